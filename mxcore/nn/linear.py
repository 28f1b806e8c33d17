"""``mxcore.nn.Linear`` and its :class:`MXConfig`.

A :class:`Linear` either keeps its weight quantized (inference: per-tensor fp8, MX, or a weight-only pair such as
bf16 x mxfp4) as uint8 buffers in ``torch.nn.Linear``'s ``[out_features, in_features]`` layout, or, with
``MXConfig(train=True)``, keeps a high-precision weight and runs the MX training recipe (both operands quantized per
call along each GEMM's reduction dimension, forward and backward).

The quantized layouts (the state_dict):

* MX: ``weight_codes`` uint8 ``[out, in]`` (one element code per byte), ``weight_scales`` uint8 E8M0
  ``[out, ceil(in / 32)]`` (blocks of 32 along ``in``, the K of ``x @ W.T``).
* fp8: ``weight_codes`` uint8 ``[out, in]``, ``weight_scale_exp`` int32 ``[]`` (the scale is ``2**weight_scale_exp``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .. import dtypes as _dt
from ..errors import ShapeError, UnsupportedError
from ..torch import ops as _ops

__all__ = ["Linear", "MXConfig"]


@dataclass(frozen=True)
class MXConfig:
    """How a :class:`Linear` multiplies.

    ``weight``: the weight's format, ``"fp8"`` (per-tensor e4m3fn; also ``"e5m2"``), ``"mxfp8"``, ``"mxfp8_e5m2"``,
    ``"mxfp6"``, ``"mxfp6_e3m2"`` or ``"mxfp4"``.  ``act``: the activations' operand dtype, None for the weight's
    format (activations quantized per call), ``"bf16"`` / ``"fp16"`` for the weight-only pair (inference), or another
    MX format for an MX pair (``act="mxfp8", weight="mxfp4"``).  ``train``: keep a high-precision weight (a
    Parameter) and quantize it per call: the MX training recipe (not for weight-only pairs).  ``scale_rounding``:
    ``"floor"`` (OCP) or ``"rceil"``.  ``grad_dtype``: the gradient GEMMs' dtype (None: the recipe's default, see
    :mod:`mxcore.torch.ops`).  ``backend``: as for :func:`mxcore.matmul`.

    A string is shorthand: ``"mxfp4"`` is ``MXConfig("mxfp4")``, ``"bf16:mxfp4"`` (or ``"bf16,mxfp4"``) is
    ``MXConfig("mxfp4", act="bf16")``."""

    weight: str = "mxfp8"
    act: str | None = None
    train: bool = False
    scale_rounding: str = "floor"
    grad_dtype: str | None = None
    backend: str = "auto"
    mdt: _dt.MatmulDType = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        w = _dt.canonical_operand(self.weight)
        a = w if self.act is None else _dt.canonical_operand(self.act)
        mdt = _dt.resolve((a, w))
        if mdt.kind == "float":
            raise UnsupportedError(f"MXConfig weight={self.weight!r} is not quantized; choose fp8, mxfp8, mxfp6 or "
                                   "mxfp4 (a float weight needs no mxcore.nn.Linear)")
        if self.train and mdt.kind == _dt.WONLY_KIND:
            raise UnsupportedError(f"weight-only pair ({a}, {w}) is for inference: its weight cannot be trained. "
                                   f"Use MXConfig({w!r}, train=True) (both operands quantized per call)")
        if self.scale_rounding not in ("floor", "rceil"):
            raise UnsupportedError(f"scale_rounding={self.scale_rounding!r}; use 'floor' (OCP v1.0) or 'rceil'")
        if self.grad_dtype is not None:
            _dt.resolve(_ops.pair(self.grad_dtype))
        object.__setattr__(self, "weight", w)
        object.__setattr__(self, "act", None if a == w else a)
        object.__setattr__(self, "mdt", mdt)

    @classmethod
    def parse(cls, config) -> MXConfig:
        """An MXConfig from an MXConfig or a string (``"mxfp4"``, ``"bf16:mxfp4"``)."""
        if isinstance(config, cls):
            return config
        if not isinstance(config, str):
            raise UnsupportedError(f"config must be a format name ('fp8', 'mxfp8', 'mxfp4', 'bf16:mxfp4') or an "
                                   f"mxcore.nn.MXConfig, got {type(config).__name__}")
        p = _ops.pair(config)
        return cls(p[1], act=p[0]) if isinstance(p, tuple) else cls(p)

    @property
    def is_mx(self) -> bool:
        return self.mdt.b.kind == "mx"

    @property
    def dtype(self) -> str:
        """The matmul dtype string of the forward GEMM (``"mxfp4"``, ``"bf16,mxfp4"``)."""
        return self.weight if self.act is None else f"{self.act},{self.weight}"

    def describe(self) -> str:
        if self.mdt.kind == _dt.WONLY_KIND:
            return f"{self.act} x {self.weight} (weight-only)"
        text = self.weight if self.act is None else f"{self.act} x {self.weight}"
        return text + (" (training recipe)" if self.train else "")

    def unquantizable(self, in_features: int, out_features: int) -> str | None:
        """Why a ``[out_features, in_features]`` weight cannot take this config, or None."""
        if self.is_mx and in_features % _dt.MX_BLOCK:
            return f"in_features={in_features} is not a multiple of {_dt.MX_BLOCK} (MX blocks run along it)"
        if not self.is_mx and in_features % 16:
            return f"in_features={in_features} is not a multiple of 16 (fp8 GEMMs read K in 16-byte rows)"
        if out_features % 8:
            return f"out_features={out_features} is not a multiple of 8"
        return None


class Linear(torch.nn.Module):
    """``y = x @ W.T + bias`` on mxcore, as ``torch.nn.Linear`` (see the module doc for the stored layouts).

    ``config``: an :class:`MXConfig` or its string shorthand.  ``weight``: a float ``[out, in]`` tensor to quantize
    (else one drawn as ``torch.nn.Linear`` draws it).  ``device`` / ``dtype``: of the bias (and of the
    high-precision weight under ``train=True``).  The output has the input's dtype."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, config="mxfp8", *, weight=None,
                 device=None, dtype=None):
        super().__init__()
        self.config = MXConfig.parse(config)
        self.in_features, self.out_features = int(in_features), int(out_features)
        reason = self.config.unquantizable(self.in_features, self.out_features)
        if reason is not None:
            raise ShapeError(f"mxcore.nn.Linear({in_features}, {out_features}) cannot use {self.config.describe()}: "
                             f"{reason}")
        kw = {"device": device, "dtype": dtype}
        if weight is None:
            weight = torch.empty((self.out_features, self.in_features), **kw)
            torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))  # torch.nn.Linear's draw
        elif tuple(weight.shape) != (self.out_features, self.in_features):
            raise ShapeError(f"weight has shape {tuple(weight.shape)}; Linear({in_features}, {out_features}) needs "
                             f"({out_features}, {in_features})")
        if self.config.train:
            self.weight = torch.nn.Parameter(weight.detach().to(**{k: v for k, v in kw.items() if v is not None}))
        else:
            self._quantize_into_buffers(weight.detach().to(device=device) if device is not None else weight.detach())
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(self.out_features, **kw))
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)
        else:
            self.register_parameter("bias", None)
        self._refresh_operand()

    # ---- the quantized weight ------------------------------------------------------------------------------------
    def _quantize_into_buffers(self, w) -> None:
        if self.config.is_mx:
            codes, scales = _ops.quantize_mx(w.float() if w.dtype == torch.float64 else w, self.config.weight,
                                             axis=-1, scale_rounding=self.config.scale_rounding)
            self.register_buffer("weight_codes", codes.contiguous())
            self.register_buffer("weight_scales", scales.contiguous())
        else:
            codes, exp = _ops.quantize_tensor(w, self.config.weight)
            self.register_buffer("weight_codes", codes.contiguous())
            self.register_buffer("weight_scale_exp", exp.reshape(()))

    def _scales(self):
        return self.weight_scales if self.config.is_mx else self.weight_scale_exp

    def _refresh_operand(self) -> None:
        """Hold the one quantized operand object of the current buffers (the backend caches the staged weight on
        it; the op finds it by the buffers)."""
        if not self.config.train:
            self.__dict__["_operand"] = _ops.weight_operand(self.weight_codes, self._scales(), self.config.weight)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._refresh_operand()
        return out

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._refresh_operand()

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_operand", None)  # rebuilt from the buffers: it holds views of them and a backend's staging
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._refresh_operand()

    def dequantize(self, dtype=torch.float32):
        """The weight ``[out, in]`` as ``dtype`` values (exact in float32)."""
        if self.config.train:
            return self.weight.detach().to(dtype)
        return _ops.dequantize_weight(self.weight_codes, self._scales(), self.config.weight, dtype)

    # ---- forward --------------------------------------------------------------------------------------------------
    def forward(self, x):
        cfg = self.config
        gd = cfg.grad_dtype or ""
        if cfg.train:
            y = _ops.matmul(x, self.weight.t(), cfg.dtype, scale_rounding=cfg.scale_rounding, backend=cfg.backend,
                            grad_dtype=cfg.grad_dtype)
        elif not (torch.is_grad_enabled() and x.requires_grad):  # no gradient can flow (compile guards on both)
            if not torch.compiler.is_compiling():
                y = self._eager(x)  # the op's implementation without the dispatcher (the same call)
            elif cfg.is_mx:
                y = torch.ops.mxcore.linear_mx_infer(x, self.weight_codes, self.weight_scales, cfg.weight,
                                                     cfg.act or "", cfg.scale_rounding, cfg.backend)
            else:
                y = torch.ops.mxcore.linear_fp8_infer(x, self.weight_codes, self.weight_scale_exp, cfg.weight,
                                                      cfg.act or "", cfg.backend)
        elif cfg.is_mx:
            y = torch.ops.mxcore.linear_mx(x, self.weight_codes, self.weight_scales, cfg.weight, cfg.act or "",
                                           cfg.scale_rounding, cfg.backend, gd)
        else:
            y = torch.ops.mxcore.linear_fp8(x, self.weight_codes, self.weight_scale_exp, cfg.weight, cfg.act or "",
                                            cfg.backend, gd)
        # read without Module.__getattr__; a parametrized bias has left _parameters (its getter computes it)
        bias = self._parameters["bias"] if "bias" in self._parameters else self.bias
        return y if bias is None else y + bias

    def _eager(self, x):
        cfg, buffers = self.config, self._buffers  # (the buffers read without Module.__getattr__: every call)
        if cfg.is_mx:
            return _ops.linear_mx_impl(x, buffers["weight_codes"], buffers["weight_scales"], cfg.weight,
                                        cfg.act or "", cfg.scale_rounding, cfg.backend)
        return _ops.linear_fp8_impl(x, buffers["weight_codes"], buffers["weight_scale_exp"], cfg.weight,
                                     cfg.act or "", cfg.backend)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"format={self.config.describe()}")

    # ---- construction from other layers / checkpoints ---------------------------------------------------------------
    @classmethod
    def from_float(cls, linear: torch.nn.Linear, config="mxfp8") -> Linear:
        """A Linear with ``linear``'s weight quantized (or, for ``train=True``, copied) and its bias."""
        w = linear.weight.detach()
        new = cls(linear.in_features, linear.out_features, linear.bias is not None, config, weight=w,
                  device=w.device, dtype=w.dtype)
        if linear.bias is not None:
            with torch.no_grad():
                new.bias.copy_(linear.bias)
            new.bias.requires_grad_(linear.bias.requires_grad)
        return new

    @classmethod
    def from_quantized(cls, weight, bias=None, *, act=None, scale_rounding: str = "floor", backend: str = "auto"):
        """A Linear on an :class:`~mxcore.mx.MXTensor` weight ``[out, in]`` blocked along ``in`` (its last axis), as
        :meth:`MXTensor.from_blocks <mxcore.mx.MXTensor.from_blocks>` reads a published checkpoint; nothing is
        requantized.  ``act``: the activations' dtype (``"bf16"`` for the weight-only pair)."""
        from .. import mx

        if not isinstance(weight, mx.MXTensor) or weight.ndim != 2 or weight.axis != 1:
            raise UnsupportedError("from_quantized takes a 2-D MXTensor [out, in] blocked along its last axis "
                                   f"(MXTensor.from_blocks makes one); got {weight!r}")
        codes, scales = _ops.as_torch(weight.codes), _ops.as_torch(weight.scales)
        out_f, in_f = weight.shape
        cfg = MXConfig(weight.fmt, act=act, scale_rounding=scale_rounding, backend=backend)
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.config, new.in_features, new.out_features = cfg, int(in_f), int(out_f)
        reason = cfg.unquantizable(new.in_features, new.out_features)
        if reason is not None:
            raise ShapeError(f"from_quantized: a [{out_f}, {in_f}] weight cannot use {cfg.describe()}: {reason}")
        new.register_buffer("weight_codes", codes.contiguous())
        new.register_buffer("weight_scales", scales.contiguous())
        new.bias = None if bias is None else torch.nn.Parameter(torch.as_tensor(bias).detach().clone())
        new._refresh_operand()
        return new
