"""Which kernel family runs a problem: the one rule.

``mma_sync`` (``kernels_cuda/gemm.cu``, plan.py) runs every dtype on sm_80 and newer.  The Hopper ``wgmma``
family (sm_90a: wgmma + TMA) arrives as one module beside it (``sm90.py``); it registers in :data:`FAMILIES`
and its rule goes into :func:`family_for`.  ``family=`` (a ``plan`` / ``matmul`` option) forces one.
"""

from __future__ import annotations

from mxcore.errors import UnsupportedError

from .sm90 import wgmma_reason

__all__ = ["FAMILIES", "family_for"]

#: family name -> what it needs (for messages)
FAMILIES = {"mma_sync": "sm_80 or newer", "wgmma": "sm_90 (sm_90a kernels: H100/H200/GH200)"}
_KNOWN = ("mma_sync", "wgmma")


def family_for(arch: str, mdt=None, shape=None, option: str | None = None) -> str:
    """The family that runs ``mdt`` on ``arch`` for ``shape`` (batch, m, n, k); ``option`` forces one."""
    if option is not None:
        if option not in _KNOWN:
            raise UnsupportedError(f"family={option!r}; choose one of {', '.join(_KNOWN)} (or None: the rule)")
        if option not in FAMILIES:
            raise UnsupportedError(f"family {option!r} is not available in this build; have: {', '.join(FAMILIES)}")
        if option == "wgmma" and wgmma_reason(arch) is not None:
            raise UnsupportedError(f"family='wgmma': {wgmma_reason(arch)}; use family='mma_sync'")
        return option
    return "wgmma" if wgmma_reason(arch, mdt, shape) is None else "mma_sync"
