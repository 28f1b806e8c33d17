"""What the weight-only kernels need to know of a weight's element format: the build's format table (the byte-code
formats one build decodes, each entry as ``WO_FORMATS`` takes it), the scale codes the wgmma kernel folds into the
decode (:func:`fold_range`), and whether a weight's scale codes all lie there."""

from __future__ import annotations

import functools
import weakref

import numpy as np

from mxcore.errors import UnsupportedError

from ..operand import _SPECIAL

__all__ = ["byte_formats", "decode_fixes", "fold_range", "format_entry", "mx_weight_folds", "span_folds", "wg_fold_only"]


@functools.lru_cache(maxsize=None)
def byte_formats() -> tuple[str, ...]:
    """The MX element formats stored one code per byte (fp6, fp8), in the order of a byte-code build's format table."""
    from mxcore import dtypes as _dt, formats

    return tuple(e for e in dict.fromkeys(_dt.MX_ELEMENT.values()) if formats.get(e).bits != 4)


def format_entry(element: str, act: str) -> str:
    """``element``'s entry of the kernels' format table (wonly_common.cuh, WoFormat): {ebits, mbits, special, mul},
    mul the 16-bit x2 bits of 2^(target bias - element bias), the exact multiply that turns placed bits into the
    value."""
    from mxcore import formats

    sp = formats.get(element)
    tbias, tmant = (127, 7) if act == "bf16" else (15, 10)
    if sp.ebits + sp.mbits + 1 != sp.bits or sp.mbits > tmant:
        raise UnsupportedError(f"internal: {element} is not a sign-magnitude minifloat the decode places")
    mul = 2.0 ** (tbias - sp.bias)
    bits = int(np.float32(mul).view(np.uint32) >> 16) if act == "bf16" else int(np.float16(mul).view(np.uint16))
    special = _SPECIAL.get(sp.specials, 0) if sp.bits == 8 else 0  # e4m3fn: 1, e5m2: 2
    return f"{{{sp.ebits}, {sp.mbits}, {special}, {bits * 0x10001:#x}u}}"


def decode_fixes(element: str, act: str) -> bool:
    """Whether the kernels' byte-code decode into ``act`` ("f16" | "bf16") sets ``element``'s special codes after the
    multiply (wonly_common.cuh wo_fixes: e4m3fn's NaN; e5m2's inf / NaN into bf16, which f16 keeps by placement)."""
    from mxcore import formats

    sp = formats.get(element)
    return sp.bits == 8 and (sp.specials == "fn" or (sp.specials == "ieee" and act == "bf16"))


def span_folds(span: tuple, element: str, act: str) -> bool:
    """Whether scale codes from span[0] to span[1] all lie in the fold range of ``element`` codes and ``act``."""
    lo, hi, _ = fold_range(element, act)
    return lo <= span[0] and span[1] <= hi


def wg_fold_only(w, act: str) -> bool:
    """Whether every scale code of the packed weight ``w`` (a DevOperand of pack_weight, which read their span)
    lies in ``act``'s fold range for its element format."""
    return w.span is not None and span_folds(w.span, w.elem, act)


def mx_weight_folds(b, act: str, element: str) -> bool:
    """Whether every scale code of weight ``b`` (``element`` codes) lies in ``act``'s fold range: an MXTensor's
    scales (their least and greatest code, a synchronization for device scales, once per tensor; the backend's
    choice of path asks, as wonly_path's ``folds``); False for a weight quantized per call."""
    from mxcore.arrays import array_kind

    if array_kind(b) != "mx":
        return False
    span = _MX_SPANS.get(b)
    if span is None:
        s = b.scales
        span = (int(s.min()), int(s.max())) if int(np.prod(s.shape)) else (127, 127)
        try:
            _MX_SPANS[b] = span
        except TypeError:  # not weak-referenceable: asked again next time
            pass
    return span_folds(span, element, act)


_MX_SPANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()



def fold_range(element: str, act: str) -> tuple[int, int, int]:
    """(lo, hi, offset): the E8M0 scale codes s in [lo, hi] for which the wgmma kernel decodes a code of ``element``
    straight to its scaled value in ``act`` ("f16" | "bf16") with one multiply of the placed bits by the 16-bit
    power of two 2^(target bias - element bias) * 2^(s - 127), exactly: that factor is a normal number of the
    target, and every finite value of the format times 2^(s - 127) is representable (its lowest bit, the format's
    smallest subnormal, stays above the target's, its largest finite value below the target's largest exponent).
    ``offset``: the factor's exponent field is s + offset.  Codes outside (e.g. 0xFF, the NaN scale, always) take
    the fp32 block-scale path.  bf16 x e2m1: [0, 128]; f16 x e2m1: [102, 128]."""
    from mxcore import formats

    sp = formats.get(element)
    tbias, tmant = (127, 7) if act == "bf16" else (15, 10)
    temin, temax = 1 - tbias, tbias
    shift = tbias - sp.bias                      # log2 of the placement's multiplier
    lsb = sp.emin - sp.mbits                     # exponent of the format's smallest subnormal
    top = int(np.floor(np.log2(sp.max_normal)))  # exponent of its largest finite value
    lo = max(0, temin - shift + 127, temin - tmant - lsb + 127)
    hi = min(254, temax - shift + 127, temax - top + 127)
    return (lo, hi, tbias + shift - 127) if lo <= hi else (255, 0, 0)
