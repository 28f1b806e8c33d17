"""Quantized objects as the per-call paths meet them (fastpath.py, tp.py): their device buffers, the staged forms
cached on them (stage.py) and the kept plans bound to those forms."""

from __future__ import annotations

import copy
import weakref

from mxcore.arrays import array_kind

from .device import ordinal_of
from .plan import CudaPlan
from .stage import VERSION, fresh_staged

__all__ = ["bound_plan", "quantized_buffers", "quantized_on", "same_form", "staged_key", "staged_on", "staged_weight",
           "swap_weight", "weight_cache"]


def quantized_buffers(*objs) -> list:
    """The device arrays inside quantized objects (MXTensor: codes, scales, scale_max; ScaledTensor: codes, scale,
    scale_exp); host arrays are left out (a replay does not touch them)."""
    out = []
    for o in objs:
        for name in ("codes", "scales", "scale_max", "scale", "scale_exp"):
            x = getattr(o, name, None)
            kind = array_kind(x) if x is not None else None
            if (kind == "torch" and x.device.type == "cuda") or kind == "cupy":
                out.append(x)
    return out


def quantized_on(b, ordinal: int, axis: int = 0) -> bool:
    """``b`` is a 2-D quantized operand (an MXTensor blocked along K: ``axis`` 0 for B, 1 for A; or a
    ScaledTensor) whose codes and device scales all live on GPU ``ordinal``."""
    if array_kind(b) != "mx" or len(b.shape) != 2 or getattr(b, "axis", axis) != axis:
        return False
    bufs = quantized_buffers(b)
    return any(x is b.codes for x in bufs) and all(ordinal_of(x) == ordinal for x in bufs)


def staged_weight(b, ordinal: int, key=None):
    """The staged form of weight ``b`` cached on it (stage.py): under ``key``, or (key=None) whether any B
    staging on GPU ``ordinal`` is cached; None / False when not staged yet."""
    if key is None:
        return staged_on(b, ordinal, "b")
    return fresh_staged(b).get(key)


def staged_key(before: dict, d):
    """The key under which ``d`` (a plan's staged B) was cached on the weight before the plan (``before``: a copy
    of the weight's cache, :func:`weight_cache`), or None (the plan staged it itself)."""
    return next((k for k, v in before.items() if v is d), None)


def weight_cache(b) -> dict:
    """A copy of the staged forms cached on weight ``b``."""
    return {k: v for k, v in fresh_staged(b).items() if k != VERSION}


def same_form(d, e) -> bool:
    """Two staged weights one plan can take in turn: the kernel variant, its launch geometry and the MX path
    (folded or per-32 blocks) are the same; only buffers and scales differ (rebind re-reads the scales)."""
    def form(x):
        mx = x.mx
        return (x.kmajor, x.elem, x.ld, x.k, x.bstride, x.exp_at is None, mx is None,
                None if mx is None else (mx.ld, mx.folded is None))
    return form(d) == form(e)


def swap_weight(p, staged) -> bool:
    """Point plan ``p`` at another staged weight of the same form (False: not the same form, nothing changed)."""
    if staged is p.db:
        return True
    if not same_form(staged, p.db):
        return False
    if isinstance(p, CudaPlan):
        p.rebind(db=staged)
    else:  # the weight-only plan: its packed launch takes B's address per call
        if not p.takes(staged):
            return False
        p.db = staged
    return True


def bound_plan(bound: dict, owners: tuple, p, da=None, db=None):
    """The kept plan ``p`` bound to staged operands ``da`` / ``db`` (None: ``p``'s own) of the quantized objects
    ``owners``: made once per owners, a shallow copy of ``p`` rebound to them (its own operand maps and packed
    launches; the workspace, the output scratch and the operands not given are ``p``'s: one stream, one call at a
    time), kept in ``bound`` until one of ``owners`` is collected.  A model's layers of one layout then switch
    weights without encoding maps or packing launches per call (rebinding one plan per call cost more host time
    than a 4096-row call's GPU time).  None where a staged operand is of another form (:func:`same_form`)."""
    key = tuple(map(id, owners))
    hit = bound.get(key)
    if hit is not None and hit[0] is da and hit[1] is db:
        return hit[2]
    if (da is not None and not same_form(da, p.da)) or (db is not None and not same_form(db, p.db)):
        return None
    new_a, new_b = (None if x is None or x is y else x for x, y in ((da, p.da), (db, p.db)))
    q = p
    if new_a is not None or new_b is not None:
        q = copy.copy(p)
        q.rebind(new_a, new_b)
    if hit is None:
        for owner in owners:  # the binding goes with its objects (their ids are not reused before)
            weakref.finalize(owner, bound.pop, key, None)
    bound[key] = (da, db, q)
    return q


def staged_on(x, ordinal: int, role: str) -> bool:
    """Whether a staged form of quantized operand ``x`` as ``role`` ("a" | "b") on GPU ``ordinal`` is cached on
    it (stage.py)."""
    return any(k != VERSION and k[0] == ordinal and k[1] == role for k in fresh_staged(x))
