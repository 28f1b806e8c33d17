"""HipBackend at run time.

Two parts:

* ``amd_gpu`` tests: real hardware (skip cleanly without an AMD Instinct GPU + hip-python + ROCm) --
  bit-exact on exactly-representable inputs, bounded error on random inputs, poisoned outputs, odd
  shapes, both majors, fp8 encodings.  NOT run by mxcore's CI (no AMD GPU); they are written to run
  on a gfx942 / gfx950 machine.
* the same glue on this machine through ``FakeHip``: a stand-in for hip-python whose "device" memory is
  numpy and whose "hiprtc" is clang-22 (the same code object hiprtc would get); a launch checks the
  packed argument tuple against the code object's kernel-argument metadata, then runs the kernel with
  the CPU mirror (tests/_hip_mirror.py).  So staging, strides, argument order and the result
  path of ``HipBackend.matmul`` are exercised without a GPU.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import os
import sys
import types

import numpy as np
import pytest
from conftest import require_tool
from mxcore.backends import hip, hip_tools
from mxcore.backends._contract import is_failure
from mxcore.backends.hip.runtime import detect_convention
from _hip_mirror import HALVES, consts, mirror_gemm

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
    last = torch.cuda.device_count() - 1  # the inputs' device and stream, not device 0's null stream
    with torch.cuda.device(last), torch.cuda.stream(torch.cuda.Stream()):
        tc, td = ta.to(f"cuda:{last}"), tb.to(f"cuda:{last}")
        got = hip_device.matmul(tc[None].expand(2, -1, -1), td, _dt.resolve("fp16"))
        assert got.device == tc.device and got.shape == (2, 64, 48)
        np.testing.assert_array_equal(got[1].cpu().numpy(), reference_matmul(a, b, "fp16"))


@pytest.mark.amd_gpu
def test_gpu_ceiling_and_emit(hip_device, tmp_path):
    mnemonic, tflops = hip_device.instruction_ceiling("fp16")
    assert mnemonic.startswith("v_mfma") and tflops > 0
    records = hip_device.emit_kernels(hip_device.target().arch, tmp_path)
    assert records and all(r.extra["compiler"].startswith("hiprtc") for r in records)


# ============================================================================ the fake hip-python
class FakeHip:
    """Just enough of hip-python's ``hip`` and ``hiprtc`` modules for HipBackend, on the CPU.

    ``convention``: "7" presents hip-python 6.x/7.x's ``hipGetDeviceProperties(prop, deviceId) -> (err,)``,
    "10" hip-python 10.x's ``hipGetDeviceProperties(deviceId) -> (err, prop)`` (the wrappers' real parameter
    names, so the runtime's signature-based detection sees what it would see on hip-python itself)."""

    compiled: dict = {}  # sha256 of a code object -> the -D options "hiprtc" compiled it with (this session)

    def __init__(self, arch="gfx950", count=1, raise_on_count=False, convention="7", max_grid=(2**31 - 1, 65536, 65536),
                 props_error=False):
        self.arch, self.count, self.raise_on_count = arch, count, raise_on_count
        self.convention, self.max_grid, self.props_error = convention, max_grid, props_error
        self.mem: dict[int, np.ndarray] = {}
        self.next = 1 << 20
        self.current = 0
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
            hipErrorInvalidDevice = 101

        class hipMemcpyKind(enum.IntEnum):
            hipMemcpyHostToDevice = 1
            hipMemcpyDeviceToHost = 2

        class hipDeviceProp_t:
            gcnArchName = b""
            name = b""
            multiProcessorCount = 0
            maxGridSize = (0, 0, 0)

        ok = hipError_t.hipSuccess
        m.hipError_t, m.hipMemcpyKind, m.hipDeviceProp_t = hipError_t, hipMemcpyKind, hipDeviceProp_t

        def get_count():
            if fake.raise_on_count:
                raise RuntimeError("failed to load libamdhip64.so")
            return (ok, fake.count) if fake.count else (hipError_t.hipErrorNoDevice, 0)

        def fill(p, dev):
            if fake.props_error:
                return hipError_t.hipErrorInvalidValue
            if not 0 <= dev < fake.count:
                return hipError_t.hipErrorInvalidDevice
            p.gcnArchName = f"{fake.arch}:sramecc+:xnack-".encode()
            p.name = f"Fake Instinct #{dev}".encode()
            p.multiProcessorCount = 4
            p.maxGridSize = fake.max_grid
            return ok

        if fake.convention == "10":
            def hipGetDeviceProperties(deviceId):
                p = hipDeviceProp_t()
                return (fill(p, deviceId), p)
        else:
            def hipGetDeviceProperties(prop, deviceId):
                return (fill(prop, deviceId),)

        def set_device(dev):
            if not 0 <= dev < fake.count:
                return (hipError_t.hipErrorInvalidDevice,)
            fake.current = dev
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
            options = FakeHip.compiled[hashlib.sha256(bytes(blob)).hexdigest()]  # what "hiprtc" built it from
            return (ok, {"blob": bytes(blob), "options": options, "device": fake.current})

        def get_function(module, name):
            return (ok, {"module": module, "name": name.decode()})

        m.hipGetDeviceCount = get_count
        m.hipGetDeviceProperties = hipGetDeviceProperties
        m.hipGetDevice = lambda: (ok, fake.current)
        m.hipSetDevice = set_device
        m.hipRuntimeGetVersion = lambda: (ok, 70_200_000)
        m.hipGetErrorString = lambda err: (ok, err.name.encode())
        m.hipMalloc, m.hipFree, m.hipMemcpy, m.hipMemset = malloc, free, memcpy, memset
        m.hipModuleLoadData, m.hipModuleGetFunction = load, get_function
        m.hipModuleLaunchKernel = fake._launch
        m.hipDeviceSynchronize = lambda: (ok,)
        m.hipStreamSynchronize = lambda stream: (ok,)
        m.hipEventCreate = lambda: (ok, {"t": None})
        m.hipEventRecord = lambda ev, stream: (ev.__setitem__("t", len(fake.launches)), (ok,))[1]
        m.hipEventSynchronize = lambda ev: (ok,)
        m.hipEventElapsedTime = lambda a, b: (ok, 1.5 * (b["t"] - a["t"]))  # 1.5 ms per launch in between
        m.hipEventDestroy = lambda ev: (ok,)
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
            FakeHip.compiled[hashlib.sha256(prog["binary"].code_object).hexdigest()] = defines
            return (ok,)

        m.hiprtcCreateProgram = lambda src, name, n, h, i: (ok, Prog(source=src.decode(), name=name.decode()))
        m.hiprtcCompileProgram = compile_
        m.hiprtcGetCodeSize = lambda prog: (ok, len(prog["binary"].code_object))
        m.hiprtcGetCode = lambda prog, buf: (buf.__setitem__(slice(None), prog["binary"].code_object), (ok,))[1]
        m.hiprtcDestroyProgram = lambda prog: (ok,)
        m.hiprtcVersion = lambda: (ok, 7, 2)
        return m

    # -- a launch: check the argument tuple against the kernel's metadata, then run the CPU mirror
    def _launch(self, func, gx, gy, gz, bx, by, bz, sharedMemBytes, stream, kernelParams, extra):
        name = func["name"]
        assert func["module"]["device"] == self.current, "kernel launched on another device than it was loaded on"
        assert gy <= self.max_grid[1] and gz <= self.max_grid[2], "grid beyond the device limit"
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
        if not name.startswith("mx_gemm_"):  # the ceiling kernel: arguments checked, nothing to compute
            self.launches.append((name, None, self.current, stream))
            return (self.hip.hipError_t.hipSuccess,)
        vals = [v.value for v in extra]
        a, b, d, sa, sb, sam, sak, sbk, sbn, ldd, sab, sbb, sdb, ssa, ssb, m, n, k, avec, bvec, mt0, b0, scale, ty = vals
        assert ty == gy, f"tiles_y argument {ty}, grid Y {gy}"
        c = {}
        for opt in func["module"]["options"]:
            key, value = opt[2:].split("=", 1)
            c[key] = int(value) if value.lstrip("-").isdigit() else value
        (spec,) = [s for s in hip.kernel_specs(self.arch) if s.entry == name]
        assert c == consts(spec)
        launch = hip.Launch((gx, gy, gz), (bx, by, bz), sam, sak, sbk, sbn, ldd, m, n, k, avec, bvec, scale,
                            sab, sbb, sdb, ssa, ssb, mt0, b0)
        kb = -(-k // 32)
        for z in range(gz):
            zb = z + b0
            scales_a = None if not sa else self._find(sa)[: (zb + 1) * max(ssa, m * kb)]
            scales_b = None if not sb else self._find(sb)[: (zb + 1) * max(ssb, kb * n)]
            out = mirror_gemm(c, launch, self._find(a), self._find(b), scales_a, scales_b, spec.layout(), z=z)
            dev = self._find(d)[zb * sdb * 4:][: m * ldd * 4].view(np.float32).reshape(m, ldd)
            written = ~np.isnan(out)
            dev[:, :n][written] = out[written]
        self.launches.append((name, launch, self.current, stream))
        return (self.hip.hipError_t.hipSuccess,)


@pytest.fixture(params=["7", "10"], ids=["hip-python7", "hip-python10"])
def convention(request):
    return request.param


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory):
    """One code-object cache for the fake-device tests (each variant is compiled by clang-22 once)."""
    return tmp_path_factory.mktemp("hip_fake_cache")


def _fake(monkeypatch, cache, arch, **kw):
    require_tool("clang-22", hip_tools.have_clang())
    monkeypatch.setenv("MXCORE_CACHE_DIR", str(cache))
    fake = FakeHip(arch, **kw)
    fake.install(monkeypatch)
    return fake, hip.HipBackend()


@pytest.fixture
def fake_gfx950(monkeypatch, shared_cache, convention):
    return _fake(monkeypatch, shared_cache, "gfx950", convention=convention)


@pytest.fixture
def fake_gfx942(monkeypatch, shared_cache, convention):
    return _fake(monkeypatch, shared_cache, "gfx942", convention=convention)


# ============================================================================ availability
def test_unavailable_without_hip_python(monkeypatch):
    monkeypatch.setitem(sys.modules, "hip", None)
    be = hip.HipBackend()
    reason = be.is_available()
    assert "hip-python is not installed" in reason and isinstance(be.unavailable_cause, ImportError)
    assert "ROCm version" in reason and not is_failure(reason)
    assert be.devices() == []
    with pytest.raises(BackendUnavailableError, match="hip-python"):
        be.target()


@pytest.mark.parametrize("kw,expect", [({"raise_on_count": True}, "no ROCm runtime"), ({"count": 0}, "no AMD GPU"),
                                       ({"arch": "gfx90a"}, "gfx90a")])
def test_unavailable_reasons(monkeypatch, kw, expect):
    """Absences (no ROCm, no GPU, another arch) are reasons to skip, not failures."""
    FakeHip(**kw).install(monkeypatch)
    reason = hip.HipBackend().is_available()
    assert expect in reason and not is_failure(reason)


@pytest.mark.parametrize("kw", [{"props_error": True}, {"convention": "7"}])
def test_initialisation_failure_is_a_failure(monkeypatch, kw):
    """hip-python imports and counts a GPU, but the runtime does not come up (a device-property error, or
    hip-python wrappers of a convention mxcore does not know): the reason is a FAILURE naming the fix."""
    fake = FakeHip(**kw)
    if "props_error" not in kw:  # a hip-python whose hipGetDeviceProperties takes three arguments
        fake.hip.hipGetDeviceProperties = lambda prop, deviceId, flags: (fake.hip.hipError_t.hipSuccess,)
    fake.install(monkeypatch)
    be = hip.HipBackend()
    reason = be.is_available()
    assert is_failure(reason) and "1 AMD GPU(s) found" in reason and "hip-python" in reason
    assert "ROCm version" in reason and be.unavailable_cause is not None
    status = {s.name: s for s in _registry_status(monkeypatch, be)}
    assert not status["hip"].usable and is_failure(status["hip"].reason)


def _registry_status(monkeypatch, be):
    from mxcore import backends

    monkeypatch.setitem(backends._INSTANCES, "hip", be)
    return backends.available()


def test_registry_falls_back(monkeypatch):
    """With hip unusable, backend='auto' never picks it (and says why it is not usable)."""
    from mxcore import backends

    FakeHip(raise_on_count=True).install(monkeypatch)
    status = {s.name: s for s in _registry_status(monkeypatch, hip.HipBackend())}
    assert not status["hip"].usable and "no ROCm runtime" in status["hip"].reason
    assert backends.select("auto").name != "hip"


def test_convention_detected_once_from_the_wrappers(convention):
    """detect_convention reads hipGetDeviceProperties' parameters (signature, or the Cython docstring)."""
    fake = FakeHip(convention=convention)
    assert detect_convention(fake.hip).props_returned is (convention == "10")

    # a builtin without an introspectable signature: Cython's embedsignature docstring is read instead
    wrapper = types.SimpleNamespace(hipGetDeviceProperties=types.SimpleNamespace(
        __doc__="hipGetDeviceProperties(object prop, int deviceId)\nReturns device properties."))
    assert detect_convention(wrapper).props_returned is False
    wrapper.hipGetDeviceProperties.__doc__ = "hipGetDeviceProperties(deviceId)\n"
    assert detect_convention(wrapper).props_returned is True


# ============================================================================ matmul through the fake
def test_fake_device_description(fake_gfx950, convention):
    _fake, be = fake_gfx950
    assert be.is_available() is None
    assert be.target().arch == "gfx950" and be.target().wave_size == 64
    (desc,) = be.devices()
    assert desc.startswith("Fake Instinct #0 (gfx950:sramecc+:xnack-); ROCm 7.2.0")
    assert ("hip-python >= 10" in desc) is (convention == "10")
    assert "mxfp4" in be.supported_dtypes() and "e4m3fnuz" not in be.supported_dtypes()


@pytest.mark.parametrize("dtype", ["fp16", "mxfp4", ("mxfp8", "mxfp6_e3m2"), "fp8", "tf32"])
def test_fake_gfx950_matmul_exact(fake_gfx950, rng, dtype):
    fake, be = fake_gfx950
    a, b = _exact_inputs(rng, 29, 35, 90)
    mdt = _dt.resolve(dtype, "gfx950")
    got = be.matmul(a, b, mdt, poison=True)
    np.testing.assert_array_equal(got, reference_matmul(a, b, dtype, arch="gfx950"))
    name, launch, _dev, _stream = fake.launches[-1]
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
    assert be.supports(_dt.resolve("e4m3fn")).startswith("gfx942 reads FNUZ")


def test_fake_mx_block_other_than_32_is_refused(fake_gfx950, rng):
    """The f8f6f4 MFMA reads one E8M0 per 32 K: an MXTensor with another block size is refused, not
    silently multiplied with the wrong scales."""
    from mxcore.mx import quantize_mx

    fake, be = fake_gfx950
    a, b = _exact_inputs(rng, 16, 16, 64)
    qa, qb = quantize_mx(a, "mxfp4", axis=1, block=16), quantize_mx(b, "mxfp4", axis=0)
    with pytest.raises(UnsupportedError, match=r"blocks of 16 elements.*block=32"):
        be.matmul(qa, qb, _dt.resolve("mxfp4"))
    assert not fake.launches and not fake.mem


def test_fake_tall_m_splits_the_grid(monkeypatch, shared_cache, rng, convention):
    """M tiles beyond the device's grid-Y limit: several launches (the fake asserts each grid fits)."""
    fake, be = _fake(monkeypatch, shared_cache, "gfx950", convention=convention, max_grid=(2**31 - 1, 2, 2))
    a, b = _exact_inputs(rng, 5 * 64 - 3, 20, 40)
    got = be.matmul(a, b, _dt.resolve("bf16"), poison=True)
    np.testing.assert_array_equal(got, reference_matmul(a, b, "bf16"))
    assert [ln.m_tile0 for _n, ln, _d, _s in fake.launches] == [0, 2, 4]


@pytest.mark.parametrize("dtype", ["fp16", "mxfp6_e2m3", "fp8"])
def test_fake_batched_one_launch(fake_gfx950, rng, dtype):
    """(B, M, K) @ (B, K, N) and (B, M, K) @ (K, N): one launch with the batch in grid Z (fp8's per-tensor scales
    differ per batch element: one launch each)."""
    fake, be = fake_gfx950
    mdt = _dt.resolve(dtype, "gfx950")
    pairs = [_exact_inputs(rng, 17, 23, 45) for _ in range(3)]
    a3 = np.stack([p[0] * np.float32(2.0 ** (3 * i)) for i, p in enumerate(pairs)])  # a per-tensor scale each
    b3 = np.stack([p[1] for p in pairs])
    got = be.matmul(a3, b3, mdt, poison=True)
    assert got.shape == (3, 17, 23)
    for i in range(3):
        np.testing.assert_array_equal(got[i], reference_matmul(a3[i], b3[i], dtype, arch="gfx950"))
    shared = be.matmul(a3, b3[0], mdt, poison=True)
    for i in range(3):
        np.testing.assert_array_equal(shared[i], reference_matmul(a3[i], b3[0], dtype, arch="gfx950"))
    grids = [ln.grid[2] for _n, ln, _d, _s in fake.launches]
    assert grids == ([1] * 6 if mdt.kind == "fp8" else [3, 3])
    assert not fake.mem


def test_fake_device_id_and_stream_of_device_inputs(monkeypatch, shared_cache, rng, convention):
    """Device arrays (here __cuda_array_interface__ producers on GPU 1 with a stream) run on THEIR device and
    stream, read in place (no upload of A or B)."""
    fake, be = _fake(monkeypatch, shared_cache, "gfx950", convention=convention, count=2)
    a, b = _exact_inputs(rng, 20, 30, 40)

    class OnGpu1:
        device = types.SimpleNamespace(id=1)

        def __init__(self, host):
            self.host = np.ascontiguousarray(host, np.float16)
            _err, self.ptr = fake.hip.hipMalloc(self.host.nbytes)
            fake._find(self.ptr)[: self.host.nbytes] = self.host.view(np.uint8).reshape(-1)
            self.shape = self.host.shape
            self.__cuda_array_interface__ = {"shape": self.host.shape, "typestr": "<f2", "strides": None,
                                             "data": (self.ptr, False), "version": 3, "stream": 0x5000}

    da, db = OnGpu1(a), OnGpu1(b)
    allocs_before = len(fake.mem)
    got = be.matmul(da, db, _dt.resolve("fp16"), poison=True)
    np.testing.assert_array_equal(got, reference_matmul(a, b, "fp16"))
    (_name, _launch, device, stream), = fake.launches
    assert device == 1 and stream == 0x5000 and fake.current == 0  # the caller's current device is restored
    assert len(fake.mem) == allocs_before  # nothing left behind, and A/B were never copied


def test_fake_timer_and_ceiling(fake_gfx942):
    fake, be = fake_gfx942
    measure = be.timer()
    assert measure(lambda: None) == 0.0
    mnemonic, tflops = be.instruction_ceiling("fp16", iters=8, chains=2)
    assert mnemonic == "v_mfma_f32_32x32x8_f16"
    blocks = 4 * 8  # the fake's 4 CUs x 8; each timed launch takes 1.5 ms of fake event time
    assert tflops == pytest.approx(2.0 * 32 * 32 * 8 * 2 * 8 * blocks * 4 / 1.5e-3 / 1e12)
    assert [ln[0] for ln in fake.launches] == ["mx_mfma_ceiling"] * 6


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
    records = be.emit_kernels("gfx942", tmp_path / "out", workers=2)
    assert [r.kernel for r in records] == [s.entry for s in hip.kernel_specs("gfx942")]
    assert all(r.extra["compiler"].startswith("hiprtc:") and r.registers > 0 for r in records)
    assert all((tmp_path / "out" / r.file).stat().st_size > 1000 for r in records)


def test_fake_plan_reuse_and_tile(fake_gfx950, rng):
    """The contract's plan: staged once, gemm()/prep() many times; tile= picks the block tile."""
    fake, be = fake_gfx950
    a, b = _exact_inputs(rng, 40, 24, 64)
    mdt = _dt.resolve("bf16")
    assert be.tiles("bf16") == ("128x128", "256x256", "64x64")
    with be.plan(a, b, mdt, tile="256x256") as p:  # the large 8-wave tile: one block, 512 threads
        assert p.spec.big and p.spec.threads == 512
        p.gemm()
        np.testing.assert_array_equal(p.result(), reference_matmul(a, b, "bf16"))
    with be.plan(a, b, mdt, tile="128x128") as p:
        assert p.spec.shape[0] == 32 and p.variant == f"{p.spec.entry} 128x128"
        p.prep()  # re-staging frees the previous operand buffers
        p.poison()
        p.gemm()
        np.testing.assert_array_equal(p.result(), reference_matmul(a, b, "bf16"))
        with p.clone() as q:
            q.gemm()
            np.testing.assert_array_equal(q.result(), reference_matmul(a, b, "bf16"))
    assert not fake.mem
    with pytest.raises(UnsupportedError, match="tile '96x96'.*128x128, 256x256, 64x64"):
        be.plan(a, b, mdt, tile="96x96")


# ============================================================================ code-object cache key
def test_fake_cache_key_is_the_full_hiprtc_option_list(monkeypatch, tmp_path, rng):
    fake, be = _fake(monkeypatch, tmp_path, "gfx950")  # a fresh cache: this call compiles
    a, b = _exact_inputs(rng, 16, 16, 32)
    be.matmul(a, b, _dt.resolve("fp16", "gfx950"))
    rt = be.runtime()
    assert fake.full_options == hip.hiprtc_options("gfx950", fake.last_options)
    assert fake.full_options[1:3] == list(hip.COMMON_OPTIONS)
    from mxcore.kernels import kernel_source

    key = hip.cache_key(kernel_source("amd", hip.SOURCE_FILE), "gfx950", fake.full_options, rt.compiler_id())
    assert os.path.exists(os.path.join(hip.cache_dir(), key + ".co"))


class _CountingRuntime(hip.Runtime):
    """hip.Runtime's cache path (code_object) with the hiprtc call replaced by a counter."""

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
    monkeypatch.setattr(hip.cache, "COMMON_OPTIONS", ("-O2", "-std=c++17"))
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


def test_amd_gpu_tests_fail_on_a_failure_reason(monkeypatch):
    """conftest: an amd_gpu test is skipped for an absence but FAILS for a failure reason (never green by skip)."""
    import conftest
    from mxcore import backends

    fake = FakeHip(props_error=True)
    fake.install(monkeypatch)
    monkeypatch.setitem(backends._INSTANCES, "hip", hip.HipBackend())

    class Item:
        keywords = {"amd_gpu": True}

        def __init__(self):
            self.markers = []

        def add_marker(self, marker):
            self.markers.append(marker)

    item = Item()
    conftest.pytest_collection_modifyitems(None, [item])
    assert item.markers == []
    with pytest.raises(pytest.fail.Exception, match="FAILURE: 1 AMD GPU"):
        conftest.pytest_runtest_setup(item)
    fake.count = 0  # an absence: skipped as before
    monkeypatch.setitem(backends._INSTANCES, "hip", hip.HipBackend())
    conftest.pytest_collection_modifyitems(None, [item])
    assert [m.name for m in item.markers] == ["skip"]
    conftest.pytest_runtest_setup(item)  # no failure


def test_fake_gemm_does_no_host_work(fake_gfx950, rng, monkeypatch):
    """The timed region (plan.gemm) only launches: compile inputs, kernel lookup and launch arguments are
    computed once per plan (per variant for the compile inputs)."""
    fake, be = fake_gfx950
    a, b = _exact_inputs(rng, 33, 20, 50)
    with be.plan(a, b, _dt.resolve("fp16")) as p:
        def forbidden(*args, **kw):
            raise AssertionError("host-side recompute inside gemm()")

        monkeypatch.setattr(hip.plan, "compile_inputs", forbidden)
        monkeypatch.setattr(p.rt, "function", forbidden)
        monkeypatch.setattr(hip.plan, "kernel_args", forbidden)
        for _ in range(3):
            p.gemm()
        np.testing.assert_array_equal(p.result(), reference_matmul(a, b, "fp16"))
    assert len(fake.launches) == 3


def test_broken_hip_python_import_is_a_failure(monkeypatch):
    """hip-python installed but failing to import with something other than ImportError: a FAILURE, not a raise."""
    import importlib.abc

    class Broken(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "hip" or name.startswith("hip."):
                raise OSError("libamdhip64.so: wrong ELF class")
            return None

    for mod in ("hip", "hip.hip", "hip.hiprtc"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    monkeypatch.setattr(sys, "meta_path", [Broken(), *sys.meta_path])
    reason = hip.HipBackend().is_available()
    assert is_failure(reason) and "OSError" in reason and "ROCm version" in reason


def test_version_mismatch_note():
    """hip-python 6.x/7.x carry the ROCm release they were built for: a different runtime gets a note naming both."""
    from mxcore.backends.hip.runtime import version_mismatch

    note = version_mismatch("7.2.2.562.43", 60_443_483)
    assert "ROCm 7.2" in note and "ROCm 6.4" in note and 'hip-python==X.Y.*' in note
    assert version_mismatch("6.4.4.555.40", 60_443_483) is None
    assert version_mismatch("10.0.0.0.1.2", 70_200_000) is None  # rocm-bindings version apart from ROCm
    assert version_mismatch("unknown", 70_200_000) is None


def test_fake_api_batched_goes_to_one_launch(fake_gfx950, rng, monkeypatch):
    """mxcore.matmul hands a batch to the hip backend whole (Backend.batched): one launch, batch in grid Z."""
    import mxcore
    from mxcore import backends

    fake, be = fake_gfx950
    monkeypatch.setitem(backends._INSTANCES, "hip", be)
    a3 = np.stack([_exact_inputs(rng, 9, 14, 33)[0] for _ in range(4)])
    b = _exact_inputs(rng, 9, 14, 33)[1]
    got = mxcore.matmul(a3, b, dtype="mxfp4", backend="hip")
    want = mxcore.matmul(a3, b, dtype="mxfp4", backend="reference")
    np.testing.assert_array_equal(got, want)
    ((_name, launch, _dev, _stream),) = fake.launches
    assert launch.grid[2] == 4 and launch.sbb == 0
