"""The ``torch.ops.mxcore`` custom ops, their fake (meta) implementations and their autograd formulas.

Ops (every one is functional: fresh outputs, no mutation, no aliasing):

* ``mm(a, b, dtype, out_dtype, scale_rounding, backend, grad_dtype)``: ``a [M, K] @ b [K, N]`` of float tensors,
  quantized per call by mxcore (MX: blocks of 32 along K).  Differentiable by the MX training recipe.
* ``linear_mx(x, codes, scales, fmt, act, scale_rounding, backend, grad_dtype)``: ``x [..., K] @ W.T`` with ``W``
  quantized once: ``codes`` uint8 ``[N, K]`` (one element code per byte), ``scales`` uint8 E8M0 ``[N, ceil(K/32)]``
  (blocks along K, the layout ``quantize_mx(W, fmt, axis=-1)`` makes).  ``act``: the activations' operand dtype,
  ``""`` for ``fmt`` itself, ``"bf16"`` / ``"fp16"`` for the weight-only pair.
* ``linear_fp8(x, codes, scale_exp, fmt, act, backend, grad_dtype)``: the same with a per-tensor fp8 weight:
  ``codes`` uint8 ``[N, K]``, ``scale_exp`` a 0-d int32 tensor (the scale is ``2**scale_exp``).
* ``linear_mx_infer`` / ``linear_fp8_infer``: the same products without ``grad_dtype`` and without an autograd
  formula (about 25 us less per call: no Python autograd layer); an input that requires grad under grad mode is
  refused.  ``mxcore.nn.Linear`` calls them under ``torch.compile`` when no gradient can flow.
* ``quantize_mx(x, fmt, axis, scale_rounding) -> (codes, scales)`` and ``quantize_tensor(x, fmt) -> (codes,
  scale_exp)``: mxcore's quantizers (the device codec on CUDA tensors, the host codec otherwise).
* ``dequantize(codes, scales, fmt, dtype)``: a weight's values (the frozen weight's gradient path).

Dtype strings: a name (``"mxfp8"``) or an A,B pair written ``"bf16,mxfp4"`` (``"bf16:mxfp4"`` is taken too);
``out_dtype`` ``""`` means the first operand's dtype; ``grad_dtype`` ``""`` means the recipe's default (below).

Each op's implementation is one ``mxcore.matmul`` call (plus reshapes that are views for contiguous inputs), so what
it allocates and synchronises is what ``mxcore.matmul`` does, and a CUDA graph captures it once the call path is
warm.  The weight ops pass ``mxcore.matmul`` the same :class:`~mxcore.mx.MXTensor` / :class:`~mxcore.mx.ScaledTensor`
object on every call for a given weight (:func:`weight_operand`): the CUDA backend caches a weight's staged form on
that object.

Autograd (the MX training recipe): for ``c = a @ b``, ``grad_a = grad_c @ b.T`` and ``grad_b = a.T @ grad_c``, each
GEMM quantizing its own operands along its own reduction dimension from the saved high-precision tensors (N for
``grad_a``, M for ``grad_b``), accumulating in fp32 and rounding once to the input's dtype.  ``grad_dtype`` defaults
to ``dtype`` (for an MX pair, the activations' format for both operands).  A weight-only pair cannot give its weight
a gradient (its B operand is a quantize-for-inference format): asking raises :class:`~mxcore.errors.UnsupportedError`
at the forward call.  The weight ops differentiate through the frozen weight only: ``grad_x = grad_y @ W`` with ``W``
dequantized exactly (every fp8 / MX value is a bf16 value inside bf16's range) and multiplied at ``grad_dtype``
(default bf16, fp32 for float32 / float64 activations).
"""

import weakref

import numpy as np
import torch

from .. import api as _api
from ..errors import InputTypeError, ShapeError, UnsupportedError

__all__ = ["dequantize_weight", "matmul", "quantize_mx", "quantize_tensor", "tensor_version", "weight_operand"]

_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float64: "float64"}
_TORCH = {v: k for k, v in _NAMES.items()}


def _out_name(t) -> str:
    try:
        return _NAMES[t.dtype]
    except KeyError:
        raise InputTypeError(f"mxcore ops take float32 / float16 / bfloat16 tensors (float64 on the reference "
                             f"backend), got {t.dtype}") from None


def pair(dtype: str):
    """A dtype string as ``mxcore.matmul`` takes it: a name, or an (A, B) tuple for ``"A,B"`` / ``"A:B"``."""
    text = str(dtype).replace(":", ",")
    if "," in text:
        a, b = (p.strip() for p in text.split(","))
        return (a, b)
    return text.strip()


def resolved(dtype: str):
    """The :class:`~mxcore.dtypes.MatmulDType` a dtype string means (arch-independent names: fp8 is e4m3fn)."""
    from .. import dtypes

    return dtypes.resolve(pair(dtype))


def _grad_dtype(dtype: str, grad_dtype: str) -> str:
    if grad_dtype:
        return grad_dtype
    mdt = resolved(dtype)
    if mdt.kind == "mx" and mdt.a != mdt.b:
        return mdt.a.name  # an MX pair: the activations' (first) format for both operands of a gradient GEMM
    return dtype


# ---- one quantized operand object per weight --------------------------------------------------------------------

_WEIGHTS: dict = {}  # (kind, device, pointers, shapes, strides, fmt) -> (weakref to the operand, versions)


def tensor_version(t) -> int:
    """``t``'s version counter (-1 for an inference tensor, which has none)."""
    try:
        return t._version
    except RuntimeError:  # an inference tensor: no version counter (and no in-place change outside inference mode)
        return -1


def _key(codes, other, fmt):
    """The weight's identity: its tensors' memory, shapes and strides, and the format (which also says MX or fp8)."""
    return (codes.device, codes.data_ptr(), other.data_ptr(), codes.shape, codes.stride(), other.shape,
            other.stride(), fmt)


def _forget(key):
    def drop(_ref):
        _WEIGHTS.pop(key, None)

    return drop


class _Bound(tuple):
    """(operand, weak reference to the scales tensor, format, version counters), kept on a codes tensor: pickled and
    copied as None (a saved or copied tensor finds or makes its own operand; a weak reference cannot be pickled)."""

    __slots__ = ()

    def __reduce__(self):
        return (_unbound, ())


def _unbound():
    return None


def weight_operand(codes, scales, fmt: str):
    """The one :class:`~mxcore.mx.MXTensor` (``fmt`` an MX format; ``scales`` uint8 E8M0) or
    :class:`~mxcore.mx.ScaledTensor` (``fmt`` an fp8 format; ``scales`` the 0-d int32 ``scale_exp``) that stands for
    a weight stored as ``codes [N, K]``: matmul's B operand ``[K, N]``, blocked along K.

    The same object comes back for the same tensors (same memory, shapes, strides and version counters) for as long
    as something holds it (an :class:`mxcore.nn.Linear` does; otherwise the codes tensor itself), so the staged form
    a backend caches on it is made once; an in-place change of the codes or scales (``load_state_dict``) makes a new
    one."""
    versions = (tensor_version(codes), tensor_version(scales))
    bound = codes.__dict__.get("_mxcore_operand")
    if bound is not None and bound[1]() is scales and bound[2] == fmt and bound[3] == versions:
        return bound[0]  # the codes tensor's own operand (a layer's every call: no key, no import)
    key = _key(codes, scales, fmt)
    hit = _WEIGHTS.get(key)
    if hit is not None:  # another tensor object over the same memory (a caller's MXTensor's views): no import
        obj = hit[0]()
        if obj is not None and hit[1] == versions:
            return obj
    from .. import dtypes, mx

    is_mx = dtypes.KINDS.get(dtypes.canonical_operand(fmt)) == "mx"
    if codes.dtype != torch.uint8 or codes.dim() != 2:
        raise InputTypeError(f"a quantized weight's codes are a uint8 [N, K] tensor, got {codes.dtype} "
                             f"{tuple(codes.shape)}")
    if is_mx:
        obj = mx.MXTensor(codes.t(), scales.t(), fmt, 0)
    elif codes.device.type == "cpu":
        obj = mx.ScaledTensor(codes.t(), float(np.ldexp(1.0, int(scales))), fmt)
    else:
        scale = torch.ldexp(torch.ones((), dtype=torch.float32, device=codes.device), scales.to(torch.int32))
        obj = mx.ScaledTensor(codes.t(), scale, fmt, scales.to(torch.int32))
    _WEIGHTS[key] = (weakref.ref(obj, _forget(key)), versions)
    try:  # the codes tensor keeps its operand alive (a cycle the collector frees) and finds it first next time
        codes._mxcore_operand = _Bound((obj, weakref.ref(scales), fmt, versions))
    except (AttributeError, RuntimeError):
        pass
    return obj


# ---- dequantization in torch (the frozen weight's gradient path) -------------------------------------------------

_LUTS: dict = {}


def _lut(element: str, device):
    """The element format's decode table on ``device``, made once (the dequantize op's impl runs on real tensors)."""
    key = (element, device)
    if key not in _LUTS:
        from .. import formats

        bits = formats.get(element).bits
        with np.errstate(invalid="ignore"):
            vals = formats.decode(np.arange(1 << bits, dtype=np.uint8), element, dtype=np.float32)
        _LUTS[key] = torch.from_numpy(np.ascontiguousarray(vals)).to(device)
    return _LUTS[key]


def dequantize_weight(codes, scales, fmt: str, dtype=torch.float32):
    """The values of a weight stored as ``codes [N, K]`` and ``scales`` (MX: E8M0 ``[N, ceil(K/32)]``; fp8: the
    0-d int32 ``scale_exp``), rounded once to ``dtype``: exact for float32, and for bfloat16 inside its range
    (``torch.ops.mxcore.dequantize``: traceable, and capturable once its decode table is on the device)."""
    return torch.ops.mxcore.dequantize(codes, scales, fmt, dtype)


@torch.library.custom_op("mxcore::dequantize", mutates_args=(),
                         schema="(Tensor codes, Tensor scales, str fmt, ScalarType dtype) -> Tensor")
def _dequantize(codes, scales, fmt, dtype):
    from .. import dtypes

    spec = dtypes.DTYPES[dtypes.canonical_operand(fmt)]
    vals = _lut(spec.element, codes.device)[codes.to(torch.int64)]
    if spec.kind == "mx":
        k = codes.shape[-1]
        exp = torch.exp2(scales.to(torch.float32) - 127.0)
        exp = torch.where(scales == 0xFF, torch.full_like(exp, float("nan")), exp)
        vals = vals * exp.repeat_interleave(dtypes.MX_BLOCK, dim=-1)[..., :k]
    else:
        vals = torch.ldexp(vals, scales.to(torch.int32))
    return vals.to(dtype)


@_dequantize.register_fake
def _dequantize_fake(codes, scales, fmt, dtype):
    return codes.new_empty(codes.shape, dtype=dtype)


# ---- the ops -------------------------------------------------------------------------------------------------------

def _as_2d(x, k: int, rows3: bool = False):
    """``x [..., K]`` as mxcore.matmul's A operand: 2-D as it is, and 3-D as it is where ``rows3`` (a weight-only
    pair: each row on its own, so a (B, T, K) batch is the same product as its B T rows), else its rows ``[-1, K]``
    (fp8 / MX activations quantized per call: one scale range over all of them, as for the 2-D rows)."""
    if x.shape[-1] != k:
        raise ShapeError(f"the input's last dimension is {x.shape[-1]} but the weight has K = {k} (in_features)")
    nd = x.dim()
    return x if nd == 2 or (rows3 and nd == 3) else x.reshape(-1, k)


def _shaped(y, x, a, n: int):
    """The product ``y`` of ``a = _as_2d(x, ...)`` shaped like ``x`` with N last."""
    return y if a is x else y.reshape(tuple(x.shape[:-1]) + (n,))


@torch.library.custom_op("mxcore::mm", mutates_args=(),
                         schema="(Tensor a, Tensor b, str dtype, str out_dtype, str scale_rounding, str backend, "
                                "str grad_dtype) -> Tensor")
def _mm(a, b, dtype, out_dtype, scale_rounding, backend, grad_dtype):
    return _api.matmul(a, b, pair(dtype), out_dtype=out_dtype or _out_name(a), backend=backend,
                       scale_rounding=scale_rounding)


@_mm.register_fake
def _mm_fake(a, b, dtype, out_dtype, scale_rounding, backend, grad_dtype):
    torch._check(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0])
    return a.new_empty((a.shape[0], b.shape[1]), dtype=_TORCH[out_dtype] if out_dtype else a.dtype)


def _mm_setup(ctx, inputs, output):
    a, b, dtype, _out_dtype, scale_rounding, backend, grad_dtype = inputs
    ctx.save_for_backward(a, b)
    ctx.cfg = (dtype, scale_rounding, backend, grad_dtype)


def _mm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    dtype, scale_rounding, backend, grad_dtype = ctx.cfg
    gd = _grad_dtype(dtype, grad_dtype)
    ga = gb = None
    if ctx.needs_input_grad[0]:  # reduction over N: grad quantized along its rows, b.T along its columns
        ga = torch.ops.mxcore.mm(grad, b.t(), gd, _out_name(a), scale_rounding, backend, grad_dtype)
    if ctx.needs_input_grad[1]:  # reduction over M: a.T along its rows, grad along its columns
        _refuse_weight_grad(dtype, gd)
        gb = torch.ops.mxcore.mm(a.t(), grad, gd, _out_name(b), scale_rounding, backend, grad_dtype)
    return ga, gb, None, None, None, None, None


_mm.register_autograd(_mm_backward, setup_context=_mm_setup)


def _refuse_weight_grad(dtype: str, grad_dtype: str) -> None:
    from .. import dtypes

    if resolved(dtype).kind == dtypes.WONLY_KIND or resolved(grad_dtype).kind == dtypes.WONLY_KIND:
        raise UnsupportedError(
            f"dtype {dtype!r} is a weight-only pair (16-bit activations x an MX weight, for inference): its weight "
            "operand b cannot get a gradient. Train with an MX recipe (dtype='mxfp8' or 'mxfp4'), or freeze b "
            "(b.requires_grad_(False))")


def linear_mx_impl(x, codes, scales, fmt, act, scale_rounding, backend):
    """The eager body of ``torch.ops.mxcore.linear_mx`` (also what ``mxcore.nn.Linear`` runs outside tracing)."""
    w = weight_operand(codes, scales, fmt)
    a = _as_2d(x, codes.shape[1], rows3=bool(act) and act != fmt)
    y = _api.matmul(a, w, (act or fmt, fmt), out_dtype=_out_name(x), backend=backend, scale_rounding=scale_rounding)
    return _shaped(y, x, a, codes.shape[0])


def linear_fp8_impl(x, codes, scale_exp, fmt, act, backend):
    """The eager body of ``torch.ops.mxcore.linear_fp8`` (also what ``mxcore.nn.Linear`` runs outside tracing)."""
    w = weight_operand(codes, scale_exp, fmt)
    a = _as_2d(x, codes.shape[1])
    y = _api.matmul(a, w, (act or fmt, fmt), out_dtype=_out_name(x), backend=backend)
    return _shaped(y, x, a, codes.shape[0])


@torch.library.custom_op("mxcore::linear_mx", mutates_args=(),
                         schema="(Tensor x, Tensor codes, Tensor scales, str fmt, str act, str scale_rounding, "
                                "str backend, str grad_dtype) -> Tensor")
def _linear_mx(x, codes, scales, fmt, act, scale_rounding, backend, grad_dtype):
    return linear_mx_impl(x, codes, scales, fmt, act, scale_rounding, backend)


@_linear_mx.register_fake
def _linear_mx_fake(x, codes, scales, fmt, act, scale_rounding, backend, grad_dtype):
    torch._check(x.shape[-1] == codes.shape[1])
    return x.new_empty(tuple(x.shape[:-1]) + (codes.shape[0],))


@torch.library.custom_op("mxcore::linear_fp8", mutates_args=(),
                         schema="(Tensor x, Tensor codes, Tensor scale_exp, str fmt, str act, str backend, "
                                "str grad_dtype) -> Tensor")
def _linear_fp8(x, codes, scale_exp, fmt, act, backend, grad_dtype):
    return linear_fp8_impl(x, codes, scale_exp, fmt, act, backend)


@_linear_fp8.register_fake
def _linear_fp8_fake(x, codes, scale_exp, fmt, act, backend, grad_dtype):
    torch._check(x.shape[-1] == codes.shape[1])
    return x.new_empty(tuple(x.shape[:-1]) + (codes.shape[0],))


def _frozen_grad_dtype(x, grad_dtype: str) -> str:
    if grad_dtype:
        return grad_dtype
    return "fp32" if x.dtype in (torch.float32, torch.float64) else "bf16"


def _linear_setup(ctx, inputs, output):
    x, codes, scales, fmt = inputs[:4]
    ctx.save_for_backward(codes, scales)
    ctx.cfg = (fmt, inputs[-2], inputs[-1], x.dtype, tuple(x.shape))


def _frozen_weight_grad(ctx, grad):
    """grad_x = grad_y @ W, the frozen weight dequantized exactly (None when x needs no gradient)."""
    if not ctx.needs_input_grad[0]:
        return None
    codes, scales = ctx.saved_tensors
    fmt, backend, grad_dtype, xdtype, xshape = ctx.cfg
    gd = _frozen_grad_dtype(grad, grad_dtype)
    store = torch.float32 if resolved(gd).a.name in ("fp32", "tf32") else torch.bfloat16
    w = dequantize_weight(codes, scales, fmt, store)
    g2 = grad.reshape(-1, codes.shape[0])
    return torch.ops.mxcore.mm(g2, w, gd, _NAMES[xdtype], "floor", backend, "").reshape(xshape)


def _linear_mx_backward(ctx, grad):
    return (_frozen_weight_grad(ctx, grad),) + (None,) * 7


def _linear_fp8_backward(ctx, grad):
    return (_frozen_weight_grad(ctx, grad),) + (None,) * 6


_linear_mx.register_autograd(_linear_mx_backward, setup_context=_linear_setup)
_linear_fp8.register_autograd(_linear_fp8_backward, setup_context=_linear_setup)


# The inference forms of the two weight ops, for calls through which no gradient can flow (mxcore.nn.Linear picks them
# when grad mode is off or its input does not require grad; torch.compile guards on both).  Defined with
# torch.library.Library and implemented at the CPU and CUDA keys only: a custom_op always routes a call through its
# Python autograd layer, which cost about 25 us per call on the H200's host (45-48 us against 17-21 us for the
# same call made directly), the whole difference in a compiled model whose layers are mxcore ops.
_LIB = torch.library.Library("mxcore", "FRAGMENT")


def _inference_only(name: str, impl):
    def body(x, *args):
        if x.requires_grad and torch.is_grad_enabled():
            raise UnsupportedError(f"torch.ops.mxcore.{name} takes no gradient and x requires one; call "
                                   f"torch.ops.mxcore.{name.replace('_infer', '')} (differentiable)")
        return impl(x, *args)

    return body


_LIB.define("linear_mx_infer(Tensor x, Tensor codes, Tensor scales, str fmt, str act, str scale_rounding, "
            "str backend) -> Tensor")
_LIB.define("linear_fp8_infer(Tensor x, Tensor codes, Tensor scale_exp, str fmt, str act, str backend) -> Tensor")
for _key_name in ("CPU", "CUDA"):
    _LIB.impl("linear_mx_infer", _inference_only("linear_mx_infer", linear_mx_impl), _key_name)
    _LIB.impl("linear_fp8_infer", _inference_only("linear_fp8_infer", linear_fp8_impl), _key_name)


@torch.library.register_fake("mxcore::linear_mx_infer", lib=_LIB)
def _linear_mx_infer_fake(x, codes, scales, fmt, act, scale_rounding, backend):
    return _linear_mx_fake(x, codes, scales, fmt, act, scale_rounding, backend, "")


@torch.library.register_fake("mxcore::linear_fp8_infer", lib=_LIB)
def _linear_fp8_infer_fake(x, codes, scale_exp, fmt, act, backend):
    return _linear_fp8_fake(x, codes, scale_exp, fmt, act, backend, "")


def _codec_input(x):
    """What mxcore's codecs read: a CUDA tensor as it is (the device codec), host data as numpy (bfloat16 through
    ml_dtypes: numpy has no bfloat16 of its own)."""
    if x.device.type != "cpu":
        return x.detach()
    from ..arrays import to_numpy

    return to_numpy(x)


@torch.library.custom_op("mxcore::quantize_mx", mutates_args=(),
                         schema="(Tensor x, str fmt, int axis, str scale_rounding) -> (Tensor, Tensor)")
def _quantize_mx(x, fmt, axis, scale_rounding):
    from .. import mx

    t = mx.quantize_mx(_codec_input(x), fmt, axis=axis, scale_rounding=scale_rounding)
    if isinstance(t.codes, torch.Tensor):
        return t.codes, t.scales
    return torch.from_numpy(t.codes), torch.from_numpy(t.scales)


@_quantize_mx.register_fake
def _quantize_mx_fake(x, fmt, axis, scale_rounding):
    from .. import dtypes

    shape = list(x.shape)
    ax = axis % len(shape)
    shape[ax] = (shape[ax] + dtypes.MX_BLOCK - 1) // dtypes.MX_BLOCK
    return x.new_empty(x.shape, dtype=torch.uint8), x.new_empty(shape, dtype=torch.uint8)


@torch.library.custom_op("mxcore::quantize_tensor", mutates_args=(),
                         schema="(Tensor x, str fmt) -> (Tensor, Tensor)")
def _quantize_tensor(x, fmt):
    from .. import mx

    t = mx.quantize_tensor(_codec_input(x), fmt)
    if isinstance(t.codes, torch.Tensor):
        return t.codes, t.scale_exp.to(torch.int32).reshape(())
    return torch.from_numpy(np.ascontiguousarray(t.codes)), torch.tensor(t.scale_exp, dtype=torch.int32)


@_quantize_tensor.register_fake
def _quantize_tensor_fake(x, fmt):
    return x.new_empty(x.shape, dtype=torch.uint8), x.new_empty((), dtype=torch.int32)


# ---- the public functions ------------------------------------------------------------------------------------------

def quantize_mx(x, fmt: str, *, axis: int = -1, scale_rounding: str = "floor"):
    """``(codes, scales)`` of ``x`` in MX format ``fmt`` (``torch.ops.mxcore.quantize_mx``; traceable)."""
    return torch.ops.mxcore.quantize_mx(x, fmt, axis, scale_rounding)


def quantize_tensor(x, fmt: str = "e4m3fn"):
    """``(codes, scale_exp)`` of ``x`` per-tensor scaled to fp8 format ``fmt`` (``torch.ops.mxcore.quantize_tensor``)."""
    return torch.ops.mxcore.quantize_tensor(x, fmt)


def _dtype_string(dtype) -> str:
    if isinstance(dtype, (tuple, list)):
        return ",".join(str(d) for d in dtype)
    return str(dtype)


def _grad_wanted(*ts) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in ts)


def matmul(a, b, dtype=None, *, out_dtype=None, scale_rounding: str = "floor", backend: str = "auto",
           grad_dtype=None):
    """``a @ b`` through ``torch.ops.mxcore``: differentiable, traceable by ``torch.compile(fullgraph=True)``.

    ``a``: a float tensor ``[..., K]``; ``b``: a float tensor ``[K, N]``, or a quantized weight (an
    :class:`~mxcore.mx.MXTensor` blocked along K, or a :class:`~mxcore.mx.ScaledTensor`) whose codes are torch
    tensors.  ``dtype``: as for :func:`mxcore.matmul` (None: ``a``'s dtype for float ``b``, ``b``'s format for a
    quantized ``b``).  ``out_dtype``: None for ``a``'s dtype.  ``grad_dtype``: the dtype of the gradient GEMMs (see
    the module doc).  Returns a torch tensor ``[..., N]`` with a ``grad_fn`` when an input requires grad; a dtype it
    cannot differentiate raises :class:`~mxcore.errors.UnsupportedError` here, never a silent drop."""
    from .. import mx

    gd = "" if grad_dtype is None else _dtype_string(grad_dtype)
    if isinstance(b, (mx.MXTensor, mx.ScaledTensor)):
        if not isinstance(a, torch.Tensor) or b.device not in (None, "torch"):
            raise InputTypeError("mxcore.torch.matmul takes a torch tensor a and a quantized b on the host or in "
                                 "torch CUDA tensors; for numpy / CuPy use mxcore.matmul")
        act = ""
        if dtype is not None:
            p = pair(_dtype_string(dtype))
            act = p[0] if isinstance(p, tuple) else ""
        codes = as_torch(b.codes).t()
        if isinstance(b, mx.MXTensor):
            if b.axis != 0 or b.ndim != 2:
                raise UnsupportedError(f"a quantized b must be a 2-D weight [K, N] blocked along K (axis 0); got "
                                       f"shape {b.shape} blocked along axis {b.axis}")
            scales = as_torch(b.scales).t()
            _adopt(b, codes, scales)
            y = torch.ops.mxcore.linear_mx(a, codes, scales, b.fmt, act, scale_rounding, backend, gd)
        else:
            exp = _scale_exp_tensor(b)
            _adopt(b, codes, exp)
            y = torch.ops.mxcore.linear_fp8(a, codes, exp, b.fmt, act, backend, gd)
        return y if out_dtype is None else y.to(_TORCH[_out_arg(out_dtype)])
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise InputTypeError(f"mxcore.torch.matmul takes torch tensors, got {type(a).__name__} and {type(b).__name__};"
                             " for numpy / CuPy use mxcore.matmul")
    if b.dim() != 2 or a.dim() < 1:
        raise ShapeError(f"mxcore.torch.matmul takes a [..., K] and b [K, N]; got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    if dtype is None:
        from ..operands import infer_dtype

        dtype = infer_dtype(a, b)
    ds = _dtype_string(dtype)
    od = "" if out_dtype is None else _out_arg(out_dtype)
    if _grad_wanted(b) and b.requires_grad:
        _refuse_weight_grad(ds, gd or _grad_dtype(ds, ""))
    rows = _as_2d(a, b.shape[0])
    y = torch.ops.mxcore.mm(rows, b, ds, od, scale_rounding, backend, gd)
    return _shaped(y, a, rows, b.shape[1])


def as_torch(x):
    """A torch view of a quantized operand's host (numpy) array, sharing its memory (the same pointer every call)."""
    if isinstance(x, torch.Tensor):
        return x
    x = np.asarray(x)
    return torch.from_numpy(x if x.flags.writeable else x.copy())


def _out_arg(out_dtype) -> str:
    from .. import dtypes

    return dtypes.canonical_out_dtype(out_dtype, allow_float64=True)


_EXPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _scale_exp_tensor(t):
    """A host ScaledTensor's exponent as one 0-d int32 tensor per object (a device one's is already a tensor)."""
    if isinstance(t.scale_exp, torch.Tensor):
        return t.scale_exp.reshape(())
    if t not in _EXPS:
        _EXPS[t] = torch.tensor(int(t.scale_exp), dtype=torch.int32)
    return _EXPS[t]


def _adopt(obj, codes, other) -> None:
    """Register a caller's quantized weight as the operand for its (transposed) codes, so the op reuses it."""
    key = _key(codes, other, obj.fmt)
    hit = _WEIGHTS.get(key)
    if hit is None or hit[0]() is not obj:
        _WEIGHTS[key] = (weakref.ref(obj, _forget(key)), (tensor_version(codes), tensor_version(other)))
