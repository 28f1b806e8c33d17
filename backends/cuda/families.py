"""Which kernel family runs a problem: the one rule.

``mma_sync`` (``kernels_cuda/gemm.cu``, plan.py) runs every dtype on sm_80 and newer.  The Hopper ``wgmma``
family (sm_90a: wgmma + TMA) arrives as one module beside it (``sm90.py``); it registers in :data:`FAMILIES`
and its rule goes into :func:`family_for`.  ``family=`` (a ``plan`` / ``matmul`` option) forces one.

MX operands on the wgmma family: every MX pair can run the exact block-scaled variant (the E8M0 scales applied in the
kernel; MXFP4 / MXFP6 folded into e4m3 with one power of two per row or 128-K window where exact, MXFP8 folded the
same way in its own format with the bits that leaves off added back after the GEMM); the rule takes it where
:data:`MX_FOLD_DEFAULT` (pairs of fp4 / fp6) / :data:`MX_EXACT_DEFAULT` (pairs with mxfp8) say it measured faster than
decoding to bf16; ``mx_path`` forces either (:func:`mx_path`).
"""

from __future__ import annotations

from mxcore.errors import UnsupportedError

from .sm90 import wgmma_reason

__all__ = ["FAMILIES", "MX_EXACT_DEFAULT", "MX_FOLD_DEFAULT", "MX_PATHS", "family_for", "mx_path"]

#: family name -> what it needs (for messages)
FAMILIES = {"mma_sync": "sm_80 or newer", "wgmma": "sm_90 (sm_90a kernels: H100/H200/GH200)"}
_KNOWN = ("mma_sync", "wgmma")
MX_PATHS = ("exact", "decode")
#: the rule's choice for mxfp8 on wgmma: exact block scaling (True) or bf16 decoding (False).  H100, one run (session
#: 14, NOTES_SM90.md): kernel only, exact (the fold, then mx_lo_fix) 938 / 614 TFLOP/s at 8192^3 / 4096^3 against
#: the bf16-decode kernel's 811 / 737 (mxfp8 x mxfp4: 990 / 632 against 821 / 749); end to end from fp16 inputs
#: (quantization and the per-call staging included) exact 1.77 ms / 437 us against decode's 1.72 ms / 308 us
#: (mxfp8 x mxfp4: 2.08 ms / 705 us against 1.73 ms / 302 us), after the fold's tables were built once per block
#: (2.29-2.33 ms / 554-565 us before): the exact staging still costs about what its kernel saves at 8192^3 and more
#: below.  Session 15 (H100, final tree): kernel 980 / 655 against decode's 832 / 771; end to end 1.65 ms / 416 us
#: against 1.72 ms / 305 us; with the mixed pair's staging replayed, mxfp8 x mxfp4 1.55 ms / 373 us against 1.77 ms
#: / 302 us.  Exact wins at 8192^3 (3 % / 13 %), decode at 4096^3 (kernel included); the crossover between is not
#: measured, so decode stays the rule for every pair with an mxfp8 operand; mx_path="exact" for large problems and
#: operands staged once
MX_EXACT_DEFAULT = False
#: the rule's choice for pairs of MXFP4 / MXFP6 operands on wgmma: the exact variant (folded into e4m3) or decoding.
#: H200, random normal data (one factor per row and column): mxfp4 1148 / 714 TFLOP/s at 8192^3 / 4096^3 against
#: decode's 849 / 676 (NOTES_SM90.md): exact.  A pair with an mxfp8 operand follows :data:`MX_EXACT_DEFAULT`
MX_FOLD_DEFAULT = True
_MXFP8_ELEMENTS = ("e4m3fn", "e5m2")


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


def mx_path(family: str, mdt, option: str | None = None) -> str | None:
    """How MX operands of ``mdt`` are staged for ``family``: "mx_exact" (the exact block-scaled wgmma variant: mxfp8
    codes as they are, MXFP4 / MXFP6 folded into e4m3) or None (decoded to bf16, the staging's default).  ``option``
    ("exact" | "decode") forces one; "exact" where it cannot run raises.  The rule: pairs of fp4 / fp6 operands
    by :data:`MX_FOLD_DEFAULT`, pairs with an mxfp8 operand by :data:`MX_EXACT_DEFAULT`."""
    if option is not None and option not in MX_PATHS:
        raise UnsupportedError(f"mx_path={option!r}; choose one of {', '.join(MX_PATHS)} (or None: the rule)")
    if mdt is None or mdt.kind != "mx" or option == "decode":
        return None
    if option == "exact":
        if family != "wgmma":
            raise UnsupportedError(f"mx_path='exact' runs MX operands on the wgmma family (sm_90); this problem is "
                                   f"{mdt.a.name} x {mdt.b.name} on {family}: use mx_path='decode'")
        return "mx_exact"
    folds = not any(od.element in _MXFP8_ELEMENTS for od in (mdt.a, mdt.b))
    return "mx_exact" if family == "wgmma" and (MX_FOLD_DEFAULT if folds else MX_EXACT_DEFAULT) else None
