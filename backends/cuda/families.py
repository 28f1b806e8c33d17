"""Which kernel family runs a problem: the one rule.

``mma_sync`` (``kernels_cuda/gemm.cu``, plan.py) runs every dtype on sm_80 and newer.  The Hopper ``wgmma``
family (sm_90a: wgmma + TMA) arrives as one module beside it (``sm90.py``); it registers in :data:`FAMILIES`
and its rule goes into :func:`family_for`.  ``family=`` (a ``plan`` / ``matmul`` option) forces one.

MX operands on the wgmma family: every MX pair can run the exact block-scaled variant (the E8M0 scales applied in the
kernel; MXFP4 / MXFP6 folded into e4m3 with one power of two per row or 128-K window where exact, MXFP8 folded the
same way in its own format with the bits that leaves off added back after the GEMM); the rule takes it where
:data:`MX_FOLD_DEFAULT` (pairs of fp4 / fp6) / :data:`MX_EXACT_FROM` (pairs with mxfp8: by shape and by how many
operands are staged per call) say it measured faster than decoding to bf16; ``mx_path`` forces either
(:func:`mx_path`).
"""

from __future__ import annotations

from mxcore.errors import UnsupportedError

from .sm90 import wgmma_reason
from .stage import is_mxfp8
from .tables import table

__all__ = ["FAMILIES", "MX_EXACT_FROM", "MX_FOLD_DEFAULT", "MX_PATHS", "exact_pays", "family_for", "mx_path"]

#: family name -> what it needs (for messages)
FAMILIES = {"mma_sync": "sm_80 or newer", "wgmma": "sm_90 (sm_90a kernels: H100/H200/GH200)"}
_KNOWN = ("mma_sync", "wgmma")
MX_PATHS = ("exact", "decode")
#: where the rule takes the exact variant for a pair with an mxfp8 operand on wgmma: (K at least, M N at least) by
#: (operands staged per call, "mxfp8" for mxfp8 x mxfp8 or "mixed" for mxfp8 x fp4 / fp6); None: never (decode).
#: Staged per call: how many operands the call itself quantized from float data (``mxcore.operands.made_per_call``):
#: 0 for two quantized objects of the caller, 1 for float activations times a weight quantized once, 2 for two float
#: operands.  Values and the figures that chose them: tuning/dense.json, mx_exact_from.
MX_EXACT_FROM = {(int(per_call), pair): tuple(bound)
                 for per_call, pairs in table("dense")["mx_exact_from"]["value"].items() for pair, bound in pairs.items()}
#: the rule's choice for pairs of MXFP4 / MXFP6 operands on wgmma: the exact variant (folded into e4m3) or decoding
#: (tuning/dense.json, mx_fold_default).  A pair with an mxfp8 operand follows :data:`MX_EXACT_FROM`
MX_FOLD_DEFAULT = bool(table("dense")["mx_fold_default"]["value"])


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


def mx_path(family: str, mdt, option: str | None = None, shape=None, per_call: int = 0) -> str | None:
    """How MX operands of ``mdt`` are staged for ``family``: "mx_exact" (the exact block-scaled wgmma variant: mxfp8
    codes as they are, MXFP4 / MXFP6 folded into e4m3) or None (decoded to bf16, the staging's default).  ``option``
    ("exact" | "decode") forces one; "exact" where it cannot run raises.  The rule: pairs of fp4 / fp6 operands
    by :data:`MX_FOLD_DEFAULT`, pairs with an mxfp8 operand by :data:`MX_EXACT_FROM` for ``shape`` ((batch, m, n,
    k); None: decode) with ``per_call`` of the operands staged per call."""
    if option is not None and option not in MX_PATHS:
        raise UnsupportedError(f"mx_path={option!r}; choose one of {', '.join(MX_PATHS)} (or None: the rule)")
    if mdt is None or mdt.kind != "mx" or option == "decode":
        return None
    if option == "exact":
        if family != "wgmma":
            raise UnsupportedError(f"mx_path='exact' runs MX operands on the wgmma family (sm_90); this problem is "
                                   f"{mdt.a.name} x {mdt.b.name} on {family}: use mx_path='decode'")
        return "mx_exact"
    if family != "wgmma":
        return None
    eights = sum(map(is_mxfp8, (mdt.a, mdt.b)))
    if not eights:
        return "mx_exact" if MX_FOLD_DEFAULT else None
    return "mx_exact" if exact_pays(shape, per_call, "mxfp8" if eights == 2 else "mixed") else None


def exact_pays(shape, per_call: int, pair: str, bounds: dict | None = None) -> bool:
    """Whether :data:`MX_EXACT_FROM` takes the exact variant for ``shape`` ((batch, m, n, k) or None) of a ``pair``
    ("mxfp8" | "mixed") with ``per_call`` (0-2) operands staged per call.  ``bounds``: a table of the same form read
    instead of :data:`MX_EXACT_FROM`."""
    bound = (MX_EXACT_FROM if bounds is None else bounds).get((per_call, pair)) if shape is not None else None
    if bound is None:
        return False
    _, m, n, k = shape
    return k >= bound[0] and m * n >= bound[1]
