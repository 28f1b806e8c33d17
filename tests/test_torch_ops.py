"""``torch.ops.mxcore`` on the CPU (reference backend): op registration (schema, fake, autograd: ``opcheck``), tracing
by ``torch.compile(fullgraph=True)``, the MX training recipe's gradients (``gradcheck`` and exact equality with
float64 autograd on exactly representable data, every dtype), typed errors instead of silent gradient drops, and
the one quantized operand object per weight.  ``import mxcore`` without torch is checked in a subprocess."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mxcore  # noqa: E402
from mxcore.errors import InputTypeError, MXCoreError, UnsupportedError  # noqa: E402
from mxcore.torch import ops  # noqa: E402

# every dtype mxcore.torch.matmul differentiates, as dtype strings (pairs "A,B")
GRAD_DTYPES = ["fp32", "tf32", "fp16", "bf16", "fp8", "e5m2", "e4m3fn,e5m2", "mxfp8", "mxfp8_e5m2", "mxfp6",
               "mxfp6_e3m2", "mxfp4", "mxfp8,mxfp4"]
WONLY_DTYPES = ["bf16,mxfp4", "fp16,mxfp8", "bf16:mxfp6"]


def _pow2(rng, shape):
    """Powers of two in [1/2, 4] and zeros, signed: exact in every format under any block or tensor scale, so that
    every GEMM of the recipe (each operand quantized along its own reduction axis) is exact."""
    v = np.exp2(rng.integers(-1, 3, size=shape)) * rng.choice([-1.0, 0.0, 1.0], size=shape, p=[0.45, 0.1, 0.45])
    return torch.from_numpy(v)


def _grid(rng, shape):
    """Multiples of 1/8 in [-13/8, 13/8]: they and their +-1/8 neighbours are e4m3 values under any block scale
    (at most 4 significant bits, no clipping at the floor rule's scale), so finite differences are exact."""
    return torch.from_numpy(rng.integers(-13, 14, size=shape) / 8.0)


# ---- registration ----------------------------------------------------------------------------------------------

# torch 2.14's opcheck (test_aot_dispatch_dynamic) reads .grad of its own non-leaf copies of the inputs
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf Tensor:UserWarning")
def test_ops_are_registered_with_fake_and_autograd(rng):
    a = torch.from_numpy(rng.standard_normal((8, 64))).requires_grad_()
    b = torch.from_numpy(rng.standard_normal((64, 16))).requires_grad_()
    lin = mxcore.nn.Linear(64, 32, config="mxfp8")
    fp8 = mxcore.nn.Linear(64, 32, config="fp8")
    x = torch.randn(2, 3, 64, requires_grad=True)
    cases = [
        (torch.ops.mxcore.mm.default, (a, b, "mxfp8", "", "floor", "reference", "")),
        (torch.ops.mxcore.linear_mx.default, (x, lin.weight_codes, lin.weight_scales, "mxfp8", "", "floor",
                                              "reference", "")),
        (torch.ops.mxcore.linear_fp8.default, (x, fp8.weight_codes, fp8.weight_scale_exp, "e4m3fn", "", "reference",
                                               "")),
        (torch.ops.mxcore.quantize_mx.default, (a.detach().float(), "mxfp4", 0, "rceil")),
        (torch.ops.mxcore.quantize_tensor.default, (a.detach().float(), "e5m2")),
        (torch.ops.mxcore.dequantize.default, (lin.weight_codes, lin.weight_scales, "mxfp8", torch.bfloat16)),
    ]
    for op, args in cases:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)


def test_quantize_ops_match_mxcore(rng):
    x = torch.from_numpy(rng.standard_normal((5, 70)).astype(np.float32))
    for axis in (0, -1):
        codes, scales = mxcore.torch.quantize_mx(x, "mxfp6", axis=axis, scale_rounding="rceil")
        ref = mxcore.quantize_mx(x.numpy(), "mxfp6", axis=axis, scale_rounding="rceil")
        assert codes.dtype == scales.dtype == torch.uint8
        np.testing.assert_array_equal(codes.numpy(), ref.codes)
        np.testing.assert_array_equal(scales.numpy(), ref.scales)
    codes, exp = mxcore.torch.quantize_tensor(x, "e4m3fn")
    ref = mxcore.quantize_tensor(x.numpy(), "e4m3fn")
    np.testing.assert_array_equal(codes.numpy(), ref.codes)
    assert exp.dtype == torch.int32 and exp.shape == () and int(exp) == ref.scale_exp


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp8_e5m2", "mxfp6", "mxfp6_e3m2", "mxfp4", "e4m3fn", "e5m2"])
def test_dequantize_is_exact(rng, fmt):
    w = rng.standard_normal((16, 96)) * np.exp2(rng.integers(-8, 8, size=(16, 1)))
    if fmt.startswith("mx"):
        t = mxcore.quantize_mx(w, fmt, axis=-1)
        codes, other = torch.from_numpy(t.codes), torch.from_numpy(t.scales)
    else:
        t = mxcore.quantize_tensor(w, fmt)
        codes, other = torch.from_numpy(t.codes), torch.tensor(t.scale_exp, dtype=torch.int32)
    got = mxcore.torch.dequantize_weight(codes, other, fmt, torch.float64)
    np.testing.assert_array_equal(got.numpy(), mxcore.dequantize(t, np.float64))
    bf = mxcore.torch.dequantize_weight(codes, other, fmt, torch.bfloat16)
    np.testing.assert_array_equal(bf.double().numpy(), mxcore.dequantize(t, np.float64))  # bf16 holds them all


# ---- torch.compile -------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("dtype", GRAD_DTYPES + WONLY_DTYPES)
def test_compile_fullgraph_traces_matmul(rng, dtype):
    """fullgraph=True: a graph break would raise.  Forward and backward equal the eager call bit for bit."""
    torch._dynamo.reset()
    a = _pow2(rng, (6, 64)).float().requires_grad_()
    b = _pow2(rng, (64, 8)).float().requires_grad_(ops.resolved(dtype).kind != "wonly")

    def f(a, b):
        return mxcore.torch.matmul(a, b, dtype, backend="reference") * 2

    g = torch.compile(f, fullgraph=True, backend="aot_eager")
    y = g(a, b)
    y.backward(torch.ones_like(y))
    grads = [t.grad.clone() for t in (a, b) if t.requires_grad]
    for t in (a, b):
        t.grad = None
    y_ref = f(a, b)
    y_ref.backward(torch.ones_like(y_ref))
    assert torch.equal(y, y_ref)
    assert all(torch.equal(g0, t.grad) for g0, t in zip(grads, [t for t in (a, b) if t.requires_grad]))
    assert a.grad is not None and a.grad.abs().sum() > 0


@pytest.mark.slow
@pytest.mark.parametrize("config", ["fp8", "mxfp8", "mxfp4", "bf16:mxfp4", "mxfp8,mxfp4"])
def test_compile_fullgraph_traces_linear(rng, config):
    torch._dynamo.reset()
    model = torch.nn.Sequential(mxcore.nn.Linear(64, 32, config=config), torch.nn.GELU(),
                                mxcore.nn.Linear(32, 64, config=config))
    x = torch.randn(3, 5, 64, requires_grad=True)
    g = torch.compile(model, fullgraph=True, backend="aot_eager")
    y = g(x)
    y.sum().backward()
    gx = x.grad.clone()
    x.grad = None
    y_ref = model(x)
    y_ref.sum().backward()
    assert torch.equal(y, y_ref) and torch.equal(gx, x.grad)


# ---- autograd: the recipe -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp8", "mxfp8"])
def test_gradcheck(rng, dtype):
    """Finite differences of 1/8 on the e4m3 grid are exact, so gradcheck holds with zero tolerance."""
    a, b = _grid(rng, (4, 64)).requires_grad_(), _grid(rng, (64, 8)).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: mxcore.torch.matmul(a, b, dtype, backend="reference"), (a, b),
                                    eps=1 / 8, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", GRAD_DTYPES)
def test_recipe_gradients_are_exact_on_representable_data(rng, dtype):
    """On data every quantization holds exactly, forward and both gradients equal float64 autograd bit for bit
    (the recipe quantizes grad_c along N for grad_a and along M for grad_b: a wrong axis or a dropped gradient
    fails here), batched activations included."""
    a = _pow2(rng, (2, 3, 64)).requires_grad_()
    b = _pow2(rng, (64, 40)).requires_grad_()
    g = _pow2(rng, (2, 3, 40))
    y = mxcore.torch.matmul(a, b, dtype, backend="reference")
    assert y.grad_fn is not None and y.dtype == torch.float64
    y.backward(g)
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    y2 = a2 @ b2
    y2.backward(g)
    assert torch.equal(y, y2)
    assert torch.equal(a.grad, a2.grad) and torch.equal(b.grad, b2.grad)


def test_recipe_quantizes_each_gemm_along_its_reduction_axis(rng):
    """grad_a = Q_N(g) @ Q_N(b.T) and grad_b = Q_M(a.T) @ Q_M(g) as mxcore.matmul computes them; the forward
    quantizes along K (generic data: the three GEMMs differ from each other and from float64)."""
    a = torch.from_numpy(rng.standard_normal((32, 64))).requires_grad_()
    b = torch.from_numpy(rng.standard_normal((64, 96))).requires_grad_()
    g = torch.from_numpy(rng.standard_normal((32, 96)))
    y = mxcore.torch.matmul(a, b, "mxfp4", backend="reference", scale_rounding="rceil")
    y.backward(g)
    ref = dict(dtype="mxfp4", backend="reference", out_dtype="float64", scale_rounding="rceil")
    assert torch.equal(y, mxcore.matmul(a.detach(), b.detach(), **ref))
    assert torch.equal(a.grad, mxcore.matmul(g, b.detach().t(), **ref))
    assert torch.equal(b.grad, mxcore.matmul(a.detach().t(), g, **ref))
    assert not torch.equal(a.grad, g @ b.detach().t())


def test_grad_dtype_option(rng):
    a = torch.from_numpy(rng.standard_normal((32, 64))).float().requires_grad_()
    b = torch.from_numpy(rng.standard_normal((64, 32))).float().requires_grad_()
    g = torch.from_numpy(rng.standard_normal((32, 32))).float()
    mxcore.torch.matmul(a, b, "mxfp8", grad_dtype="mxfp8_e5m2", backend="reference").backward(g)
    assert torch.equal(a.grad, mxcore.matmul(g, b.detach().t(), "mxfp8_e5m2", backend="reference"))
    assert torch.equal(b.grad, mxcore.matmul(a.detach().t(), g, "mxfp8_e5m2", backend="reference"))


@pytest.mark.parametrize("dtype", WONLY_DTYPES)
def test_weight_only_pairs_give_activation_gradients_and_refuse_weight_gradients(rng, dtype):
    a = _pow2(rng, (4, 64)).float().requires_grad_()
    b = _pow2(rng, (64, 16)).float()
    g = _pow2(rng, (4, 16)).float()
    mxcore.torch.matmul(a, b, dtype, backend="reference").backward(g)
    assert torch.equal(a.grad, g @ b.t())
    with pytest.raises(UnsupportedError, match="weight-only pair"):
        mxcore.torch.matmul(a, b.requires_grad_(), dtype, backend="reference")
    with torch.no_grad():  # no gradient asked: nothing to refuse
        assert mxcore.torch.matmul(a, b, dtype, backend="reference").grad_fn is None


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "e4m3fn"])
def test_quantized_weight_passes_activation_gradient(rng, fmt):
    """An MXTensor / ScaledTensor weight is a constant: a's gradient flows through it (dequantized exactly), and
    the result is the op's (mxcore.matmul's) bit for bit."""
    w = _pow2(rng, (64, 16)).float()
    q = mxcore.quantize_mx(w, fmt, axis=0) if fmt.startswith("mx") else mxcore.quantize_tensor(w, fmt)
    a = _pow2(rng, (4, 64)).float().requires_grad_()
    y = mxcore.torch.matmul(a, q, backend="reference")
    assert torch.equal(y, torch.from_numpy(mxcore.matmul(a.detach().numpy(), q, q.fmt, backend="reference")))
    g = _pow2(rng, (4, 16)).float()
    y.backward(g)
    assert torch.equal(a.grad, g @ w.t())


def test_no_silent_drop_for_uint8_or_integer_inputs():
    a = torch.ones(4, 32, requires_grad=True)
    with pytest.raises(InputTypeError):
        mxcore.torch.matmul(a, torch.ones(32, 8, dtype=torch.int32), "mxfp8", backend="reference")
    with pytest.raises(MXCoreError):
        mxcore.torch.matmul(a, torch.ones(8, 32), "mxfp8", backend="reference")


# ---- one operand per weight ----------------------------------------------------------------------------------

def test_weight_operand_is_one_object_per_weight():
    lin = mxcore.nn.Linear(64, 32, config="mxfp4")
    first = ops.weight_operand(lin.weight_codes, lin.weight_scales, "mxfp4")
    assert first is lin._operand
    assert ops.weight_operand(lin.weight_codes, lin.weight_scales, "mxfp4") is first
    assert first.shape == (64, 32) and first.axis == 0  # matmul's B [K, N], blocked along K
    state = {k: v.clone() for k, v in lin.state_dict().items()}
    state["weight_codes"][0, 0] ^= 1
    lin.load_state_dict(state)  # in place: a new version of the codes, so a new operand (the old staging is stale)
    assert lin._operand is not first
    assert ops.weight_operand(lin.weight_codes, lin.weight_scales, "mxfp4") is lin._operand


def test_weight_operand_sees_each_tensor_and_version():
    """The codes tensor's bound operand is taken only for its own scales tensor, format and versions: a change of
    the scales alone in place, another scales tensor, or another format each give another operand (never a stale
    one), and a layer's output follows the change."""
    torch.manual_seed(3)
    lin = mxcore.nn.Linear(64, 32, bias=False, config="mxfp8")
    x = torch.randn(4, 64)
    codes, scales = lin.weight_codes, lin.weight_scales
    first = ops.weight_operand(codes, scales, "mxfp8")
    before = lin(x)
    with torch.no_grad():
        scales.add_(1)  # every block factor doubled, the codes untouched
    second = ops.weight_operand(codes, scales, "mxfp8")
    assert second is not first and ops.weight_operand(codes, scales, "mxfp8") is second
    assert torch.equal(lin(x), 2 * before)
    other = scales.clone()
    assert ops.weight_operand(codes, other, "mxfp8") is not second
    assert ops.weight_operand(codes, scales, "mxfp8") is second
    assert ops.weight_operand(codes, scales, "mxfp8_e5m2").fmt == "mxfp8_e5m2"
    assert ops.weight_operand(codes, scales, "mxfp8") is second  # the same object again (found by its key)


def test_a_callers_mxtensor_is_reused():
    w = torch.randn(64, 16)
    q = mxcore.quantize_mx(w, "mxfp8", axis=0)
    a = torch.randn(4, 64)
    mxcore.torch.matmul(a, q, backend="reference")
    codes = ops.as_torch(q.codes).t()
    assert ops.weight_operand(codes, ops.as_torch(q.scales).t(), q.fmt) is q


def test_import_mxcore_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import mxcore\n"
            "assert mxcore.matmul and 'nn' not in mxcore.__all__\n"
            "from mxcore import *\n"
            "try:\n"
            "    mxcore.nn\n"
            "except ModuleNotFoundError as e:\n"
            "    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "refused: mxcore.nn needs PyTorch: pip install 'mxcore[torch]'" in out
    code = "import sys, mxcore; mxcore.__version__; assert 'torch' not in sys.modules, 'mxcore imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bench_rows_format_every_kind_of_row():
    """The torch benchmark prints timed rows, tokens/s rows and failed rows (a tokens/s row has no "ms")."""
    from mxcore.torch import bench

    assert bench._fmt({"model": "m", "mode": "eager", "ms": 1.23456}).endswith("mode=eager  1.235 ms")
    assert bench._fmt({"model": "m", "tokens": 8, "tok_per_s": 9.5}) == "model=m  tokens=8  tok_per_s=9.5"
    assert bench._fmt({"model": "m", "error": "E: x"}) == "model=m  FAILED E: x"
