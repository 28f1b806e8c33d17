"""Matrices to per-lane register words and back, as the layout record says (shared by every probe family)."""

from __future__ import annotations

import numpy as np

from mxcore import dtypes

__all__ = ["d_values", "scale_words", "slots", "words"]


def operand_format(layout, role: str) -> str:
    return layout.scale_format if role in ("scale_a", "scale_b") else getattr(layout, f"{role}_format")


def slots(layout, role: str, matrix) -> np.ndarray:
    """scatter() of a matrix of *values*; element codes for the formats whose registers hold codes (what the
    emulator and the probe kernels read)."""
    from mxcore import emulate, formats

    fmt = operand_format(layout, role)
    matrix = np.asarray(matrix)
    if dtypes.holds_codes(fmt) and matrix.dtype.kind == "f":
        matrix = formats.encode(matrix.astype(np.float64), fmt)
    return emulate.scatter(layout, role, matrix)


def words(layout, role: str, regs) -> np.ndarray:
    """Per-lane slots -> the lane-major uint32 words a probe kernel loads (mxcore.emulate.pack)."""
    from mxcore import emulate

    return emulate.pack(layout, role, regs)


def d_values(layout, d_words) -> np.ndarray:
    """D's register words (lanes, registers) -> per-lane slots as float64 values."""
    from mxcore import emulate

    return np.asarray(emulate.unpack(layout, "c", d_words), dtype=np.float64)


def scale_words(layout, name: str, regs) -> np.ndarray:
    """One 32-bit scale register per lane: the E8M0 code at the byte the record's op_sel names, and decoy
    codes (code ^ 0x55) in the bytes the instruction must not read."""
    from mxcore import emulate

    op = getattr(layout, name)
    codes = np.asarray(regs).astype(np.uint32).reshape(layout.lanes, op.slots)
    word = emulate.pack(layout, name, codes.astype(np.uint8))[:, 0]
    used = 0
    for off in op.bit_offsets:
        used |= ((1 << int(op.bits)) - 1) << int(off)
    decoy = ((codes[:, 0] ^ 0x55) & 0xFF) * np.uint32(0x01010101)
    out = word | (decoy & np.uint32(~used & 0xFFFFFFFF))
    # lanes that supply no scale (NVIDIA block_scale: thread-id picks the lanes) hold decoys only
    return np.where(op.held.any(axis=1), out, decoy ^ np.uint32(0x01010101)).astype(np.uint32)
