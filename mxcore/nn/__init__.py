"""Drop-in PyTorch modules on mxcore: :class:`Linear` and :func:`quantize_` (needs torch: ``pip install
mxcore[torch]``).

``mxcore.nn`` mirrors ``torch.nn`` (modules a model is built from); the ops, autograd and benchmarks it stands on
are in :mod:`mxcore.torch`.  See docs/torch.md.
"""

from __future__ import annotations

from .fused import FusedLinear, FusedPart
from .linear import Linear, MXConfig
from .quantize import QuantizeReport, quantize_

__all__ = ["FusedLinear", "FusedPart", "Linear", "MXConfig", "QuantizeReport", "quantize_"]
