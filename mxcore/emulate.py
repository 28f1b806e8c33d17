"""Execute one matrix-core instruction on per-lane registers, from its layout record alone.

One generic path, no per-instruction branches: ``gather`` the lanes' registers into the A, B, C
(and scale) tiles with the record's ``coords``, compute D = A·B + C, ``scatter`` D back to lanes.

Register contents (arrays of shape (lanes, slots), slot order as in :mod:`mxcore.layouts`):

* formats of at most 8 bits (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e2m3, e3m2, e2m1, e8m0 scales):
  unsigned integer element codes, one per slot (fp4/fp6 unpacked, code in the low bits);
* fp32 / tf32 / fp16 / bf16: values.  A value that the element format cannot hold is rounded to
  it first, once from its float64 value (RNE; overflow gives ±inf, inf and NaN propagate) —
  hardware may truncate instead (NVIDIA's tf32 ignores the low 13 bits), so use representable
  inputs when comparing with hardware.

Arithmetic modelled: every product exact; each product of a scaled instruction multiplied by the
E8M0 scales of its 32-element K block (exact, powers of two); then the exact sum of all K
products and C, rounded ONCE (RNE) to the accumulator format (fp32, or fp16 for the NVIDIA .f16
accumulator).  This is an ideal fused dot product: real matrix cores add in a fixed internal order
and may differ in the last bit when partial sums are inexact; for inputs whose partial sums are
all exact (small integers times powers of two), every order agrees and so does the hardware.
Non-finite inputs: the result follows IEEE float64 summation (NaN/inf propagate).

``pack``/``unpack`` convert between these slot arrays and the 32-bit register words a probe
kernel loads, following ``bit_offsets`` (fp6 elements straddle registers; scales sit at op_sel).

Hopper ``wgmma.mma_async`` (a :class:`~mxcore.layouts.WgmmaLayout`): ``execute(rec, a, b_desc, c, smem=buf)``
follows the instruction's operand list — ``a`` is A's registers (128 lanes) or a 64-bit matrix descriptor, ``b``
always a descriptor; both descriptors address ``smem`` (a uint8 array: shared memory from the swizzle pattern's
repeat boundary on, byte 0 at address 0).  ``smem_read`` / ``smem_write`` move an operand tile through a
descriptor's canonical layout and swizzle (PTX ISA 9.7.15.5.1.2; :mod:`mxcore.layouts.hopper`); ``trans_a`` /
``trans_b`` are imm-trans-a/b (M/N-major, 16-bit formats), ``scale_d=False`` drops C, ``imm_scale_a/b`` = -1
negate A / B.  The arithmetic is the one above: exact products, one rounding of the exact sum.
"""

from __future__ import annotations

import math

import numpy as np

from . import formats
from .dtypes import bits as _bits, holds_codes
from .errors import InputTypeError, LayoutError, ShapeError

__all__ = ["scatter", "gather", "execute", "decode_regs", "pack", "unpack", "ldmatrix", "smem_read", "smem_write",
           "RegisterShapeError"]


class RegisterShapeError(ShapeError, LayoutError):
    """Register arrays whose shape is not the layout's (lanes, slots); both a ShapeError and a LayoutError."""


def _mma_layout(layout, what: str):
    """``layout`` when it is a matrix-instruction record, else LayoutError saying what to use."""
    from .layouts import MATRIX_TYPES, LdMatrixLayout

    if isinstance(layout, LdMatrixLayout):
        raise LayoutError(f"{layout.name} is a movement layout (ldmatrix loads, it does not multiply): "
                          f"{what} needs an mma/MFMA layout; use mxcore.emulate.ldmatrix(layout, matrices)")
    if not isinstance(layout, MATRIX_TYPES):
        raise LayoutError(f"{what} needs a layout from mxcore.layouts.get(name), got {type(layout).__name__}")
    return layout


def _operand(layout, operand, what: str = "emulate"):
    from .layouts import OperandLayout

    layout = _mma_layout(layout, what)
    op = layout.operand(operand) if isinstance(operand, str) else operand
    if not isinstance(op, OperandLayout):
        raise LayoutError(f"{what}: {layout.name} operand {operand} is read from shared memory through a descriptor, "
                          "not from registers; use mxcore.emulate.smem_write / smem_read")
    return op


def _check_regs(layout, op, regs, what: str) -> np.ndarray:
    arr = np.asarray(regs)
    if arr.shape != (op.lanes, op.slots):
        raise RegisterShapeError(
            f"{what}: {layout.name} operand {op.role} registers must have shape (lanes, slots) = "
            f"({op.lanes}, {op.slots}), got an array of shape {arr.shape}")
    return arr


def scatter(layout, operand, matrix) -> np.ndarray:
    """Per-lane registers (lanes, slots) holding ``matrix`` (the operand's full tile) as the layout says."""
    op = _operand(layout, operand, "emulate.scatter")
    mat = np.asarray(matrix)
    if mat.shape != op.shape:
        raise ShapeError(f"{layout.name} operand {op.role}: tile is {op.shape}, got an array of shape {mat.shape}")
    regs = mat[op.coords[..., 0], op.coords[..., 1]]
    if not op.held.all():  # partial maps (NVIDIA scale operands): lanes that supply nothing get 0
        regs = np.where(op.held, regs, np.zeros((), dtype=regs.dtype))
    return regs


def gather(layout, operand, regs) -> np.ndarray:
    """The operand's tile rebuilt from per-lane registers (lanes, slots)."""
    op = _operand(layout, operand, "emulate.gather")
    regs = _check_regs(layout, op, regs, "emulate.gather")
    out = np.empty(op.shape, dtype=regs.dtype)
    held = op.held
    out[op.coords[held, 0], op.coords[held, 1]] = regs[held]
    return out


def ldmatrix(layout, matrices) -> np.ndarray:
    """What each lane receives from ``ldmatrix``: ``matrices`` (num, 8, 8) as stored -> (32, 2*num) halves."""
    from .layouts import LdMatrixLayout

    if not isinstance(layout, LdMatrixLayout):
        raise LayoutError(f"emulate.ldmatrix needs an ldmatrix layout (e.g. mxcore.layouts.get('ldmatrix.x4')), "
                          f"got {getattr(layout, 'name', type(layout).__name__)}; use emulate.execute for mma/MFMA")
    mats = np.asarray(matrices)
    if mats.shape != (layout.num, 8, 8):
        raise ShapeError(f"{layout.name}: expected ({layout.num}, 8, 8) stored matrices, got {mats.shape}")
    c = layout.coords
    return mats[c[..., 0], c[..., 1], c[..., 2]]


# ---------------------------------------------------------------- decoding / rounding
def _round_value(x: np.ndarray, fmt: str) -> np.ndarray:
    """float64 values rounded once (RNE) to a value format (fp32, tf32, fp16, bf16), IEEE overflow and specials."""
    return formats.round_to(x, fmt, overflow="nan", nan="propagate")


def decode_regs(fmt: str, regs) -> np.ndarray:
    """Register contents of one operand in format ``fmt`` -> float64 values (see module docstring)."""
    arr = np.asarray(regs)
    if holds_codes(fmt):
        if arr.dtype.kind not in "ui":
            raise InputTypeError(f"{fmt} registers hold element codes: pass unsigned integers "
                                 f"(e.g. mxcore.formats.encode(x, {fmt!r})), got dtype {arr.dtype}")
        return formats.decode(arr, fmt, dtype=np.float64)  # FormatError names a code outside [0, 2^bits)
    if arr.dtype.kind in "uib" or arr.dtype.kind == "c":
        raise InputTypeError(f"{fmt} registers hold values: pass a real float array, got dtype {arr.dtype}")
    return _round_value(arr.astype(np.float64), fmt)


# ---------------------------------------------------------------- exact sum, one rounding
def _round_once(terms: np.ndarray, out_dtype) -> np.ndarray:
    """Round the exact sum of terms[..., :] once (RNE) to ``out_dtype`` (float32 or float16)."""
    flat = terms.reshape(-1, terms.shape[-1])
    n = flat.shape[0]
    s = np.empty(n)
    r = np.zeros(n)
    finite = np.isfinite(flat).all(axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        s[~finite] = flat[~finite].sum(axis=1)
    for i in np.flatnonzero(finite):
        row = flat[i].tolist()
        s[i] = math.fsum(row)
        if math.isfinite(s[i]):
            r[i] = math.fsum(row + [-s[i]])  # sign of (exact - s), exact terms so exactly rounded
    with np.errstate(over="ignore"):
        t = s.astype(out_dtype)
        # s is the float64 nearest the exact sum; if s sits exactly on a tie between two target
        # values while the exact sum does not, break the tie toward the exact sum.
        tf = t.astype(np.float64)
        inexact = (r != 0) & (tf != s) & np.isfinite(tf)
        if inexact.any():
            up = np.nextafter(t, np.asarray(np.inf, out_dtype)).astype(np.float64)
            down = np.nextafter(t, np.asarray(-np.inf, out_dtype)).astype(np.float64)
            lo = np.where(tf < s, tf, down)
            hi = np.where(tf < s, up, tf)
            tie = inexact & (s == (lo + hi) / 2)
            fixed = np.where(r > 0, hi, lo).astype(out_dtype)
            t = np.where(tie, fixed, t)
    return t.reshape(terms.shape[:-1])


def execute(layout, a, b, c, *, scale_a=None, scale_b=None, smem=None, trans_a=False, trans_b=False,
            scale_d=True, imm_scale_a=1, imm_scale_b=1) -> np.ndarray:
    """D registers (lanes, slots of C) for D = A·B + C with A, B, C given as per-lane registers.

    Scaled instructions (``layout.scaled``) need ``scale_a``/``scale_b``: E8M0 codes, registers of
    shape (lanes, 1) holding the byte that op_sel selects.  Returns float32 (or float16 for an fp16
    accumulator) values.  wgmma records: ``a`` registers or an A descriptor, ``b`` a B descriptor, both into
    ``smem``, and the instruction's immediates (module docstring).
    """
    from .layouts import WgmmaLayout

    _mma_layout(layout, "emulate.execute")
    if isinstance(layout, WgmmaLayout):
        A, B, C = _wgmma_operands(layout, a, b, c, smem, trans_a, trans_b, scale_d, imm_scale_a, imm_scale_b)
        scale_a = scale_b = None
    else:
        if smem is not None or trans_a or trans_b or scale_d is not True or (imm_scale_a, imm_scale_b) != (1, 1):
            raise LayoutError(f"{layout.name} reads registers only: smem, trans_a/b, scale_d and imm_scale_a/b are "
                              "wgmma operands")
        a = _check_regs(layout, layout.a, a, "emulate.execute")
        b = _check_regs(layout, layout.b, b, "emulate.execute")
        c = _check_regs(layout, layout.c, c, "emulate.execute")
        A = gather(layout, "a", decode_regs(layout.a_format, a))
        B = gather(layout, "b", decode_regs(layout.b_format, b))
        C = gather(layout, "c", decode_regs(layout.c_format, c))
    if layout.scaled:
        if scale_a is None or scale_b is None:
            raise ShapeError(f"{layout.name} is block-scaled: pass scale_a and scale_b (E8M0 codes, "
                             f"registers of shape ({layout.lanes}, 1))")
        blk = layout.scale_block
        scale_a = _check_regs(layout, layout.scale_a, scale_a, "emulate.execute")
        scale_b = _check_regs(layout, layout.scale_b, scale_b, "emulate.execute")
        SA = gather(layout, "scale_a", decode_regs(layout.scale_format, scale_a))
        SB = gather(layout, "scale_b", decode_regs(layout.scale_format, scale_b))
        A = A * np.repeat(SA, blk, axis=1)   # exact: powers of two, far from float64's range limits
        B = B * np.repeat(SB, blk, axis=0)
    elif scale_a is not None or scale_b is not None:
        raise ShapeError(f"{layout.name} takes no scales")
    with np.errstate(invalid="ignore", over="ignore"):
        prods = A[:, None, :] * B.T[None, :, :]          # (M, N, K), each product exact in float64
    terms = np.concatenate([prods, C[:, :, None]], axis=2)
    out_dtype = np.float16 if layout.c_format == "fp16" else np.float32
    return scatter(layout, "c", _round_once(terms, out_dtype))


# ---------------------------------------------------------------- register words
def _slot_bits(fmt: str, regs: np.ndarray) -> np.ndarray:
    """Bit patterns (uint64) of each slot: codes as given, values as their storage encoding."""
    if holds_codes(fmt):
        return np.asarray(regs).astype(np.uint64)
    vals = np.asarray(regs, dtype=np.float64)
    if fmt in ("fp32", "tf32"):  # a tf32 slot is an fp32 word: its bits as given (hardware ignores the low 13)
        return vals.astype(np.float32).view(np.uint32).astype(np.uint64)
    storage = formats.get(fmt).dtype  # fp16, bf16: rounded once from float64, then the exact 16-bit pattern
    return _round_value(vals, fmt).astype(storage).view(np.uint16).astype(np.uint64)


def pack(layout, operand, regs) -> np.ndarray:
    """(lanes, registers) uint32 words holding ``regs`` (lanes, slots) at the layout's bit offsets."""
    op = _operand(layout, operand, "emulate.pack")
    fmt = layout.format_of(op.role)
    bits = _slot_bits(fmt, _check_regs(layout, op, regs, "emulate.pack"))
    big = np.zeros((op.lanes,), dtype=object)
    mask = (1 << op.bits) - 1
    for s, off in enumerate(op.bit_offsets):
        big = big + np.array([(int(v) & mask) << off for v in bits[:, s]], dtype=object)
    words = np.zeros((op.lanes, op.registers), dtype=np.uint32)
    for r in range(op.registers):
        words[:, r] = [(int(v) >> (32 * r)) & 0xFFFFFFFF for v in big]
    return words


def unpack(layout, operand, words) -> np.ndarray:
    """Inverse of :func:`pack`: codes (uint8) for ≤8-bit formats, float values otherwise."""
    op = _operand(layout, operand, "emulate.unpack")
    fmt = layout.format_of(op.role)
    words = np.asarray(words, dtype=np.uint64)
    if words.shape != (op.lanes, op.registers):
        raise RegisterShapeError(f"{layout.name} operand {op.role}: expected ({op.lanes}, {op.registers}) words")
    big = [sum(int(w) << (32 * r) for r, w in enumerate(row)) for row in words]
    mask = (1 << op.bits) - 1
    raw = np.array([[(v >> off) & mask for off in op.bit_offsets] for v in big], dtype=np.uint64)
    if holds_codes(fmt):
        return raw.astype(np.uint8)
    if _bits(fmt) > 16:  # fp32 / tf32: 32-bit words
        return raw.astype(np.uint32).view(np.float32)
    return raw.astype(np.uint16).view(formats.get(fmt).dtype)


# ---------------------------------------------------------------- wgmma: operands in shared memory
def _wgmma_record(layout, what: str):
    from .layouts import WgmmaLayout

    layout = _mma_layout(layout, what)
    if not isinstance(layout, WgmmaLayout):
        raise LayoutError(f"{what}: {layout.name} reads no shared memory; shared-memory operands are wgmma's "
                          "(mxcore.layouts.get('m64n128k16.f16'))")
    return layout


def _smem_role(role: str) -> str:
    key = str(role).strip().lower()
    if key in ("a", "a_smem"):
        return "a"
    if key == "b":
        return "b"
    raise LayoutError(f"shared-memory operand {role!r}: use 'a' or 'b'")


def _smem_buffer(smem, what: str) -> np.ndarray:
    buf = np.asarray(smem)
    if buf.dtype != np.uint8 or buf.ndim != 1:
        raise InputTypeError(f"{what}: smem is the shared memory as a 1-D uint8 array (byte i at address i), got "
                             f"{buf.dtype} of shape {buf.shape}")
    return buf


def _is_descriptor(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def smem_read(layout, role: str, smem, desc: int, *, transpose: bool = False) -> np.ndarray:
    """The A (64 x K) or B (K x N) tile that wgmma reads from ``smem`` through descriptor ``desc`` (M/N-major when
    ``transpose``): element codes (uint8) for fp8, values (float64) for fp16 / bf16 / tf32 (tf32 as its fp32 word,
    rounded to tf32 once as for registers)."""
    from .layouts.hopper import descriptor_fields

    rec = _wgmma_record(layout, "emulate.smem_read")
    key = _smem_role(role)
    buf = _smem_buffer(smem, "emulate.smem_read")
    if not _is_descriptor(desc):
        raise InputTypeError(f"emulate.smem_read: desc is a 64-bit matrix descriptor (an int), got {type(desc).__name__}")
    lay = rec.smem(key, "MN" if transpose else "K", desc=int(desc))
    start = descriptor_fields(desc)["start"]
    addr = lay.addresses(start)
    nbytes = lay.bits // 8
    if int(addr.max()) + nbytes > buf.size:
        raise ShapeError(f"emulate.smem_read: {rec.name} operand {key.upper()} reaches byte {int(addr.max()) + nbytes} "
                         f"of shared memory, the buffer holds {buf.size}")
    word = np.zeros(addr.shape, dtype=np.uint64)
    for i in range(nbytes):  # little endian, as the GPU stores
        word |= buf[addr + i].astype(np.uint64) << np.uint64(8 * i)
    fmt = rec.format_of(key)
    if holds_codes(fmt):
        return word.astype(np.uint8)
    if nbytes == 4:  # tf32: an fp32 word
        return decode_regs(fmt, word.astype(np.uint32).view(np.float32))
    return word.astype(np.uint16).view(formats.get(fmt).dtype).astype(np.float64)


def smem_write(layout, role: str, tile, smem=None, *, start: int = 0, major: str = "K", swizzle: str = "128B",
               lbo: int | None = None, sbo: int | None = None) -> tuple[np.ndarray, int]:
    """Store an A (64 x K) or B (K x N) tile as wgmma reads it: at ``start`` (bytes) in the canonical layout of
    ``major`` / ``swizzle`` / ``lbo`` / ``sbo`` (:meth:`WgmmaLayout.smem`).  ``tile`` holds codes (fp8) or values
    (rounded once to fp16 / bf16; tf32 stored as fp32 words).  Writes into ``smem`` (a uint8 array, grown copy if
    too short) or a new zeroed buffer; returns (buffer, descriptor)."""
    rec = _wgmma_record(layout, "emulate.smem_write")
    key = _smem_role(role)
    lay = rec.smem(key, major, swizzle, lbo, sbo)
    t = np.asarray(tile)
    if t.shape != (lay.rows, lay.cols):
        raise ShapeError(f"emulate.smem_write: {rec.name} operand {key.upper()} is {lay.rows}x{lay.cols}, got an "
                         f"array of shape {t.shape}")
    desc = lay.descriptor(start)
    addr = lay.addresses(start)
    nbytes = lay.bits // 8
    end = int(addr.max()) + nbytes
    buf = np.zeros(end, np.uint8) if smem is None else _smem_buffer(smem, "emulate.smem_write")
    if buf.size < end:
        buf = np.concatenate([buf, np.zeros(end - buf.size, np.uint8)])
    fmt = rec.format_of(key)
    if not holds_codes(fmt) and t.dtype.kind in "uib":
        raise InputTypeError(f"{fmt} tiles hold values: pass a real float array, got dtype {t.dtype}")
    bits = _slot_bits(fmt, t)
    for i in range(nbytes):
        buf[addr + i] = ((bits >> np.uint64(8 * i)) & np.uint64(0xFF)).astype(np.uint8)
    return buf, desc


def _wgmma_operands(rec, a, b, c, smem, trans_a, trans_b, scale_d, imm_scale_a, imm_scale_b):
    """(A, B, C) float64 tiles of one wgmma: A from registers or a descriptor, B from a descriptor."""
    if (trans_a or trans_b) and not rec.transpose:
        raise LayoutError(f"{rec.name}: imm-trans-a/b exist for .f16/.bf16 only; {rec.a_format} operands are K-major")
    if imm_scale_a not in (1, -1) or imm_scale_b not in (1, -1):
        raise LayoutError(f"imm-scale-a/b are 1 or -1, got {imm_scale_a}, {imm_scale_b}")
    if not _is_descriptor(b):
        raise InputTypeError(f"{rec.name}: B comes from shared memory: pass its 64-bit descriptor (an int) and smem")
    if smem is None:
        raise ShapeError(f"{rec.name}: pass smem, the shared memory the descriptors address (a uint8 array)")
    if _is_descriptor(a):
        A = smem_read(rec, "a", smem, a, transpose=trans_a)
        A = decode_regs(rec.a_format, A) if holds_codes(rec.a_format) else A
    else:
        if trans_a:
            raise LayoutError(f"{rec.name}: imm-trans-a applies to A in shared memory, not in registers")
        A = gather(rec, "a", decode_regs(rec.a_format, _check_regs(rec, rec.a, a, "emulate.execute")))
    B = smem_read(rec, "b", smem, b, transpose=trans_b)
    B = decode_regs(rec.b_format, B) if holds_codes(rec.b_format) else B
    C = gather(rec, "c", decode_regs(rec.c_format, _check_regs(rec, rec.c, c, "emulate.execute")))
    if not scale_d:
        C = np.zeros_like(C)
    return A * imm_scale_a, B * imm_scale_b, C
