"""mxcore.operands: how inputs become what a matrix core reads (one rounding, IEEE specials, dtype inference)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mxcore import dtypes, operands

INF, NAN = np.inf, np.nan


def prepared(x, name):
    return operands.prepare_one(np.asarray(x), dtypes.resolve(name).a, "a").to_float64()


@pytest.mark.parametrize("name", ["fp32", "tf32", "fp16", "bf16"])
def test_float_dtypes_keep_inf_and_nan(name):
    """IEEE: ±inf and NaN pass through the rounding (tf32 used to saturate inf to 3.4e38)."""
    got = prepared([[INF, -INF, NAN, 1.0]], name)
    assert got[0, 0] == INF and got[0, 1] == -INF and np.isnan(got[0, 2]) and got[0, 3] == 1.0


@pytest.mark.parametrize("name,huge", [("tf32", 2.0 ** 128), ("bf16", 2.0 ** 128), ("fp16", 65520.0),
                                       ("fp32", 2.0 ** 128)])
def test_float_overflow_is_inf(name, huge):
    assert prepared([[huge, -huge]], name).tolist() == [[INF, -INF]]


@pytest.mark.parametrize("name,x,want", [
    ("tf32", 1 + 2.0 ** -11 + 2.0 ** -30, 1 + 2.0 ** -10),   # just above a tf32 midpoint
    ("bf16", 1 + 2.0 ** -8 + 2.0 ** -30, 1 + 2.0 ** -7),     # just above a bf16 midpoint
    ("fp16", 1 + 2.0 ** -11 + 2.0 ** -30, 1 + 2.0 ** -10),
    ("fp32", 1 + 2.0 ** -24 + 2.0 ** -40, 1 + 2.0 ** -23),
])
def test_float64_inputs_are_rounded_once(name, x, want):
    """A float64 just above a midpoint rounds up; through float32 it would first land on the midpoint, then
    round to even (down)."""
    assert prepared([[x]], name)[0, 0] == want
    assert prepared([[-x]], name)[0, 0] == -want


def test_tf32_values_are_stored_rounded_in_float32():
    op = operands.prepare_one(np.array([[1 + 2.0 ** -11 + 2.0 ** -30]]), dtypes.resolve("tf32").a, "a")
    assert op.values.dtype == np.float32 and op.values[0, 0] == np.float32(1 + 2.0 ** -10)


@pytest.mark.parametrize("dt,want", [(np.float64, "fp32"), (np.float32, "fp32"), (np.float16, "fp16"),
                                     (ml_dtypes.bfloat16, "bf16"), (ml_dtypes.float8_e4m3fn, "e4m3fn"),
                                     (ml_dtypes.float8_e5m2fnuz, "e5m2fnuz")])
def test_infer_dtype(dt, want):
    x = np.zeros((2, 2), dt)
    assert operands.infer_dtype(x, x) == want


def test_infer_dtype_rejects_what_it_cannot_name():
    from mxcore.errors import InputTypeError

    with pytest.raises(InputTypeError, match="pass dtype= explicitly"):
        operands.infer_dtype(np.zeros((2, 2), ml_dtypes.float4_e2m1fn), np.zeros((2, 2), np.float32))
