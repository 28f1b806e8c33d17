"""HipBackend at run time.

Two parts:

* ``amd_gpu`` tests: real hardware (skip cleanly without an AMD Instinct GPU + hip-python + ROCm) --
  bit-exact on exactly-representable inputs, bounded error on random inputs, poisoned outputs, odd
  shapes, both majors, fp8 encodings.  NOT run by mxcore's CI (no AMD GPU); they are written to run
  on a gfx942 / gfx950 machine.
* the same glue on this machine through ``FakeHip``: a stand-in for hip-python whose "device" memory is
  numpy and whose "hiprtc" is clang-22 (the same code object hiprtc would get); a launch checks the
  packed argument tuple against the code object's kernel-argument metadata, then runs the kernel with
  the CPU mirror of tests/test_hip_index.py.  So staging, strides, argument order and the result
  path of ``HipBackend.matmul`` are exercised without a GPU.
"""

from __future__ import annotations

import ctypes
import enum
import os
import sys
import types

import numpy as np
import pytest
from conftest import require_tool
from mxcore.backends import hip, hip_tools
from test_hip_index import HALVES, consts, mirror_gemm

from mxcore import dtypes as _dt
from mxcore.errors import BackendUnavailableError, DeviceError, UnsupportedError
from mxcore.reference import reference_matmul


def _exact_inputs(rng, m, n, k):
    kb = -(-k // 32)
    a = rng.choice(HALVES, (m, k)) * np.exp2(np.repeat(rng.integers(-3, 4, (m, kb)), 32, axis=1)[:, :k])
    b = rng.choice(HALVES, (k, n)) * np.exp2(np.repeat(rng.integers(-3, 4, (kb, n)), 32, axis=0)[:k, :])
    return a.astype(np.float32), b.astype(np.float32)


# ============================================================================ real AMD GPU
@pytest.mark.amd_gpu
@pytest.mark.parametrize("shape", [(1, 1, 1), (37, 45, 70), (131, 77, 97), (256, 256, 256), (3, 300, 5)])
def test_gpu_exact_every_dtype(hip_device, rng, shape):
    arch = hip_device.target().arch
    m, n, k = shape
    for dtype in hip_device.supported_dtypes():
        a, b = _exact_inputs(rng, m, n, k)
        want = reference_matmul(a, b, dtype, arch=arch)
        got = hip_device.matmul(a, b, _dt.resolve(dtype, arch), poison=True)
        np.testing.assert_array_equal(got, want, err_msg=f"{dtype} {shape}")
        got_t = hip_device.matmul(np.asfortranarray(a), np.asfortranarray(b), _dt.resolve(dtype, arch), poison=True)
        np.testing.assert_array_equal(got_t, want, err_msg=f"{dtype} {shape} column-major")


@pytest.mark.amd_gpu
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16", "fp8"])
def test_gpu_random_bounded(hip_device, rng, dtype):
    arch = hip_device.target().arch
    m, n, k = 200, 150, 333
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    mdt = _dt.resolve(dtype, arch)
    want = reference_matmul(a, b, dtype, arch=arch, out_dtype="float64")
    from mxcore.operands import prepare

    opa, opb = prepare(a, b, mdt)
    bound = (k + 2) * 2.0**-23 * (np.abs(opa.to_float64()) @ np.abs(opb.to_float64())) + 1e-30
    got = hip_device.matmul(a, b, mdt, poison=True)
    assert np.all(np.abs(got - want) <= bound)


@pytest.mark.amd_gpu
def test_gpu_fp8_encoding_mismatch(hip_device, rng):
    import ml_dtypes

    arch = hip_device.target().arch
    other = ml_dtypes.float8_e4m3fn if arch == "gfx942" else ml_dtypes.float8_e4m3fnuz
    a = rng.choice(HALVES, (16, 32)).astype(other)
    b = rng.choice(HALVES, (32, 16)).astype(other)
    with pytest.raises(UnsupportedError, match="e4m3fn.*e4m3fnuz|e4m3fnuz.*e4m3fn"):
        hip_device.matmul(a, b, _dt.resolve("fp8", arch))
    got = hip_device.matmul(a, b, _dt.resolve("fp8", arch), fp8_convert=True)
    np.testing.assert_array_equal(got, a.astype(np.float64) @ b.astype(np.float64))


@pytest.mark.amd_gpu
def test_gpu_mx_tensors_and_mixed(hip_device, rng):
    if hip_device.target().arch != "gfx950":
        pytest.skip("MX formats need gfx950")
    from mxcore.mx import quantize_mx

    a, b = _exact_inputs(rng, 70, 50, 200)
    qa, qb = quantize_mx(a, "mxfp4", axis=1), quantize_mx(b, "mxfp6_e3m2", axis=0)
    want = reference_matmul(qa, qb, ("mxfp4", "mxfp6_e3m2"))
    got = hip_device.matmul(qa, qb, _dt.resolve(("mxfp4", "mxfp6_e3m2")), poison=True)
    np.testing.assert_array_equal(got, want)


@pytest.mark.amd_gpu
def test_gpu_device_arrays(hip_device, rng):
    torch = pytest.importorskip("torch")
    if not getattr(torch.version, "hip", None):
        pytest.skip("needs a ROCm build of torch")
    a, b = _exact_inputs(rng, 64, 48, 96)
    ta, tb = torch.from_numpy(a).cuda().half(), torch.from_numpy(b).cuda().half()
    got = hip_device.matmul(ta, tb, _dt.resolve("fp16"))
    assert isinstance(got, torch.Tensor) and got.device.type == "cuda"
    np.testing.assert_array_equal(got.cpu().numpy(), reference_matmul(a, b, "fp16"))


@pytest.mark.amd_gpu
def test_gpu_ceiling_and_emit(hip_device, tmp_path):
    mnemonic, tflops = hip_device.instruction_ceiling("fp16")
    assert mnemonic.startswith("v_mfma") and tflops > 0
    rows = hip_device.emit_kernels(hip_device.target().arch, tmp_path)
    assert rows and all(r["compiler"].startswith("hiprtc") for r in rows)


# ============================================================================ the fake hip-python
class FakeHip:
    """Just enough of hip-python's ``hip`` and ``hiprtc`` modules for HipBackend, on the CPU."""

    def __init__(self, arch="gfx950", count=1, raise_on_count=False):
        self.arch, self.count, self.raise_on_count = arch, count, raise_on_count
        self.mem: dict[int, np.ndarray] = {}
        self.next = 1 << 20
        self.launches = []
        self.hip = self._hip_module()
        self.hiprtc = self._hiprtc_module()
        self.pkg = types.ModuleType("hip")
        self.pkg.hip, self.pkg.hiprtc = self.hip, self.hiprtc

    def install(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "hip", self.pkg)
        monkeypatch.setitem(sys.modules, "hip.hip", self.hip)
        monkeypatch.setitem(sys.modules, "hip.hiprtc", self.hiprtc)

    # -- device memory: address -> numpy byte array
    def _find(self, addr):
        for base, buf in self.mem.items():
            if base <= addr < base + max(len(buf), 1):
                return buf[addr - base:]
        raise AssertionError(f"address {addr:#x} is not device memory")

    def _hip_module(self):
        fake = self
        m = types.ModuleType("hip.hip")

        class hipError_t(enum.IntEnum):
            hipSuccess = 0
            hipErrorInvalidValue = 1
            hipErrorNoDevice = 100

        class hipMemcpyKind(enum.IntEnum):
            hipMemcpyHostToDevice = 1
            hipMemcpyDeviceToHost = 2

        class hipDeviceProp_t:
            gcnArchName = b""
            name = b""
            multiProcessorCount = 0

        ok = hipError_t.hipSuccess
        m.hipError_t, m.hipMemcpyKind, m.hipDeviceProp_t = hipError_t, hipMemcpyKind, hipDeviceProp_t

        def get_count():
            if fake.raise_on_count:
                raise RuntimeError("failed to load libamdhip64.so")
            return (ok, fake.count) if fake.count else (hipError_t.hipErrorNoDevice, 0)

        def props(p, dev):
            p.gcnArchName = f"{fake.arch}:sramecc+:xnack-".encode()
            p.name = b"Fake Instinct"
            p.multiProcessorCount = 4
            return (ok,)

        def malloc(n):
            addr = fake.next
            fake.mem[addr] = np.zeros(int(n), np.uint8)
            fake.next += (int(n) + 4095) // 4096 * 4096 + 4096
            return (ok, addr)

        def free(p):
            del fake.mem[p]
            return (ok,)

        def memcpy(dst, src, n, kind):
            if kind == hipMemcpyKind.hipMemcpyHostToDevice:
                fake._find(dst)[:n] = np.frombuffer(memoryview(np.ascontiguousarray(src)).cast("B"), np.uint8)[:n]
            else:
                dst.reshape(-1).view(np.uint8)[:n] = fake._find(src)[:n]
            return (ok,)

        def memset(p, byte, n):
            fake._find(p)[:n] = byte
            return (ok,)

        def load(blob):
            return (ok, {"blob": bytes(blob), "options": fake.last_options})

        def get_function(module, name):
            return (ok, {"module": module, "name": name.decode()})

        m.hipGetDeviceCount = get_count
        m.hipGetDeviceProperties = props
        m.hipRuntimeGetVersion = lambda: (ok, 70000000)
        m.hipGetErrorString = lambda err: err.name.encode()
        m.hipMalloc, m.hipFree, m.hipMemcpy, m.hipMemset = malloc, free, memcpy, memset
        m.hipModuleLoadData, m.hipModuleGetFunction = load, get_function
        m.hipModuleLaunchKernel = fake._launch
        m.hipDeviceSynchronize = lambda: (ok,)
        return m

    def _hiprtc_module(self):
        fake = self
        m = types.ModuleType("hip.hiprtc")

        class hiprtcResult(enum.IntEnum):
            HIPRTC_SUCCESS = 0
            HIPRTC_ERROR_COMPILATION = 6

        ok = hiprtcResult.HIPRTC_SUCCESS
        m.hiprtcResult = hiprtcResult

        class Prog(dict):
            def createRef(self):
                return self

        def compile_(prog, n, opts):
            opts = [o.decode() for o in opts]
            fake.full_options = opts
            arch = next(o.split("=", 1)[1] for o in opts if o.startswith("--offload-arch="))
            assert opts[1:3] == list(hip.COMMON_OPTIONS)
            defines = [o for o in opts if o.startswith("-D")]
            prog["binary"] = hip_tools.compile_hip(prog["source"], name=prog["name"], arch=arch, options=defines)
            prog["options"] = defines
            fake.last_options = defines
            return (ok,)

        m.hiprtcCreateProgram = lambda src, name, n, h, i: (ok, Prog(source=src.decode(), name=name.decode()))
        m.hiprtcCompileProgram = compile_
        m.hiprtcGetCodeSize = lambda prog: (ok, len(prog["binary"].code_object))
        m.hiprtcGetCode = lambda prog, buf: (buf.__setitem__(slice(None), prog["binary"].code_object), (ok,))[1]
        m.hiprtcDestroyProgram = lambda prog: (ok,)
        m.hiprtcVersion = lambda: (ok, 7, 0)
        return m

    # -- a launch: check the argument tuple against the kernel's metadata, then run the CPU mirror
    def _launch(self, func, gx, gy, gz, bx, by, bz, sharedMemBytes, stream, kernelParams, extra):
        name = func["name"]
        meta = hip_tools.code_object_metadata(func["module"]["blob"])["amdhsa.kernels"]
        (kmeta,) = [k for k in meta if k[".name"] == name]
        explicit = [a for a in kmeta[".args"] if not a[".value_kind"].startswith("hidden_")]
        assert len(explicit) == len(extra), f"{name}: kernel takes {len(explicit)} arguments, got {len(extra)}"
        offset = 0
        for arg, value in zip(explicit, extra):
            size = ctypes.sizeof(value)
            offset = (offset + size - 1) // size * size  # hip-python packs each ctypes value at its alignment
            assert (arg[".offset"], arg[".size"]) == (offset, size), f"{name}: argument layout differs from {arg}"
            offset += size
        vals = [v.value for v in extra]
        a, b, d, sa, sb, sam, sak, sbk, sbn, ldd, m, n, k, avec, bvec, scale = vals
        c = {}
        for opt in func["module"]["options"]:
            key, value = opt[2:].split("=", 1)
            c[key] = int(value) if value.lstrip("-").isdigit() else value
        arch = self.arch
        (spec,) = [s for s in hip.kernel_specs(arch) if s.entry == name]
        assert c == consts(spec)
        launch = hip.Launch((gx, gy, gz), (bx, by, bz), sam, sak, sbk, sbn, ldd, m, n, k, avec, bvec, scale)
        kb = -(-k // 32)
        scales_a = None if not sa else self._find(sa)[: m * kb]
        scales_b = None if not sb else self._find(sb)[: kb * n]
        out = mirror_gemm(c, launch, self._find(a), self._find(b), scales_a, scales_b, spec.layout())
        dev = self._find(d)[: m * ldd * 4].view(np.float32).reshape(m, ldd)
        written = ~np.isnan(out)
        dev[:, :n][written] = out[written]
        self.launches.append((name, launch))
        return (self.hip.hipError_t.hipSuccess,)


@pytest.fixture
def fake_gfx950(monkeypatch, tmp_path):
    require_tool("clang-22", hip_tools.have_clang())
    monkeypatch.setenv("MXCORE_CACHE_DIR", str(tmp_path))
    fake = FakeHip("gfx950")
    fake.install(monkeypatch)
    return fake, hip.HipBackend()


@pytest.fixture
def fake_gfx942(monkeypatch, tmp_path):
    require_tool("clang-22", hip_tools.have_clang())
    monkeypatch.setenv("MXCORE_CACHE_DIR", str(tmp_path))
    fake = FakeHip("gfx942")
    fake.install(monkeypatch)
    return fake, hip.HipBackend()


# ============================================================================ availability
def test_unavailable_without_hip_python(monkeypatch):
    monkeypatch.setitem(sys.modules, "hip", None)
    be = hip.HipBackend()
    reason = be.is_available()
    assert "hip-python is not installed" in reason and isinstance(be.unavailable_cause, ImportError)
    assert be.devices() == []
    with pytest.raises(BackendUnavailableError, match="hip-python"):
        be.target()


@pytest.mark.parametrize("kw,expect", [({"raise_on_count": True}, "no ROCm runtime"), ({"count": 0}, "no AMD GPU"),
                                       ({"arch": "gfx90a"}, "gfx90a")])
def test_unavailable_reasons(monkeypatch, kw, expect):
    FakeHip(**kw).install(monkeypatch)
    be = hip.HipBackend()
    assert expect in be.is_available()


def test_registry_falls_back(monkeypatch):
    """With hip unusable, backend='auto' never picks it (and says why it is not usable)."""
    from mxcore import backends

    FakeHip(raise_on_count=True).install(monkeypatch)
    monkeypatch.setitem(backends._INSTANCES, "hip", hip.HipBackend())
    status = {s.name: s for s in backends.available()}
    assert not status["hip"].usable and "no ROCm runtime" in status["hip"].reason
    assert backends.select("auto").name != "hip"


# ============================================================================ matmul through the fake
def test_fake_device_description(fake_gfx950):
    _fake, be = fake_gfx950
    assert be.is_available() is None
    assert be.target().arch == "gfx950" and be.target().wave_size == 64
    assert be.devices() == ["Fake Instinct (gfx950:sramecc+:xnack-)"]
    assert "mxfp4" in be.supported_dtypes() and "e4m3fnuz" not in be.supported_dtypes()


@pytest.mark.parametrize("dtype", ["fp16", "mxfp4", ("mxfp8", "mxfp6_e3m2"), "fp8", "tf32"])
def test_fake_gfx950_matmul_exact(fake_gfx950, rng, dtype):
    fake, be = fake_gfx950
    a, b = _exact_inputs(rng, 29, 35, 90)
    mdt = _dt.resolve(dtype, "gfx950")
    got = be.matmul(a, b, mdt, poison=True)
    np.testing.assert_array_equal(got, reference_matmul(a, b, dtype, arch="gfx950"))
    name, launch = fake.launches[-1]
    assert name == hip.select_spec("gfx950", mdt, 29, 35).entry and launch.m == 29


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp8", ("e5m2fnuz", "e4m3fnuz")])
def test_fake_gfx942_matmul_both_majors(fake_gfx942, rng, dtype):
    fake, be = fake_gfx942
    a, b = _exact_inputs(rng, 19, 26, 41)
    mdt = _dt.resolve(dtype, "gfx942")
    want = reference_matmul(a, b, dtype, arch="gfx942")
    np.testing.assert_array_equal(be.matmul(a, b, mdt, poison=True), want)
    if mdt.kind == "float":  # a column-major A stays column-major on the device (the kernel reads either)
        got = be.matmul(np.asfortranarray(a), np.asfortranarray(b), mdt, poison=True)
        np.testing.assert_array_equal(got, want)
        assert fake.launches[-1][1].sam == 1 and fake.launches[-1][1].sbk == 1
    assert not fake.mem, "device memory leaked"


def test_fake_out_dtype_and_scaled_tensor(fake_gfx950, rng):
    from mxcore.mx import quantize_tensor

    _fake, be = fake_gfx950
    a, b = _exact_inputs(rng, 12, 20, 33)
    got = be.matmul(a, b, _dt.resolve("fp16"), out_dtype="float16")
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, reference_matmul(a, b, "fp16", out_dtype="float16"))
    qa, qb = quantize_tensor(a * 64, "e4m3fn"), quantize_tensor(b / 8, "e5m2")
    got = be.matmul(qa, qb, _dt.resolve(("e4m3fn", "e5m2")))
    np.testing.assert_array_equal(got, reference_matmul(qa, qb, ("e4m3fn", "e5m2")))


def test_fake_fp8_encodings(fake_gfx942, rng):
    import ml_dtypes

    _fake, be = fake_gfx942
    a = rng.choice(HALVES, (10, 40)).astype(ml_dtypes.float8_e4m3fn)  # OCP bytes on a FNUZ machine
    b = rng.choice(HALVES, (40, 12)).astype(ml_dtypes.float8_e4m3fn)
    mdt = _dt.resolve("fp8", "gfx942")
    with pytest.raises(UnsupportedError, match="e4m3fn") as info:
        be.matmul(a, b, mdt)
    assert "e4m3fnuz" in str(info.value)
    got = be.matmul(a, b, mdt, fp8_convert=True)
    np.testing.assert_array_equal(got, (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32))
    with pytest.raises(UnsupportedError, match="OCP"):
        be.matmul(a, b, _dt.resolve("e4m3fn"))


def test_convert_fp8_tables():
    import ml_dtypes

    codes = np.arange(256, dtype=np.uint8)
    ocp = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    fnuz = hip.convert_fp8(codes, "e4m3fn", "e4m3fnuz").view(ml_dtypes.float8_e4m3fnuz).astype(np.float64)
    fin = np.isfinite(ocp)
    small = fin & (np.abs(ocp) <= 240)
    assert np.array_equal(fnuz[small], ocp[small])  # exact where representable
    assert np.array_equal(fnuz[fin & (np.abs(ocp) > 240)], 240 * np.sign(ocp[fin & (np.abs(ocp) > 240)]))
    assert np.isnan(fnuz[~fin]).all()
    back = hip.convert_fp8(codes, "e4m3fnuz", "e4m3fn").view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    src = codes.view(ml_dtypes.float8_e4m3fnuz).astype(np.float64)
    odd = np.isfinite(src) & (np.abs(src) < 2.0**-6) & (np.round(src * 2**10) % 2 == 1)  # odd multiples of 2^-10
    ok = np.isfinite(src) & ~odd
    assert np.array_equal(back[ok], src[ok]) and odd.sum() > 0
    e5 = np.arange(256, dtype=np.uint8)
    inf = hip.convert_fp8(e5, "e5m2", "e5m2fnuz")
    assert np.isnan(inf.view(ml_dtypes.float8_e5m2fnuz).astype(np.float64)[np.isinf(
        e5.view(ml_dtypes.float8_e5m2).astype(np.float64))]).all()
    with pytest.raises(UnsupportedError):
        hip.convert_fp8(codes, "e4m3fn", "e5m2")


def test_fake_emit_kernels_uses_hiprtc(fake_gfx942, tmp_path):
    _fake, be = fake_gfx942
    rows = be.emit_kernels("gfx942", tmp_path / "out")
    assert len(rows) == len(hip.kernel_specs("gfx942"))
    assert all(r["compiler"].startswith("hiprtc:") for r in rows)


def test_fake_plan_reuse_and_forced_tile(fake_gfx950, rng):
    """bench's interface: plan() once, prep()/gemm() many times, force_tile picks the instruction shape."""
    fake, be = fake_gfx950
    a, b = _exact_inputs(rng, 40, 24, 64)
    mdt = _dt.resolve("bf16")
    be.force_tile = 32
    try:
        with be.plan(a, b, mdt) as p:
            assert p.variant.shape[0] == 32 and p.variant.name == p.spec.entry
            p.prep()
            p.prep()  # re-staging frees the previous operand buffers
            p.poison()
            p.gemm()
            np.testing.assert_array_equal(p.result(), reference_matmul(a, b, "bf16"))
    finally:
        be.force_tile = None
    assert not fake.mem


# ============================================================================ code-object cache key
def test_fake_cache_key_is_the_full_hiprtc_option_list(fake_gfx950, rng):
    fake, be = fake_gfx950
    a, b = _exact_inputs(rng, 16, 16, 32)
    be.matmul(a, b, _dt.resolve("fp16", "gfx950"))
    rt = be.runtime()
    assert fake.full_options == hip.hiprtc_options("gfx950", fake.last_options)
    assert fake.full_options[1:3] == list(hip.COMMON_OPTIONS)
    from mxcore.kernels import kernel_source

    key = hip.cache_key(kernel_source("amd", hip.SOURCE_FILE), "gfx950", fake.full_options, rt.compiler_id())
    assert os.path.exists(os.path.join(hip.cache_dir(), key + ".co"))


class _CountingRuntime(hip._Runtime):
    """hip._Runtime's cache path (code_object) with the hiprtc call replaced by a counter."""

    def __init__(self):  # no hip-python: only what code_object needs
        self.compiled = []

    def compiler_id(self) -> str:
        return "hiprtc:test"

    def hiprtc_compile(self, source, name, arch, options) -> bytes:
        self.compiled.append(hip.hiprtc_options(arch, options))
        return f"code object #{len(self.compiled)}".encode()


def test_hiprtc_cache_key_covers_common_options(tmp_path, monkeypatch):
    monkeypatch.setenv("MXCORE_CACHE_DIR", str(tmp_path))
    rt = _CountingRuntime()
    first = rt.code_object("src", "k", "gfx950", ("-DA=1",))
    assert rt.code_object("src", "k", "gfx950", ("-DA=1",)) == first and len(rt.compiled) == 1  # cache hit
    monkeypatch.setattr(hip, "COMMON_OPTIONS", ("-O2", "-std=c++17"))
    again = rt.code_object("src", "k", "gfx950", ("-DA=1",))
    assert again != first and rt.compiled[-1] == ["--offload-arch=gfx950", "-O2", "-std=c++17", "-DA=1"]
    # option order reaches the compiler, so it is part of the key too (a later -D wins)
    rt.code_object("src", "k", "gfx950", ("-DA=1", "-DA=2"))
    rt.code_object("src", "k", "gfx950", ("-DA=2", "-DA=1"))
    assert len(rt.compiled) == 4


def test_offline_cache_key_covers_clang_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("MXCORE_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_compile(source, *, name, arch, options=()):
        calls.append((tuple(hip_tools.DEFAULT_OPTIONS), tuple(options)))
        return hip_tools.HipBinary(f"co{len(calls)}".encode(), name=name, arch=arch, options=tuple(options))

    monkeypatch.setattr(hip_tools, "compile_hip", fake_compile)
    monkeypatch.setattr(hip_tools, "clang_version", lambda: "22.test")
    spec = hip.kernel_specs("gfx950")[0]
    assert hip.offline_compile(spec).code_object == b"co1"
    assert hip.offline_compile(spec).code_object == b"co1" and len(calls) == 1
    monkeypatch.setattr(hip_tools, "DEFAULT_OPTIONS", ("-O1", "-std=c++17"))
    assert hip.offline_compile(spec).code_object == b"co2"
    opts = hip.clang_options("gfx950", ("-DX=1",), "entry")
    assert opts[:len(hip_tools.BASE_FLAGS)] == list(hip_tools.BASE_FLAGS)
    assert "--offload-arch=gfx950" in opts and opts[-3:] == ["-O1", "-std=c++17", "-DX=1"]
    assert any(o.startswith("hip_shim.h@") for o in opts)


# ============================================================================ public runtime / address helpers
def test_device_address_forms():
    class Cai:
        __cuda_array_interface__ = {"data": (4096, False), "shape": (1,), "typestr": "<f4", "version": 3}

    assert hip.device_address(12288) == 12288
    assert hip.device_address(ctypes.c_void_p(8192)) == 8192
    assert hip.device_address(Cai()) == 4096
    with pytest.raises(DeviceError, match="cannot read a device address from object"):
        hip.device_address(object())


def test_runtime_is_public_and_says_why_not(monkeypatch):
    monkeypatch.setitem(sys.modules, "hip", None)
    with pytest.raises(BackendUnavailableError, match="hip-python is not installed"):
        hip.HipBackend().runtime()
