"""mxcore.matmul on the reference backend: numerics for every dtype, typed errors, array kinds."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import mxcore
from mxcore import dtypes, errors
from mxcore.backends import available, select

ALL_DTYPES = ["fp32", "tf32", "fp16", "bf16", "fp8", "e5m2", "e4m3fnuz", "e5m2fnuz", "mxfp8", "mxfp8_e5m2",
              "mxfp6", "mxfp6_e3m2", "mxfp4", ("mxfp8", "mxfp4"), ("mxfp6_e3m2", "mxfp8_e5m2"), ("e4m3", "e5m2")]

# relative Frobenius error vs float64 on standard-normal inputs, K=256 (quantization error of the inputs)
BOUND = {"fp32": 1e-6, "tf32": 2e-3, "fp16": 2e-3, "bf16": 1e-2, "e4m3fn": 0.08, "e5m2": 0.15, "e4m3fnuz": 0.08,
         "e5m2fnuz": 0.15, "mxfp8_e4m3": 0.08, "mxfp8_e5m2": 0.15, "mxfp6_e2m3": 0.12, "mxfp6_e3m2": 0.2,
         "mxfp4": 0.35}


def _ids(d):
    return d if isinstance(d, str) else "+".join(d)


def _exact_ints(rng, shape):
    """Small integers every format holds exactly (e2m1 has 0,1,2,3,4 and their negatives)."""
    return rng.integers(-4, 5, size=shape).astype(np.float32)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_ids)
def test_reference_exact_on_representable_inputs(dtype, rng):
    a = _exact_ints(rng, (17, 65))
    b = _exact_ints(rng, (65, 33))
    scale = np.float32(2.0) ** rng.integers(-3, 4)  # powers of two keep every product and sum exact
    got = mxcore.matmul(a * scale, b, dtype, backend="reference")
    want = (a.astype(np.float64) * float(scale)) @ b.astype(np.float64)
    assert got.dtype == np.float32 and got.shape == (17, 33)
    np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_ids)
def test_reference_random_within_quantization_bound(dtype, rng):
    a = rng.standard_normal((64, 256)).astype(np.float32)
    b = rng.standard_normal((256, 48)).astype(np.float32)
    got = mxcore.matmul(a, b, dtype, backend="reference").astype(np.float64)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    err = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    mdt = dtypes.resolve(dtype)
    bound = max(BOUND[mdt.a.name], BOUND[mdt.b.name])
    assert np.isfinite(got).all() and err < bound, (dtype, err)


def test_reference_matches_independent_decode(rng):
    """The oracle equals an independent computation: quantize, dequantize in float64, matmul."""
    a = rng.standard_normal((8, 96)).astype(np.float32)
    b = rng.standard_normal((96, 8)).astype(np.float32)
    qa = mxcore.quantize_mx(a, "mxfp4", axis=1)
    qb = mxcore.quantize_mx(b, "mxfp8", axis=0)
    want = (mxcore.dequantize(qa, dtype=np.float64) @ mxcore.dequantize(qb, dtype=np.float64)).astype(np.float32)
    np.testing.assert_array_equal(mxcore.matmul(a, b, ("mxfp4", "mxfp8"), backend="reference"), want)
    # pre-quantized inputs are used as they are
    np.testing.assert_array_equal(mxcore.matmul(qa, qb, backend="reference"), want)


@pytest.mark.parametrize("out_dtype,np_type", [("float32", np.float32), ("float16", np.float16),
                                               ("bf16", ml_dtypes.bfloat16)])
def test_out_dtype_is_one_rounding(out_dtype, np_type, rng):
    a = rng.standard_normal((16, 40))
    b = rng.standard_normal((40, 16))
    got = mxcore.matmul(a, b, "fp32", out_dtype=out_dtype, backend="reference")
    assert got.dtype == np_type
    exact = a.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64)
    want = mxcore.formats.round_to(exact, {np.float32: "fp32", np.float16: "fp16"}.get(np_type, "bf16"))
    np.testing.assert_array_equal(got.astype(np.float64), want)


def test_dtype_none_uses_input_dtype(rng):
    a = rng.standard_normal((4, 8)).astype(np.float16)
    b = rng.standard_normal((8, 4)).astype(np.float16)
    np.testing.assert_array_equal(mxcore.matmul(a, b, backend="reference"),
                                  (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32))
    fa = mxcore.formats.round_to(rng.standard_normal((4, 8)), "e4m3fn").astype(ml_dtypes.float8_e4m3fn)
    fb = mxcore.formats.round_to(rng.standard_normal((8, 4)), "e5m2").astype(ml_dtypes.float8_e5m2)
    got = mxcore.matmul(fa, fb, backend="reference")  # (e4m3fn, e5m2) pair, codes used as they are
    np.testing.assert_array_equal(got, (fa.astype(np.float64) @ fb.astype(np.float64)).astype(np.float32))


def test_views_and_batches(rng):
    a = rng.standard_normal((40, 30)).astype(np.float32)
    b = rng.standard_normal((20, 30)).astype(np.float32)
    got = mxcore.matmul(a[::2], b.T, "fp32", backend="reference")  # strided and transposed views
    np.testing.assert_array_equal(got, (a[::2].astype(np.float64) @ b.T.astype(np.float64)).astype(np.float32))
    ba = rng.standard_normal((3, 5, 7)).astype(np.float32)
    bb = rng.standard_normal((3, 7, 2)).astype(np.float32)
    got = mxcore.matmul(ba, bb, "bf16", backend="reference")
    assert got.shape == (3, 5, 2)
    for i in range(3):
        np.testing.assert_array_equal(got[i], mxcore.matmul(ba[i], bb[i], "bf16", backend="reference"))


@pytest.mark.parametrize("shape_a,shape_b", [((0, 5), (5, 3)), ((4, 0), (0, 3)), ((4, 5), (5, 0))])
def test_zero_size(shape_a, shape_b):
    got = mxcore.matmul(np.ones(shape_a, np.float32), np.ones(shape_b, np.float32), "fp16", backend="reference")
    assert got.shape == (shape_a[0], shape_b[1]) and got.dtype == np.float32
    assert (got == 0).all()


def test_overflow_to_inf_is_silent_ieee():
    big = np.full((1, 1), 1e6)
    assert np.isinf(mxcore.matmul(big, np.ones((1, 1)), "fp16", backend="reference")).all()
    assert np.isinf(mxcore.matmul(np.full((1, 1), 1e39), np.ones((1, 1)), "bf16", backend="reference")).all()
    assert np.isinf(mxcore.matmul(np.full((1, 1), 1e39), np.ones((1, 1)), backend="reference")).all()


def test_nan_and_inf_policy():
    a = np.ones((2, 64), np.float32)
    b = np.ones((64, 2), np.float32)
    a[0, 3] = np.nan
    got = mxcore.matmul(a, b, "mxfp8", backend="reference")
    assert np.isnan(got[0]).all() and np.isfinite(got[1]).all()  # the NaN block poisons only its row
    a[0, 3] = np.inf
    got = mxcore.matmul(a, b, "fp16", backend="reference")
    assert np.isinf(got[0]).all() and (got[1] == 64).all()


def test_errors():
    a = np.ones((3, 4), np.float32)
    with pytest.raises(errors.ShapeError, match="inner dimensions"):
        mxcore.matmul(a, np.ones((5, 2), np.float32))
    with pytest.raises(errors.ShapeError, match="2-D"):
        mxcore.matmul(np.ones(4, np.float32), np.ones(4, np.float32))
    with pytest.raises(errors.UnknownNameError, match="mxfp8") as info:
        mxcore.matmul(a, a.T, "fp7")
    assert isinstance(info.value, KeyError)
    with pytest.raises(errors.InputTypeError, match="int64"):
        mxcore.matmul(np.ones((3, 4), np.int64), a.T)
    with pytest.raises(errors.InputTypeError, match="complex"):
        mxcore.matmul(np.ones((3, 4), np.complex64), a.T)
    with pytest.raises(errors.UnknownNameError, match="backend"):
        mxcore.matmul(a, a.T, backend="tpu")
    with pytest.raises(errors.UnsupportedError, match="scaling kinds"):
        mxcore.matmul(a, a.T, ("mxfp8", "fp8"))
    with pytest.raises(errors.UnsupportedError, match="FNUZ"):
        mxcore.matmul(a, a.T, ("e4m3fnuz", "e5m2"))
    with pytest.raises(errors.UnknownNameError, match="out_dtype"):
        mxcore.matmul(a, a.T, out_dtype="int8")
    with pytest.raises(errors.UnsupportedError, match="scale_rounding"):
        mxcore.matmul(a, a.T, "mxfp4", scale_rounding="ceil", backend="reference")
    with pytest.raises(errors.UnsupportedError, match="fp8_convert"):
        mxcore.matmul(a, a.T, "fp16", backend="reference", fp8_convert=True)
    ocp = np.zeros((3, 4), ml_dtypes.float8_e4m3fn)
    with pytest.raises(errors.UnsupportedError, match="e4m3fnuz") as info:
        mxcore.matmul(ocp, ocp.T, "e4m3fnuz", backend="reference")
    assert "e4m3fn" in str(info.value) and "CDNA3" in str(info.value)
    e5 = mxcore.quantize_tensor(np.ones((3, 4)), "e5m2")
    with pytest.raises(errors.UnsupportedError, match="element formats"):
        mxcore.matmul(e5, mxcore.quantize_tensor(np.ones((4, 3)), "e4m3fn"), "fp8", backend="reference")


def test_arch_dependent_fp8_names():
    assert dtypes.resolve("fp8", "gfx942").a.name == "e4m3fnuz"
    assert dtypes.resolve("fp8", "gfx950").a.name == "e4m3fn"
    assert dtypes.resolve("FP8", "sm_90").a.name == "e4m3fn"
    assert dtypes.resolve("bf8", "gfx942").b.name == "e5m2fnuz"
    assert dtypes.resolve(("mxfp8", "mxfp4")).name == "mxfp8_e4m3,mxfp4"


def test_backend_registry(monkeypatch):
    statuses = {s.name: s for s in available()}
    assert set(statuses) == {"cuda", "hip", "reference"}
    assert statuses["reference"].usable
    for name in ("cuda", "hip"):
        if not statuses[name].usable:
            assert statuses[name].reason  # says why
            with pytest.raises(errors.BackendUnavailableError, match=name):
                select(name)
    monkeypatch.setenv("MXCORE_BACKEND", "reference")
    assert select("auto").name == "reference"
    monkeypatch.setenv("MXCORE_BACKEND", "nonsense")
    with pytest.raises(errors.UnknownNameError, match="MXCORE_BACKEND"):
        select("auto")


def test_info_mentions_every_backend():
    from mxcore.tools import info

    text = str(info())
    for name in ("cuda", "hip", "reference", "numpy", "ml_dtypes"):
        assert name in text


def test_import_loads_no_gpu_library():
    import subprocess
    import sys

    code = ("import sys, mxcore, numpy as np; mxcore.matmul(np.ones((2,2)), np.ones((2,2)), 'mxfp4', backend='reference');"
            "bad=[m for m in ('cupy','torch','hip','cuda.bindings') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_reference_backend_plan_out_and_clone():
    """The reference backend follows the backend contract: plan -> gemm -> result, out=, clone."""
    from mxcore.backends import get

    be = get("reference")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones((3, 2), np.float32)
    out = np.full((2, 2), -1.0, np.float32)
    p = be.plan(a, b, dtypes.resolve("fp16"), out=out)
    p.gemm()
    assert p.result() is out and out.tolist() == [[3.0, 3.0], [12.0, 12.0]]
    np.testing.assert_array_equal(p.clone().result(), out)
    with pytest.raises(errors.ShapeError, match="shape"):
        be.plan(a, b, dtypes.resolve("fp16"), out=np.zeros((3, 3), np.float32)).gemm()
    with pytest.raises(errors.UnsupportedError, match="no option"):
        be.plan(a, b, dtypes.resolve("fp16"), tile="128x128")


@pytest.mark.parametrize("act", ["bf16", "fp16"])
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e3m2", "mxfp8"])
def test_weight_only_reference(act, fmt):
    """(fp16/bf16 A, MX B): A rounded once to its 16-bit format, B block-quantized along K (or taken as the given
    MXTensor), exact products, float64 sum, one rounding; the dtype is inferred from a 16-bit array and an MXTensor."""
    import ml_dtypes

    rng = np.random.default_rng(3)
    a = rng.standard_normal((7, 70))
    b = rng.standard_normal((70, 9))
    got = mxcore.matmul(a, b, (act, fmt), backend="reference", out_dtype="float64")
    a16 = a.astype(np.float16 if act == "fp16" else ml_dtypes.bfloat16)
    bq = mxcore.quantize_mx(b, fmt, axis=0)
    want = a16.astype(np.float64) @ mxcore.dequantize(bq, dtype=np.float64)
    assert np.array_equal(got, want)
    assert np.array_equal(mxcore.matmul(a16, bq, backend="reference"), want.astype(np.float32))
    with pytest.raises(errors.UnsupportedError, match="blocks along"):
        mxcore.matmul(a16, mxcore.quantize_mx(b, fmt, axis=1), (act, fmt), backend="reference")
