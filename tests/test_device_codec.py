"""GPU tests of the device codecs: every result compared bit for bit with the numpy path.

Decode of every code of every format (all 2^16 codes of fp16/bf16, sampled codes of tf32/fp32); encode of
float32/float64/float16/bfloat16 bit-pattern classes (every code's value, every midpoint between neighbours
and its neighbours one ulp away, overflow edges, ±0, ±inf, NaN payloads, random bit patterns, all 65536
half/bfloat16 patterns) under every rounding / overflow / NaN policy; OCP-MX blocks that are all zero, hold
NaN/inf, straddle 2^-127, K tails, both scale_rounding rules, both block axes, other block lengths;
per-tensor scaling; dequantization; packing; CuPy and torch inputs; a non-default stream.  Inputs: exactly
chosen values plus fresh random ones (seed printed on failure).  Run: ``pytest -m nvidia_gpu``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import mxcore
from mxcore import _codec_host as H
from mxcore import formats as F
from mxcore.errors import FormatError, InputTypeError, ShapeError, UnsupportedError
from mxcore.backends import codec
from mxcore.mx import mx_element
from conftest import mx_special_rows

pytestmark = pytest.mark.nvidia_gpu

LIBS = ["cupy", "torch"]
MX = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"]
FP8 = ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e2m1"]
POLICIES = [(r, o, n) for r in ("rne", "rtz") for o in ("saturate", "nan") for n in ("raise", "zero")]


# ---- moving arrays ------------------------------------------------------------------------------------------------
def dev(a, lib):
    a = np.asarray(a)
    if lib == "cupy":
        import cupy

        if a.dtype == ml_dtypes.bfloat16:
            pytest.skip("CuPy has no bfloat16 arrays")
        return cupy.asarray(a)
    import torch

    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).cuda()
    if a.dtype == np.uint16:
        a = a.astype(np.int32)
    elif a.dtype == np.uint32:
        a = a.astype(np.int64)
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def host(a, view=None):
    """A device result on the host (raw bits kept), optionally reinterpreted as ``view``."""
    mod = type(a).__module__
    if mod.startswith("cupy"):
        h = a.get()
    else:
        import torch

        t = a.detach()
        name = str(t.dtype).replace("torch.", "")
        if name in ("uint16", "uint32", "bfloat16"):
            t = t.view({2: torch.int16, 4: torch.int32}[t.element_size()])
        h = t.cpu().numpy()
    return h.view(view) if view is not None else h


def kind_of(a):
    return "cupy" if type(a).__module__.startswith("cupy") else "torch"


def same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if got.dtype.kind == "f":
        got, want = got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}")
    bad = np.flatnonzero(got.ravel() != want.ravel())
    assert bad.size == 0, f"{bad.size} mismatches, first at {bad[:5]}: got {got.ravel()[bad[:5]]}, want {want.ravel()[bad[:5]]}"


# ---- decode -------------------------------------------------------------------------------------------------------
def _all_codes(spec, rng):
    if spec.bits <= 16:
        return np.arange(1 << spec.bits, dtype=spec.code_dtype)
    specials = np.array([0, 1, spec.max_code, spec.max_code + 1, *spec.nan_codes, *spec.inf_codes,
                         (1 << spec.bits) - 1, 1 << (spec.bits - 1)], np.uint64)
    rand = rng.integers(0, 1 << spec.bits, 1 << 16, dtype=np.uint64)
    return np.concatenate([specials, rand]).astype(spec.code_dtype)


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("name", F.names())
def test_decode_every_code(name, lib, rng):
    spec = F.get(name)
    codes = _all_codes(spec, rng)
    d = dev(codes, lib)
    for dtype in (np.float32, np.float64):
        got = F.decode(d, name, dtype=dtype)
        assert kind_of(got) == lib
        same_bits(host(got), H.decode(codes, name, dtype=dtype))
    if spec.bits < 8:
        with pytest.raises(FormatError):
            F.decode(dev(np.array([1 << spec.bits], np.int32), lib), name)


# ---- encode -------------------------------------------------------------------------------------------------------
def _encode_inputs(spec, rng) -> np.ndarray:
    """float64 candidates: every value, midpoint and ±ulp neighbours, edges, specials (cast per input dtype)."""
    if spec.bits <= 8:
        vals = H.decode(np.arange(1 << spec.bits), spec, dtype=np.float64)
    else:
        vals = H.decode(_all_codes(spec, rng)[:4096], spec, dtype=np.float64)
    v = np.unique(np.abs(vals[np.isfinite(vals)]))
    mids = (v[:-1] + v[1:]) / 2
    near = [np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
            np.nextafter(mids.astype(np.float32), np.float32(np.inf)).astype(np.float64),
            np.nextafter(mids.astype(np.float32), np.float32(0)).astype(np.float64)]
    top = spec.max_normal
    ulp = 2.0 ** (spec.emax - spec.mbits)
    edges = [top, top + ulp / 2, top + ulp / 4, top + ulp, 2.0 ** (spec.emax + 1), 1.5 * 2.0 ** (spec.emax + 1),
             spec.min_subnormal / 2, spec.min_subnormal / 4, 0.75 * spec.min_subnormal, spec.min_normal,
             2.0 ** -149, 2.0 ** -126, 3.4028234663852886e38, 2.0 ** 127, 1e300, 1e-300, 5e-324, 0.0]
    pos = np.concatenate([v, mids, *near, np.array(edges)])
    return np.concatenate([pos, -pos, [np.inf, -np.inf]])


def _with_specials(x: np.ndarray, dtype, rng) -> np.ndarray:
    """``x`` cast to ``dtype`` plus NaN payloads and random bit patterns of that dtype."""
    with np.errstate(over="ignore"):
        a = x.astype(dtype)
    bits = np.dtype(f"u{np.dtype(dtype).itemsize}")
    if np.dtype(dtype).itemsize == 2:
        pats = np.arange(1 << 16, dtype=np.uint16)  # every half / bfloat16 pattern
    else:
        pats = rng.integers(0, np.iinfo(bits).max, 8192, dtype=bits, endpoint=True)
    nan = {2: [0x7E01, 0xFE00, 0x7C01, 0xFFFF], 4: [0x7FC00001, 0x7F800001, 0xFFC00000, 0xFFFFFFFF],
           8: [0x7FF8000000000001, 0x7FF0000000000001, 0xFFF8000000000000]}[np.dtype(dtype).itemsize]
    return np.concatenate([a, pats.view(dtype), np.array(nan, bits).view(dtype)])


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("name", F.names())
def test_encode_every_policy_and_input_type(name, lib, rng):
    spec = F.get(name)
    base = _encode_inputs(spec, rng)
    for dtype in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
        if lib == "cupy" and dtype == ml_dtypes.bfloat16:
            continue
        x = _with_specials(base, dtype, rng)
        for rounding, overflow, nan in POLICIES:
            xs = x if (spec.has_nan or nan == "zero") else x[~np.isnan(x.astype(np.float64))]
            want = H.encode(xs, spec, rounding=rounding, overflow=overflow, nan=nan)
            got = F.encode(dev(xs, lib), name, rounding=rounding, overflow=overflow, nan=nan)
            assert kind_of(got) == lib
            same_bits(host(got, want.dtype), want)
    if not spec.has_nan:
        with pytest.raises(FormatError, match="NaN"):
            F.encode(dev(np.array([1.0, np.nan], np.float32), lib), name)
    with pytest.raises(UnsupportedError, match="stochastic"):
        F.encode(dev(np.ones(3, np.float32), lib), name, rounding="stochastic", rng=0)
    with pytest.raises(InputTypeError):
        F.encode(dev(np.ones(3, np.int32), lib), name)


@pytest.mark.parametrize("lib", LIBS)
def test_encode_keeps_shape_and_handles_views(lib, rng):
    x = rng.standard_normal((6, 10)).astype(np.float32) * 100
    d = dev(x, lib)
    view = d.T if lib == "cupy" else d.t()
    got = F.encode(view, "e4m3fn")
    same_bits(host(got), H.encode(x.T, "e4m3fn"))
    if lib == "cupy":
        same_bits(host(F.encode(d[:, ::-1], "e5m2")), H.encode(x[:, ::-1], "e5m2"))


# ---- packing ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("n", [1, 2, 5, 8, 33, 64, 4096])  # 64, 4096: 3 rows fill whole 32-code units (fast fp4)
def test_pack_unpack(lib, n, rng):
    c4 = rng.integers(0, 16, (3, n), dtype=np.uint8)
    c6 = rng.integers(0, 64, (3, n), dtype=np.uint8)
    p4, p6 = F.pack_fp4(dev(c4, lib)), F.pack_fp6(dev(c6, lib))
    same_bits(host(p4), H.pack_fp4(c4))
    same_bits(host(p6), H.pack_fp6(c6))
    same_bits(host(F.unpack_fp4(p4, n)), c4)
    same_bits(host(F.unpack_fp6(p6, n)), c6)
    with pytest.raises(FormatError):
        F.pack_fp4(dev(c6 | 0x10, lib))


# ---- MX ------------------------------------------------------------------------------------------------------------
def _check_mx(x_host, x_dev, fmt, axis, block, rounding):
    want = mxcore.quantize_mx(x_host, fmt, axis=axis, block=block, scale_rounding=rounding)
    got = mxcore.quantize_mx(x_dev, fmt, axis=axis, block=block, scale_rounding=rounding)
    assert got.device is not None and got.shape == want.shape
    same_bits(host(got.codes), want.codes)
    same_bits(host(got.scales), want.scales)
    assert int(host(got.scale_max)) == want.scale_max
    back = got.to_host()
    same_bits(back.codes, want.codes)
    return got, want


@pytest.fixture(params=["auto", "generic"])
def mx_kernel(request, monkeypatch):
    """The MX quantization kernel choice (backends.codec._mx_launch): the default, and the generic kernel for
    every layout (so both kernels meet every case the fast one takes)."""
    monkeypatch.setenv("MXCORE_MX_KERNEL", request.param)
    return request.param


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("fmt", MX)
def test_quantize_mx_bit_identical(fmt, lib, rng, mx_kernel):
    spec = mx_element(fmt)[1]
    for k in (100, 64, 31):
        x64 = mx_special_rows(spec, rng, k)
        for dtype in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
            if lib == "cupy" and dtype == ml_dtypes.bfloat16:
                continue
            with np.errstate(over="ignore"):
                xh = x64.astype(dtype)
            for rounding in ("floor", "rceil"):
                _check_mx(xh, dev(xh, lib), fmt, -1, 32, rounding)
                xt = np.ascontiguousarray(xh.T)
                _check_mx(xt, dev(xt, lib), fmt, 0, 32, rounding)
    x = rng.standard_normal((2, 50, 3)).astype(np.float32)
    for block in (16, 7, 50):
        _check_mx(x, dev(x, lib), fmt, 1, block, "floor")


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("fmt", MX)
def test_fast_mx_kernel_bit_identical(fmt, lib, rng, monkeypatch):
    """The fast kernel forced (MXCORE_MX_KERNEL=fast raises where it does not apply, so it really ran): the
    special rows, every float16 / bfloat16 bit pattern in shuffled blocks and in blocks of one binade, random
    float32 bit patterns; and a tensor large enough for several grid-stride turns against the generic kernel."""
    monkeypatch.setenv("MXCORE_MX_KERNEL", "fast")
    spec = mx_element(fmt)[1]
    x64 = mx_special_rows(spec, rng, 128)
    every = np.arange(1 << 16, dtype=np.uint16)
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        if lib == "cupy" and dtype == ml_dtypes.bfloat16:
            continue
        with np.errstate(over="ignore"):
            cases = [x64.astype(dtype)]
        if np.dtype(dtype).itemsize == 2:
            cases += [rng.permutation(every).view(dtype).reshape(-1, 512), every.view(dtype).reshape(-1, 64)]
        else:
            cases.append(rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32)
                         .reshape(-1, 256))
        for xh in cases:
            for rounding in ("floor", "rceil"):
                _check_mx(xh, dev(xh, lib), fmt, -1, 32, rounding)
    # the column kernel (blocks along the second-to-last axis): every 16-bit pattern as [256, 256] along axis 0
    # and as a batch [4, 64, 256] along axis 1; the special rows as columns
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        if lib == "cupy" and dtype == ml_dtypes.bfloat16:
            continue
        with np.errstate(over="ignore"):
            cols = np.ascontiguousarray(x64[: x64.shape[0] // 2 * 2].T).astype(dtype)  # [128, even rows]
        cases = [(cols, 0)]
        if np.dtype(dtype).itemsize == 2:
            sq = rng.permutation(every).view(dtype).reshape(256, 256)
            cases += [(sq, 0), (sq.reshape(4, 64, 256), 1)]
        for xh, axis in cases:
            for rounding in ("floor", "rceil"):
                _check_mx(xh, dev(xh, lib), fmt, axis, 32, rounding)
    # several grid-stride turns (more half blocks than one resident wave of CTAs): fast == generic kernel
    big = dev((rng.standard_normal((2048, 4096)) * 2.0 ** rng.integers(-20, 10, (2048, 1))).astype(np.float16), lib)
    fast = mxcore.quantize_mx(big, fmt)
    monkeypatch.setenv("MXCORE_MX_KERNEL", "generic")
    generic = mxcore.quantize_mx(big, fmt)
    same_bits(host(fast.codes), host(generic.codes))
    same_bits(host(fast.scales), host(generic.scales))
    assert int(host(fast.scale_max)) == int(host(generic.scale_max))


@pytest.mark.parametrize("lib", LIBS)
def test_mx_kernel_choice(lib, rng, monkeypatch):
    """Inputs the fast kernel does not take (unaligned, other axis, K tail, other block, float64) run the generic
    kernel under the default choice (the fast one where it applies), and raise a typed error when the
    fast one is forced."""
    base = dev(rng.standard_normal(1 + 4 * 64).astype(np.float32), lib)
    unaligned = base[1:]  # contiguous, 4 bytes past a 16-byte boundary
    x = rng.standard_normal((64, 96)).astype(np.float32)  # each case misses exactly one condition
    cases = [(unaligned.reshape(4, 64), -1, 32), (dev(x[:50].copy(), lib), 0, 32),
             (dev(x[:, :90].copy(), lib), -1, 32), (dev(x, lib), -1, 16), (dev(x.astype(np.float64), lib), -1, 32)]
    for d, axis, block in cases:
        want = mxcore.quantize_mx(host(d), "mxfp8", axis=axis, block=block)
        monkeypatch.setenv("MXCORE_MX_KERNEL", "auto")
        got = mxcore.quantize_mx(d, "mxfp8", axis=axis, block=block)
        same_bits(host(got.codes), want.codes)
        same_bits(host(got.scales), want.scales)
        monkeypatch.setenv("MXCORE_MX_KERNEL", "fast")
        with pytest.raises(UnsupportedError):
            mxcore.quantize_mx(d, "mxfp8", axis=axis, block=block)
    monkeypatch.setenv("MXCORE_MX_KERNEL", "fastest")
    with pytest.raises(UnsupportedError):
        mxcore.quantize_mx(dev(x, lib), "mxfp8")


@pytest.mark.parametrize("lib", LIBS)
def test_quantize_mx_views_and_errors(lib, rng):
    x = rng.standard_normal((40, 70)).astype(np.float32)
    d = dev(x, lib)
    view = d.T if lib == "cupy" else d.t()
    _check_mx(np.ascontiguousarray(x.T), view, "mxfp4", 0, 32, "floor")
    with pytest.raises(ShapeError):
        mxcore.quantize_mx(d, "mxfp8", block=10**9)
    with pytest.raises(InputTypeError):
        mxcore.quantize_mx(dev(np.ones((2, 4), np.int32), lib), "mxfp8")


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("fmt", MX)
def test_mx_dequantize_and_pack_on_device(fmt, lib, rng):
    x = (rng.standard_normal((9, 70)) * 2.0 ** rng.integers(-20, 20, (9, 70))).astype(np.float32)
    x[3, 33] = np.nan
    got, want = _check_mx(x, dev(x, lib), fmt, -1, 32, "floor")
    for dtype in (np.float32, np.float64):
        d = mxcore.dequantize(got, dtype=dtype)
        assert kind_of(d) == lib
        h, w = host(d), mxcore.dequantize(want, dtype=dtype)
        assert np.array_equal(np.isnan(h), np.isnan(w))
        same_bits(np.where(np.isnan(w), 0, h), np.where(np.isnan(w), 0, w))
    same_bits(host(got.packed()), want.packed())
    same_bits(host(got.scale_values()), want.scale_values())
    again = got.to_host().to_device(like=got.codes)
    same_bits(host(again.codes), want.codes)
    assert int(host(again.scale_max)) == want.scale_max


# ---- per-tensor ---------------------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("fmt", FP8)
def test_quantize_tensor_bit_identical(fmt, lib, rng):
    spec = F.get(fmt)
    cases = [rng.standard_normal((33, 65)) * 10, np.zeros((4, 4)), rng.standard_normal(1000) * 2.0 ** -140,
             rng.standard_normal(100) * 1e30, np.array([spec.max_normal * 2.0 ** -3, -1.0, 0.5]),
             np.array([np.nextafter(np.float32(spec.max_normal), np.float32(np.inf)), 1.0])]
    # sizes that are multiples of 16 run the 16-element-run kernels: mx_quantize_tensor_small (one CTA) up to
    # codec.SMALL_TENSOR_RUNS runs of 16, mx_amax_fast / mx_quantize_tensor_fast above
    cases += [rng.standard_normal((64, 96)) * 10, rng.standard_normal(1024) * 2.0 ** -140,
              rng.standard_normal(2048) * 2.0 ** -125, rng.standard_normal((128, 128)) * 2.0 ** rng.integers(-30, 30),
              rng.standard_normal((320, 256)) * 2.0 ** rng.integers(-30, 30, (320, 1)),
              np.where(np.arange(81920) % 9999 == 7, np.inf, rng.standard_normal(81920) * 2.0 ** -135)]
    assert 16 * codec.SMALL_TENSOR_RUNS < 320 * 256
    for n in (300, 320):
        special = rng.standard_normal(n)
        special[[5, 50]] = [np.inf, -np.inf]
        if spec.has_nan:
            special[[7, 70]] = [np.nan, -np.nan]
        cases.append(special)
    for x64 in cases:
        for dtype in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
            if lib == "cupy" and dtype == ml_dtypes.bfloat16:
                continue
            with np.errstate(over="ignore"):
                xh = np.asarray(x64).astype(dtype)
            want = mxcore.quantize_tensor(xh, fmt)
            got = mxcore.quantize_tensor(dev(xh, lib), fmt)
            assert got.device == lib and kind_of(got.scale) == lib
            same_bits(host(got.codes), want.codes)
            assert int(host(got.scale_exp)) == want.scale_exp and float(host(got.scale)) == want.scale
            for dtype_out in (np.float32, np.float64):
                h, w = host(mxcore.dequantize(got, dtype=dtype_out)), mxcore.dequantize(want, dtype=dtype_out)
                assert np.array_equal(np.isnan(h), np.isnan(w))
                same_bits(np.where(np.isnan(w), 0, h), np.where(np.isnan(w), 0, w))
    every = np.arange(1 << 16, dtype=np.uint16)  # every 16-bit pattern (fast kernels: 65536 is a multiple of 16)
    for dtype in (np.float16, ml_dtypes.bfloat16):
        if lib == "cupy" and dtype == ml_dtypes.bfloat16:
            continue
        xh = rng.permutation(every).view(dtype)
        if not spec.has_nan:
            xh = xh[~np.isnan(xh.astype(np.float32))][:65520]
        for xs in (xh, np.concatenate([xh, xh[::-1]])):  # one CTA, and the two-kernel path
            want = mxcore.quantize_tensor(xs, fmt)
            got = mxcore.quantize_tensor(dev(xs, lib), fmt)
            same_bits(host(got.codes), want.codes)
            assert int(host(got.scale_exp)) == want.scale_exp
    x64 = np.array([1.0, 1e300, -1e-300, 5e-324])  # float64 only: clamps of the exponent, exact rounding
    same_bits(host(mxcore.quantize_tensor(dev(x64, lib), fmt).codes), mxcore.quantize_tensor(x64, fmt).codes)
    if not spec.has_nan:
        with pytest.raises(FormatError):
            mxcore.quantize_tensor(dev(np.array([np.nan, 1.0], np.float32), lib), fmt)


@pytest.mark.parametrize("lib", LIBS)
def test_finite_amax_and_a_given_amax(lib, rng):
    """codec.finite_amax (one reduction; NaN/inf ignored; empty and all-zero: 0) equals numpy's for every input
    dtype and both run lengths; quantize_tensor(x, amax=) on the device equals the host's with the same amax
    (a shard scaled by its whole tensor's magnitude)."""
    from mxcore.mx import _codec

    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        if lib == "cupy" and dtype == ml_dtypes.bfloat16:
            continue
        for n in (1024, 1000, 0):
            x = (rng.standard_normal(n) * 2.0 ** rng.integers(-12, 12, n)).astype(dtype)  # finite in float16
            if n:
                x[[3, 7]] = [np.inf, np.nan]
            got = _codec().finite_amax(dev(x, lib))
            assert tuple(got.shape) == () and str(got.dtype).replace("torch.", "") == np.dtype(dtype).name
            fin = x.astype(np.float64)[np.isfinite(x.astype(np.float64))]
            value = host(got.reshape(1), view=np.dtype(dtype))[0]  # host() keeps raw bits: read them as dtype
            assert float(value) == float(np.abs(fin).max(initial=0.0)), (dtype, n)
        whole = (rng.standard_normal((64, 96)) * 10).astype(dtype)
        amax = np.abs(whole.astype(np.float64)).max()
        shard = np.ascontiguousarray(whole[:32])
        want = mxcore.quantize_tensor(shard, "e4m3fn", amax=amax)
        d_amax = _codec().finite_amax(dev(whole, lib))
        got = mxcore.quantize_tensor(dev(shard, lib), "e4m3fn", amax=d_amax)
        same_bits(host(got.codes), want.codes)
        assert float(host(got.scale)) == want.scale


@pytest.mark.parametrize("lib", LIBS)
def test_quantize_tensor_column_major(lib, rng):
    """order='F' on the device: the transposing kernel (both dimensions multiples of 64: tiles, tiny and special
    values) and the copy fallback give the host path's codes, column-major (K contiguous)."""
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        if lib == "cupy" and dtype == ml_dtypes.bfloat16:
            continue
        for shape, mag in (((128, 192), 0), ((64, 64), -140), ((96, 80), 3)):
            x = (rng.standard_normal(shape) * 2.0 ** mag).astype(dtype)
            if mag == 3:
                x[5, 7], x[6, 1] = np.inf, np.nan
            want = mxcore.quantize_tensor(x, "e4m3fn", order="F")
            got = mxcore.quantize_tensor(dev(x, lib), "e4m3fn", order="F")
            stride = got.codes.strides if lib == "cupy" else got.codes.stride()
            assert stride == (1, shape[0]), stride  # column-major bytes
            same_bits(host(got.codes), want.codes)
            assert int(host(got.scale_exp)) == want.scale_exp


# ---- streams and devices ------------------------------------------------------------------------------------------
def test_torch_non_default_stream(rng):
    import torch

    src = torch.from_numpy(rng.standard_normal((1024, 1024)).astype(np.float32)).cuda()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.zeros_like(src)
        torch.cuda._sleep(100_000_000)  # the copy below lands late: a kernel on another stream would read zeros
        x.copy_(src)
        q = mxcore.quantize_mx(x, "mxfp8")
        t = mxcore.quantize_tensor(x, "e4m3fn")
    s.synchronize()
    want = mxcore.quantize_mx(src.cpu().numpy(), "mxfp8")
    same_bits(host(q.codes), want.codes)
    same_bits(host(t.codes), mxcore.quantize_tensor(src.cpu().numpy(), "e4m3fn").codes)


def test_cupy_non_default_stream(rng):
    import cupy

    spin = cupy.RawKernel(r'''extern "C" __global__ void spin(long long n) {
        long long t0 = clock64(); while (clock64() - t0 < n) {} }''', "spin")
    src = rng.standard_normal((1024, 1024)).astype(np.float32)
    with cupy.cuda.Stream(non_blocking=True) as s:
        x = cupy.zeros(src.shape, cupy.float32)
        spin((1,), (1,), (np.int64(200_000_000),))
        x.set(src, stream=s)
        q = mxcore.quantize_mx(x, "mxfp4", scale_rounding="rceil")
        s.synchronize()
    same_bits(host(q.codes), mxcore.quantize_mx(src, "mxfp4", scale_rounding="rceil").codes)


def test_second_device_if_present(rng):
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("one GPU")
    import torch

    x = rng.standard_normal((64, 96)).astype(np.float32)
    with cupy.cuda.Device(1):
        xc = cupy.asarray(x)
    q = mxcore.quantize_mx(xc, "mxfp8")
    assert q.codes.device.id == 1
    same_bits(host(q.codes), mxcore.quantize_mx(x, "mxfp8").codes)
    qt = mxcore.quantize_mx(torch.from_numpy(x).to("cuda:1"), "mxfp8")
    assert qt.codes.device.index == 1
    same_bits(host(qt.codes), mxcore.quantize_mx(x, "mxfp8").codes)
