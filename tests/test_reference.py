"""mxcore.reference, the oracle: IEEE inf/NaN for every dtype, one rounding, dtype objects."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import mxcore
from mxcore import dtypes
from mxcore.reference import reference_matmul

ALL = sorted(dtypes.DTYPES)


def test_tf32_inf_times_one_is_inf_and_times_zero_is_nan():
    inf = np.array([[np.inf]])
    assert reference_matmul(inf, np.array([[1.0]]), "tf32")[0, 0] == np.inf
    assert np.isnan(reference_matmul(inf, np.array([[0.0]]), "tf32")[0, 0])


@pytest.mark.parametrize("name", ALL)
def test_inf_propagates_for_every_dtype(name):
    """[[inf, 1]] @ [[1], [1]]: inf where the element format has inf (float dtypes, e5m2); NaN where it
    has none (e4m3fn and the FNUZ formats) or where the MX block gets the NaN scale."""
    a = np.array([[np.inf, 1.0]], np.float32)
    b = np.ones((2, 1), np.float32)
    got = float(reference_matmul(a, b, name)[0, 0])
    kind, element = dtypes.DTYPES[name].kind, dtypes.DTYPES[name].element
    if kind == "float" or (kind == "fp8" and element == "e5m2"):
        assert got == np.inf, (name, got)
    else:
        assert np.isnan(got), (name, got)


@pytest.mark.parametrize("name", ALL)
def test_nan_propagates_for_every_dtype(name):
    a = np.array([[np.nan, 1.0]], np.float32)
    assert np.isnan(reference_matmul(a, np.ones((2, 1), np.float32), name)[0, 0])


def test_tf32_rounds_float64_once():
    x = np.array([[1 + 2.0 ** -11 + 2.0 ** -30]])
    assert reference_matmul(x, np.array([[1.0]]), "tf32")[0, 0] == np.float32(1 + 2.0 ** -10)


@pytest.mark.parametrize("obj,name", [(np.float16, "fp16"), (np.dtype(np.float32), "fp32"),
                                      (ml_dtypes.bfloat16, "bf16"), (ml_dtypes.float8_e4m3fn, "e4m3fn")])
def test_dtype_objects_are_accepted(obj, name):
    """dtype= takes dtype objects, as out_dtype= does (torch dtypes: tests/test_dtypes.py)."""
    rng = np.random.default_rng(20261123)
    a = rng.integers(-4, 5, (4, 8)).astype(np.float32)
    b = rng.integers(-4, 5, (8, 3)).astype(np.float32)
    want = mxcore.matmul(a, b, name, backend="reference")
    np.testing.assert_array_equal(mxcore.matmul(a, b, obj, backend="reference"), want)
    np.testing.assert_array_equal(reference_matmul(a, b, obj, out_dtype=np.float32), want)
