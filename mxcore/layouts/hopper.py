"""NVIDIA Hopper ``wgmma.mma_async`` (sm_90a) as layout-database records: the warpgroup accumulator fragment, the
register-A operand form, and the shared-memory operands (descriptor, canonical layout, swizzle atom: :mod:`._smem`).

Source: PTX ISA 9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" — 9.7.15.5.1.1 register
fragments (D of m64nNk*: each warp of the warpgroup owns 16 rows, laid out as mma.m16n8's C fragment repeated
over N/8 column blocks; A in registers: each warp holds the 16-row slice of the m16n8k{16,8,32} A fragment),
9.7.15.5.1.2 shared-memory layouts and swizzling modes, 9.7.15.5.1.2.2 the matrix descriptor, 9.7.15.5.2 the
instruction (``wgmma.mma_async.sync.aligned.shape.dtype.atype.btype d, a-desc|a, b-desc, scale-d, imm-scale-a,
imm-scale-b[, imm-trans-a], [imm-trans-b]``; the transpose immediates exist for .f16/.bf16 only).

* :func:`accumulator` — D of ``m64nNk*`` (fp32 accumulation): 128 lanes x N/2 slots on a 64 x N tile; slot s of
  lane t is register d[s]: row 16·(t/32) + (t%32)/4 + 8·((s/2)%2), column 8·(s/4) + 2·(t%4) + s%2.
* :func:`register_a` — the register-A form of ``m64nNk16`` (f16/bf16), ``k8`` (tf32), ``k32`` (e4m3/e5m2):
  warp w holds rows [16w, 16w + 16) exactly as the matching mma.sync record's A fragment (composed from
  :mod:`.nvidia`, not re-typed).
* :class:`WgmmaLayout` / :func:`record` — one instruction: ``c`` (= ``d``) and ``a`` are register operands
  (:class:`~._core.OperandLayout`); ``smem("a" | "b", major, swizzle, lbo, sbo)`` gives a shared-memory operand
  (:class:`~._smem.SmemLayout`: the byte offset of every element, the descriptor, the swizzle atom).
* :data:`RECORDS` — the database entries: every N the kernels use (gemm_sm90.cu's block tile N 64 / 128 / 192 /
  256; gemm_wonly_wg.cu's 8 · WO_MT, 8..64) for every A/B format pair (f16, bf16, tf32, e4m3/e5m2 x e4m3/e5m2),
  fp32 accumulators; named in PTX form, with aliases ``m64nNkK.<types>`` and ``wgmma.m64nNkK.<types>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..errors import LayoutError
from . import nvidia
from ._core import Map, OperandLayout
from ._smem import (CANONICAL, MAJORS, SWIZZLE_ATOMS, SWIZZLES, SmemLayout, SwizzleAtom, descriptor,
                    descriptor_fields, smem_layout)

__all__ = ["ARCHS", "CANONICAL", "KERNEL_N", "MAJORS", "RECORDS", "SWIZZLES", "SWIZZLE_ATOMS", "WGMMA_K",
           "SmemLayout", "SwizzleAtom", "WgmmaLayout", "WgmmaRecord", "accumulator", "descriptor",
           "descriptor_fields", "record", "register_a", "smem_layout", "wgmma_ptx"]

ARCHS = ("sm_90a",)
LANES = 128  # one warpgroup
WGMMA_K = {"fp16": 16, "bf16": 16, "tf32": 8, "e4m3fn": 32, "e5m2": 32}  # K of one wgmma per A/B format
_PTX_TYPE = {"fp16": "f16", "bf16": "bf16", "tf32": "tf32", "e4m3fn": "e4m3", "e5m2": "e5m2"}
_STORAGE_BITS = {"fp16": 16, "bf16": 16, "tf32": 32, "e4m3fn": 8, "e5m2": 8}  # bits per element in shared memory
_SRC = ("PTX ISA 9.7.15 wgmma.mma_async: register fragments, shared-memory layouts, matrix descriptor",)
#: N of the wgmma the kernels issue: gemm_sm90.cu's SM90_BN (backends/cuda/sm90.py SM90_TILES) and
#: gemm_wonly_wg.cu's 8 * WO_MT (backends/cuda/tuning/wonly.json: wg.mt + wg_fold.mt); tests/test_wgmma_ptx.py checks that
#: every wgmma in the emitted PTX has a record
KERNEL_N = (8, 16, 24, 32, 40, 48, 56, 64, 128, 192, 256)
#: the A/B format pairs of wgmma with fp32 accumulators (.f16 x .f16, .bf16 x .bf16, .tf32 x .tf32, fp8 pairs)
FORMAT_PAIRS = (("fp16", "fp16"), ("bf16", "bf16"), ("tf32", "tf32"), ("e4m3fn", "e4m3fn"), ("e4m3fn", "e5m2"),
                ("e5m2", "e4m3fn"), ("e5m2", "e5m2"))

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
    if c_format not in ("fp32", "fp16") or (c_format == "fp16" and a_format in ("bf16", "tf32")):
        raise LayoutError(f"wgmma {a_format} accumulates in fp32" + (" or fp16" if a_format not in ("bf16", "tf32")
                                                                     else "") + f", not {c_format}")
    k = WGMMA_K[a_format]
    tc = {"fp32": "f32", "fp16": "f16"}[c_format]
    return f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.{tc}.{_PTX_TYPE[a_format]}.{_PTX_TYPE[b_format]}"


@dataclass(frozen=True, eq=False)
class WgmmaLayout:
    """One ``wgmma.mma_async`` instruction: D = A·B + D on a 64 x N x K tile, run by a warpgroup (128 lanes).

    Register operands are :class:`~._core.OperandLayout` (``c`` = ``d``: the accumulator; ``a``: A when it comes
    from registers); A from shared memory and B (always in shared memory) are described by a descriptor:
    :meth:`smem` gives their :class:`~._smem.SmemLayout` for a major-ness, swizzle mode and LBO / SBO.
    ``transpose``: whether the operands may be M/N-major (imm-trans-a/b; 16-bit formats only)."""

    name: str
    n: int
    k: int
    a_format: str
    b_format: str
    c_format: str
    c: OperandLayout
    a: OperandLayout
    transpose: bool
    alias: str
    m: int = 64
    lanes: int = LANES
    vendor: str = "nvidia"
    archs: tuple = ARCHS
    sources: tuple = _SRC
    # the InstructionLayout fields that do not apply: wgmma takes no block scales and no AMD modifiers
    scale_a = scale_b = scale_format = scale_block = scale_opsel = scale_thread = None
    cbsz = blgp = intrinsic = None
    scaled = False

    @property
    def ptx(self) -> str:
        return self.name

    @property
    def mnemonic(self) -> str:
        return self.name

    @property
    def d(self) -> OperandLayout:
        return self.c

    @property
    def a_registers(self) -> OperandLayout:
        return self.a

    @property
    def key(self) -> str:
        return f"{self.name}@{self.archs[0]}"

    @property
    def smem_bits(self) -> dict:
        """Bits one A / B element occupies in shared memory (tf32 as 32-bit words)."""
        return {"a": _STORAGE_BITS[self.a_format], "b": _STORAGE_BITS[self.b_format]}

    def smem(self, role: str = "b", major: str = "K", swizzle: str = "128B", lbo: int | None = None,
             sbo: int | None = None, *, desc: int | None = None) -> SmemLayout:
        """A ("a", M x K) or B ("b", K x N) in shared memory: ``major`` "K" or "MN" (16-bit formats only),
        ``swizzle`` 128B / 64B / 32B / none, ``lbo`` / ``sbo`` in bytes (default: the tile packed densely), or all
        three from a descriptor ``desc`` (its start address is yours: :meth:`SmemLayout.addresses`)."""
        key = _role(role)
        if key not in ("a", "b"):
            raise LayoutError(f"{self.name}: only A and B can come from shared memory, not {role!r}")
        major = str(major).upper()
        if major == "MN" and not self.transpose:
            raise LayoutError(f"{self.name}: {self.a_format if key == 'a' else self.b_format} operands are K-major "
                              "only (imm-trans-a/b exist for .f16/.bf16)")
        rows, cols = (self.m, self.k) if key == "a" else (self.k, self.n)
        return smem_layout(key, rows, cols, self.smem_bits[key], desc, major=major, swizzle=swizzle, lbo=lbo,
                           sbo=sbo)

    def operand(self, role: str):
        """The register operand "a" (A from registers) or "c" / "d"; "a_smem" and "b" give the canonical
        shared-memory form (K-major, 128-byte swizzle, dense) -- :meth:`smem` for the others."""
        key = _role(role)
        if key in ("c", "d"):
            return self.c
        if key == "a":
            return self.a
        if key in ("a_smem", "b"):
            return self.smem(key[0])
        raise LayoutError(f"{self.name} has no operand {role!r}; operands: a (registers), a_smem, b (shared memory), "
                          "c, d")

    def operands(self) -> dict:
        """The register operands (A's register form and C/D); B is in shared memory (:meth:`smem`)."""
        return {"a": self.a, "c": self.c}

    def format_of(self, role: str) -> str:
        key = _role(role)
        if key not in ("a", "a_smem", "b", "c", "d"):
            self.operand(role)  # raises, naming the operands
        return {"a": self.a_format, "a_smem": self.a_format, "b": self.b_format}.get(key, self.c_format)

    def __str__(self) -> str:
        km = self.smem("b")
        lines = [f"{self.name} (nvidia {', '.join(self.archs)}): D[64x{self.n}] = A[64x{self.k}] {self.a_format} x "
                 f"B[{self.k}x{self.n}] {self.b_format} + D {self.c_format}, {self.lanes} lanes (one warpgroup)",
                 f"  alias: {self.alias}",
                 f"  ptx: {self.name} d, a-desc|a, b-desc, scale-d, imm-scale-a, imm-scale-b"
                 + (", imm-trans-a, imm-trans-b" if self.transpose else ""),
                 f"  {self.c}",
                 f"  {self.a} (A from registers)",
                 f"  A or B from shared memory: descriptor (start, LBO, SBO, base offset, swizzle 128B/64B/32B/none), "
                 f"K-major{' or MN-major' if self.transpose else ' only'}; e.g. {km}"]
        return "\n".join(lines)

    __repr__ = __str__


WgmmaRecord = WgmmaLayout  # the earlier name of the record type


def _role(role) -> str:
    key = str(role).strip().lower().replace("-", "_")
    return {"asmem": "a_smem", "a_shared": "a_smem", "bsmem": "b", "b_smem": "b"}.get(key, key)


def record(n: int, a_format: str, b_format: str | None = None, c_format: str = "fp32") -> WgmmaLayout:
    """The :class:`WgmmaLayout` of ``wgmma.mma_async.m64n{n}k*`` for the formats (``b_format`` defaults to A's); one
    object per instruction."""
    return _record(n, a_format, b_format or a_format, c_format)


@lru_cache(maxsize=None)
def _record(n: int, a_format: str, b_format: str, c_format: str) -> WgmmaLayout:
    ptx = wgmma_ptx(n, a_format, b_format, c_format)
    k = WGMMA_K[a_format]
    ta, tb = _PTX_TYPE[a_format], _PTX_TYPE[b_format]
    alias = f"m64n{n}k{k}.{ta}" + ("" if ta == tb else f".{tb}") + ("" if c_format == "fp32" else ".f16acc")
    return WgmmaLayout(ptx, n, k, a_format, b_format, c_format, accumulator(n, 32 if c_format == "fp32" else 16),
                       register_a(k), a_format in ("fp16", "bf16"), alias)


RECORDS = tuple(record(n, fa, fb) for fa, fb in FORMAT_PAIRS for n in KERNEL_N)


def aliases(rec: WgmmaLayout) -> tuple:
    """Short names of a record: ``m64n128k16.f16`` and ``wgmma.m64n128k16.f16`` (fp8 pairs: ``.e4m3.e5m2``; equal
    fp8 pairs also spelled out, ``m64n64k32.e4m3.e4m3``)."""
    shape, _, ta, tb = rec.name.split(".")[4:]
    out = [rec.alias, f"wgmma.{rec.alias}"]
    if ta == tb and ta in ("e4m3", "e5m2"):
        out += [f"{shape}.{ta}.{tb}", f"wgmma.{shape}.{ta}.{tb}"]
    return tuple(dict.fromkeys(out))
