"""Record types and map machinery for the fragment-layout database.

A *map* sends (lane, slot) to (row, col) of one operand tile.  It is written once, either as a closed
form over numpy index arrays or as a CuTe-style thread/value (shape, stride) pair; the ``coords`` and
``inverse`` arrays are derived from it and never typed by hand.  Every record proves in
``__post_init__`` that each of its maps is a bijection onto its tile (``LayoutError`` otherwise).

Conventions (binding for probes, kernels and the emulator):

* ``coords[lane, slot] = (row, col)``: (i, k) of A (M x K), (k, j) of B (K x N), (i, j) of C/D,
  (i, k_block) of the A scales, (k_block, j) of the B scales.
* Slots count a lane's elements in register order: register 0 from its low bits upward, then
  register 1, ... (PTX a0, a1, ...; AMD v0.[7:0], v0.[15:8], ...).  ``bit_offsets[slot]`` is the
  element's first bit in the lane's concatenated registers (register r holds bits [32r, 32r+32)),
  normally ``slot * bits``; fp6 elements straddle register boundaries that way, and a scale byte
  chosen by op_sel sits at ``8 * byte``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import LayoutError

__all__ = [
    "Map",
    "closed_form",
    "tv_layout",
    "OperandLayout",
    "InstructionLayout",
    "LdMatrixLayout",
]


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class Map:
    """(lane, slot) -> (row, col) on a rows x cols tile, held by ``lanes`` lanes with ``slots`` each."""

    rows: int
    cols: int
    lanes: int
    slots: int
    fn: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
    doc: str = ""
    partial: bool = False   # some (lane, slot) cells hold nothing: fn returns row -1 there (NVIDIA scale operands)

    def evaluate(self) -> np.ndarray:
        lane, slot = np.meshgrid(np.arange(self.lanes), np.arange(self.slots), indexing="ij")
        r, c = self.fn(lane, slot)
        out = np.empty((self.lanes, self.slots, 2), dtype=np.int64)
        out[..., 0] = np.broadcast_to(r, lane.shape)
        out[..., 1] = np.broadcast_to(c, lane.shape)
        return out


def closed_form(rows: int, cols: int, lanes: int, slots: int, doc: str = ""):
    """Decorator: a vectorised ``fn(lane, slot) -> (row, col)`` becomes a :class:`Map`."""

    def wrap(fn):
        return Map(rows, cols, lanes, slots, fn, doc or (fn.__doc__ or "").strip())

    return wrap


def _cute_offset(index: np.ndarray, shape: tuple, stride: tuple) -> np.ndarray:
    """CuTe's layout function for a flat index over a (possibly nested) shape: colexicographic."""
    off = np.zeros_like(index)
    rest = index.copy()
    for s, d in zip(shape, stride):
        off = off + (rest % s) * d
        rest = rest // s
    return off


def tv_layout(rows: int, cols: int, thr: tuple, val: tuple, *, nk: bool = False, doc: str = "") -> Map:
    """A CuTe-style thread/value layout: ``thr = (shape, stride)`` over the lane, ``val`` over the slot.

    The offset indexes the tile column-major (offset = row + col * rows).  CuTe writes B operands
    as (N, K) tiles; pass ``nk=True`` with ``rows=K, cols=N`` and the offset is read as n + k * N.
    """
    (tshape, tstride), (vshape, vstride) = thr, val
    lanes = int(np.prod(tshape))
    slots = int(np.prod(vshape))

    def fn(lane, slot):
        off = _cute_offset(lane, tshape, tstride) + _cute_offset(slot, vshape, vstride)
        if nk:  # offset = n + k * N  ->  (row k, col n)
            return off // cols, off % cols
        return off % rows, off // rows

    desc = doc or f"TV ({tshape}:{tstride}), ({vshape}:{vstride})" + (" on (N,K)" if nk else "")
    return Map(rows, cols, lanes, slots, fn, desc)


@dataclass(frozen=True, eq=False)
class OperandLayout:
    """One operand's register layout: which (lane, slot) holds which (row, col) of its tile."""

    role: str            # "a", "b", "c", "scale_a", "scale_b"
    map: Map
    bits: int            # storage bits per element in the register file
    registers: int       # 32-bit registers per lane that the operand occupies
    bit_offsets: tuple | None = None   # per slot; default slot * bits
    coords: np.ndarray = field(init=False, repr=False)   # (-1, -1) where a partial map's cell holds nothing
    inverse: np.ndarray = field(init=False, repr=False)
    held: np.ndarray = field(init=False, repr=False)     # (lanes, slots) bool: the cell holds an element

    def __post_init__(self):
        m = self.map
        coords = m.evaluate()
        rows, cols = m.rows, m.cols
        where = f"{self.role} map ({m.doc or 'unnamed'})"
        held = coords[..., 0] >= 0 if m.partial else np.ones(coords.shape[:2], dtype=bool)
        coords[~held] = -1
        if int(held.sum()) != rows * cols:
            raise LayoutError(f"{where}: {m.lanes} lanes x {m.slots} slots ({int(held.sum())} holding an element) "
                              f"cannot cover a {rows}x{cols} tile exactly once")
        r, c = coords[held, 0], coords[held, 1]
        if r.min() < 0 or c.min() < 0 or r.max() >= rows or c.max() >= cols:
            raise LayoutError(f"{where}: coordinates fall outside the {rows}x{cols} tile")
        inverse = np.full((rows, cols, 2), -1, dtype=np.int64)
        lane, slot = np.meshgrid(np.arange(m.lanes), np.arange(m.slots), indexing="ij")
        inverse[r, c, 0] = lane[held]
        inverse[r, c, 1] = slot[held]
        if (inverse[..., 0] < 0).any():
            missing = np.argwhere(inverse[..., 0] < 0)[0]
            raise LayoutError(f"{where}: not a bijection, element {tuple(int(x) for x in missing)} is held by "
                              "no (lane, slot) and another is held twice")
        offs = tuple(range(0, m.slots * self.bits, self.bits)) if self.bit_offsets is None else tuple(self.bit_offsets)
        if len(offs) != m.slots:
            raise LayoutError(f"{where}: {len(offs)} bit offsets for {m.slots} slots")
        spans = sorted((o, o + self.bits) for o in offs)
        if spans[0][0] < 0 or spans[-1][1] > 32 * self.registers or any(
                a[1] > b[0] for a, b in zip(spans, spans[1:])):
            raise LayoutError(f"{where}: slots overlap or exceed {self.registers} registers")
        object.__setattr__(self, "bit_offsets", offs)
        object.__setattr__(self, "coords", _readonly(coords))
        object.__setattr__(self, "inverse", _readonly(inverse))
        object.__setattr__(self, "held", _readonly(held))

    @property
    def lanes(self) -> int:
        return self.map.lanes

    @property
    def slots(self) -> int:
        return self.map.slots

    @property
    def shape(self) -> tuple[int, int]:
        return (self.map.rows, self.map.cols)

    def register_of(self, slot: int) -> int:
        """Index of the 32-bit register that holds the first bit of ``slot``."""
        return self.bit_offsets[slot] // 32

    def __str__(self) -> str:
        return (f"{self.role}: {self.map.rows}x{self.map.cols} tile, {self.lanes} lanes x {self.slots} slots, "
                f"{self.bits}-bit elements in {self.registers} register(s)/lane; {self.map.doc}")


@dataclass(frozen=True, eq=False)
class InstructionLayout:
    """Everything a kernel or test needs about one matrix-core instruction (C and D share ``c``)."""

    name: str
    vendor: str                  # "nvidia" | "amd"
    archs: tuple
    m: int
    n: int
    k: int
    lanes: int
    a_format: str
    b_format: str
    c_format: str
    a: OperandLayout
    b: OperandLayout
    c: OperandLayout
    mnemonic: str                # PTX text (nvidia) or ISA mnemonic (amd)
    alias: str | None = None
    ptx: str | None = None       # nvidia: the exact instruction text to emit
    intrinsic: str | None = None  # amd: the __builtin_amdgcn_* that emits it
    cbsz: int | None = None      # amd f8f6f4: A format code (0 fp8, 1 bf8, 2 fp6, 3 bf6, 4 fp4)
    blgp: int | None = None      # amd f8f6f4: B format code
    scale_a: OperandLayout | None = None
    scale_b: OperandLayout | None = None
    scale_format: str | None = None   # "e8m0"
    scale_block: int | None = None    # K elements per scale (32)
    scale_opsel: tuple | None = None  # (byte of scale_a register, byte of scale_b register)
    scale_thread: tuple | None = None  # nvidia block_scale: (thread-id-a, thread-id-b) selectors
    sources: tuple = ()
    notes: str = ""

    def __post_init__(self):
        want = {"a": (self.m, self.k), "b": (self.k, self.n), "c": (self.m, self.n)}
        if self.scale_a is not None or self.scale_b is not None:
            if self.scale_a is None or self.scale_b is None or not self.scale_block:
                raise LayoutError(f"{self.name}: scaled instruction needs scale_a, scale_b and scale_block")
            if self.k % self.scale_block:
                raise LayoutError(f"{self.name}: K={self.k} is not a multiple of the scale block {self.scale_block}")
            nb = self.k // self.scale_block
            want.update(scale_a=(self.m, nb), scale_b=(nb, self.n))
        for role, shape in want.items():
            op = getattr(self, role)
            if op.shape != shape:
                raise LayoutError(f"{self.name}: operand {role} covers {op.shape}, expected {shape}")
            if op.lanes != self.lanes:
                raise LayoutError(f"{self.name}: operand {role} uses {op.lanes} lanes, instruction has {self.lanes}")

    @property
    def d(self) -> OperandLayout:
        return self.c

    @property
    def scaled(self) -> bool:
        return self.scale_a is not None

    @property
    def key(self) -> str:
        """A short unique id: ``name@first arch``, plus ``[A,B]`` formats where a mnemonic serves several."""
        fmts = f"[{self.a_format},{self.b_format}]" if self.cbsz is not None or "fp8" in self.name else ""
        return f"{self.name}@{self.archs[0]}{fmts}"

    @property
    def modifiers(self) -> str:
        """Assembler modifiers as LLVM prints them (nonzero cbsz/blgp; scale op_sel), '' if none."""
        parts = []
        if self.scale_opsel is not None and any(self.scale_opsel):
            sa, sb = self.scale_opsel
            parts.append(f"op_sel:[{sa & 1},{sb & 1},0] op_sel_hi:[{sa >> 1},{sb >> 1},0]")
        if self.cbsz:
            parts.append(f"cbsz:{self.cbsz}")
        if self.blgp:
            parts.append(f"blgp:{self.blgp}")
        return " ".join(parts)

    def operand(self, role: str) -> OperandLayout:
        if not isinstance(role, str):
            raise LayoutError(f"{self.name}: an operand is named by a string (a, b, c, d"
                              f"{', scale_a, scale_b' if self.scaled else ''}), not {type(role).__name__} {role!r}")
        key = role.strip().lower().replace("-", "_")
        key = {"d": "c", "sa": "scale_a", "sb": "scale_b", "ascale": "scale_a", "bscale": "scale_b"}.get(key, key)
        op = getattr(self, key, None) if key in ("a", "b", "c", "scale_a", "scale_b") else None
        if not isinstance(op, OperandLayout):
            have = ["a", "b", "c", "d"] + (["scale_a", "scale_b"] if self.scaled else [])
            raise LayoutError(f"{self.name} has no operand {role!r}; operands: {', '.join(have)}")
        return op

    def operands(self) -> dict:
        out = {"a": self.a, "b": self.b, "c": self.c}
        if self.scaled:
            out.update(scale_a=self.scale_a, scale_b=self.scale_b)
        return out

    def format_of(self, role: str) -> str:
        role = self.operand(role).role
        return {"a": self.a_format, "b": self.b_format, "c": self.c_format}.get(role, self.scale_format)

    def __str__(self) -> str:
        head = f"{self.name} ({self.vendor} {', '.join(self.archs)}): D[{self.m}x{self.n}] = A[{self.m}x{self.k}]"
        head += f" {self.a_format} x B[{self.k}x{self.n}] {self.b_format} + C {self.c_format}, {self.lanes} lanes"
        lines = [head]
        if self.alias:
            lines.append(f"  alias: {self.alias}")
        if self.ptx:
            lines.append(f"  ptx: {self.ptx}")
        if self.intrinsic:
            extra = f" {self.modifiers}" if self.modifiers else ""
            lines.append(f"  asm: {self.mnemonic}{extra}; builtin: {self.intrinsic}")
        if self.scaled and self.scale_thread is not None:
            lines.append(f"  scales: {self.scale_format} per {self.scale_block} K, (byte-id, thread-id) "
                         f"A {(self.scale_opsel[0], self.scale_thread[0])}, B {(self.scale_opsel[1], self.scale_thread[1])}")
        elif self.scaled:
            lines.append(f"  scales: {self.scale_format} per {self.scale_block} K, op_sel bytes {self.scale_opsel}")
        for op in self.operands().values():
            lines.append(f"  {op}")
        return "\n".join(lines)

    __repr__ = __str__


@dataclass(frozen=True, eq=False)
class LdMatrixLayout:
    """``ldmatrix`` as a movement layout: who supplies which row address, and where each element lands.

    The instruction loads ``num`` 8x8 matrices of 16-bit elements; row ``r`` of matrix ``j`` is read
    from the 16-byte row whose address lane ``address_lane[j, r]`` supplies.  ``coords[lane, slot]``
    = (matrix, row, col) of the element that lands in that lane's destination slot (register
    ``slot // 2``, low half for even slots), rows/cols as stored in memory.
    """

    name: str
    num: int
    trans: bool
    map_fn: Callable = field(repr=False)
    ptx: str = ""
    archs: tuple = ("sm_80", "sm_86", "sm_89", "sm_90")
    lanes: int = 32
    bits: int = 16
    sources: tuple = ()
    coords: np.ndarray = field(init=False, repr=False)
    inverse: np.ndarray = field(init=False, repr=False)
    address_lane: np.ndarray = field(init=False, repr=False)

    vendor = "nvidia"

    def __post_init__(self):
        slots = 2 * self.num
        lane, slot = np.meshgrid(np.arange(self.lanes), np.arange(slots), indexing="ij")
        mat, row, col = self.map_fn(lane, slot)
        coords = np.stack(np.broadcast_arrays(mat, row, col), axis=-1).astype(np.int64)
        inverse = np.full((self.num, 8, 8, 2), -1, dtype=np.int64)
        if coords.min() < 0 or coords[..., 0].max() >= self.num or coords[..., 1:].max() >= 8:
            raise LayoutError(f"{self.name}: destination coordinates outside {self.num} 8x8 matrices")
        inverse[coords[..., 0], coords[..., 1], coords[..., 2], 0] = lane
        inverse[coords[..., 0], coords[..., 1], coords[..., 2], 1] = slot
        if (inverse < 0).any():
            raise LayoutError(f"{self.name}: destination map is not a bijection onto {self.num} 8x8 matrices")
        # PTX ISA, ldmatrix: threads 0-7 give the row addresses of matrix 0, 8-15 of matrix 1, ...
        addr = np.arange(8 * self.num, dtype=np.int64).reshape(self.num, 8)
        object.__setattr__(self, "coords", _readonly(coords))
        object.__setattr__(self, "inverse", _readonly(inverse))
        object.__setattr__(self, "address_lane", _readonly(addr))

    @property
    def slots(self) -> int:
        return 2 * self.num

    @property
    def registers(self) -> int:
        return self.num

    def __str__(self) -> str:
        how = "transposed (column c of the stored matrix becomes lane group c)" if self.trans else "row-wise"
        return (f"{self.name}: {self.num} 8x8 b16 matrices, row addresses from lanes 0-{8 * self.num - 1}, "
                f"{self.slots} halves in {self.registers} register(s)/lane, {how}")

    __repr__ = __str__
