"""CI compile checks of the device codecs (``kernels_cuda/mx_codec.cuh``), no GPU needed.

The one source is compiled exactly as it is launched (``backends.codec.compile_inputs``): by NVRTC to cubins
for sm_80 / sm_89 / sm_90 and by clang-22 to code objects for gfx942 / gfx950 (the fp8 module on each arch,
fp4 and the packing-only module on one arch per vendor: every kernel on every arch).  Checked:
every ``extern "C"`` entry point exists, no local memory / scratch / spills, and the instructions the design
relies on: 128-bit vector loads and stores in both MX quantizers (LDG.E.128 / STG.E.128, global_load_dwordx4),
the lane-pair exchange of the fast one (SHFL.BFLY / DPP quad_perm), its SASS instruction budget per element,
count-leading-zeros for the exponent (FLO / v_ffbh), shared-memory atomics for the per-CTA maxima (ATOMS /
ds_max), and no floating-point conversion instruction in the encoders (rounding is integer arithmetic; the
fast MX quantizer rounds by one float add, with float32 subnormals kept).
Under CI=true a missing toolchain fails instead of skipping.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import mx_special_rows, require_tool

from mxcore import formats as F
from mxcore.backends import codec, nvrtc_tools

try:
    from mxcore.backends import hip_tools
except ImportError:  # the HIP backend's tools may move inside its package
    from mxcore.backends.hip import hip_tools  # type: ignore[no-redef]

NV_ARCHS = ("sm_80", "sm_89", "sm_90")
AMD_ARCHS = ("gfx942", "gfx950")
# Every kernel is in every format's module (the format only changes constants), so each arch compiles the
# module of its fp8 format, plus fp4 (the 4-bit, no-NaN case) and the packing-only module on one arch each;
# gfx942 also compiles e4m3fn, the MX element format (its fast MX quantizer's float path).
# The other formats' modules are compiled and run, bit-compared, by tests/test_device_codec.py on a GPU.
_JOBS = ([("nvidia", arch, "e4m3fn") for arch in NV_ARCHS] + [("nvidia", "sm_90", "e2m1"), ("nvidia", "sm_90", None)]
         + [("amd", "gfx942", "e4m3fnuz"), ("amd", "gfx942", "e4m3fn"), ("amd", "gfx950", "e4m3fn"),
            ("amd", "gfx950", "e2m1"),
            ("amd", "gfx950", None)])


def _jobs():
    return list(_JOBS)


def _compile(job):
    vendor, arch, name = job
    spec = F.get(name) if name else None
    src, opts = codec.compile_inputs(spec, vendor)
    label = f"codec_{name or 'pack'}"
    if vendor == "nvidia":
        return nvrtc_tools.compile_cuda(src, name=label, arch=arch, options=opts)
    return hip_tools.compile_hip(src, name=label, arch=arch, options=opts)


@pytest.fixture(scope="module")
def binaries():
    nv = nvrtc_tools.have_nvrtc() is None and nvrtc_tools.have_cuobjdump() is None
    amd = hip_tools.have_clang() is None
    jobs = [j for j in _jobs() if (nv if j[0] == "nvidia" else amd)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(jobs, pool.map(_compile, jobs)))


def _need(vendor):
    if vendor == "nvidia":
        require_tool("NVRTC (cuda-bindings + nvidia-cuda-nvrtc)", nvrtc_tools.have_nvrtc())
        require_tool("cuobjdump + nvdisasm", nvrtc_tools.have_cuobjdump())
    else:
        require_tool("clang-22", hip_tools.have_clang())


def _sass_of(sass: str, kernel: str) -> str:
    """The SASS text of one function from cuobjdump output."""
    parts = re.split(r"\n\s*Function : ", sass)
    for p in parts[1:]:
        if p.split()[0] == kernel:
            return p
    raise AssertionError(f"{kernel} not in the SASS")


def _amd_of(disasm: str, kernel: str) -> str:
    m = re.search(rf"^[0-9a-f]+ <{kernel}>:\n(.*?)(?=^[0-9a-f]+ <|\Z)", disasm, re.S | re.M)
    assert m, f"{kernel} not in the disassembly"
    return m.group(1)


@pytest.mark.parametrize("job", [j for j in _jobs() if j[0] == "nvidia"], ids=lambda j: f"{j[1]}-{j[2] or 'pack'}")
def test_nvrtc_codec_module(binaries, job):
    _need("nvidia")
    b = binaries[job]
    want = codec.entry_points(job[2] is not None)
    # out-of-line device functions (C++-mangled: the fast quantizer's rare tiny-block path) are not entry points
    assert sorted(k for k in b.resources if not k.startswith("_Z")) == sorted(want)
    for kernel, res in b.resources.items():
        assert res["local_bytes"] == 0 and res["spill_stores"] == 0 and res["spill_loads"] == 0, (kernel, res)
    counts = nvrtc_tools.sass_counts(b.sass)
    assert counts["LDL"] == 0 and counts["STL"] == 0
    if job[2] is None:
        return
    for suf in ("f32", "f16", "bf16", "f64"):
        q = _sass_of(b.sass, f"mx_quantize_mx_{suf}")
        assert "LDG.E.128" in q and "STG.E.128" in q, f"mx_quantize_mx_{suf}: no 128-bit vector load/store"
        assert "ATOMS" in q, "per-CTA scale maximum is a shared-memory atomic"
        enc = _sass_of(b.sass, f"mx_encode_{suf}")
        assert "FLO" in enc, "the exponent comes from a count-leading-zeros"
        assert not re.search(r"\b(F2F|F2I|I2F)\b", enc), "encoding is integer arithmetic: no float conversion"
    assert "ATOMS" in _sass_of(b.sass, "mx_amax_bf16")
    for suf in codec.FAST_SUFFIXES:
        q = _sass_of(b.sass, f"mx_quantize_mx_fast_{suf}")
        assert "LDG.E.128" in q and "STG.E.128" in q, f"mx_quantize_mx_fast_{suf}: no 128-bit vector load/store"
        assert "SHFL.BFLY" in q, "the two lanes of a block exchange their half maxima by a shuffle"
        # one float rounding per element (float16 -> float32 is HADD2.F32, exact), no flush to zero
        assert not re.search(r"\b(F2F|F2I|I2F)\b|\.FTZ\b", q), "one float rounding per element, subnormals kept"
        per_element = _loop_instructions(q) / 16  # a lane encodes 16 elements per turn
        assert per_element <= _SASS_PER_ELEMENT, (suf, per_element)


# The fast MX quantizer's instruction budget.  bf16 -> MX moves 2 + 1 + 1/32 bytes per element; 70 % of an H200's
# ~3.8 TB/s is ~8.8e11 elements/s, against 132 SMs x 4 schedulers x ~1.98 GHz x 32 lanes = 3.3e13 thread
# instructions/s: ~38 SASS instructions per element at full issue, ~19 on the half-rate integer pipe.  The
# loop turn (static span, rarely taken branches included) must stay within 21 per element on every arch (sm_90:
# 16-17; the executed path ~14, against ~56 for the one-thread-per-block kernel).
_SASS_PER_ELEMENT = 21


def _loop_instructions(sass_fn: str) -> int:
    """Instructions in the longest backward branch's span (the kernel's main loop) of one function's SASS."""
    best = 0
    for line in sass_fn.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/.*\bBRA (0x[0-9a-f]+)", line)
        if m and int(m.group(2), 16) < int(m.group(1), 16):
            best = max(best, (int(m.group(1), 16) - int(m.group(2), 16)) // 16 + 1)
    assert best, "no loop in the fast MX quantizer"
    return best


@pytest.mark.parametrize("job", [j for j in _jobs() if j[0] == "amd"], ids=lambda j: f"{j[1]}-{j[2] or 'pack'}")
def test_clang_codec_module(binaries, job):
    _need("amd")
    b = binaries[job]
    res = b.resources
    want = codec.entry_points(job[2] is not None)
    assert sorted(res) == sorted(want)
    for kernel, r in res.items():
        assert r["scratch_bytes"] == 0 and r["vgpr_spill"] == 0 and r["sgpr_spill"] == 0, (kernel, r)
    if job[2] is None:
        return
    for suf in ("f32", "f16", "bf16", "f64"):
        q = _amd_of(b.disasm, f"mx_quantize_mx_{suf}")
        assert "global_load_dwordx4" in q and "global_store_dwordx4" in q, f"mx_quantize_mx_{suf}: no 16-byte access"
        assert re.search(r"\bds_max_(rtn_)?u32\b", q), "per-CTA scale maximum is an LDS atomic"
        enc = _amd_of(b.disasm, f"mx_encode_{suf}")
        assert re.search(r"\bv_ffbh_u32|\bs_flbit_i32", enc), "the exponent comes from a count-leading-zeros"
        assert not re.search(r"\bv_cvt_f(16|32|64)_f(16|32|64)", enc), "encoding is integer arithmetic"
    for suf in codec.FAST_SUFFIXES:
        q = _amd_of(b.disasm, f"mx_quantize_mx_fast_{suf}")
        assert "global_load_dwordx4" in q and "global_store_dwordx4" in q, f"mx_quantize_mx_fast_{suf}: no 16-byte access"
        assert "quad_perm:[1,0,3,2]" in q, "the two lanes of a block exchange their half maxima by DPP"
        # one float rounding per element: the only conversion is float16 -> float32 (exact, subnormals included)
        assert not re.search(r"\bv_cvt_(?!f32_f16(_e32|_e64)?\b)", q), "no rounding conversion instruction"


def test_one_source_for_both_vendors():
    """The HIP compile unit inlines the very header NVRTC compiles; vendor intrinsics only inside the shim."""
    nv, _ = codec.compile_inputs(F.get("e4m3fn"), "nvidia")
    amd, _ = codec.compile_inputs(F.get("e4m3fn"), "amd")
    from mxcore import kernel_source

    header = kernel_source("nvidia", "mx_codec.cuh")
    assert header in nv and header in amd
    shim_end = header.index("// ---- input formats")
    body = header[shim_end:]
    for vendor_only in ("__clz", "atomicMax", "atomicAdd", "__hip_atomic", "__builtin_amdgcn", "asm(", "__shfl"):
        assert vendor_only not in body, vendor_only


@pytest.mark.parametrize("name", F.names())
def test_format_defines_come_from_the_spec(name):
    """Each -D define is the FormatSpec's own value (the kernel restates no format)."""
    spec = F.get(name)
    d = dict(opt[2:].split("=", 1) for opt in codec.format_defines(spec))
    num = lambda k: int(d[k].rstrip("ul"))  # noqa: E731
    assert (num("MXF_BITS"), num("MXF_EBITS"), num("MXF_MBITS"), num("MXF_BIAS")) == (spec.bits, spec.ebits, spec.mbits,
                                                                                      spec.bias)
    assert (num("MXF_EMIN"), num("MXF_EMAX"), num("MXF_MAX_MAGCODE")) == (spec.emin, spec.emax, spec.max_magcode)
    assert num("MXF_NAN_CODE") == (spec.nan_code or 0) and bool(num("MXF_HAS_INF")) == spec.has_inf
    # the max normal the kernel reconstructs is the spec's
    assert num("MXF_MAXSIG") * 2.0 ** (spec.emax - spec.mbits) == spec.max_normal
    assert d["MXF_CODE_T"] == {1: "mxc_u8", 2: "mxc_u16", 4: "mxc_u32"}[spec.code_dtype.itemsize]


# ---- the kernels' arithmetic on the CPU -------------------------------------------------------------------------
# The same header, built as plain C++ (MXC_HOST) with clang-22 and run one thread at a time through ctypes, must
# give the numpy path's codes bit for bit: a CI check of the device algorithm without a GPU.
_HARNESS = r"""
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
#define MXC_HOST 1
struct mxc_dim3 { unsigned x, y, z; };
static mxc_dim3 threadIdx, blockIdx;
static inline void __syncthreads() {}
HEADER
#define RUN(total, CALL) for (long long g_ = 0; g_ < (long long)(total); ++g_) { \
    blockIdx.x = (unsigned)(g_ / MXC_THREADS); threadIdx.x = (unsigned)(g_ % MXC_THREADS); CALL; }
#define PER_INPUT(SUF, B) \
    extern "C" void host_encode_##SUF(const B* x, mxc_code_t* o, mxc_i64 n, int rtz, int ovf, mxc_u32* c) { \
        RUN(n, mx_encode_##SUF(x, o, n, rtz, ovf, c)) } \
    extern "C" void host_quantize_mx_##SUF(const B* x, mxc_u8* c, mxc_u8* s, mxc_u32* m, mxc_i64 outer, mxc_i64 K, \
                                           mxc_i64 inner, int block, int rceil) { \
        RUN(outer * ((K + block - 1) / block) * inner, mx_quantize_mx_##SUF(x, c, s, m, outer, K, inner, block, rceil)) } \
    extern "C" void host_quantize_tensor_##SUF(const B* x, mxc_u8* c, mxc_i64 n, mxc_u64* amax, int* k, float* sc, \
                                               mxc_u32* cnt) { \
        RUN(n, mx_amax_##SUF(x, n, n, amax)) RUN(n > 0 ? n : 1, mx_quantize_tensor_##SUF(x, c, n, amax, k, sc, cnt)) }
PER_INPUT(f32, mxc_u32)
PER_INPUT(f16, mxc_u16)
PER_INPUT(bf16, mxc_u16)
PER_INPUT(f64, mxc_u64)
// flush != 0: run with the x86 MXCSR's flush-to-zero and denormals-are-zero bits set (float32 subnormal inputs
// and results read as 0, like a GPU's .FTZ arithmetic), restored afterwards
#if defined(__x86_64__)
static inline unsigned host_csr() { unsigned v; __asm__ volatile("stmxcsr %0" : "=m"(v)); return v; }
static inline void host_set_csr(unsigned v) { __asm__ volatile("ldmxcsr %0" : : "m"(v)); }
extern "C" int host_can_flush() { return 1; }
#else
static inline unsigned host_csr() { return 0u; }
static inline void host_set_csr(unsigned) {}
extern "C" int host_can_flush() { return 0; }
#endif
#define FAST(SUF, B) \
    extern "C" void host_quantize_mx_fast_##SUF(const B* x, mxc_u8* c, mxc_u8* s, mxc_u32* m, mxc_i64 halves, \
                                                mxc_i64 ctas, int rceil, int flush) { \
        const unsigned csr = host_csr(); if (flush) host_set_csr(csr | 0x8040u); \
        RUN(ctas * MXC_THREADS, mx_quantize_mx_fast_##SUF(x, c, s, m, halves, ctas * MXC_THREADS, rceil)) \
        host_set_csr(csr); }
#define FAST_TENSOR(SUF, B) \
    extern "C" void host_quantize_tensor_fast_##SUF(const B* x, mxc_u8* c, mxc_i64 n, mxc_u64* amax, int* k, \
                                                    float* sc, mxc_u32* cnt, mxc_i64 ctas, int flush) { \
        const unsigned csr = host_csr(); if (flush) host_set_csr(csr | 0x8040u); \
        RUN(ctas * MXC_THREADS, mx_amax_fast_##SUF(x, n / 16, ctas * MXC_THREADS, amax)) \
        RUN(ctas * MXC_THREADS, mx_quantize_tensor_fast_##SUF(x, c, n / 16, ctas * MXC_THREADS, amax, k, sc, cnt)) \
        host_set_csr(csr); }
#define SMALL_TENSOR(SUF, B) \
    extern "C" void host_quantize_tensor_small_##SUF(const B* x, mxc_u8* c, mxc_i64 n, int* k, float* sc, \
                                                     mxc_u32* cnt, int flush) { \
        const unsigned csr = host_csr(); if (flush) host_set_csr(csr | 0x8040u); \
        RUN(MXC_THREADS, mx_quantize_tensor_small_##SUF(x, c, n / 16, k, sc, cnt)) \
        host_set_csr(csr); }
SMALL_TENSOR(f32, mxc_u32)
SMALL_TENSOR(f16, mxc_u16)
SMALL_TENSOR(bf16, mxc_u16)
#define COLS(SUF, B) \
    extern "C" void host_quantize_mx_cols_##SUF(const B* x, mxc_u8* c, mxc_u8* s, mxc_u32* m, mxc_i64 outer, \
                                                mxc_i64 K, mxc_i64 N, int rceil, int flush) { \
        const unsigned csr = host_csr(); if (flush) host_set_csr(csr | 0x8040u); \
        RUN(outer * (K / 32) * (N / (4 / sizeof(B))), mx_quantize_mx_cols_##SUF(x, c, s, m, outer, K, N, rceil)) \
        host_set_csr(csr); }
COLS(f32, mxc_u32)
COLS(f16, mxc_u16)
COLS(bf16, mxc_u16)
#define TENSOR_T(SUF, B) \
    extern "C" void host_quantize_tensor_t_##SUF(const B* x, mxc_u8* c, mxc_i64 R, mxc_i64 C, mxc_u64* amax, int* k, \
                                                 float* sc, mxc_u32* cnt, int flush) { \
        const unsigned csr = host_csr(); if (flush) host_set_csr(csr | 0x8040u); \
        RUN(MXC_THREADS, mx_amax_fast_##SUF(x, R * C / 16, MXC_THREADS, amax)) \
        RUN((R / 64) * (C / 64) * MXC_THREADS, mx_quantize_tensor_t_##SUF(x, c, R, C, amax, k, sc, cnt)) \
        host_set_csr(csr); }
TENSOR_T(f32, mxc_u32)
TENSOR_T(f16, mxc_u16)
TENSOR_T(bf16, mxc_u16)
FAST_TENSOR(f32, mxc_u32)
FAST_TENSOR(f16, mxc_u16)
FAST_TENSOR(bf16, mxc_u16)
FAST(f32, mxc_u32)
FAST(f16, mxc_u16)
FAST(bf16, mxc_u16)
extern "C" void host_decode_f32(const mxc_code_t* c, mxc_u32* o, mxc_i64 n) { RUN(n, mx_decode_f32(c, o, n, 0)) }
extern "C" void host_decode_f64(const mxc_code_t* c, mxc_u64* o, mxc_i64 n) { RUN(n, mx_decode_f64(c, o, n, 0)) }
"""

_SUFFIX = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}


@pytest.fixture(scope="module")
def host_codecs(tmp_path_factory):
    """format name -> ctypes library of the header built for the host (all formats, compiled in parallel)."""
    import ctypes
    import subprocess

    if hip_tools.have_clang() is not None:
        return None
    from mxcore import kernel_source

    header = kernel_source("nvidia", "mx_codec.cuh")
    src = tmp_path_factory.mktemp("hostcodec") / "harness.cpp"
    src.write_text(_HARNESS.replace("HEADER", header))

    def build(name):
        so = src.with_name(f"codec_{name}.so")
        defs = [d for d in codec.format_defines(F.get(name))]
        # no C library, LLVM's own linker: only what CI installs (clang-22, lld-22) is needed
        cmd = [hip_tools.CLANG, "-x", "c++", "-std=c++17", "-O1", "-shared", "-fPIC", "-nostdlib", "-fuse-ld=lld",
               "-ffp-contract=off",
               f"-DMXC_THREADS={codec.THREADS}",
               *defs, str(src), "-o", str(so)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return ctypes.CDLL(str(so))

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(F.names(), pool.map(build, F.names())))


def _ptr(a):
    import ctypes

    return a.ctypes.data_as(ctypes.c_void_p)


def _i(v):
    import ctypes

    return ctypes.c_longlong(int(v))


def _host_encode(lib, spec, x, rounding, overflow):
    import ctypes

    x = np.ascontiguousarray(x)
    out = np.zeros(x.shape, spec.code_dtype)
    cnt = np.zeros(1, np.uint32)
    fn = getattr(lib, f"host_encode_{_SUFFIX[x.dtype.name]}")
    fn(_ptr(x), _ptr(out), _i(x.size), ctypes.c_int(rounding == "rtz"), ctypes.c_int(overflow == "nan"), _ptr(cnt))
    return out, int(cnt[0])


def _candidates(spec, rng):
    """Every value, every midpoint and its float64/float32 neighbours, overflow edges, ±0, ±inf, NaN, random bits."""
    import ml_dtypes

    from mxcore import _codec_host as H

    codes = np.arange(1 << spec.bits) if spec.bits <= 8 else rng.integers(0, 1 << spec.bits, 4096)
    v = np.unique(np.abs(H.decode(codes, spec, dtype=np.float64)))
    v = v[np.isfinite(v)]
    mids = (v[:-1] + v[1:]) / 2
    ulp = 2.0 ** (spec.emax - spec.mbits)
    edges = np.array([spec.max_normal + ulp / 2, spec.max_normal + ulp, 2.0 ** (spec.emax + 1), spec.min_subnormal / 2,
                      0.75 * spec.min_subnormal, 2.0 ** -149, 3.4028234663852886e38, 1e300, 5e-324, 0.0, np.inf, np.nan])
    pos = np.concatenate([v, mids, np.nextafter(mids, np.inf), np.nextafter(mids, 0),
                          np.nextafter(mids.astype(np.float32), np.float32(np.inf)).astype(np.float64), edges])
    x = np.concatenate([pos, -pos])
    out = {}
    for dt in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
        with np.errstate(over="ignore"):
            a = x.astype(dt)
        bits = np.dtype(f"u{np.dtype(dt).itemsize}")
        rand = (np.arange(1 << 16, dtype=np.uint16) if bits.itemsize == 2
                else rng.integers(0, np.iinfo(bits).max, 4096, dtype=bits, endpoint=True))
        out[np.dtype(dt).name] = np.concatenate([a, rand.view(dt)])
    return out


@pytest.mark.parametrize("name", F.names())
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
def test_kernel_arithmetic_on_host_matches_numpy(host_codecs, name, rng):
    """encode (every policy, every input type), decode (every code), quantize_tensor: kernel == numpy."""
    require_tool("clang-22", hip_tools.have_clang())
    from mxcore import _codec_host as H

    lib, spec = host_codecs[name], F.get(name)
    for dt, x in _candidates(spec, rng).items():
        isnan = np.isnan(x.astype(np.float64))
        for rounding in ("rne", "rtz"):
            for overflow in ("saturate", "nan"):
                got, nans = _host_encode(lib, spec, x, rounding, overflow)
                want = H.encode(x, spec, rounding=rounding, overflow=overflow, nan="zero")
                assert np.array_equal(got, want), (dt, rounding, overflow, np.flatnonzero(got != want)[:5])
                assert nans == (0 if spec.has_nan else int(isnan.sum()))
    codes = (np.arange(1 << spec.bits) if spec.bits <= 16 else rng.integers(0, 1 << spec.bits, 1 << 16)).astype(
        spec.code_dtype)
    for fn, odt in (("host_decode_f32", np.uint32), ("host_decode_f64", np.uint64)):
        out = np.zeros(codes.shape, odt)
        getattr(lib, fn)(_ptr(codes), _ptr(out), _i(codes.size))
        want = H.decode(codes, spec, dtype=np.float32 if odt == np.uint32 else np.float64)
        assert np.array_equal(out, want.view(odt)), np.flatnonzero(out != want.view(odt))[:5]
    if spec.bits <= 8 and spec.signed:
        from mxcore import mx

        for x in (rng.standard_normal(300) * 2.0 ** rng.integers(-30, 30, 300), np.zeros(5),
                  np.array([1.0, np.inf, -3.0, 1e-300]), rng.standard_normal(64) * 2.0 ** -140):
            if spec.has_nan:
                x = np.append(x, np.nan)
            for dt in (np.float32, np.float64):
                xs = x.astype(dt)
                c, amax, k, sc, cnt = (np.zeros(xs.size, np.uint8), np.zeros(1, np.uint64), np.zeros(1, np.int32),
                                       np.zeros(1, np.float32), np.zeros(1, np.uint32))
                getattr(lib, f"host_quantize_tensor_{_SUFFIX[np.dtype(dt).name]}")(
                    _ptr(xs), _ptr(c), _i(xs.size), _ptr(amax), _ptr(k), _ptr(sc), _ptr(cnt))
                want = mx.quantize_tensor(xs, name)
                assert np.array_equal(c, want.codes) and int(k[0]) == want.scale_exp and float(sc[0]) == want.scale


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"])
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
def test_mx_kernel_arithmetic_on_host_matches_numpy(host_codecs, fmt, rng):
    """quantize_mx (fixed-32 and any-block paths, both axes, both scale rules, special blocks) == numpy."""
    import ctypes

    import ml_dtypes

    require_tool("clang-22", hip_tools.have_clang())
    from mxcore import mx

    name, spec = mx.mx_element(fmt)
    lib = host_codecs[spec.name]
    k = 100
    rows = [np.zeros(k), -np.zeros(k), np.where(np.arange(k) == 40, np.nan, 1.0), np.where(np.arange(k) == 3, -np.inf, 2.0)]
    rows += [rng.standard_normal(k) * 2.0 ** e for e in (-150, -135, -128, -127, -126, -20, 0, 100, 127)]
    rows.append(np.where(np.arange(k) % 3 == 0, 2.0 ** -24, 3 * 2.0 ** -24))  # half subnormals of 1-2 bits
    r = rng.uniform(-1, 1, k) * spec.max_normal
    r[::7] = spec.max_normal
    rows += [r, np.where(np.arange(k) % 7 == 0, np.nextafter(np.float32(spec.max_normal), np.float32(np.inf)), r)]
    rows.append(rng.standard_normal(k) * 2.0 ** rng.integers(-40, 40, k))
    x64 = np.stack(rows)
    for dt in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
        with np.errstate(over="ignore"):
            xh = x64.astype(dt)
        for axis, block in ((1, 32), (0, 32), (1, 7), (1, 64)):
            xa = xh if axis == 1 else np.ascontiguousarray(xh.T)
            for rule in ("floor", "rceil"):
                want = mx.quantize_mx(xa, fmt, axis=axis, block=block, scale_rounding=rule)
                outer, kk, inner = (xa.shape[0], xa.shape[1], 1) if axis == 1 else (1, xa.shape[0], xa.shape[1])
                c = np.zeros(xa.shape, np.uint8)
                s = np.zeros(want.scales.shape, np.uint8)
                m = np.zeros(1, np.uint32)
                getattr(lib, f"host_quantize_mx_{_SUFFIX[np.dtype(dt).name]}")(
                    _ptr(xa), _ptr(c), _ptr(s), _ptr(m), _i(outer), _i(kk), _i(inner), ctypes.c_int(block),
                    ctypes.c_int(rule == "rceil"))
                assert np.array_equal(s, want.scales), (dt, axis, block, rule)
                assert np.array_equal(c, want.codes), (dt, axis, block, rule)
                assert (int(m[0]) - 1 if m[0] else 127) == want.scale_max


def _host_quantize_mx_fast(lib, x, rule: str, ctas: int, flush: bool = False):
    """The fast MX kernel (lane pairs, grid-stride loop over ``ctas`` CTAs) on the host: (codes, scales, max);
    ``flush``: with float32 subnormals flushed to zero (inputs and results, x86 MXCSR FTZ + DAZ)."""
    import ctypes

    x = np.ascontiguousarray(x)
    c = np.zeros(x.shape, np.uint8)
    s = np.zeros(x.shape[:-1] + (x.shape[-1] // 32,), np.uint8)
    m = np.zeros(1, np.uint32)
    getattr(lib, f"host_quantize_mx_fast_{_SUFFIX[x.dtype.name]}")(
        _ptr(x), _ptr(c), _ptr(s), _ptr(m), _i(x.size // 16), _i(ctas), ctypes.c_int(rule == "rceil"),
        ctypes.c_int(int(flush)))
    return c, s, int(m[0]) - 1 if m[0] else 127


def _every_offset_blocks(dt, rng):
    """For every binade 2^j of a 16-bit float type (subnormal ones too): blocks whose largest magnitude lies
    in that binade (2^j itself, or the binade's largest pattern: both scale rules' cases) holding every
    pattern of the 12 binades below it, random signs: every element encode for every scale."""
    mant = {np.dtype(np.float16): 10}.get(np.dtype(dt), 7)
    mags = np.arange(1, 0x7c00 if mant == 10 else 0x7f80, dtype=np.uint16)  # finite, nonzero magnitudes
    vals = mags.view(dt).astype(np.float64)
    top = np.floor(np.log2(vals))
    blocks = []
    for j in np.unique(top):
        pats = mags[(top < j) & (top >= j - 12)]
        pats = pats[: pats.size - pats.size % 31]
        if not pats.size:
            continue
        lead = np.where(np.arange(pats.size // 31) % 2 == 0, mags[top == j].min(), mags[top == j].max())
        blk = np.concatenate([lead[:, None], pats.reshape(-1, 31)], axis=1).astype(np.uint16)
        blocks.append(blk | (rng.integers(0, 2, blk.shape, dtype=np.uint16) << 15))
    b = np.concatenate(blocks).ravel()
    return b[: b.size - b.size % 256].view(dt).reshape(-1, 256)


@pytest.mark.parametrize("flush", [False, True], ids=["ieee", "ftz"])
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"])
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
def test_fast_mx_kernel_on_host_matches_numpy(host_codecs, fmt, flush, rng):
    """mx_quantize_mx_fast_* (the kernel the device path launches for contiguous blocks), lane exchange and
    grid-stride loop included, == numpy: float32 / float16 / bfloat16 inputs, both scale rules, special blocks,
    every float16 / bfloat16 bit pattern (all 65536, shuffled into blocks, plus blocks of one binade), and
    every pattern at every offset of up to 12 binades below every block maximum.  ``ftz``: the same with float32
    subnormals flushed to zero (inputs and results): the kernel must not depend on them (an H200 flushed them in
    an earlier version of this kernel)."""
    import ml_dtypes

    require_tool("clang-22", hip_tools.have_clang())
    from mxcore import mx

    spec = mx.mx_element(fmt)[1]
    lib = host_codecs[spec.name]
    if flush and not lib.host_can_flush():
        pytest.skip("flush-to-zero mode is set through the x86 MXCSR; this host is not x86-64")
    x64 = mx_special_rows(spec, rng, 96)
    for dt in (np.float32, np.float16, ml_dtypes.bfloat16):
        with np.errstate(over="ignore"):
            cases = [x64.astype(dt)]
        if np.dtype(dt).itemsize == 2:
            every = np.arange(1 << 16, dtype=np.uint16)
            cases.append(rng.permutation(every).view(dt).reshape(-1, 256))  # mixed magnitudes per block
            cases.append(every.view(dt).reshape(-1, 64))  # blocks of neighbouring patterns: one binade each
            cases.append(_every_offset_blocks(dt, rng))
        else:
            bits = rng.integers(0, 1 << 32, 1 << 14, dtype=np.uint64).astype(np.uint32)
            cases.append(bits.view(np.float32).reshape(-1, 128))
        for xa in cases:
            for rule in ("floor", "rceil"):
                want = mx.quantize_mx(xa, fmt, axis=-1, block=32, scale_rounding=rule)
                for ctas in (1, 3):  # grid-stride loops of several turns, and a partly live last turn
                    c, s, smax = _host_quantize_mx_fast(lib, xa, rule, ctas, flush)
                    assert np.array_equal(s, want.scales), (dt, rule, ctas, np.argwhere(s != want.scales)[:5])
                    bad = np.argwhere(c != want.codes)
                    assert bad.size == 0, (dt, rule, ctas, bad[:5], c[tuple(bad[0])], want.codes[tuple(bad[0])])
                    assert smax == want.scale_max


@pytest.mark.parametrize("flush", [False, True], ids=["ieee", "ftz"])
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"])
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
def test_column_mx_kernel_on_host_matches_numpy(host_codecs, fmt, flush, rng):
    """mx_quantize_mx_cols_* (blocks of 32 along the second-to-last axis: B [K, N] along K, and batches of them)
    == numpy: float32 / float16 / bfloat16, both scale rules, the special rows as columns, every 16-bit pattern;
    ``ftz``: with float32 subnormals flushed to zero."""
    import ctypes

    import ml_dtypes

    require_tool("clang-22", hip_tools.have_clang())
    from mxcore import mx

    spec = mx.mx_element(fmt)[1]
    lib = host_codecs[spec.name]
    if flush and not lib.host_can_flush():
        pytest.skip("flush-to-zero mode is set through the x86 MXCSR; this host is not x86-64")
    cols = mx_special_rows(spec, rng, 96).T  # [96, rows]: each special row is a column of three blocks
    for dt in (np.float32, np.float16, ml_dtypes.bfloat16):
        with np.errstate(over="ignore"):
            cases = [np.ascontiguousarray(cols[:, : cols.shape[1] // 2 * 2]).astype(dt)]
        cases.append(cases[0].reshape(3, 32, -1))  # a batch: outer 3
        if np.dtype(dt).itemsize == 2:
            cases.append(rng.permutation(np.arange(1 << 16, dtype=np.uint16)).view(dt).reshape(256, 256))
        for xa in cases:
            xa = np.ascontiguousarray(xa)
            outer, k, n = (1,) + xa.shape if xa.ndim == 2 else xa.shape
            for rule in ("floor", "rceil"):
                want = mx.quantize_mx(xa, fmt, axis=-2, block=32, scale_rounding=rule)
                c, s = np.zeros(xa.shape, np.uint8), np.zeros(want.scales.shape, np.uint8)
                m = np.zeros(1, np.uint32)
                getattr(lib, f"host_quantize_mx_cols_{_SUFFIX[xa.dtype.name]}")(
                    _ptr(xa), _ptr(c), _ptr(s), _ptr(m), _i(outer), _i(k), _i(n), ctypes.c_int(rule == "rceil"),
                    ctypes.c_int(int(flush)))
                assert np.array_equal(s, want.scales), (xa.dtype, rule, np.argwhere(s != want.scales)[:5])
                bad = np.argwhere(c != want.codes)
                assert bad.size == 0, (xa.dtype, rule, bad[:5], c[tuple(bad[0])], want.codes[tuple(bad[0])])
                assert (int(m[0]) - 1 if m[0] else 127) == want.scale_max


@pytest.mark.parametrize("flush", [False, True], ids=["ieee", "ftz"])
@pytest.mark.parametrize("name", [n for n in F.names() if F.get(n).bits == 8 and F.get(n).signed])
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
def test_fast_tensor_kernels_on_host_match_numpy(host_codecs, name, flush, rng):
    """mx_amax_fast_* + mx_quantize_tensor_fast_* (runs of 16, grid-stride; what the device path launches for
    aligned data whose size is a multiple of 16) and mx_quantize_tensor_small_* (both in one CTA: small tensors) ==
    numpy's quantize_tensor: float32 / float16 / bfloat16, tensors with NaN / inf, all-zero, tiny (scale exponent at
    its lower clamp: float32/bfloat16 subnormal inputs count), every 16-bit pattern; ``ftz``: with float32
    subnormals flushed to zero (the kernels must not depend on them)."""
    import ctypes

    import ml_dtypes

    require_tool("clang-22", hip_tools.have_clang())
    from mxcore import mx

    lib = host_codecs[name]
    if flush and not lib.host_can_flush():
        pytest.skip("flush-to-zero mode is set through the x86 MXCSR; this host is not x86-64")
    spec = F.get(name)
    base = [rng.standard_normal(512) * 2.0 ** rng.integers(-30, 30, 512), np.zeros(64),
            rng.standard_normal(256) * 2.0 ** -140, rng.standard_normal(256) * 2.0 ** -125,
            np.where(rng.random(256) < 0.5, 2.0 ** -135, 3 * 2.0 ** -133) * rng.choice([-1, 1], 256),
            np.where(np.arange(128) == 5, np.inf, rng.standard_normal(128)),
            rng.standard_normal(4096) * 2.0 ** -140,  # 64 x 64 tiles for the transposing kernel: tiny, specials
            np.where(np.arange(4096) % 1000 == 5, -np.inf, rng.standard_normal(4096) * 2.0 ** rng.integers(-9, 9))]
    if spec.has_nan:
        base.append(np.where(np.arange(128) == 77, np.nan, rng.standard_normal(128)))
        base.append(np.where(np.arange(4096) % 777 == 3, np.nan, rng.standard_normal(4096)))
    for dt in (np.float32, np.float16, ml_dtypes.bfloat16):
        with np.errstate(over="ignore"):
            cases = [x.astype(dt) for x in base]
        if np.dtype(dt).itemsize == 2:
            every = rng.permutation(np.arange(1 << 16, dtype=np.uint16)).view(dt)
            cases.append(every if spec.has_nan else every[~np.isnan(every.astype(np.float32))][:65520])
        for xs in cases:
            xs = np.ascontiguousarray(xs)
            for ctas in (1, 3):
                c, amax, k, sc, cnt = (np.zeros(xs.size, np.uint8), np.zeros(1, np.uint64), np.zeros(1, np.int32),
                                       np.zeros(1, np.float32), np.zeros(1, np.uint32))
                getattr(lib, f"host_quantize_tensor_fast_{_SUFFIX[np.dtype(dt).name]}")(
                    _ptr(xs), _ptr(c), _i(xs.size), _ptr(amax), _ptr(k), _ptr(sc), _ptr(cnt), _i(ctas),
                    ctypes.c_int(int(flush)))
                want = mx.quantize_tensor(xs, name)
                bad = np.flatnonzero(c != want.codes)
                assert bad.size == 0, (dt, ctas, bad[:5], c[bad[:1]], want.codes[bad[:1]], xs[bad[:1]])
                assert int(k[0]) == want.scale_exp and float(sc[0]) == want.scale, (dt, int(k[0]), want.scale_exp)
            # mx_quantize_tensor_small: both passes in one CTA (the device path's small tensors)
            c, k, sc, cnt = (np.zeros(xs.size, np.uint8), np.zeros(1, np.int32), np.zeros(1, np.float32),
                             np.zeros(1, np.uint32))
            getattr(lib, f"host_quantize_tensor_small_{_SUFFIX[np.dtype(dt).name]}")(
                _ptr(xs), _ptr(c), _i(xs.size), _ptr(k), _ptr(sc), _ptr(cnt), ctypes.c_int(int(flush)))
            bad = np.flatnonzero(c != want.codes)
            assert bad.size == 0, (dt, "small", bad[:5], c[bad[:1]], want.codes[bad[:1]], xs[bad[:1]])
            assert int(k[0]) == want.scale_exp and float(sc[0]) == want.scale, (dt, "small", int(k[0]))
            if xs.size % 4096 == 0:  # the transposing kernel (order="F"): x as [R, C] multiples of 64
                x2 = xs.reshape(64, -1) if xs.size // 64 % 64 == 0 else None
                if x2 is None:
                    continue
                c, amax, k, sc, cnt = (np.zeros(x2.shape[::-1], np.uint8), np.zeros(1, np.uint64),
                                       np.zeros(1, np.int32), np.zeros(1, np.float32), np.zeros(1, np.uint32))
                getattr(lib, f"host_quantize_tensor_t_{_SUFFIX[np.dtype(dt).name]}")(
                    _ptr(x2), _ptr(c), _i(x2.shape[0]), _i(x2.shape[1]), _ptr(amax), _ptr(k), _ptr(sc), _ptr(cnt),
                    ctypes.c_int(int(flush)))
                want = mx.quantize_tensor(x2, name, order="F")
                assert want.codes.flags.f_contiguous
                bad = np.argwhere(c.T != want.codes)
                assert bad.size == 0, (dt, "transposed", bad[:5])
                assert int(k[0]) == want.scale_exp


def test_mx_kernel_choice_on_host(monkeypatch):
    """backends.codec._mx_launch (no GPU: a stand-in call/module records the launch): the fast kernel by default
    for contiguous aligned 32-blocks of <=32-bit floats, the generic one elsewhere or when forced (a forced fast
    kernel that does not apply, or an unknown name, raises)."""
    from types import SimpleNamespace

    from mxcore.errors import UnsupportedError

    class Module:
        def get_function(self, name):
            return name

    call = SimpleNamespace(module=lambda spec: Module(), sm_count=lambda: 132)
    spec = F.get("e4m3fn")

    def arr(ptr):
        return SimpleNamespace(data=SimpleNamespace(ptr=ptr))

    def launch(shape, axis=1, block=32, suf="bf16", ptr=4096, kernel=None):
        return codec._mx_launch(call, spec, arr(ptr), suf, arr(8192), arr(0), arr(0), shape, axis, block, False, kernel)

    monkeypatch.delenv("MXCORE_MX_KERNEL", raising=False)
    assert launch((8192, 8192))[0] == "mx_quantize_mx_fast_bf16"  # the default where it applies
    assert launch((8192, 8192), kernel="generic")[0] == "mx_quantize_mx_bf16"
    assert launch((8192, 8192), axis=0)[0] == "mx_quantize_mx_cols_bf16"  # B [K, N] along K
    assert launch((8192, 8192), axis=0, kernel="fast")[0] == "mx_quantize_mx_cols_bf16"
    assert launch((8192, 8192), axis=0, kernel="generic")[0] == "mx_quantize_mx_bf16"
    assert launch((64, 8191), axis=0, suf="f16")[0] == "mx_quantize_mx_f16"  # odd N: not whole 32-bit words
    name, grid, args = launch((8192, 8192), kernel="fast")
    assert name == "mx_quantize_mx_fast_bf16" and grid == (8 * 132,)  # grid-stride: one resident wave
    assert int(args[4]) == 8192 * 8192 // 16 and int(args[5]) == 8 * 132 * codec.THREADS
    assert launch((4, 64), kernel="fast")[1] == (1,)
    for odd in (dict(shape=(4, 96), axis=0), dict(shape=(4, 90)), dict(shape=(4, 64), block=16),
                dict(shape=(4, 64), suf="f64"), dict(shape=(4, 64), ptr=4098)):
        name, _, args = launch(**odd)
        assert name.startswith("mx_quantize_mx_") and "fast" not in name, odd
        with pytest.raises(UnsupportedError, match="fast MX quantizer"):
            launch(**odd, kernel="fast")
    assert launch((4, 64), kernel="generic")[0] == "mx_quantize_mx_bf16"
    monkeypatch.setenv("MXCORE_MX_KERNEL", "generic")
    assert launch((4, 64))[0] == "mx_quantize_mx_bf16"
    assert launch((4, 64), kernel="fast")[0] == "mx_quantize_mx_fast_bf16"  # the keyword wins over the variable
    monkeypatch.setenv("MXCORE_MX_KERNEL", "auto")
    assert launch((4, 64))[0] == "mx_quantize_mx_fast_bf16"
    monkeypatch.setenv("MXCORE_MX_KERNEL", "fastest")
    with pytest.raises(UnsupportedError, match="MXCORE_MX_KERNEL"):
        launch((4, 64))
