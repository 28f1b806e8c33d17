"""Per-lane constants of ``gemm_mfma.hip`` fitted to an instruction's record in :mod:`mxcore.layouts`.

The kernel reads fragments with one parametric lane map per operand; :func:`fragment_constants` fits its
parameters to the record's ``coords`` (raising :class:`~mxcore.errors.LayoutError` when a record does not
fit), and :func:`frag_type` names the ``mx_types.h`` typedef the instruction's builtin takes.
tests/test_hip_index.py runs the same constants through a Python mirror of the kernel and mxcore.emulate.
"""

from __future__ import annotations

import numpy as np

from ...errors import LayoutError

__all__ = ["WAVE", "frag_type", "fragment_constants"]

WAVE = 64


def frag_type(rec, role: str) -> str:
    """The ``kernels_hip/mx_types.h`` typedef that ``rec``'s builtin takes for operand ``role`` ("a", "b", "c"),
    from the record: register count, element bits and family (no table of counts kept here)."""
    if role == "c":
        return f"mx_f32x{rec.c.registers}"
    op = getattr(rec, role)
    fmt = rec.a_format if role == "a" else rec.b_format
    if rec.cbsz is not None:  # f8f6f4 family: always eight registers, whatever the format uses
        return "mx_i32x8"
    if op.bits == 32:
        return "mx_f32" if op.registers == 1 else f"mx_f32x{op.registers}"
    if op.bits == 16:
        if fmt == "bf16":  # CDNA3's *bf16_1k builtins take short vectors, CDNA4's take __bf16
            return "mx_i16x4" if op.registers == 2 else f"mx_bf16x{2 * op.registers}"
        return f"mx_f16x{2 * op.registers}"
    if op.bits == 8 and op.registers == 2:
        return "mx_i64"
    raise LayoutError(f"{rec.name}: no mx_types.h fragment type for operand {role} ({op.bits}-bit, "
                      f"{op.registers} registers)")


def _leading_run(first) -> tuple[int, int]:
    """(length, stride) of lane 0's slot runs: first[0], first[0]+1, ... for `length` slots, the next run
    starting `stride` later (stride = length when a single run covers every slot)."""
    slots = len(first)
    run = next((s for s in range(1, slots) if first[s] != first[0] + s), slots)
    return run, (int(first[run] - first[0]) if run < slots else run)


def _fit_affine(values, period: int):
    """(lane step, run, run stride) when values[l, s] == step * (l // period) + (s // run) * stride + s % run
    for every lane l and slot s (lane 0's slot 0 at 0), else None."""
    lanes, slots = values.shape
    first = values[0]
    step = int(values[period, 0] - values[0, 0]) if lanes > period else 0
    run, stride = _leading_run(first)
    s = np.arange(slots)
    model = step * (np.arange(lanes)[:, None] // period) + (s // run) * stride + s % run
    return (step, run, stride) if first[0] == 0 and np.array_equal(values, model) else None


def _fit_operand(op, role: str, frag_rows: int, name: str) -> dict:
    """Fit the kernel's operand lane map to a layout record's coords:
    lane l, slot s -> (row l % FR, k = KLANE*(l // FR) + (s // CHUNK)*CSTRIDE + s % CHUNK)."""
    coords = np.asarray(op.coords)
    lanes, slots = coords.shape[0], coords.shape[1]
    if role == "a":
        rows, ks = coords[..., 0], coords[..., 1]
    else:  # B tiles are (K, N): coords are (k, n)
        ks, rows = coords[..., 0], coords[..., 1]
    lane = np.arange(lanes)[:, None]
    if not np.array_equal(rows, np.broadcast_to(lane % frag_rows, rows.shape)):
        raise LayoutError(f"{name} operand {role.upper()}: rows/cols are not lane % {frag_rows}; gemm_mfma.hip cannot load it")
    fit = _fit_affine(ks, frag_rows)
    if fit is None or slots % fit[1]:
        raise LayoutError(f"{name} operand {role.upper()}: K map does not fit KLANE*(l//FR) + chunked slots")
    klane, chunk, cstride = fit
    bits = int(op.bits)
    offsets = tuple(getattr(op, "bit_offsets", None) or range(0, slots * bits, bits))
    if offsets != tuple(range(0, slots * bits, bits)):
        raise LayoutError(f"{name} operand {role.upper()}: slots are not packed at slot*bits; staging.pack_k packs that way")
    p = role.upper()
    return {f"MX_{p}_SLOTS": slots, f"MX_{p}_BITS": bits, f"MX_{p}_KLANE": klane, f"MX_{p}_CHUNK": chunk,
            f"MX_{p}_CSTRIDE": cstride}


def _fit_c(op, n: int, name: str) -> dict:
    """lane l, slot s -> (row RLANE*(l // N) + (s // GROUP)*GSTRIDE + s % GROUP, col l % N)."""
    coords = np.asarray(op.coords)
    lanes, slots = coords.shape[0], coords.shape[1]
    rows, cols = coords[..., 0], coords[..., 1]
    lane = np.arange(lanes)[:, None]
    if not np.array_equal(cols, np.broadcast_to(lane % n, cols.shape)):
        raise LayoutError(f"{name} C/D: columns are not lane % {n}")
    fit = _fit_affine(rows, n)
    if fit is None:
        raise LayoutError(f"{name} C/D: row map does not fit RLANE*(l//N) + grouped slots")
    rlane, group, gstride = fit
    return {"MX_C_SLOTS": slots, "MX_C_RLANE": rlane, "MX_C_GROUP": group, "MX_C_GSTRIDE": gstride}


def _fit_scale(op, role: str, frag_rows: int, name: str) -> dict:
    """Scale operand: lane l holds the E8M0 of row (l % FR) and 32-K block (l // FR) (byte 0, op_sel 0)."""
    coords = np.asarray(op.coords)
    first = coords[:, 0, :]
    lane = np.arange(coords.shape[0])
    if role == "a":
        rows, blocks = first[:, 0], first[:, 1]
    else:
        blocks, rows = first[:, 0], first[:, 1]
    if not (np.array_equal(rows, lane % frag_rows) and np.array_equal(blocks, lane // frag_rows)):
        raise LayoutError(f"{name} scale {role.upper()}: not (row l % {frag_rows}, block l // {frag_rows})")
    return {f"MX_S{role.upper()}_FR": frag_rows}


def fragment_constants(layout, spec) -> dict:
    """The MX_* lane constants of ``spec`` derived from its layout record (raises LayoutError on mismatch)."""
    m, n, k = spec.shape
    if (layout.m, layout.n, layout.k) != (m, n, k) or int(layout.lanes) != WAVE:
        raise LayoutError(f"{layout.name}: record is {layout.m}x{layout.n}x{layout.k}/{layout.lanes} lanes, "
                          f"kernel variant expects {m}x{n}x{k}/{WAVE}")
    if (layout.a_format, layout.b_format) != (spec.a_format, spec.b_format):
        raise LayoutError(f"{layout.name}: record reads {layout.a_format} x {layout.b_format}, kernel variant "
                          f"{spec.a_format} x {spec.b_format}")
    out = {}
    out.update(_fit_operand(layout.a, "a", m, layout.name))
    out.update(_fit_operand(layout.b, "b", n, layout.name))
    out.update(_fit_c(layout.c, n, layout.name))
    if spec.scaled:
        out.update(_fit_scale(layout.scale_a, "a", m, layout.name))
        out.update(_fit_scale(layout.scale_b, "b", n, layout.name))
    else:
        out.update({"MX_SA_FR": m, "MX_SB_FR": n})
    for p in ("A", "B"):
        sbits, bits = spec.stored_bits(p.lower()), out[f"MX_{p}_BITS"]
        if sbits != bits:
            raise LayoutError(f"{layout.name}: operand {p} has {bits}-bit elements, the variant stores {sbits} bits "
                              "each; the kernel copies stored bytes straight into the instruction's registers")
        if (out[f"MX_{p}_CHUNK"] * bits) % 32 and out[f"MX_{p}_CHUNK"] < out[f"MX_{p}_SLOTS"]:
            raise LayoutError(f"{layout.name}: operand {p} chunks of {out[f'MX_{p}_CHUNK']} elements are not whole words")
        if (out[f"MX_{p}_SLOTS"] * bits) % 32:
            raise LayoutError(f"{layout.name}: operand {p} holds {out[f'MX_{p}_SLOTS']} x {bits} bits per lane, "
                              "not whole registers")
    return out
