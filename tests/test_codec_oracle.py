"""The fast host codecs (ml_dtypes casts, mxcore._codec_host) against the exact float64 codec
(mxcore._codec_exact), bit for bit: every code, every midpoint and its neighbours, overflow edges,
±0, ±inf, NaN, subnormals of the input and of the format, random bit patterns; every format, rounding,
overflow and NaN policy, input dtype; and the MX / per-tensor quantizers and dequantizers."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mxcore import _codec_exact as X
from mxcore import _codec_host as H
from mxcore import formats as F
from mxcore import mx
from mxcore.errors import FormatError

INPUTS = (np.float32, np.float64, np.float16, ml_dtypes.bfloat16)
POLICIES = [(o, n) for o in ("saturate", "nan") for n in ("raise", "zero")]


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def _candidates(spec, seed: int = 0) -> dict[str, np.ndarray]:
    """Per input dtype: each value of the format, each midpoint, their float64 and float32 neighbours, the
    overflow and underflow edges, ±0, ±inf, NaN, float32/float64 subnormals, and random bit patterns (every
    pattern for 16-bit inputs)."""
    rng = np.random.default_rng(seed)
    codes = np.arange(1 << spec.bits) if spec.bits <= 8 else rng.integers(0, 1 << spec.bits, 4096)
    v = np.unique(np.abs(X.decode(codes, spec, dtype=np.float64)))
    v = v[np.isfinite(v)]
    mids = (v[:-1] + v[1:]) / 2
    ulp = 2.0 ** (spec.emax - spec.mbits)
    edges = np.array([spec.max_normal + ulp / 2, spec.max_normal + ulp, spec.max_normal * 1.5, 2.0 ** (spec.emax + 1),
                      spec.min_subnormal / 2, 0.75 * spec.min_subnormal, 2.0 ** -126, 2.0 ** -127, 1.5 * 2.0 ** -127,
                      1.25 * 2.0 ** -127, 2.0 ** -149, 2.0 ** -150, 3 * 2.0 ** -150, 3.4028234663852886e38, 2.0 ** 128,
                      1.5 * 2.0 ** 127, 1e300, 2.0 ** -1022, 5e-324, 0.0, np.inf, np.nan])
    with np.errstate(over="ignore"):
        f32 = mids.astype(np.float32)
        pos = np.concatenate([v, mids, np.nextafter(mids, np.inf), np.nextafter(mids, 0), np.nextafter(v, np.inf),
                              np.nextafter(v, 0), np.nextafter(f32, np.float32(np.inf)).astype(np.float64),
                              np.nextafter(f32, np.float32(0)).astype(np.float64), edges])
    x = np.concatenate([pos, -pos])
    out = {}
    for dt in INPUTS:
        with np.errstate(over="ignore"):
            a = x.astype(dt)
        ui = np.dtype(f"u{np.dtype(dt).itemsize}")
        rand = (np.arange(1 << 16, dtype=np.uint16) if ui.itemsize == 2
                else rng.integers(0, np.iinfo(ui).max, 20000, dtype=ui, endpoint=True))
        out[np.dtype(dt).name] = np.concatenate([a, rand.view(dt)])
    return out


def _equal_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    bad = np.flatnonzero(_bits(got).ravel() != _bits(want).ravel())
    assert bad.size == 0, (bad[:5], got.ravel()[bad[:5]], want.ravel()[bad[:5]])


def _same(fast, exact, *args, **kw):
    """``fast(*args, **kw)`` and ``exact(*args, **kw)`` give the same bits, or raise the same FormatError."""
    try:
        want = exact(*args, **kw)
    except FormatError as e:
        with pytest.raises(FormatError) as got:
            fast(*args, **kw)
        assert str(got.value) == str(e)
        return
    _equal_bits(fast(*args, **kw), want)


@pytest.mark.parametrize("rounding", ["rne", "rtz", "stochastic"])
@pytest.mark.parametrize("name", F.names())
def test_encode_and_round_to_match_the_exact_codec(name, rounding):
    spec = F.get(name)
    for x in _candidates(spec).values():
        for overflow, nan in POLICIES:
            if spec.has_nan and nan == "zero":
                continue  # the NaN policy is only read for formats without NaN
            kw = {"rounding": rounding, "overflow": overflow, "nan": nan, "rng": 7}
            _same(F.encode, X.encode, x, spec, **kw)  # the public encode is the fast one
            _same(H.round_to, X.round_to, x, spec, **kw)
            if not spec.has_nan:
                _same(H.round_to, X.round_to, x, spec, **{**kw, "nan": "propagate"})


@pytest.mark.parametrize("name", ["e4m3fn", "e4m3fnuz", "e5m2", "e2m1", "e3m2", "e8m0", "bf16", "fp16"])
def test_float64_rounded_to_odd_through_float32(monkeypatch, name):
    """The path for ml_dtypes < 0.7 (float64 cast through float32 twice): float64 is first rounded to odd
    into float32; the codes stay those of one rounding, around every midpoint and far outside float32."""
    monkeypatch.setattr(H, "_F64_ONCE", False)
    spec = F.get(name)
    x = _candidates(spec, seed=3)["float64"]
    rng = np.random.default_rng(4)
    near = np.repeat(x[np.isfinite(x)], 4) * (1 + rng.integers(-3, 4, 4 * int(np.isfinite(x).sum())) * 2.0 ** -40)
    x = np.concatenate([x, near])
    for rounding in ("rne", "rtz", "stochastic"):
        for overflow in ("saturate", "nan"):
            _same(H.encode, X.encode, x, spec, rounding=rounding, overflow=overflow, nan="zero", rng=1)


def test_round_to_odd_keeps_the_float64_side_of_every_float32_tie():
    x = np.array([1.0625 + 2.0**-40, 1.0625 - 2.0**-40, 1.0625, -(1.0625 + 2.0**-40), 1e300, -1e300, 1e-300, -0.0, 3.0])
    f = H._round_to_odd_f32(x)
    assert f.dtype == np.float32
    assert f[0] > 1.0625 > f[1] and f[2] == 1.0625 and f[3] < -1.0625
    assert f[4] == np.finfo(np.float32).max and f[5] == -np.finfo(np.float32).max
    assert f[6] == 2.0**-149 and np.signbit(f[7]) and f[7] == 0 and f[8] == 3.0


def test_decode_matches_the_exact_codec():
    for name in F.names():
        spec = F.get(name)
        codes = np.arange(1 << min(spec.bits, 16)).astype(spec.code_dtype)
        for dtype in (np.float32, np.float64, np.float16):
            with np.errstate(over="ignore"):  # e8m0 and fp32 in float16
                _same(F.decode, X.decode, codes, name, dtype=dtype)
        if spec.bits < 8:
            with pytest.raises(FormatError):
                F.decode(np.array([1 << spec.bits], np.uint8), name)


def _mx_inputs(seed: int = 0) -> list[np.ndarray]:
    """Blocks of every kind: normal data over a wide range of block magnitudes, amax on and around the
    element format's clipping point, all-zero and -0 blocks, NaN / inf blocks, float32 subnormals, blocks
    whose small elements underflow float32 when scaled, and blocks at the ends of E8M0's range."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((24, 96)) * np.exp2(rng.integers(-140, 120, (24, 1)))
    edge = np.ldexp(rng.uniform(1, 2, (16, 96)), rng.integers(-160, 128, (16, 96)))
    edge[:, ::7] = np.array([448, 464, 480, 500, 6, 6.5, 7, 7.5, 28, 30, 57344, 61440, 1.5, -0.0, 2.0**-149, 3.4e38])[
        :, None].repeat(14, axis=1)
    edge[0] = 0.0
    edge[1] = -0.0
    edge[2, 5] = np.nan
    edge[3, 40] = -np.inf
    edge[4, 80] = np.inf
    edge[5] = np.ldexp(1.0, rng.integers(-149, -126, 96))  # float32 subnormals only
    edge[6, ::2] = 2.0**127  # big amax: the small elements underflow after scaling
    x = np.concatenate([base, edge]) * np.where(rng.random((40, 96)) < 0.5, -1, 1)
    with np.errstate(over="ignore"):
        return [x.astype(np.float32), x, x.astype(np.float16), x.astype(ml_dtypes.bfloat16)]


@pytest.mark.parametrize("rceil", [False, True])
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"])
def test_quantize_mx_matches_the_exact_codec(fmt, rceil):
    _, spec = mx.mx_element(fmt)
    for x in _mx_inputs():
        for axis, block in ((1, 32), (0, 32), (1, 16), (1, 40), (0, 7)):
            got = mx.quantize_mx(x, fmt, axis=axis, block=block, scale_rounding="rceil" if rceil else "floor")
            codes, scales = X.quantize_mx(x, spec, axis=axis, block=block, rceil=rceil)
            assert np.array_equal(got.codes, codes) and np.array_equal(got.scales, scales), (x.dtype, axis, block)
            for dtype in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
                want = X.dequantize_mx(codes, scales, spec, axis=axis, block=block, dtype=dtype)
                _equal_bits(mx.dequantize(got, dtype=dtype), want)


@pytest.mark.parametrize("name", ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e2m1", "e3m2"])
def test_quantize_tensor_matches_the_exact_codec(name):
    spec = F.get(name)
    for x in _mx_inputs(1):
        for sub in (x[:24], x[7:8], x[:0], x):  # finite; one row; empty; with NaN / inf
            if not spec.has_nan and np.isnan(sub.astype(np.float64)).any():
                with pytest.raises(FormatError):
                    mx.quantize_tensor(sub, name)
                continue
            t = mx.quantize_tensor(sub, name)
            k = X.tensor_exponent(X.finite_amax(sub), spec)
            assert t.scale_exp == k
            assert np.array_equal(t.codes, X.encode_scaled(sub, spec, k))
            for dtype in (np.float32, np.float64, np.float16):
                _equal_bits(mx.dequantize(t, dtype=dtype), X.dequantize_tensor(t.codes, spec, k, dtype))
    codes = np.arange(1 << spec.bits, dtype=np.uint8)
    for e in (-160, -149, -140, -126, 0, 100, 127, 130):  # scales beyond float32's: the float64 path
        _same(H.dequantize_tensor, X.dequantize_tensor, codes, spec, e)


def test_quantize_mx_fast_path_on_a_large_array():
    """A 256 x 4096 float32 array (the shape of the benchmark, shorter): codes, scales and values agree."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((256, 4096), dtype=np.float32)
    for fmt in ("mxfp8", "mxfp4"):
        _, spec = mx.mx_element(fmt)
        t = mx.quantize_mx(x, fmt)
        codes, scales = X.quantize_mx(x, spec, axis=1, block=32, rceil=False)
        assert np.array_equal(t.codes, codes) and np.array_equal(t.scales, scales)
        _equal_bits(mx.dequantize(t), X.dequantize_mx(codes, scales, spec, axis=1, block=32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"])
def test_scale_exponents_at_every_binade_edge(fmt, dtype):
    """Block amax at max_normal * 2^k, one ulp either side, and at powers of two, for k over E8M0's range and
    beyond, and subnormal amax: the scales (read off the bits on the fast path) equal the exact ones."""
    _, spec = mx.mx_element(fmt)
    ks = np.arange(-150, 150) if dtype == np.float64 else np.arange(-140, 126)
    with np.errstate(over="ignore"):
        centre = np.concatenate([np.ldexp(spec.max_normal, ks), np.ldexp(1.0, ks)]).astype(dtype)
    centre = centre[np.isfinite(centre) & (centre > 0)]
    amax = np.concatenate([centre, np.nextafter(centre, dtype(np.inf)), np.nextafter(centre, dtype(0))])
    x = np.zeros((amax.size, 32), dtype)
    x[:, 3] = -amax
    x[:, 9] = amax / 3
    for rceil in (False, True):
        got = mx.quantize_mx(x, fmt, scale_rounding="rceil" if rceil else "floor")
        codes, scales = X.quantize_mx(x, spec, axis=1, block=32, rceil=rceil)
        assert np.array_equal(got.scales, scales) and np.array_equal(got.codes, codes)
