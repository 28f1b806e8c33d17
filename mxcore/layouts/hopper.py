"""NVIDIA Hopper ``wgmma.mma_async`` (sm_90a) layouts as data: the warpgroup accumulator fragment, the
register-A operand form, the shared-memory swizzle atoms and the matrix descriptor.

Source: PTX ISA 9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" — 9.7.15.5.1 register
fragments (D of m64nNk*: each warp of the warpgroup owns 16 rows, laid out as mma.m16n8's C fragment repeated
over N/8 column blocks; A in registers: each warp holds the 16-row slice of the m16n8k{16,8,32} A fragment),
9.7.15.5.1.2 shared-memory layouts and swizzling modes, 9.7.15.5.1.2.2 the matrix descriptor.

* :func:`accumulator` — D of ``m64nNk*`` (fp32 accumulation): 128 lanes x N/2 slots on a 64 x N tile; slot s of
  lane t is register d[s]: row 16·(t/32) + (t%32)/4 + 8·((s/2)%2), column 8·(s/4) + 2·(t%4) + s%2.
* :func:`register_a` — the register-A form of ``m64nNk16`` (f16/bf16), ``k8`` (tf32), ``k32`` (e4m3/e5m2):
  warp w holds rows [16w, 16w + 16) exactly as the matching mma.sync record's A fragment (composed from
  :mod:`.nvidia`, not re-typed).
* :class:`SwizzleAtom` (:data:`SWIZZLE_ATOMS`: 128B, 64B, 32B) — CuTe ``Swizzle<B, 4, 3>`` on byte offsets:
  the 16-byte chunk index (bits 4..4+B) is XORed with bits 7..7+B of the offset; an atom is 8 rows of the
  swizzle span (1024 / 512 / 256 bytes).  ``chunks[row, c]`` is the physical chunk of logical chunk c.
* :func:`descriptor` / :func:`descriptor_fields` — the 64-bit shared-memory matrix descriptor (start address,
  leading / stride byte offsets, base offset, swizzle mode; addresses and offsets in 16-byte units), and
  :data:`CANONICAL` the LBO/SBO meaning of the K-major and M/N-major swizzled layouts that
  ``kernels_cuda/gemm_sm90.cu`` uses (tile rows of 128 bytes; 64 elements of a 16-bit M/N-major operand per
  swizzle atom).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from ..errors import LayoutError
from . import nvidia
from ._core import Map, OperandLayout

__all__ = ["ARCHS", "CANONICAL", "SWIZZLE_ATOMS", "WGMMA_K", "SwizzleAtom", "WgmmaRecord", "accumulator",
           "descriptor", "descriptor_fields", "record", "register_a", "wgmma_ptx"]

ARCHS = ("sm_90a",)
LANES = 128  # one warpgroup
WGMMA_K = {"fp16": 16, "bf16": 16, "tf32": 8, "e4m3fn": 32, "e5m2": 32}  # K of one wgmma per A/B format
_PTX_TYPE = {"fp16": "f16", "bf16": "bf16", "tf32": "tf32", "e4m3fn": "e4m3", "e5m2": "e5m2"}
_SRC = ("PTX ISA 9.7.15 wgmma.mma_async: register fragments, shared-memory layouts, matrix descriptor",)

# the mma.sync A fragment whose 16-row slice a warp holds in wgmma's register-A form, per K
_MMA_A = {16: nvidia.A16X16_F16, 8: nvidia.A16X8_TF32, 32: nvidia.A16X32_F8}
_BITS = {16: 16, 8: 32, 32: 8}


def _check_n(n: int) -> None:
    if not isinstance(n, int) or n < 8 or n > 256 or n % 8:
        raise LayoutError(f"wgmma N must be a multiple of 8 in [8, 256], got {n!r}")


@lru_cache(maxsize=None)
def accumulator(n: int, bits: int = 32) -> OperandLayout:
    """D of ``wgmma.mma_async.m64n{n}k*`` (``bits`` 32: .f32 accumulators, 16: .f16 packed two per register)."""
    _check_n(n)
    c = nvidia.C16X8  # the 16x8 C fragment: warp w's rows, one n8 block per 4 slots

    def fn(lane, slot):
        r, col = c.fn(lane % 32, slot % 4)
        return 16 * (lane // 32) + r, 8 * (slot // 4) + col

    mp = Map(64, n, LANES, n // 2, fn, f"m64n{n} D: row 16(t/32)+g+8((s/2)%2), col 8(s/4)+2(t%4)+s%2")
    return OperandLayout("c", mp, bits, n // 2 * bits // 32)


@lru_cache(maxsize=None)
def register_a(k: int) -> OperandLayout:
    """A of ``wgmma.mma_async.m64nNk{k}`` read from registers: 64 x k, warp w = rows [16w, 16w+16)."""
    if k not in _MMA_A:
        raise LayoutError(f"wgmma register-A K is 16 (f16/bf16), 8 (tf32) or 32 (e4m3/e5m2), got {k!r}")
    base = _MMA_A[k]

    def fn(lane, slot):
        r, col = base.fn(lane % 32, slot)
        return 16 * (lane // 32) + r, col

    mp = Map(64, k, LANES, base.slots, fn, f"m64k{k} register A: warp w rows 16w.. as mma.sync m16 A ({base.doc})")
    return OperandLayout("a", mp, _BITS[k], base.slots * _BITS[k] // 32)


def wgmma_ptx(n: int, a_format: str, b_format: str, c_format: str = "fp32") -> str:
    """The instruction text (without operands) for D(c_format) = A(a_format) B(b_format)."""
    _check_n(n)
    if a_format not in WGMMA_K or b_format not in WGMMA_K or WGMMA_K[a_format] != WGMMA_K[b_format]:
        raise LayoutError(f"wgmma has no {a_format} x {b_format} form; formats: {', '.join(WGMMA_K)} "
                          "(fp8 pairs mix e4m3fn/e5m2; 16-bit and tf32 pairs are equal)")
    if a_format in ("fp16", "bf16", "tf32") and a_format != b_format:
        raise LayoutError(f"wgmma multiplies equal 16-bit/tf32 formats, not {a_format} x {b_format}")
    k = WGMMA_K[a_format]
    tc = {"fp32": "f32", "fp16": "f16"}[c_format]
    return f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.{tc}.{_PTX_TYPE[a_format]}.{_PTX_TYPE[b_format]}"


@dataclass(frozen=True, eq=False)
class WgmmaRecord:
    """One wgmma shape: D (accumulator, registers), A (register form, or read from shared memory), B from shared
    memory through a descriptor.  ``transpose``: whether the descriptor may describe an M/N-major operand
    (imm-trans-a/b; 16-bit formats only)."""

    ptx: str
    m: int
    n: int
    k: int
    a_format: str
    b_format: str
    c_format: str
    d: OperandLayout
    a_registers: OperandLayout
    transpose: bool
    archs: tuple = ARCHS
    sources: tuple = _SRC

    @property
    def c(self) -> OperandLayout:
        return self.d


def record(n: int, a_format: str, b_format: str | None = None, c_format: str = "fp32") -> WgmmaRecord:
    """The :class:`WgmmaRecord` of ``wgmma.mma_async.m64n{n}k*`` for the formats (``b_format`` defaults to A's)."""
    b_format = b_format or a_format
    ptx = wgmma_ptx(n, a_format, b_format, c_format)
    k = WGMMA_K[a_format]
    return WgmmaRecord(ptx, 64, n, k, a_format, b_format, c_format, accumulator(n, 32 if c_format == "fp32" else 16),
                       register_a(k), a_format in ("fp16", "bf16"))


# ------------------------------------------------------------------------------------------------------------
# shared memory: swizzle atoms and the matrix descriptor
# ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class SwizzleAtom:
    """``Swizzle<bits, 4, 3>`` on byte offsets inside one atom of 8 rows x ``span`` bytes."""

    name: str
    mode: int        # the descriptor's / tensor map's code: descriptor 1 = 128B, 2 = 64B, 3 = 32B
    span: int        # bytes per row (the swizzle width)
    bits: int        # number of XORed chunk-index bits
    chunks: np.ndarray = field(init=False, repr=False)  # [row, logical 16-byte chunk] -> physical chunk

    def __post_init__(self):
        rows, per_row = 8, self.span // 16
        r, c = np.meshgrid(np.arange(rows), np.arange(per_row), indexing="ij")
        phys = self.physical(r * self.span + c * 16)
        if ((phys // self.span) != r).any():
            raise LayoutError(f"{self.name}: the swizzle moves bytes between rows")
        chunks = (phys % self.span) // 16
        if any(sorted(row) != list(range(per_row)) for row in chunks.tolist()):
            raise LayoutError(f"{self.name}: not a permutation of each row's chunks")
        chunks.flags.writeable = False
        object.__setattr__(self, "chunks", chunks)

    @property
    def atom_bytes(self) -> int:
        return 8 * self.span

    def physical(self, offset):
        """Byte offset (from a base aligned to the atom) -> swizzled byte offset: bits 4.. ^= bits 7.."""
        offset = np.asarray(offset)
        return offset ^ (((offset >> 7) & ((1 << self.bits) - 1)) << 4)


SWIZZLE_ATOMS = {
    "128B": SwizzleAtom("128B", 1, 128, 3),
    "64B": SwizzleAtom("64B", 2, 64, 2),
    "32B": SwizzleAtom("32B", 3, 32, 1),
}

# descriptor bit fields: name -> (first bit, width, unit in bytes)
_FIELDS = {"start": (0, 14, 16), "lbo": (16, 14, 16), "sbo": (32, 14, 16), "base_offset": (49, 3, 1),
           "swizzle": (62, 2, 1)}


def descriptor(start: int, lbo: int, sbo: int, swizzle: str = "128B", base_offset: int = 0) -> int:
    """The 64-bit wgmma shared-memory matrix descriptor (byte address/offsets; each a multiple of 16 bytes)."""
    mode = 0 if swizzle in (None, "none") else SWIZZLE_ATOMS[swizzle].mode
    vals = {"start": start, "lbo": lbo, "sbo": sbo, "base_offset": base_offset, "swizzle": mode}
    out = 0
    for key, (lo, width, unit) in _FIELDS.items():
        v = vals[key]
        if v % unit or not 0 <= v // unit < (1 << width):
            raise LayoutError(f"descriptor field {key}={v} must be a multiple of {unit} below {unit << width}")
        out |= (v // unit) << lo
    return out


def descriptor_fields(desc: int) -> dict:
    """The fields of a descriptor, in bytes (``swizzle`` as its name or "none")."""
    out = {key: ((desc >> lo) & ((1 << width) - 1)) * unit for key, (lo, width, unit) in _FIELDS.items()}
    out["swizzle"] = {0: "none", **{a.mode: n for n, a in SWIZZLE_ATOMS.items()}}[out["swizzle"]]
    return out


#: the swizzled canonical layouts (PTX ISA 9.7.15.5.1.2; CuTe GmmaDescriptor), for a tile stored as 128-byte
#: rows (one TMA box row each): K-major — rows are M/N, 8-row groups SBO apart, LBO unused (1 unit);
#: M/N-major — rows are K, 8-K-row groups SBO apart, 64-element (128-byte) atoms along M/N LBO apart, where one
#: TMA box of 64 elements x BK rows is BK * 128 bytes.  One wgmma step along K moves the start address by
#: 32 bytes (K-major) or by k * 128 bytes (M/N-major).
CANONICAL = {
    "kmajor": {"lbo": 16, "sbo": 8 * 128, "k_step_bytes": 32},
    "mnmajor": {"lbo": lambda bk: bk * 128, "sbo": 8 * 128, "k_step_bytes": lambda k: k * 128},
}
