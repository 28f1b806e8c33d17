"""Property-based fuzzing of the public API: every bad argument raises an MXCoreError subclass, never another
exception and never a silent accept; every accepted call gives the reference result.

Deterministic (``derandomize=True``) and bounded (``max_examples``), so it runs in seconds on the CPU and fails
the same way on every machine.  Each generated argument carries whether it is valid, so an accepted invalid
argument fails as surely as a stray TypeError.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

import mxcore  # noqa: E402
from mxcore import dtypes, formats, layouts  # noqa: E402
from mxcore.errors import MXCoreError  # noqa: E402

FUZZ = settings(derandomize=True, max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

JUNK = st.sampled_from([None, "x", "", {}, object(), 1j, b"fp8", float("nan"), [[1.0], [1.0, 2.0]]])


def call(fn, *args, **kwargs):
    """(True, result) or (False, error); an exception outside the MXCoreError hierarchy fails the test."""
    try:
        return True, fn(*args, **kwargs)
    except MXCoreError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg.split(". ")[0], f"an error message must lead with one line: {msg!r}"
        return False, exc


def same(got, want) -> bool:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return got.shape == want.shape and bool(np.array_equal(got, want, equal_nan=True))


# ---- inputs: (value, valid) ----------------------------------------------------------------------------------

FLOATS = st.sampled_from([np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
SPECIALS = st.sampled_from([0.0, -0.0, 1.0, -3.5, 448.0, 1e-8, 6e4, 3e38, np.nan, np.inf, -np.inf])


@st.composite
def float_arrays(draw, min_dims=1, max_dims=3, finite=False):
    """A small float array (at most 4 x 4 x 70): one long axis, anywhere, so blocks of 32 are full or partial;
    seeded normal values over a drawn range of magnitudes, and a few specials (NaN, inf, 0, large, tiny)."""
    dims = draw(st.integers(min_dims, max_dims))
    shape = [draw(st.integers(1, 4)) for _ in range(dims - 1)]
    shape.insert(draw(st.integers(0, dims - 1)), draw(st.integers(1, 70)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal(shape) * 2.0 ** draw(st.integers(-20, 20))
    if not finite and draw(st.booleans()):
        flat = x.reshape(-1)
        for i in draw(st.lists(st.integers(0, flat.size - 1), max_size=3)):
            flat[i] = draw(SPECIALS)
    with np.errstate(over="ignore"):
        return x.astype(draw(FLOATS))


@st.composite
def values(draw, finite=False, min_dims=1):
    """An array argument and whether mxcore must take it (real floating-point data, any array-like of floats)."""
    kind = draw(st.sampled_from(["float"] * 6 + ["list", "int", "bool", "complex", "object", "string", "masked",
                                                  "junk"]))
    x = draw(float_arrays(finite=finite, min_dims=min_dims))
    if kind == "float":
        return x, True
    if kind == "list":
        return x.astype(np.float64).tolist(), True
    if kind == "int":
        return np.ones(x.shape, np.int32), False
    if kind == "bool":
        return np.ones(x.shape, bool), False
    if kind == "complex":
        return x.astype(np.complex64), False
    if kind == "object":
        return x.astype(object), False
    if kind == "string":
        return x.astype(np.float64).astype(str), False
    if kind == "masked":
        return np.ma.masked_array(x, mask=np.zeros(x.shape, bool)), False
    return draw(JUNK), False


MX_NAMES = ["mxfp8", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"]
FP8_NAMES = ["fp8", "e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e2m1", "e2m3", "e3m2"]


def names_or_junk(good, bad=("fp16", "mxfp9", "e9m9", "float32")):
    return st.one_of(st.sampled_from(good).map(lambda n: (n, True)), st.sampled_from(bad).map(lambda n: (n, False)),
                     JUNK.map(lambda v: (v, False)))


AXES = st.one_of(st.integers(-3, 2).map(lambda a: (a, None)), st.sampled_from([None, "0", 1.0, True, [0]])
                 .map(lambda a: (a, False)))


# ---- oracles: block scaling written out per block, from formats.round_to -----------------------------------------

def mx_oracle(x, fmt, axis, block=32, scale_rounding="floor"):
    """The MX v1.0 values of ``x`` (float64), one block at a time."""
    spec = formats.get(dtypes.MX_ELEMENT[dtypes.canonical_operand(fmt)])
    x = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx]
        for s in range(0, row.size, block):
            blk = row[s:s + block]
            if not np.isfinite(blk).all():
                out[idx][s:s + block] = np.nan
                continue
            amax = float(np.max(np.abs(blk)))
            if amax == 0:
                e = -127
            elif scale_rounding == "floor":  # floor(log2(amax)) - emax; frexp is exact where log2 may round
                e = int(np.frexp(amax)[1]) - 1 - spec.emax
            else:  # rceil: the smallest e with amax <= max_normal * 2^e
                e = int(np.frexp(amax)[1] - np.frexp(spec.max_normal)[1])
                while amax > np.ldexp(spec.max_normal, e):
                    e += 1
                while amax <= np.ldexp(spec.max_normal, e - 1):
                    e -= 1
            e = min(max(e, -127), 127)
            out[idx][s:s + block] = formats.round_to(np.ldexp(blk, -e), spec.name, overflow="saturate") * 2.0 ** e
    return np.moveaxis(out, -1, axis)


# ---- the properties --------------------------------------------------------------------------------------------

@FUZZ
@given(values(), names_or_junk(MX_NAMES), AXES, st.sampled_from([("floor", True), ("rceil", True), ("up", False),
                                                                   (None, False)]))
def test_quantize_mx(xv, fv, av, rv):
    (x, x_ok), (fmt, f_ok), (axis, a_ok), (rounding, r_ok) = xv, fv, av, rv
    ok, res = call(mxcore.quantize_mx, x, fmt, axis=axis, scale_rounding=rounding)
    ndim = np.ndim(x) if x_ok else 0
    valid = x_ok and f_ok and r_ok and a_ok is None and -ndim <= axis < ndim
    assert ok == valid, (type(x), fmt, axis, rounding, res)
    if ok:
        got = mxcore.dequantize(res, np.float64)
        assert same(got, mx_oracle(x, fmt, axis % ndim, scale_rounding=rounding))


@FUZZ
@given(values(), names_or_junk(FP8_NAMES, bad=("mxfp8", "fp16", "e8m0", "e9m9")),
       st.one_of(st.none().map(lambda a: (a, True)), st.floats(allow_nan=True, allow_infinity=True).map(
           lambda a: (a, None)), st.sampled_from([("1", False), (np.ones(3), False), ([1.0], False), (1j, False),
                                                  (True, False), (np.array(1e5), None), (np.float32(7.0), None)])))
def test_quantize_tensor(xv, fv, mv):
    (x, x_ok), (fmt, f_ok), (amax, m_ok) = xv, fv, mv
    ok, res = call(mxcore.quantize_tensor, x, fmt, amax=amax)
    if x_ok and f_ok and m_ok is None:  # a number: valid when finite, >= 0 and at least x's finite amax
        x64 = np.asarray(x, np.float64)
        own = float(np.max(np.abs(x64[np.isfinite(x64)]), initial=0.0))
        m_ok = bool(np.isfinite(amax) and amax >= own)
    valid = x_ok and f_ok and bool(m_ok)
    assert ok == valid, (type(x), fmt, amax, res)
    if ok:
        x64 = np.asarray(x, np.float64)
        spec = formats.get(fmt)
        got = mxcore.dequantize(res, np.float64)
        fin = np.isfinite(x64)
        with np.errstate(over="ignore"):
            want = formats.round_to(x64[fin] / res.scale, spec.name, overflow="saturate") * res.scale
        assert same(got[fin], want)
        assert np.isnan(got[np.isnan(x64)]).all()
        inf = np.isinf(x64)
        assert (np.isnan(got[inf]) if not spec.has_inf else got[inf] == x64[inf]).all()
        bound = float(np.max(np.abs(x64[fin]), initial=0.0)) if amax is None else float(amax)
        assert bound <= spec.max_normal * res.scale  # the scale fits the magnitude


DEQ_DTYPES = [(np.float32, True), (np.float64, True), (np.float16, True), (ml_dtypes.bfloat16, True),
              ("float16", True), (np.int32, False), (bool, False), (np.complex64, False), ("mxfp8", False),
              ("U3", False), (None, False), ({}, False), (object, False)]


@FUZZ
@given(float_arrays(min_dims=2, max_dims=2), st.sampled_from(DEQ_DTYPES), st.booleans(), st.booleans())
def test_dequantize(x, dv, mx_kind, wrap):
    dtype, d_ok = dv
    t = mxcore.quantize_mx(x, "mxfp8") if mx_kind else mxcore.quantize_tensor(x, "e5m2")
    arg = t if not wrap else np.asarray(x)
    ok, res = call(mxcore.dequantize, arg, dtype)
    assert ok == (d_ok and not wrap), (dtype, wrap, res)
    if ok:
        exact = mxcore.dequantize(t, np.float64)
        with np.errstate(over="ignore"):
            assert res.dtype == np.dtype(dtype) and same(res, exact.astype(dtype))


MATMUL_DTYPES = ["fp32", "tf32", "fp16", "bf16", "fp8", "e5m2", "mxfp8", "mxfp6", "mxfp4", ("mxfp8", "mxfp4"),
                 np.float16, None]


@pytest.fixture(scope="module")
def reference_everywhere():
    """backend "auto" and None mean the reference on every machine (the oracle these results are checked with)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MXCORE_BACKEND", "reference")
        yield


@st.composite
def matmul_args(draw):
    m, k, n = draw(st.integers(1, 6)), draw(st.integers(1, 70)), draw(st.integers(1, 6))
    dt = draw(FLOATS)

    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols)) * 4).astype(dt)

    a, b = matrix(m, k), matrix(k, n)
    if draw(st.booleans()):
        a[draw(st.integers(0, m - 1)), draw(st.integers(0, k - 1))] = draw(SPECIALS)
    return a, b


def _bad_operand(draw_kind, a):
    return {"int": np.ones(a.shape, np.int32), "bool": a > 0, "complex": a.astype(np.complex64),
            "object": a.astype(object), "string": a.astype(np.float64).astype(str), "masked": np.ma.masked_array(a),
            "list": a.tolist(), "1d": a.ravel(), "4d": a[None, None]}[draw_kind]


@FUZZ
@given(matmul_args(), st.sampled_from(["ok"] * 8 + ["int", "bool", "complex", "object", "string", "masked", "list",
                                                    "1d", "4d", "inner"]),
       st.one_of(st.sampled_from(MATMUL_DTYPES).map(lambda d: (d, True)),
                 st.sampled_from(["fp7", ("mxfp8",), ("a", "b", "c"), {}, 3, object()]).map(lambda d: (d, False))),
       st.sampled_from([("float32", True), ("float16", True), ("bfloat16", True), ("float64", True), ("int8", False),
                        (None, False), ({}, False)]),
       st.sampled_from([("reference", True), (None, True), ("auto", True), ("nope", False), (3, False), ([], False)]))
def test_matmul_reference(reference_everywhere, ab, bad, dv, ov, bv):
    (a, b), (dtype, d_ok), (out_dtype, o_ok), (backend, b_ok) = ab, dv, ov, bv
    if bad == "inner":
        b = np.concatenate([b, b[:1]])
    elif bad != "ok":
        a = _bad_operand(bad, a)
    ok, res = call(mxcore.matmul, a, b, dtype, out_dtype=out_dtype, backend=backend)
    assert ok == (bad == "ok" and d_ok and o_ok and b_ok), (bad, dtype, out_dtype, backend, res)
    if ok:
        want = mxcore.reference_matmul(a, b, dtype, out_dtype=out_dtype)
        assert res.dtype == want.dtype and same(res, want)
        if dtype == "fp32" and np.isfinite(a).all() and np.isfinite(b).all() and out_dtype == "float64":
            exact = a.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64)
            assert np.allclose(res, exact, rtol=1e-12, atol=1e-12)


@FUZZ
@given(st.integers(1, 3), st.sampled_from([16, 32, 64]), st.sampled_from(["mxfp8", "mxfp4"]))
def test_matmul_takes_mx_blocks_of_32_only(m, block, fmt):
    rng = np.random.default_rng(m)
    a, b = rng.standard_normal((m, 64)), rng.standard_normal((64, 4))
    qa = mxcore.quantize_mx(a, fmt, axis=1, block=block)
    qb = mxcore.quantize_mx(b, fmt, axis=0, block=block)
    ok, res = call(mxcore.matmul, qa, qb, fmt, backend="reference")
    assert ok == (block == 32), res
    if ok:
        assert same(res, mxcore.reference_matmul(a, b, fmt))


# ---- formats, layouts, dtypes ----------------------------------------------------------------------------------

ALL_FORMATS = list(formats.names())


@FUZZ
@given(values(), names_or_junk(ALL_FORMATS, bad=("e9m9", "mxfp8", "int8")),
       st.sampled_from([("rne", True), ("rtz", True), ("up", False), (None, False)]),
       st.sampled_from([("saturate", True), ("nan", True), ("wrap", False)]))
def test_formats_encode_round_decode(xv, fv, rv, ov):
    (x, x_ok), (fmt, f_ok), (rounding, r_ok), (overflow, o_ok) = xv, fv, rv, ov
    if isinstance(x, np.ma.MaskedArray):
        return  # formats.* do not look for masks yet: test_formats_refuse_masked_arrays
    ok, codes = call(formats.encode, x, fmt, rounding=rounding, overflow=overflow, nan="zero")
    valid = x_ok and f_ok and r_ok and o_ok and formats.get(fmt).signed
    if x_ok and f_ok and r_ok and o_ok and not formats.get(fmt).signed:  # e8m0: negative values are refused
        valid = ok
    assert ok == valid, (type(x), fmt, rounding, overflow, codes)
    if ok:
        ok2, back = call(formats.decode, codes, fmt, dtype=np.float64)
        assert ok2
        rounded = formats.round_to(x, fmt, rounding=rounding, overflow=overflow, nan="zero")
        assert same(back, rounded)


def test_formats_refuse_masked_arrays():
    """formats refuse masked arrays as quantize_mx / quantize_tensor / matmul do (the mask would be dropped)."""
    x = np.ma.masked_array([1.0, 2.0], mask=[False, True])
    for fn in (formats.encode, formats.round_to):
        with pytest.raises(MXCoreError, match="masked"):
            fn(x, "e4m3fn")
    with pytest.raises(MXCoreError, match="masked"):
        formats.decode(np.ma.masked_array([1, 2], mask=[False, True], dtype=np.uint8), "e4m3fn")


@FUZZ
@given(st.one_of(st.sampled_from(layouts.names(kind="all")[:40]), st.text(max_size=12), JUNK),
       st.sampled_from([None, "A", "B", "C", "D", "Z", "", "scale_a"]))
def test_layouts_lookups(name, operand):
    ok, lay = call(layouts.get, name)
    assert not ok or isinstance(name, str), (name, lay)
    if ok and operand is not None and hasattr(lay, "operand"):
        ok2, op = call(lay.operand, operand)
        assert not ok2 or (isinstance(operand, str) and op is not None), (name, operand)


def test_layout_operand_of_a_non_string():
    with pytest.raises(MXCoreError, match="string"):
        layouts.get("m16n8k16.f16").operand(3)


@FUZZ
@given(st.one_of(st.sampled_from(MATMUL_DTYPES + dtypes.known_names()), st.text(max_size=8), JUNK,
                 st.tuples(st.sampled_from(["fp8", "x", None]), st.sampled_from(["mxfp4", 1]))),
       st.sampled_from([None, "sm_80", "sm_90", "gfx942", "gfx950", "sm_1", "x"]),
       st.sampled_from([None, "nvidia", "amd", "intel", 3]))
def test_dtypes_and_layout_names(dtype, arch, vendor):
    ok, mdt = call(dtypes.resolve, dtype, arch)
    assert not ok or (mdt.a.name in dtypes.DTYPES and mdt.b.name in dtypes.DTYPES), (dtype, arch, mdt)
    ok, got = call(layouts.names, vendor, arch)
    assert not ok or (vendor in (None, "nvidia", "amd") and all(isinstance(n, str) for n in got)), (vendor, got)
