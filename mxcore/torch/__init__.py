"""mxcore inside PyTorch: custom ops (``torch.ops.mxcore.*``) that ``torch.compile(fullgraph=True)`` traces and
``mode="reduce-overhead"`` captures in CUDA graphs, and a differentiable :func:`matmul` (the MX training recipe).

Importing this package imports torch; ``import mxcore`` does not (``mxcore.torch`` and ``mxcore.nn`` load on first
use).  The modules built on these ops (``Linear``, ``quantize_``) are in :mod:`mxcore.nn`.

Quantized operands cross the op boundary as their codes and scales tensors, not as a tensor subclass: plain uint8
tensors are what ``state_dict``, ``torch.compile``'s fake tensors and CUDA graphs already handle, and the one
:class:`~mxcore.mx.MXTensor` per weight that the CUDA backend caches its staged form on is kept beside them
(:func:`weight_operand`), not rebuilt by a subclass's flatten / unflatten at every trace.
"""

from __future__ import annotations

from .ops import dequantize_weight, matmul, quantize_mx, quantize_tensor, weight_operand

__all__ = ["dequantize_weight", "matmul", "quantize_mx", "quantize_tensor", "weight_operand"]
