"""mxcore.mx: OCP MX block quantization and per-tensor scaling; golden values and edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mxcore import formats as F
from mxcore import mx
from mxcore.errors import FormatError, InputTypeError, ShapeError, UnknownNameError, UnsupportedError

MX_NAMES = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"]
EMAX = {"mxfp8_e4m3": 8, "mxfp8_e5m2": 15, "mxfp6_e2m3": 2, "mxfp6_e3m2": 4, "mxfp4": 2}


def _block(values, k=32):
    x = np.zeros((1, k))
    x[0, : len(values)] = values
    return x


def _scale_exp(t):
    return t.scales.astype(np.int64) - 127


# ---- golden values -------------------------------------------------------------------------------
def test_golden_e4m3_amax_500():
    x = _block([500.0, 1.0, -3.0])
    fl = mx.quantize_mx(x, "mxfp8")
    assert fl.fmt == "mxfp8_e4m3" and fl.scales.tolist() == [[127]]  # floor: 2^(8 - 8) = 2^0
    assert F.decode(fl.codes[0, 0], "e4m3fn") == 448.0  # elements saturate
    assert mx.dequantize(fl)[0, :3].tolist() == [448.0, 1.0, -3.0]
    rc = mx.quantize_mx(x, "mxfp8", scale_rounding="rceil")
    assert rc.scales.tolist() == [[128]]  # rceil: 2^ceil(log2(500 / 448)) = 2^1
    assert mx.dequantize(rc)[0, :3].tolist() == [512.0, 1.0, -3.0]  # 250 -> 256 (nearest), no clipping


def test_golden_e2m1_amax_7():
    x = _block([7.0, 0.75, -1.25])
    fl = mx.quantize_mx(x, "mxfp4")
    assert fl.scales.tolist() == [[127]]
    assert mx.dequantize(fl)[0, :3].tolist() == [6.0, 1.0, -1.0]  # 7 -> 6 (saturate); ties to even
    rc = mx.quantize_mx(x, "mxfp4", scale_rounding="rceil")
    assert rc.scales.tolist() == [[128]]  # 2^ceil(log2(7/6))
    assert mx.dequantize(rc)[0, :3].tolist() == [8.0, 1.0, -1.0]  # 3.5 -> 4 (tie, even); 0.375 -> 0.5; 0.625 -> 0.5


@pytest.mark.parametrize("name", MX_NAMES)
def test_floor_scale_is_ocp_shared_exponent(name):
    # amax in [2^e, 2^(e+1)) gives shared_exp = e - emax_elem, for many e
    e = np.arange(-100, 101, 7)
    x = np.zeros((e.size, 32))
    x[:, 3] = np.ldexp(1.0, e) * 1.9
    x[:, 4] = -np.ldexp(1.0, e)
    t = mx.quantize_mx(x, name)
    assert np.array_equal(_scale_exp(t)[:, 0], np.clip(e - EMAX[name], -127, 127))
    assert F.get(t.element).emax == EMAX[name]


def _rceil_oracle(amax, max_normal):
    """Smallest k with amax <= max_normal * 2^k, by exact rational arithmetic."""
    from fractions import Fraction

    r = Fraction(amax) / Fraction(max_normal)
    k = math.floor(math.log2(r)) - 1
    while Fraction(2) ** k < r:
        k += 1
    return k


@pytest.mark.parametrize("name", MX_NAMES)
def test_rceil_scale_is_exact_at_powers_of_two(name):
    spec = F.get(mx.mx_element(name)[1])
    ks = np.arange(-90, 91, 9)
    at = np.ldexp(spec.max_normal, ks)  # exactly max * 2^k: scale 2^k, nothing clips
    above = np.nextafter(at, np.inf)  # a hair above: 2^(k+1)
    rng = np.random.default_rng(3)
    rand = np.abs(rng.standard_normal(40)) * np.exp2(rng.integers(-80, 80, 40))
    amax = np.concatenate([at, above, rand])
    x = np.zeros((amax.size, 32))
    x[:, 7] = amax
    t = mx.quantize_mx(x, name, scale_rounding="rceil")
    want = [_rceil_oracle(float(a), spec.max_normal) for a in amax]
    assert _scale_exp(t)[:, 0].tolist() == want
    assert np.array_equal(mx.dequantize(t, np.float64)[: ks.size, 7], at)  # max*2^k is stored exactly


def test_elements_are_rne_of_x_over_scale_then_saturated():
    """quantize_mx agrees with an independent per-block computation (python frexp + round_to)."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((16, 96)) * np.exp2(rng.integers(-20, 20, (16, 1)))
    x[3, 40] = 0.0
    for name, elem in [("mxfp8", "e4m3fn"), ("mxfp6_e3m2", "e3m2"), ("mxfp4", "e2m1")]:
        t = mx.quantize_mx(x, name)
        emax = F.get(elem).emax
        for i in range(x.shape[0]):
            for b in range(3):
                blk = x[i, 32 * b : 32 * b + 32]
                amax = max(abs(float(v)) for v in blk)
                shared = math.frexp(amax)[1] - 1 - emax
                assert int(t.scales[i, b]) == shared + 127
                want = F.round_to(blk / 2.0**shared, elem) * 2.0**shared
                assert np.array_equal(mx.dequantize(t, np.float64)[i, 32 * b : 32 * b + 32], want)


# ---- special blocks ------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["floor", "rceil"])
def test_all_zero_block_gets_scale_code_0(policy):
    x = np.zeros((2, 64))
    x[0, 40] = 1.0
    x[1, 3] = -0.0
    t = mx.quantize_mx(x, "mxfp8", scale_rounding=policy)
    assert t.scales[0, 0] == 0x00 and t.scales[1, 0] == 0x00 and t.scales[1, 1] == 0x00
    assert t.scales[0, 1] != 0x00
    d = mx.dequantize(t)
    assert np.array_equal(d, x) and np.signbit(d[1, 3])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", MX_NAMES)
def test_nan_or_inf_poisons_exactly_its_block(name, bad):
    x = np.ones((2, 70))
    x[1, 33] = bad
    t = mx.quantize_mx(x, name)
    assert t.scales[1, 1] == 0xFF
    assert np.count_nonzero(t.scales == 0xFF) == 1
    d = mx.dequantize(t)
    assert np.isnan(d[1, 32:64]).all()
    assert not np.isnan(d[1, :32]).any() and not np.isnan(d[1, 64:]).any() and not np.isnan(d[0]).any()
    assert np.array_equal(d[0], np.ones(70, np.float32))


def test_exponent_clamped_to_e8m0_range():
    x = np.zeros((4, 32))
    x[0, 0] = 2.0**-130  # floor: -130 - 8 = -138 -> -127; 2^-130 / 2^-127 = 2^-3, representable
    x[1, 0] = 2.0**-140  # -> -127; 2^-13 is below e4m3fn's min subnormal 2^-9: rounds to 0
    x[2, 0] = 2.0**200  # floor: 192 -> 127; 2^73 saturates to 448
    x[3, 0] = -(2.0**130)  # 130 - 8 = 122: in range
    t = mx.quantize_mx(x, "mxfp8")
    assert _scale_exp(t)[:, 0].tolist() == [-127, -127, 127, 122]
    d64 = mx.dequantize(t, dtype=np.float64)
    assert d64[:, 0].tolist() == [2.0**-130, 0.0, 448 * 2.0**127, -(2.0**130)]
    d32 = mx.dequantize(t)
    assert d32.dtype == np.float32 and d32[2, 0] == np.inf and d32[0, 0] == np.float32(2.0**-130)
    r = mx.quantize_mx(x, "mxfp8", scale_rounding="rceil")
    assert _scale_exp(r)[:, 0].tolist() == [-127, -127, 127, 122]


# ---- padding and axes ----------------------------------------------------------------------------
def test_partial_last_block_is_scaled_from_its_real_elements():
    x = np.full((3, 33), 100.0)
    x[:, 32] = 1.0
    t = mx.quantize_mx(x, "mxfp8")
    assert t.codes.shape == (3, 33) and t.scales.shape == (3, 2) and t.shape == (3, 33)
    assert t.scales[:, 1].tolist() == [127 - 8] * 3  # from the real element 1.0 only
    assert np.array_equal(mx.dequantize(t)[:, 32], np.ones(3, np.float32))
    padded = np.concatenate([x, np.zeros((3, 31))], axis=1)
    tp = mx.quantize_mx(padded, "mxfp8")
    assert np.array_equal(tp.scales, t.scales) and np.array_equal(tp.codes[:, :33], t.codes)
    for k in (1, 31, 32, 63, 65):
        y = np.random.default_rng(k).standard_normal((2, k))
        q = mx.quantize_mx(y, "mxfp4")
        assert q.scales.shape == (2, -(-k // 32)) and mx.dequantize(q).shape == (2, k)
    empty = mx.quantize_mx(np.zeros((4, 0)), "mxfp4")
    assert empty.scales.shape == (4, 0) and mx.dequantize(empty).shape == (4, 0)


def test_axis0_is_the_transpose_of_axis_last():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((8, 70)).astype(np.float32)
    ta = mx.quantize_mx(a, "mxfp6", axis=-1)
    tb = mx.quantize_mx(a.T, "mxfp6", axis=0)
    assert ta.axis == 1 and tb.axis == 0 and tb.scales.shape == (3, 8)
    assert np.array_equal(tb.codes, ta.codes.T) and np.array_equal(tb.scales, ta.scales.T)
    assert np.array_equal(mx.dequantize(tb), mx.dequantize(ta).T)
    c = rng.standard_normal((2, 40, 3))
    t3 = mx.quantize_mx(c, "mxfp8_e5m2", axis=1)
    assert t3.scales.shape == (2, 2, 3)
    ref = mx.quantize_mx(np.moveaxis(c, 1, -1), "mxfp8_e5m2")
    assert np.array_equal(np.moveaxis(t3.scales, 1, -1), ref.scales)


# ---- accuracy ------------------------------------------------------------------------------------
def _sqnr_db(x, y):
    x = x.astype(np.float64)
    return 10 * np.log10(np.sum(x * x) / np.sum((x - y) ** 2))


@pytest.mark.parametrize("name,bound", [("mxfp8_e4m3", 30.0), ("mxfp4", 18.0)])
def test_sqnr_on_standard_normal(name, bound):
    x = np.random.default_rng(2025).standard_normal((4096, 1024)).astype(np.float32)
    t = mx.quantize_mx(x, name, scale_rounding="floor")
    assert _sqnr_db(x, mx.dequantize(t, np.float64)) >= bound


# ---- per-tensor scaling --------------------------------------------------------------------------
def test_quantize_tensor_scale_rule():
    cases = [(500.0, 2.0), (448.0, 1.0), (float(np.nextafter(448.0, 1e9)), 2.0), (1.0, 2.0**-8), (0.0, 1.0)]
    for amax, scale in cases:
        t = mx.quantize_tensor(np.array([amax, -amax / 3, 0.1 * amax]), "fp8")
        assert t.fmt == "e4m3fn" and t.scale == scale, (amax, t.scale)
        assert np.abs(mx.dequantize(t, np.float64)).max() <= 448 * scale
    rng = np.random.default_rng(6)
    x = rng.standard_normal((64, 64)) * 1000
    for fmt in ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"):
        t = mx.quantize_tensor(x, fmt)
        spec = F.get(fmt)
        amax = np.abs(x).max()
        assert amax / t.scale <= spec.max_normal < 2 * amax / t.scale  # fits, and a smaller scale would not
        assert np.array_equal(mx.dequantize(t, np.float64), F.round_to(x / t.scale, fmt) * t.scale)
    assert mx.quantize_tensor(np.zeros(3, np.float32), "e5m2").scale == 1.0
    assert mx.quantize_tensor(np.array([1e-45], np.float32), "e4m3fn").scale == 2.0**-126
    assert mx.quantize_tensor(np.array([1e300]), "e4m3fn").scale == 2.0**127


def test_quantize_tensor_with_a_given_amax():
    """amax= scales a shard by the whole tensor's magnitude: the shard's codes and scale are those of the whole
    tensor; an amax below the shard's own is refused."""
    rng = np.random.default_rng(3)
    whole = (rng.standard_normal((8, 64)) * 2.0 ** rng.integers(-6, 6, (8, 1))).astype(np.float32)
    full = mx.quantize_tensor(whole, "e4m3fn")
    amax = float(np.abs(whole).max())
    for rows in (slice(0, 4), slice(4, 8)):
        part = mx.quantize_tensor(whole[rows], "e4m3fn", amax=amax)
        assert part.scale == full.scale
        assert np.array_equal(part.codes, full.codes[rows])
    assert mx.quantize_tensor(whole[:4], "e5m2", amax=np.float32(amax)).scale == mx.quantize_tensor(whole, "e5m2").scale
    with pytest.raises(ShapeError, match="below"):
        mx.quantize_tensor(whole, "e4m3fn", amax=amax / 2)


def test_quantize_tensor_column_major_codes():
    """order='F' gives the same codes in column-major memory (B [K, N] as the fp8 GEMMs read it); other orders
    and non-2-D arrays are refused."""
    x = np.random.default_rng(4).standard_normal((64, 96)).astype(np.float32)
    c, f = mx.quantize_tensor(x, "e4m3fn"), mx.quantize_tensor(x, "e4m3fn", order="F")
    assert f.codes.flags.f_contiguous and np.array_equal(f.codes, c.codes) and f.scale == c.scale
    with pytest.raises(UnsupportedError, match="order"):
        mx.quantize_tensor(x, "e4m3fn", order="K")
    with pytest.raises(ShapeError, match="2-D"):
        mx.quantize_tensor(x.ravel(), "e4m3fn", order="F")


def test_quantize_tensor_nonfinite():
    t = mx.quantize_tensor(np.array([np.nan, np.inf, -np.inf, 3.0, -1000.0]), "e4m3fn")
    assert t.scale == 4.0  # 1000 / 448 -> 2^2, from the finite values
    assert t.codes.tolist()[:3] == [0x7F, 0x7F, 0xFF]
    d = mx.dequantize(t, np.float64)
    assert np.isnan(d[:3]).all() and d[3:].tolist() == [3.0, -1024.0]  # 250 -> 256
    t5 = mx.quantize_tensor(np.array([np.inf, -np.inf, np.nan, 1.0]), "e5m2")
    assert mx.dequantize(t5, np.float64)[:2].tolist() == [np.inf, -np.inf]
    assert t5.scale == 2.0**-15  # 1 / 57344 -> 2^-15


# ---- API details ---------------------------------------------------------------------------------
def test_names_aliases_and_errors():
    assert mx.quantize_mx(np.ones(32), "MXFP8").fmt == "mxfp8_e4m3"
    assert mx.quantize_mx(np.ones(32), "mxfp6").fmt == "mxfp6_e2m3"
    for bad in ("fp8", "mxfp3", "e2m1"):
        with pytest.raises(UnknownNameError):
            mx.quantize_mx(np.ones(32), bad)
    with pytest.raises(UnsupportedError):
        mx.quantize_mx(np.ones(32), "mxfp4", scale_rounding="ceil")
    with pytest.raises(InputTypeError):
        mx.quantize_mx(np.arange(32), "mxfp4")
    with pytest.raises(ShapeError):
        mx.quantize_mx(np.ones((2, 32)), "mxfp4", axis=2)
    with pytest.raises(ShapeError):
        mx.MXTensor(np.zeros((2, 40), np.uint8), np.zeros((2, 1), np.uint8), "mxfp4", 1)
    with pytest.raises(FormatError):
        mx.MXTensor(np.full((2, 4), 0x10, np.uint8), np.zeros((2, 1), np.uint8), "mxfp4", 1)
    with pytest.raises(InputTypeError):
        mx.dequantize(np.ones(3))
    with pytest.raises(FormatError):
        mx.ScaledTensor(np.zeros(2, np.uint8), 3.0, "e4m3fn")
    t = mx.MXTensor(np.zeros((2, 40), np.uint8), np.full((2, 2), 127, np.uint8), "mxfp4", 1)
    assert t.shape == (2, 40) and t.element == "e2m1" and "mxfp4" in repr(t)
    assert mx.dequantize(mx.ScaledTensor(np.array([0x38], np.uint8), 0.5, "fp8")).tolist() == [0.5]


@pytest.mark.parametrize("name,bits", [("mxfp4", 4), ("mxfp6_e3m2", 6), ("mxfp8", 8)])
def test_packed_along_block_axis(name, bits):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((64, 6))
    t = mx.quantize_mx(x, name, axis=0)
    p = t.packed()
    assert p.dtype == np.uint8 and p.shape == (64 * bits // 8, 6)
    unpack = {4: F.unpack_fp4, 6: F.unpack_fp6, 8: lambda c, n: c}[bits]
    assert np.array_equal(np.moveaxis(unpack(np.moveaxis(p, 0, -1), 64), -1, 0), t.codes)


def test_block_longer_than_the_axis_is_refused_without_allocating():
    x = np.ones((2, 40), np.float32)
    with pytest.raises(ShapeError, match="block=1000000000 is longer"):
        mx.quantize_mx(x, "mxfp8", block=10**9)
    with pytest.raises(ShapeError, match="positive integer"):
        mx.quantize_mx(x, "mxfp8", block=0)
    with pytest.raises(ShapeError, match="positive integer"):
        mx.quantize_mx(x, "mxfp8", block=True)
    # a short axis keeps the OCP block of 32 (one partial block), and a block up to K is allowed
    assert mx.quantize_mx(x[:, :10], "mxfp8").scales.shape == (2, 1)
    assert mx.quantize_mx(x, "mxfp8", block=40).scales.shape == (2, 1)


def test_device_quantize_checks_before_device_work():
    """Block, axis and policy errors on device data are raised before anything touches the device."""

    class Fake:
        shape, dtype = (4, 64), np.dtype(np.float32)

        def __dlpack_device__(self):
            return (2, 0)

    with pytest.raises(ShapeError, match="longer"):
        mx.quantize_mx(Fake(), "mxfp8", block=10**9)
    with pytest.raises(ShapeError, match="axis"):
        mx.quantize_mx(Fake(), "mxfp8", axis=5)
    with pytest.raises(UnsupportedError, match="scale_rounding"):
        mx.quantize_mx(Fake(), "mxfp8", scale_rounding="ceil")
    with pytest.raises(UnsupportedError, match="signed format"):
        mx.quantize_tensor(Fake(), "e8m0")


def test_mxtensor_host_fields_and_round_trip_helpers():
    x = np.linspace(-3, 3, 2 * 70).reshape(2, 70).astype(np.float32)
    x[1, 40:] = np.nan
    t = mx.quantize_mx(x, "mxfp4")
    assert t.device is None and t.to_host() is t and mx.to_host(t) is t
    finite = t.scales[t.scales != 0xFF]
    assert t.scale_max == int(finite.max())
    allnan = mx.MXTensor(np.zeros((1, 4), np.uint8), np.full((1, 1), 0xFF, np.uint8), "mxfp4", 1)
    assert allnan.scale_max == 127
    s = mx.quantize_tensor(np.array([1.0, 300.0]), "e4m3fn")
    assert s.scale == 2.0 ** s.scale_exp and s.to_host() is s
    with pytest.raises(InputTypeError, match="same place"):
        mx.MXTensor(np.zeros((1, 4), np.uint8), type("D", (), {"__dlpack_device__": lambda self: (2, 0)})(),
                    "mxfp4", 1)
    with pytest.raises(InputTypeError):
        mx.to_device(t, like=np.zeros(3))


def test_host_quantize_takes_every_float_layout_and_dtype_alike():
    """float16 / bfloat16 / float32 / float64 inputs of the same values, big-endian and strided arrays and lists
    give the same codes and scales (the host path widens to float32 or keeps float64, never rounds)."""
    import ml_dtypes

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((8, 96)) * np.exp2(rng.integers(-14, 10, (8, 1)))).astype(np.float16)
    ref = mx.quantize_mx(x.astype(np.float32), "mxfp8")
    for y in (x, x.astype(np.float64), x.astype(">f4"), x.astype(np.float64).tolist(),
              np.asfortranarray(x.astype(np.float32))):
        t = mx.quantize_mx(y, "mxfp8")
        assert np.array_equal(t.codes, ref.codes) and np.array_equal(t.scales, ref.scales)
    xb = x.astype(ml_dtypes.bfloat16)
    tb, tf = mx.quantize_mx(xb, "mxfp4"), mx.quantize_mx(xb.astype(np.float32), "mxfp4")
    assert np.array_equal(tb.codes, tf.codes) and np.array_equal(tb.scales, tf.scales)
    wide = np.zeros((96, 8 * 3), np.float32)[:, ::3]  # strided, blocks along axis 0
    wide[:] = x.T
    t0 = mx.quantize_mx(wide, "mxfp8", axis=0)
    assert np.array_equal(t0.codes, ref.codes.T) and np.array_equal(t0.scales, ref.scales.T)
    s = mx.quantize_tensor(x, "e4m3fn")
    assert np.array_equal(s.codes, mx.quantize_tensor(x.astype(np.float64), "e4m3fn").codes)
    assert mx.dequantize(ref).dtype == np.float32 and mx.dequantize(ref, np.float64).dtype == np.float64


def test_bench_host_rows_and_cli(capsys):
    from mxcore.tools import bench_quant

    rows = bench_quant.bench_host(64, 64, formats=("mxfp4",), repeats=1)
    names = [r["what"] for r in rows]
    assert names[0] == "ml_dtypes cast f32 -> float8_e4m3fn" and rows[0]["x cast"] == 1.0
    assert {"quantize_mx mxfp4 floor", "quantize_mx mxfp4 rceil", "quantize_tensor fp8", "dequantize mxfp4",
            "dequantize fp8 (per tensor)"} <= set(names)
    for r in rows:
        assert r["ms"] > 0 and r["GB/s"] > 0 and r["x cast"] == pytest.approx(r["ms"] / rows[0]["ms"])
    assert bench_quant.main(["--host", "--size", "64", "32", "--formats", "mxfp8"]) == 0
    out = capsys.readouterr().out
    assert "64x32 float32" in out and "quantize_mx mxfp8 rceil" in out and "x cast" in out
