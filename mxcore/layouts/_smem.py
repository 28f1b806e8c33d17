"""Shared-memory operands of ``wgmma.mma_async`` (sm_90a): swizzle atoms, the matrix descriptor and the canonical
layouts that a descriptor describes, as data.

Source: PTX ISA 9.7.15.5.1.2 "Shared Memory Matrix Layout" — Table 38 (swizzle atoms: 8 rows of 128 / 64 / 32
bytes, or one 16-byte column of 8 rows without swizzling), 9.7.15.5.1.2.1 (leading / stride dimension byte
offsets per major-ness), 9.7.15.5.1.2.1.3 "Canonical Layouts" (in CuTe notation, T = 128 / element bits):

=========  ===========  ====================================  ===============
major      swizzle      canonical layout                      swizzle
=========  ===========  ====================================  ===============
MN         none         ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))  Swizzle<0,4,3>
MN         32B/64B/128B ((T,q,m),(8,k)):((1,T,LBO),(qT,SBO))  Swizzle<b,4,3>
K          none         ((8,m),(T,2k)):((1T,SBO),(1,LBO))     Swizzle<0,4,3>
K          32B/64B/128B ((8,m),(T,2k)):((qT,SBO),(1,T))       Swizzle<b,4,3>
=========  ===========  ====================================  ===============

with q = swizzle bytes / 16 (2, 4, 8) and b = log2 q; the first mode of each layout runs along M/N, the second
along K; strides in elements, LBO and SBO in the descriptor in bytes.  ``Swizzle<b,4,3>`` acts on the byte
address: bits [4, 4+b) (the 16-byte chunk within a row) are XORed with bits [7, 7+b).  9.7.15.5.1.2.2 "Matrix
Descriptor Format": start address bits 0-13, LBO 16-29, SBO 32-45 (each ``(x & 0x3FFFF) >> 4``), base offset
49-51, swizzle mode 62-63 (0 none, 1 128B, 2 64B, 3 32B); the base offset is 0 when the swizzle pattern starts
on its repeat boundary (1024 / 512 / 256 bytes), which is the case modelled here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import LayoutError

__all__ = ["CANONICAL", "MAJORS", "SWIZZLE_ATOMS", "SWIZZLES", "SmemLayout", "SwizzleAtom", "descriptor",
           "descriptor_fields", "smem_layout"]


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
        """The swizzle pattern's repeat: 8 rows (1024 / 512 / 256 bytes)."""
        return 8 * self.span

    @property
    def cute(self) -> str:
        return f"Swizzle<{self.bits},4,3>"

    def physical(self, offset):
        """Byte offset (from a base aligned to the atom) -> swizzled byte offset: bits 4.. ^= bits 7.."""
        offset = np.asarray(offset)
        return offset ^ (((offset >> 7) & ((1 << self.bits) - 1)) << 4)

    def logical_at(self) -> np.ndarray:
        """[row, physical chunk] -> the logical chunk stored there (the inverse permutation of ``chunks``)."""
        out = np.empty_like(self.chunks)
        r = np.arange(8)[:, None]
        out[r, self.chunks] = np.arange(self.chunks.shape[1])[None, :]
        return out


SWIZZLE_ATOMS = {
    "128B": SwizzleAtom("128B", 1, 128, 3),
    "64B": SwizzleAtom("64B", 2, 64, 2),
    "32B": SwizzleAtom("32B", 3, 32, 1),
}
SWIZZLES = ("128B", "64B", "32B", "none")
MAJORS = ("K", "MN")

# descriptor bit fields: name -> (first bit, width, unit in bytes)
_FIELDS = {"start": (0, 14, 16), "lbo": (16, 14, 16), "sbo": (32, 14, 16), "base_offset": (49, 3, 1),
           "swizzle": (62, 2, 1)}


def _swizzle_name(swizzle) -> str:
    key = "none" if swizzle in (None, 0, "none", "None", "NONE") else str(swizzle).upper().replace("BYTES", "B")
    if key not in SWIZZLES:
        raise LayoutError(f"swizzle {swizzle!r}: use one of {', '.join(SWIZZLES)}")
    return key


def descriptor(start: int, lbo: int, sbo: int, swizzle: str = "128B", base_offset: int = 0) -> int:
    """The 64-bit wgmma shared-memory matrix descriptor (byte address/offsets; each a multiple of 16 bytes)."""
    swizzle = _swizzle_name(swizzle)
    mode = 0 if swizzle == "none" else SWIZZLE_ATOMS[swizzle].mode
    vals = {"start": start, "lbo": lbo, "sbo": sbo, "base_offset": base_offset, "swizzle": mode}
    out = 0
    for key, (lo, width, unit) in _FIELDS.items():
        v = int(vals[key])
        if v % unit or not 0 <= v // unit < (1 << width):
            raise LayoutError(f"descriptor field {key}={v} must be a multiple of {unit} below {unit << width}")
        out |= (v // unit) << lo
    return out


def descriptor_fields(desc: int) -> dict:
    """The fields of a descriptor, in bytes (``swizzle`` as its name or "none")."""
    desc = int(desc)
    if not 0 <= desc < 1 << 64:
        raise LayoutError(f"a wgmma descriptor is a 64-bit unsigned integer, got {desc}")
    out = {key: ((desc >> lo) & ((1 << width) - 1)) * unit for key, (lo, width, unit) in _FIELDS.items()}
    out["swizzle"] = {0: "none", **{a.mode: n for n, a in SWIZZLE_ATOMS.items()}}[out["swizzle"]]
    return out


#: the swizzled canonical layouts that ``kernels_cuda/gemm_sm90.cu`` uses, for a tile stored as 128-byte rows (one
#: TMA box row each): K-major — rows are M/N, 8-row groups SBO apart, LBO unused (1 unit); M/N-major — rows are K,
#: 8-K-row groups SBO apart, 64-element (128-byte) atoms along M/N LBO apart, where one TMA box of 64 elements x
#: BK rows is BK * 128 bytes.  One wgmma step along K moves the start address by 32 bytes (K-major) or by k * 128
#: bytes (M/N-major).
CANONICAL = {
    "kmajor": {"lbo": 16, "sbo": 8 * 128, "k_step_bytes": 32},
    "mnmajor": {"lbo": lambda bk: bk * 128, "sbo": 8 * 128, "k_step_bytes": lambda k: k * 128},
}


def _dense_offsets(major: str, swizzle: str, mn_extent: int, k_extent: int, ebytes: int) -> tuple[int, int]:
    """(LBO, SBO) that pack one instruction's tile densely: core matrices along M/N adjacent, as in the PTX ISA's
    examples (K-major swizzled: 8-row groups one atom apart, LBO unused = 16)."""
    t = 16 // ebytes
    if major == "K":
        if swizzle == "none":  # core matrix 8 rows x 16 B; M/N groups adjacent, then the next 16 bytes of K
            return 128 * (-(-mn_extent // 8)), 128
        return 16, 8 * SWIZZLE_ATOMS[swizzle].span
    if swizzle == "none":  # core matrix T elements x 8 K rows; M/N groups adjacent, then the next 8 K rows
        return 128 * (-(-mn_extent // t)), 128
    span = SWIZZLE_ATOMS[swizzle].span  # 8 K rows of one atom; K groups adjacent, then the next atom along M/N
    return 8 * span * (-(-k_extent // 8)), 8 * span


def _offsets(major: str, swizzle: str, mn: np.ndarray, k: np.ndarray, ebytes: int, lbo: int, sbo: int):
    """Byte offsets (before the swizzle) of elements (mn, k) in the canonical layout (table in the module doc)."""
    t = 16 // ebytes
    if major == "K":
        mn0, mn1, k0, k1 = mn % 8, mn // 8, k % t, k // t
        if swizzle == "none":
            return mn0 * 16 + mn1 * sbo + k0 * ebytes + k1 * lbo
        return mn0 * SWIZZLE_ATOMS[swizzle].span + mn1 * sbo + k0 * ebytes + k1 * 16
    k0, k1 = k % 8, k // 8
    if swizzle == "none":
        return (mn % t) * ebytes + (mn // t) * sbo + k0 * 16 + k1 * lbo
    q = SWIZZLE_ATOMS[swizzle].span // 16
    return (mn % t) * ebytes + ((mn // t) % q) * 16 + (mn // (t * q)) * lbo + k0 * 16 * q + k1 * sbo


@dataclass(frozen=True, eq=False)
class SmemLayout:
    """One wgmma operand tile in shared memory as a descriptor describes it.

    ``role``: "a" (M x K) or "b" (K x N); ``rows`` x ``cols`` the tile in that (row, col) convention; ``major``:
    "K" (imm-trans 0) or "MN" (imm-trans 1, 16-bit formats only); ``swizzle``; ``lbo`` / ``sbo`` in bytes.
    ``offsets[row, col]`` is the element's first byte relative to the start address before the swizzle;
    :meth:`addresses` applies the swizzle to absolute addresses (the pattern starts on its repeat boundary)."""

    role: str
    rows: int
    cols: int
    bits: int
    major: str = "K"
    swizzle: str = "128B"
    lbo: int | None = None
    sbo: int | None = None
    offsets: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        if self.role not in ("a", "b"):
            raise LayoutError(f"shared-memory operand role {self.role!r}: use 'a' or 'b'")
        if self.major not in MAJORS:
            raise LayoutError(f"major {self.major!r}: use 'K' (imm-trans 0) or 'MN' (imm-trans 1)")
        object.__setattr__(self, "swizzle", _swizzle_name(self.swizzle))
        if self.bits not in (8, 16, 32):
            raise LayoutError(f"wgmma shared-memory elements are 8, 16 or 32 bits, got {self.bits}")
        eb = self.bits // 8
        mn_ext, k_ext = (self.rows, self.cols) if self.role == "a" else (self.cols, self.rows)
        if k_ext * eb != 32:
            raise LayoutError(f"a wgmma reads 32 bytes of K per row, got K = {k_ext} of {self.bits}-bit elements")
        lbo, sbo = _dense_offsets(self.major, self.swizzle, mn_ext, k_ext, eb)
        object.__setattr__(self, "lbo", lbo if self.lbo is None else int(self.lbo))
        object.__setattr__(self, "sbo", sbo if self.sbo is None else int(self.sbo))
        for name in ("lbo", "sbo"):
            v = getattr(self, name)
            if v % 16 or not 0 <= v < 1 << 18:
                raise LayoutError(f"{name}={v}: a multiple of 16 bytes below {1 << 18}")
        r, c = np.meshgrid(np.arange(self.rows), np.arange(self.cols), indexing="ij")
        mn, k = (r, c) if self.role == "a" else (c, r)
        offs = _offsets(self.major, self.swizzle, mn, k, eb, self.lbo, self.sbo).astype(np.int64)
        used = (self.addresses(0, offs)[..., None] + np.arange(eb)).ravel()
        if len(np.unique(used)) != used.size:
            raise LayoutError(f"{self}: LBO {self.lbo} / SBO {self.sbo} make elements overlap")
        offs.flags.writeable = False
        object.__setattr__(self, "offsets", offs)

    @property
    def atom(self) -> SwizzleAtom | None:
        return SWIZZLE_ATOMS.get(self.swizzle)

    @property
    def elements_per_chunk(self) -> int:
        """T of the PTX ISA: elements per 16-byte chunk."""
        return 128 // self.bits

    @property
    def canonical(self) -> str:
        """The PTX ISA's canonical layout of this major-ness and swizzle, in CuTe notation."""
        if self.swizzle == "none":
            return ("Swizzle<0,4,3> o ((8,m),(T,2k)):((1T,SBO),(1,LBO))" if self.major == "K"
                    else "Swizzle<0,4,3> o ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))")
        a = self.atom
        q = a.span // 16
        return (f"{a.cute} o ((8,m),(T,2k)):(({q}T,SBO),(1,T))" if self.major == "K"
                else f"{a.cute} o ((T,{q},m),(8,k)):((1,T,LBO),({q}T,SBO))")

    @property
    def footprint(self) -> int:
        """Bytes from the start address to the end of the last element."""
        return int(self.offsets.max()) + self.bits // 8

    def addresses(self, start: int = 0, offsets=None) -> np.ndarray:
        """Physical byte address of each element's first byte for a descriptor start address ``start`` (bytes)."""
        offs = self.offsets if offsets is None else offsets
        addr = int(start) + offs
        return addr if self.atom is None else self.atom.physical(addr)

    def descriptor(self, start: int = 0) -> int:
        return descriptor(start, self.lbo, self.sbo, self.swizzle)

    def __str__(self) -> str:
        what = "A (M x K)" if self.role == "a" else "B (K x N)"
        return (f"{what} {self.rows}x{self.cols} in shared memory, {self.major}-major, swizzle {self.swizzle}, "
                f"LBO {self.lbo} B, SBO {self.sbo} B: {self.canonical}, T = {self.elements_per_chunk}")

    __repr__ = __str__


def smem_layout(role: str, rows: int, cols: int, bits: int, desc: int | None = None, *, major: str = "K",
                swizzle: str = "128B", lbo: int | None = None, sbo: int | None = None) -> SmemLayout:
    """The :class:`SmemLayout` of an operand tile: from a descriptor's LBO / SBO / swizzle when ``desc`` is given
    (its start address is the caller's), else from ``swizzle``, ``lbo`` and ``sbo`` (dense defaults)."""
    if desc is not None:
        f = descriptor_fields(desc)
        if f["base_offset"]:
            raise LayoutError(f"descriptor base offset {f['base_offset']}: only swizzle patterns that start on their "
                              "repeat boundary (base offset 0) are modelled")
        swizzle, lbo, sbo = f["swizzle"], f["lbo"], f["sbo"]
    return SmemLayout(role, rows, cols, bits, major, swizzle, lbo, sbo)
