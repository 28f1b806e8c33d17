"""The prebuilt kernels (``backends/cuda/prebuilt.py``, ``default_builds.py``, ``mxcore/prebuilt/``) without a GPU:

* the package data holds every build the default choice uses, keyed on today's sources and options (a kernel or
  rule edit without ``python -m mxcore kernels --prebuild --package`` fails here, naming the command);
* its blobs decompress to cubins of the right arch holding the entries the backend takes (cuobjdump from the wheel);
* the loader's order (package data, then the ``--prebuild`` cache; sm_80 cubins on sm_86), ``MXCORE_PREBUILT=0``,
  damaged blobs, and the loaded kernel as the backend uses a RawKernel (a fake CuPy: calls, attributes, handles);
* ``--prebuild`` into the disk cache (NVRTC from the wheel), the CLI's one-line errors, the first-call benchmark's
  host side (child report parsing, environment, table).

On an NVIDIA GPU, ``test_first_calls_use_only_prebuilt_kernels`` runs fresh processes with empty caches and checks
that no mxcore kernel of the benchmark's cases is compiled.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_tool

from mxcore.backends import nvrtc_tools
from mxcore.backends.cuda import compile as cuda_compile
from mxcore.backends.cuda import default_builds as db
from mxcore.backends.cuda import device, first_call, prebuild, prebuilt
from mxcore.backends.cuda.compile import source

FIX = f"run `{prebuilt.PACKAGE_COMMAND}` and commit mxcore/prebuilt/"


# ----------------------------------------------------------------------------------------------------------------
# the package data against the sources
# ----------------------------------------------------------------------------------------------------------------
def test_every_default_build_is_packaged_for_todays_sources():
    pkg = prebuilt.package()
    assert pkg.manifest.get("format") == 1, f"mxcore/prebuilt/manifest.json is missing or unreadable: {FIX}"
    modules = pkg.modules
    want = {}
    for target in db.TARGETS:
        for b in db.default_builds(target):
            want[prebuilt.build_key(source(b.file), b.options, b.arch)] = b
    stale = []
    for key, b in want.items():
        entry = modules.get(key)
        if entry is None:
            text_sha = hashlib.sha256(source(b.file).encode()).hexdigest()[:16]
            same_file = [m for m in modules.values() if m["file"] == b.file and m["arch"] == b.arch]
            why = ("its source changed" if same_file and all(m["source"] != text_sha for m in same_file)
                   else "a new or changed build (options)")
            stale.append(f"{b.file} for {b.arch} ({', '.join(b.entries)}): {why}")
        elif not set(b.entries) <= set(entry["entries"]):
            stale.append(f"{b.file} for {b.arch}: entries {sorted(set(b.entries) - set(entry['entries']))} not listed")
    assert not stale, f"{len(stale)} default builds have no current prebuilt cubin ({FIX}): " + "; ".join(stale[:8])
    extra = sorted(f"{m['file']} ({m['arch']})" for k, m in modules.items() if k not in want)
    assert not extra, f"the package data holds builds the default choice no longer uses ({FIX}): {extra[:8]}"
    assert len(modules) == len(want) > 100


def test_package_blobs_are_cubins_for_their_arch():
    pkg = prebuilt.package()
    total = 0
    for key, m in pkg.modules.items():
        raw = lzma.decompress((pkg.folder / m["blob"]).read_bytes())
        assert hashlib.sha256(raw).hexdigest() == m["sha256"] and len(raw) == m["size"], m["blob"]
        assert raw[:4] == b"\x7fELF" and prebuild.cubin_sm(raw) == int(m["arch"][3:].rstrip("a")), m["blob"]
        assert pkg.blob(key) == raw and m["blob"] == f"{m['arch']}/{key}.cubin.xz"
        total += (pkg.folder / m["blob"]).stat().st_size
    assert total < 25 * 2**20, f"the prebuilt data is {total / 2**20:.1f} MiB compressed: keep the wheel small"


def _cuobjdump(flag, path):
    res = subprocess.run([nvrtc_tools.cuobjdump_path(), flag, str(path)], capture_output=True, text=True,
                         env=nvrtc_tools._tool_env(), timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _text_sections(elf: bytes) -> set:
    """The kernels' code sections (``.text.<function>``) of an ELF64 cubin, read from its section headers (no tool:
    the symbol listings of cuobjdump differ between CUDA versions)."""
    import struct

    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names_at, names_size = headers[shstrndx][4], headers[shstrndx][5]
    table = elf[names_at:names_at + names_size]
    names = {table[h[0]:table.index(b"\0", h[0])].decode() for h in headers}
    return {n[len(".text."):] for n in names if n.startswith(".text.")}


def test_package_cubins_name_their_arch_and_entries(tmp_path):
    """cuobjdump (the wheel's) reads every cubin and its ELF names the packaged arch (sm_90a for the wgmma
    builds); the cubin holds the code of every entry the backend takes from it."""
    require_tool("cuobjdump (nvidia-cuda-cuobjdump)", nvrtc_tools.cuobjdump_path() is not None)
    pkg = prebuilt.package()
    for key, m in pkg.modules.items():
        path = tmp_path / f"{key}.cubin"
        path.write_bytes(pkg.blob(key))
        assert f".{m['arch']}.cubin" in _cuobjdump("-lelf", path), (m["file"], m["arch"])
        entries = _text_sections(pkg.blob(key))
        assert set(m["entries"]) <= entries, (m["file"], sorted(set(m["entries"]) - entries))
        path.unlink()


# ----------------------------------------------------------------------------------------------------------------
# the enumeration
# ----------------------------------------------------------------------------------------------------------------
def _names(builds):
    return {(b.file, b.arch) for b in builds}


def test_default_builds_follow_the_rules():
    from mxcore.backends.cuda.sm90 import SM90_FILE, choose_sm90
    from mxcore.backends.cuda.variants import Variant, choose_tile, gemm_options

    sm90, sm80 = db.default_builds("sm_90"), db.default_builds("sm_80")
    assert all(b.arch == "sm_80" for b in sm80) and not any("sm90" in b.file for b in sm80)
    assert {b.arch for b in sm90} == {"sm_90", "sm_90a"}
    assert all(b.arch == "sm_90a" for b in sm90 if b.file in (SM90_FILE, "gemm_wonly_wg.cu"))
    for target, builds in (("sm_90", sm90), ("sm_80", sm80)):  # the arch a device's lookup asks for (prebuilt.py)
        assert all(prebuilt.lookup_archs(b.options, target)[0] == b.arch for b in builds)
    # fp16 1024^3 on an H100: too few 128x256 tiles for wgmma, so mma.sync with the tile rule's 64x64 tile
    f16 = db.problem_builds("sm_90", 132, "fp16", (1024, 1024, 1024))
    tile = choose_tile(1024, 1024, 132, "f16")
    assert tile == "64x64"
    assert {b.options for b in f16 if b.file == "gemm.cu"} == {gemm_options(Variant("f16", True, ak, tile))
                                                               for ak in (True, False)}
    # 8192^3 bf16: the wgmma family's default variant, TMA stores for fp32 and 16-bit outputs
    big = db.problem_builds("sm_90", 132, "bf16", (8192, 8192, 8192))
    want = {tuple(choose_sm90("bf16", "bf16", True, bk, tma_store=ob).options()) for bk in (True, False)
            for ob in (4, 2)}
    assert {b.options for b in big if b.file == SM90_FILE} == want
    # fp8 runs only from sm_89: no fp8 GEMM among the sm_80 builds, the converted fp8 variant on sm_90
    assert not any("-DMX_ESIZE=1" in b.options for b in sm80 if b.file == "gemm.cu")
    assert any("-DMX_F8_CVT=1" in b.options for b in sm90 if b.file == "gemm.cu")
    # every build has entries, every problem's builds are in the target's set (one module per build)
    assert all(b.entries for b in sm90 + sm80)
    assert len({b.module for b in sm90}) == len(sm90)
    mods = {b.module for b in sm90}
    for dtype in ("mxfp4", ("bf16", "mxfp4"), "fp8"):
        for shape in db.SHAPES[:3]:
            assert {b.module for b in db.problem_builds("sm_90", 132, dtype, shape)} <= mods


def test_weight_only_and_exact_mx_builds():
    from mxcore.backends.cuda import wonly

    # bf16 x mxfp4 at M = 1 on an H100: the small-M kernel the rules name, packing and the codec for e2m1
    builds = db.problem_builds("sm_90", 132, ("bf16", "mxfp4"), (1, 4096, 4096))
    kind = wonly.choose(wonly.WonlyProblem(1, 4096, 4096, "bf16", "e2m1", "sm_90", 132, True)).variant.kernel
    files = {wonly.KERNELS[kind][0], "wonly_pack.cu", "codec.cu", "gemm_prep.cu"}
    assert files <= {b.file for b in builds}
    pack = {"mx_wonly_pack", "mx_wonly_ranges", "mx_wonly_fence"}
    assert any(b.file == "wonly_pack.cu" and set(b.entries) == pack for b in builds)
    # mxfp4 x mxfp4 8192^3 on sm_90: the exact block-scaled variant and its fold kernels (sm_90a)
    mx = db.problem_builds("sm_90", 132, "mxfp4", (8192, 8192, 8192))
    assert any(b.file == "gemm_sm90_mx.cu" and "mx_lo_fix" in b.entries for b in mx)
    assert any(b.file == "gemm_sm90.cu" and "-DSM90_MX=1" in b.options for b in mx)
    # on sm_80 MX decodes to bf16 (mma.sync)
    mx80 = db.problem_builds("sm_80", 108, "mxfp4", (8192, 8192, 8192))
    assert _names(mx80) == {("gemm_prep.cu", "sm_80"), ("codec.cu", "sm_80"), ("gemm.cu", "sm_80")}


def test_target_for_other_archs():
    assert db.target_for("sm_90a") is db.TARGETS["sm_90"] and db.target_for("sm_80") is db.TARGETS["sm_80"]
    t = db.target_for("sm_89")
    assert t.arch == "sm_89" and len(t.sms) > 1
    assert db.target_for("sm_86", sms=84).sms == (84,)
    # sm_89 has native fp8 mma.sync: its own builds include them
    assert any("-DMX_ESIZE=1" in b.options and "-DMX_F8_CVT=1" not in b.options
               for b in db.default_builds(db.target_for("sm_89", sms=58)) if b.file == "gemm.cu")


# ----------------------------------------------------------------------------------------------------------------
# the mirrored rules against the real plans (built on a fake device: the kernel each plan asks for is recorded)
# ----------------------------------------------------------------------------------------------------------------
class _Buf:
    def __init__(self, shape=(0,), itemsize=4):
        from types import SimpleNamespace as NS

        self.shape, self.size = shape, int(__import__("math").prod(shape))
        self.dtype, self.data = NS(itemsize=itemsize), NS(ptr=1 << 20)


class _PlanCupy:
    float32, uint32 = "float32", "uint32"

    def __init__(self):
        import contextlib
        from types import SimpleNamespace as NS

        self.cuda = NS(Device=lambda i: contextlib.nullcontext())

    def empty(self, shape, dtype=None):
        return _Buf(shape if isinstance(shape, tuple) else (shape,))

    zeros = empty


class _Recorder:
    """A KernelCache that records (file, options) and hands out kernels with attributes."""

    def __init__(self):
        self.asked = []

    def get(self, cp, ordinal, key, filename, name, options, smem=0):
        from types import SimpleNamespace as NS

        self.asked.append((filename, tuple(options), name))
        return NS(attributes={"num_regs": 96, "shared_size_bytes": 0, "max_dynamic_shared_size_bytes": 0},
                  max_dynamic_shared_size_bytes=0, kernel=NS(ptr=1))

    def prep(self, cp, ordinal, name):
        return self.get(cp, ordinal, ("prep", name), "gemm_prep.cu", name, ("-std=c++17",))


def _real_gemm(monkeypatch, arch, sms, elems, majors, shape, out_bytes, mx=False):
    """(file, options) of the GEMM kernel the real plan of ``shape`` binds for staged operands of ``elems``."""
    from types import SimpleNamespace as NS

    from mxcore import dtypes as _dt
    from mxcore.backends.cuda import sm90
    from mxcore.backends.cuda.families import family_for
    from mxcore.backends.cuda.plan import CudaPlan
    from mxcore.backends.cuda.stage import DevOperand, MXFactors
    from mxcore.backends.cuda.variants import native_fp8

    monkeypatch.setattr(sm90, "max_active_clusters", lambda kernel, v: sms // v.cluster)
    monkeypatch.setattr(sm90, "_CLUSTERS", {})
    m, n, k = shape
    rec = _Recorder()
    be = NS(kernels=rec)
    dev = device.DeviceInfo(0, "fake", arch, sms, {})
    fac = MXFactors(None, 4, 4, None, None, folded=object()) if mx else None
    da = DevOperand(_Buf(), k, majors[0], elems[0], 0, 0, mx=fac)  # K = 0: no tensor maps (no driver here)
    db = DevOperand(_Buf(), k, majors[1], elems[1], 0, 0, mx=fac)
    out = _Buf((m, n), out_bytes)
    mdt = _dt.resolve("bf16", arch)
    fam = "wgmma" if mx else family_for(arch, mdt, (1, m, n, k))
    args = (be, _PlanCupy(), dev, NS(ptr=0), da, db, out, m, n, None, "float32", None, None)
    if fam == "wgmma":
        sm90.Sm90Plan(*args)
    else:
        CudaPlan(*args, fp8_convert=not native_fp8(arch))
    return [(f, o) for f, o, name in rec.asked if name in ("mx_gemm", "mx_gemm_sm90")]


#: the enumeration's shapes and a few beyond it (wide weights at small M: the wgmma family's swapped variant)
PROBES = db.SHAPES + ((64, 32768, 4096), (16, 65536, 2048), (200, 3000, 512), (1, 57344, 8192))


@pytest.mark.parametrize("arch, sms", [("sm_90", 132), ("sm_90", 114), ("sm_80", 108), ("sm_80", 72)])
def test_mirrored_gemm_choices_match_the_plans(monkeypatch, arch, sms):
    """default_builds asks variants.choose / sm90.choose as CudaPlan._bind and Sm90Plan._bind do: over the probe
    shapes, staged elements and majorness the real plans bind exactly the enumerated builds."""
    from mxcore import dtypes as _dt

    staged = [(("f16", "f16"), db._SIXTEEN), (("bf16", "bf16"), db._SIXTEEN), (("tf32", "tf32"), db._SIXTEEN[:1])]
    if arch == "sm_90":
        staged += [(("e4m3", "e5m2"), db._SIXTEEN[:1]), (("e5m2", "e5m2"), db._SIXTEEN[:1])]
    mdt = _dt.resolve("bf16", arch)
    for elems, majors in staged:
        for shape in PROBES:
            mirrored = {(b.file, b.options) for b in db._gemm(arch, sms, mdt, elems, majors, shape)}
            real = {r for mj in majors for ob in db._OUT_BYTES
                    for r in _real_gemm(monkeypatch, arch, sms, elems, mj, shape, ob)}
            assert mirrored == real, (arch, sms, elems, shape)
    if arch == "sm_90":  # the exact MX variant (folded operands, K-major fp8 elements)
        for elems in (("e4m3", "e4m3"), ("e4m3", "e5m2")):
            for ob in db._OUT_BYTES:
                b = db._wgmma(elems[0], elems[1], True, True, 4096, ob, mx=True)
                assert [(b.file, b.options)] == _real_gemm(monkeypatch, arch, sms, elems, (True, True),
                                                           (4096, 4096, 4096), ob, mx=True)


@pytest.mark.parametrize("arch", ["sm_90", "sm_89"])
def test_mma_sync_launches_pass_the_fp8_pair_last(arch):
    """CudaPlan packs mx_gemm's last argument, f8_pair, in every launch it makes (the plain launch, the split-K
    launch of Relaunch and the loop diagnostics' _args): the fp8 formats on sm_90's converted build (one build for
    every pair), 0 natively (sm_89)."""
    from types import SimpleNamespace as NS

    from mxcore.backends.cuda.plan import CudaPlan
    from mxcore.backends.cuda.stage import DevOperand

    dev = device.DeviceInfo(0, "fake", arch, 132, {})
    for shape, split in (((4096, 4096, 4096), False), ((16, 8192, 8192), True)):
        m, n, k = shape
        builds = set()
        for code, (ea, eb) in enumerate((("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e5m2"))):
            rec = _Recorder()
            da, db_ = DevOperand(_Buf(), k, True, ea, 0, k), DevOperand(_Buf(), k, True, eb, 0, k)
            p = CudaPlan(NS(kernels=rec), _PlanCupy(), dev, NS(ptr=0), da, db_, _Buf((m, n)), m, n, None, "float32",
                         None, None, fp8_convert=arch == "sm_90")
            builds |= {o for f, o, name in rec.asked if name == "mx_gemm"}
            want = code if arch == "sm_90" else 0
            assert (p._splits > 1) == split
            main = p.launcher().main
            assert len(main.vals) == 20 and main.vals[-1].value == want, (shape, ea, eb)
            assert p._args(None, n, p._scale, 0, 0, 0)[-1] == want
        assert len(builds) == (1 if arch == "sm_90" else 4), builds


class _Stream:
    """A stand-in for the plan's CuPy stream: its handle, and the context that makes it current (no-op)."""

    ptr = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("arch, sms", [("sm_90", 132), ("sm_90", 114), ("sm_80", 108)])
def test_mirrored_weight_only_choices_match_the_plan(arch, sms):
    """default_builds._wonly asks wonly.choose as WonlyPlan.__init__ does: the real plan binds that build for every
    probe shape, activation type, element and weight whose scales fold or not."""
    from types import SimpleNamespace as NS

    from mxcore import dtypes as _dt
    from mxcore.backends.cuda.stage import DevOperand
    from mxcore.backends.cuda.wonly.plan import WonlyPlan

    dev = device.DeviceInfo(0, "fake", arch, sms, {})
    for element in dict.fromkeys(_dt.MX_ELEMENT.values()):
        for act in ("f16", "bf16"):
            for folds in (False, True):
                for m, n, k in PROBES:
                    rec = _Recorder()
                    da = DevOperand(_Buf(), k, True, act, 0, k)
                    dw = DevOperand(_Buf(), n, True, element, 0, k, span=(127, 127) if folds else (0, 255))
                    WonlyPlan(NS(kernels=rec), _PlanCupy(), dev, _Stream(), da, dw, _Buf((0, n)), m, n, "float32",
                              None, None)  # an empty output: no launch is packed
                    b = db._wonly(arch, sms, act, element, m, n, k, folds)
                    real = {(f, o) for f, o, _ in rec.asked}
                    assert real == {(b.file, b.options)}, (arch, element, act, folds, (m, n, k))
                    assert {name for *_, name in rec.asked} == set(b.entries)


# ----------------------------------------------------------------------------------------------------------------
# the loader, with a fake CuPy
# ----------------------------------------------------------------------------------------------------------------
class _Fn:
    def __init__(self, module, name):
        if name not in module.names:
            raise RuntimeError(f"CUDA_ERROR_NOT_FOUND: {name}")
        self.module, self.name, self.ptr = module, name, 1000 + len(module.log)
        module.log.append(("get", name))

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        assert isinstance(grid, tuple) and isinstance(block, tuple)
        self.module.log.append(("call", self.name, grid, block, tuple(args), shared_mem))


class _Module:
    refuse = False

    def __init__(self):
        self.log, self.names = [], set()

    def load(self, cubin):
        if _Module.refuse:
            raise RuntimeError("CUDA_ERROR_INVALID_IMAGE")
        assert cubin[:4] == b"\x7fELF"
        self.names = {"mx_prep_float", "mx_splitk_reduce", "mx_gemm"}
        self.log.append(("load", len(cubin)))

    def get_function(self, name):
        return _Fn(self, name)


class _Driver:
    def __init__(self):
        self.attrs = {}

    def funcGetAttribute(self, attr, ptr):
        return self.attrs.get((ptr, attr), 7)

    def funcSetAttribute(self, ptr, attr, value):
        self.attrs[(ptr, attr)] = value


class _RawKernel:
    made = []

    def __init__(self, code, name, options=()):
        self.code, self.name, self.options = code, name, options
        _RawKernel.made.append(name)


class FakeCupy:
    """What the loader and KernelCache touch of CuPy on device 0 of ``arch``."""

    def __init__(self, arch="sm_90"):
        major, minor = int(arch[3:-1]), int(arch[-1])
        from types import SimpleNamespace as NS

        self.driver = _Driver()
        self.cuda = NS(runtime=NS(getDevice=lambda: 0, getDeviceProperties=lambda i: {
            "name": b"Fake GPU", "major": major, "minor": minor, "multiProcessorCount": 132}),
            function=NS(Module=_Module), driver=self.driver)
        self.RawKernel = _RawKernel


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty user cache, device properties asked again, no modules loaded before, events from here on."""
    monkeypatch.setenv("MXCORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(prebuilt.ENV, raising=False)
    monkeypatch.setattr(device, "_INFO", {})
    monkeypatch.setattr(prebuilt, "_LOADED", {})
    monkeypatch.setattr(prebuilt, "EVENTS", [])
    monkeypatch.setattr(_Module, "refuse", False)
    _RawKernel.made.clear()
    return tmp_path


def _packaged(file, options, arch="sm_90"):
    key = prebuilt.build_key(source(file), options, arch)
    return key if key in prebuilt.package().modules else None


def test_kernel_cache_loads_packaged_cubins_as_raw_kernels(fresh):
    from mxcore.backends.cuda.compile import PREP_FILE, KernelCache

    assert _packaged(PREP_FILE, ("-std=c++17",))
    cp = FakeCupy("sm_90")
    kc = KernelCache()
    k = kc.prep(cp, 0, "mx_prep_float")
    assert isinstance(k, prebuilt.LoadedKernel) and k.origin == "package" and _RawKernel.made == []
    assert kc.prep(cp, 0, "mx_prep_float") is k  # the handle cache
    k((2, 3), (32, 8), (1, 2), shared_mem=64)
    fn = getattr(k, "kernel", k)  # how driver.RawLaunch and sm90 take the CUfunction
    assert fn.ptr == k.kernel.ptr and ("call", "mx_prep_float", (2, 3), (32, 8), (1, 2), 64) in fn.module.log
    k.max_dynamic_shared_size_bytes = 100_000
    assert cp.driver.attrs[(fn.ptr, 8)] == 100_000 and k.max_dynamic_shared_size_bytes == 100_000
    attrs = k.attributes
    assert attrs["num_regs"] == 7 and attrs["max_dynamic_shared_size_bytes"] == 100_000 and len(attrs) == 10
    # a second entry of the same module shares the loaded image
    r = kc.prep(cp, 0, "mx_splitk_reduce")
    assert r._module is k._module and sum(1 for e in fn.module.log if e[0] == "load") == 1
    assert prebuilt.EVENTS == [("package", PREP_FILE, "mx_prep_float", "sm_90"),
                               ("package", PREP_FILE, "mx_splitk_reduce", "sm_90")]


def test_kernel_cache_compiles_what_is_not_prebuilt(fresh, monkeypatch):
    from mxcore.backends.cuda.compile import PREP_FILE

    cp = FakeCupy("sm_90")
    k = cuda_compile.kernel(cp, 0, PREP_FILE, "mx_prep_float", ("-std=c++17", "-DUNPACKAGED=1"))
    assert isinstance(k, _RawKernel) and k.options == ("-default-device", "-std=c++17", "-DUNPACKAGED=1")
    assert prebuilt.EVENTS == [("compiled", PREP_FILE, "mx_prep_float", "sm_90")]
    monkeypatch.setenv(prebuilt.ENV, "0")  # off: packaged builds compile too
    k = cuda_compile.kernel(cp, 0, PREP_FILE, "mx_prep_float", ("-std=c++17",))
    assert isinstance(k, _RawKernel)
    monkeypatch.setenv(prebuilt.ENV, "1")
    _Module.refuse = True  # a driver that refuses the image: compiled
    assert isinstance(cuda_compile.kernel(cp, 0, PREP_FILE, "mx_prep_float", ("-std=c++17",)), _RawKernel)
    _Module.refuse = False
    assert isinstance(cuda_compile.kernel(cp, 0, PREP_FILE, "mx_prep_float", ("-std=c++17",)), prebuilt.LoadedKernel)


def test_lookup_order_and_archs(fresh, monkeypatch):
    """sm_86 takes a cubin of its own from the cache first, then the package's sm_80 one; a forced sm_90a build
    is looked up for sm_90a only; a damaged package blob is never returned."""
    from mxcore.backends.cuda.compile import PREP_FILE

    opts = ("-std=c++17",)
    text = source(PREP_FILE)
    pkg_cubin = prebuilt.package().blob(_packaged(PREP_FILE, opts, "sm_80"))
    assert prebuilt.find(text, opts, "sm_86") == (pkg_cubin, "package")
    own = b"\x7fELF" + b"sm_86 cubin"
    prebuilt._USER.put(prebuilt.build_key(text, opts, "sm_86"), own)
    assert prebuilt.find(text, opts, "sm_86") == (own, "cache")
    assert prebuilt.find(text, opts, "sm_120") is None and prebuilt.find(text, opts, "sm_75") is None
    assert prebuilt.lookup_archs(("--gpu-architecture=sm_90a", "-std=c++17"), "sm_90") == ["sm_90a"]
    monkeypatch.setenv(prebuilt.ENV, "off")
    assert prebuilt.find(text, opts, "sm_86") is None
    monkeypatch.setenv(prebuilt.ENV, "1")
    # a package whose blob was damaged: its sha256 no longer matches
    pkg = prebuilt.package()
    key = _packaged(PREP_FILE, opts, "sm_80")
    folder = fresh / "pkg"
    (folder / "sm_80").mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps(pkg.manifest))
    (folder / pkg.modules[key]["blob"]).write_bytes(lzma.compress(pkg_cubin[:-1] + bytes([pkg_cubin[-1] ^ 1])))
    damaged = prebuilt._package_at(str(folder))
    assert damaged.blob(key) is None and pkg.blob(key) == pkg_cubin


def test_codec_modules_come_from_the_package(fresh):
    from mxcore import formats
    from mxcore.backends import codec_runtime

    src, opts = codec_runtime.compile_inputs(formats.get("e2m1"), "nvidia")
    assert _packaged("codec.cu", opts)
    cp = FakeCupy("sm_90")
    mod = codec_runtime._prebuilt(cp, 0, src, opts)
    assert isinstance(mod, prebuilt.LoadedModule) and mod.origin == "package"
    assert prebuilt.EVENTS == [("package", "codec.cu", "*", "sm_90")]


# ----------------------------------------------------------------------------------------------------------------
# --prebuild and the CLI
# ----------------------------------------------------------------------------------------------------------------
def test_prebuild_fills_the_disk_cache(fresh, monkeypatch):
    """A build the package lacks is compiled for the named arch into the cache (and found there); one whose sm_80
    cubin the package holds counts as present on sm_86; a second run compiles nothing."""
    require_tool("NVRTC (cuda-bindings + nvidia-cuda-nvrtc)", nvrtc_tools.have_nvrtc())
    from mxcore.backends.cuda.wonly.records import PACK_FILE, formula_options

    packaged = db.Build(PACK_FILE, ("-std=c++17", *formula_options()), "sm_86", ("mx_wonly_pack", "mx_wonly_fence"))
    assert _packaged(PACK_FILE, packaged.options, "sm_80")
    new = db.Build(PACK_FILE, (*packaged.options, "-DMXCORE_PREBUILD_TEST=1"), "sm_86", ("mx_wonly_pack",))
    monkeypatch.setattr(db, "default_builds", lambda target: (packaged, new) if target.arch == "sm_86" else ())
    s = prebuild.prebuild("sm_86", sms=84, jobs=1)
    assert (s["builds"], s["compiled"], s["present"]) == (2, 1, 1) and s["bytes"] > 1000, s
    cubin, where = prebuilt.find(source(PACK_FILE), new.options, "sm_86")
    assert where == "cache" and prebuild.cubin_sm(cubin) == 86
    assert prebuilt.find(source(PACK_FILE), packaged.options, "sm_86")[1] == "package"
    again = prebuild.prebuild("sm_86", sms=84, jobs=1)
    assert again["compiled"] == 0 and again["present"] == 2


def _cli(*args):
    res = subprocess.run([sys.executable, "-m", "mxcore", *args], capture_output=True, text=True, timeout=300)
    return res.returncode, res.stdout, res.stderr.strip().splitlines()


@pytest.mark.parametrize("args, says", [
    (("kernels", "--prebuild", "--arch", "sm_75"), "sm_80 or newer"),
    (("kernels", "--prebuild", "--package", "--arch", "sm_80"), "leave out --arch"),
    (("kernels", "--prebuild", "--jobs", "-2"), "--jobs -2"),
    (("bench", "--first-call", "--cases", "fp16,nope"), "no first-call case 'nope'"),
])
def test_cli_errors_are_one_line(args, says):
    rc, _, err = _cli(*args)
    assert rc == 2 and len(err) == 1 and says in err[0] and "Traceback" not in err[0], err


def test_cli_without_a_gpu_says_what_to_do():
    from mxcore.backends.cuda.backend import CudaBackend

    if CudaBackend().is_available() is None:
        pytest.skip("this machine has a GPU: the commands run (test_first_calls_use_only_prebuilt_kernels)")
    rc, _, err = _cli("bench", "--first-call", "--cases", "fp16")
    assert rc == 2 and len(err) == 1 and "NVIDIA GPU" in err[0] and "run it on a machine with one" in err[0], err
    rc, _, err = _cli("kernels", "--prebuild")
    assert rc == 2 and len(err) == 1 and "pass --arch sm_90a or --arch sm_80" in err[0], err


# ----------------------------------------------------------------------------------------------------------------
# the first-call benchmark's host side
# ----------------------------------------------------------------------------------------------------------------
def test_first_call_child_environment(tmp_path):
    import mxcore

    env = first_call.child_env(tmp_path, prebuilt=False, base={"PYTHONPATH": "/x", "MXCORE_BACKEND": "reference"})
    assert env["MXCORE_CACHE_DIR"] == str(tmp_path / "mxcore") and env["CUPY_CACHE_DIR"] == str(tmp_path / "cupy")
    assert env["MXCORE_PREBUILT"] == "0" and "MXCORE_BACKEND" not in env
    root = env["PYTHONPATH"].split(":")[0]
    assert env["PYTHONPATH"].endswith(":/x") and (mxcore.__file__).startswith(root)
    assert first_call.child_env(tmp_path, prebuilt=True, base={})["MXCORE_PREBUILT"] == "1"
    compile(first_call.child_code(), "<child>", "exec")  # the child's program is valid Python


def test_first_call_child_without_cupy_reports_an_error(tmp_path):
    """The child program itself, run here: without CuPy (or a GPU) it reports a one-line error, which the table
    shows."""
    import importlib.util

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed: the child runs (test_first_calls_use_only_prebuilt_kernels)")
    case = first_call.CASES["fp16"]
    arg = json.dumps({"label": case.label, "dtype": case.dtype, "shape": list(case.shape)})
    res = subprocess.run([sys.executable, "-c", first_call.child_code(), arg], capture_output=True, text=True,
                         env=first_call.child_env(tmp_path, True), timeout=120)
    report = first_call.parse_child(res.stdout, res.stderr, res.returncode)
    assert report["case"] == "fp16" and report["error"].startswith("ModuleNotFoundError")
    table = first_call.render([{"label": "fp16", "shape": case.shape_text, "prebuilt": report}])
    assert "fp16" in table and "failed: ModuleNotFoundError" in table


def test_first_call_table_and_parsing(tmp_path):
    assert "status 3" in first_call.parse_child("noise\n", "Traceback\nKeyError: 'x'", 3)["error"]
    assert "KeyError" in first_call.parse_child("", "Traceback\nKeyError: 'x'", 3)["error"]
    pre = {"case": "mxfp4", "import_s": 0.2, "call_s": 0.5, "first_s": 0.7, "second_s": 0.0004, "cupy_compiles": 2,
           "device": "NVIDIA H200 (sm_90, 132 SMs)", "prebuilt_on": True,
           "kernels": [["package", "codec.cu", "*", "sm_90"], ["package", "gemm_sm90.cu", "mx_gemm_sm90", "sm_90"],
                       ["compiled", "gemm_prep.cu", "mx_prep_codes", "sm_90"]]}
    line = "MXCORE-FIRST-CALL " + json.dumps(pre)
    assert first_call.parse_child("x\n" + line + "\n") == pre
    comp = dict(pre, first_s=7.6, kernels=[], prebuilt_on=False)
    rows = [{"label": "mxfp4", "shape": "1024x1024x1024", "prebuilt": pre, "compiled": comp},
            {"label": "fp16", "shape": "1024x1024x1024", "prebuilt": {"error": "no result within 600 s"}}]
    table = first_call.render(rows)
    row = next(ln for ln in table.splitlines() if ln.startswith("mxfp4"))
    assert row.split()[2:5] == ["0.70", "7.60", "0.40"] and "2/0/1" in row and row.split()[-1] == "2"
    assert "NVIDIA H200 (sm_90, 132 SMs)" in table.splitlines()[0]
    assert "mxfp4: gemm_prep.cu mx_prep_codes (sm_90)" in table and "fp16" in table and "no result" in table
    assert first_call.origins(pre) == {"package": 2, "cache": 0, "compiled": 1}
    res = first_call.results_file(rows, "python -m mxcore bench --first-call")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import render
    finally:
        sys.path.pop(0)
    assert res["gpu"] == "H200" and res["rows"][0] == {
        "dtype": "mxfp4", "shape": "1024x1024x1024", "prebuilt_s": 0.7, "compiled_s": 7.6, "import_s": 0.2,
        "second_ms": 0.4, "kernels": "2/0/1", "nvrtc": 2}
    assert res["rows"][1]["prebuilt_s"] is None and res["reports"] == rows
    (tmp_path / "first-call-h200.json").write_text(json.dumps(res))  # render.py takes it as a results file
    text = render.render(render.load(tmp_path))
    assert "## First call" in text and "| mxfp4 | 1024x1024x1024 | 0.7 | 7.6 | 0.2 | 0.4 | 2/0/1 | 2 |" in text
    assert set(first_call.CASES) == {"fp16", "bf16", "tf32", "fp8", "mxfp8", "mxfp4", "bf16-mxfp4"}


@pytest.mark.nvidia_gpu
@pytest.mark.slow
@pytest.mark.parametrize("case", list(first_call.CASES))
def test_first_calls_use_only_prebuilt_kernels(case):
    """On sm_90 / sm_80-class GPUs: a fresh process with empty caches compiles no mxcore kernel for the
    benchmark's cases (all come from the package data) and gets its result."""
    from mxcore.backends.cuda.backend import CudaBackend

    arch = CudaBackend().target().arch
    if not (arch == "sm_90" or arch.startswith("sm_8")):
        pytest.skip(f"the package data serves sm_90 and sm_80-class GPUs, not {arch}")
    if case == "fp8" and arch != "sm_90":
        pytest.skip(f"fp8 runs from sm_89, and the package's fp8 kernels are sm_90's, not {arch}'s")
    report = first_call.run_case(first_call.CASES[case], prebuilt=True, timeout=300)
    assert "error" not in report, report
    compiled = [k for k in report["kernels"] if k[0] == "compiled"]
    assert report["kernels"] and not compiled, compiled
