"""What a kernel reads: :class:`DevOperand` (an operand staged on the device) with its exact-MX block scales
(:class:`MXFactors`), and the codes the plans pass to the kernels (output kinds, staged fp8 element names, the
special-value policies).  Below the staging and the plans, which both use them; it imports neither."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FP8_SHORT", "LO_CAP", "OUT_KIND", "STORE", "DevOperand", "MXFactors"]

#: the kernels' output kind codes and storage dtypes (bfloat16 is stored as its uint16 bits)
OUT_KIND = {"float32": 0, "float16": 1, "bfloat16": 2}
STORE = {"float32": "float32", "float16": "float16", "bfloat16": "uint16"}
_SPECIAL = {"none": 0, "fn": 1, "ieee": 2}  # a format's special values, as the kernels' format words encode them
FP8_SHORT = {"e4m3fn": "e4m3", "e5m2": "e5m2"}  # fp8 element names -> the staged element names
LO_CAP = 64  # a lossy MXFP8 fold's entries of lost bits per row (stage.py: LO_SHIFT)


@dataclass
class MXFactors:
    """An MX operand's block scales as the exact wgmma variant reads them (``gemm_sm90_mx.cu``): ``factors``
    int32 (A: [M][blocks_pad], B: [blocks_pad][ld] with columns permuted in 16s), ``ld`` its row pitch (elements),
    ``blocks_pad`` = K/32 rounded up to whole 128-K stages, ``info`` int32 x 8 (live code range, any NaN block,
    for folded operands 1 when some row has no single factor over all of K, and 1 when a lossy fold's list
    overflowed), ``nan`` uint8 per row of A / column of B (1: the row / column holds a NaN block); an MXFP8 operand
    folded with its lost bits kept (:meth:`Stager.mx_fold`) has ``lo_cnt`` int32 per row and ``lo_ent`` int32
    [rows][LO_CAP][2] ({k, lo bits} sorted by k), and ``lo_elt`` the folded elements transposed for ``mx_lo_fix``,
    which the fold writes (for an MXFP4 / MXFP6 operand too when staged beside an MXFP8 one: ``mx_fold(transposed=)``;
    else ``sm90._transposed_elements`` makes it at the first ``gemm()``)."""

    factors: object
    ld: int
    blocks_pad: int
    info: object
    nan: object
    folded: object = None  # uint8 per 128-K window (1: folded in every row; :meth:`Stager.mx_fold`), or None
    lo_cnt: object = None  # lossy MXFP8 fold: entries per row (may exceed LO_CAP: then info[4] = 1, refolded)
    lo_ent: object = None
    lo_elt: object = None  # the folded elements transposed, uint8 [windows * 128][rows rounded up to 32]: mx_lo_fix

    def copy(self) -> "MXFactors":
        def cp(x):
            return None if x is None else x.copy()

        return MXFactors(self.factors.copy(), self.ld, self.blocks_pad, self.info.copy(), self.nan.copy(),
                         cp(self.folded), cp(self.lo_cnt), cp(self.lo_ent), cp(self.lo_elt))


@dataclass
class DevOperand:
    """An operand as the GEMM kernel reads it: ``buf`` (kept alive) at ``ld`` elements per row, K-major or not,
    element ``elem`` ("f16" | "bf16" | "tf32" | "e4m3" | "e5m2"), values times 2^(exp + *exp_at), K as the kernel
    sees it (3xTF32 triples it), batch stride in elements (0: shared by every batch element).  ``exp_at``: None,
    or a 0-d device array the epilogue reads (int32: a per-tensor fp8 scale exponent; uint8: an MX scale
    maximum)."""

    buf: object
    ld: int
    kmajor: bool
    elem: str
    exp: int = 0
    k: int = 0
    bstride: int = 0
    exp_at: object = None
    direct: bool = False  # buf is the caller's array itself (read in place)
    mx: MXFactors | None = None  # exact MX fp8: the block scales as the kernel reads them
    span: tuple | None = None  # weight-only records: (least, greatest) scale code (wonly/records.py: pack_weight)
    specials: bool = True  # weight-only records: some element code is special (NaN / inf) or not known to be none

    def copy(self) -> "DevOperand":
        return DevOperand(self.buf.copy(), self.ld, self.kmajor, self.elem, self.exp, self.k, self.bstride,  # not the
                          self.exp_at, mx=None if self.mx is None else self.mx.copy(), span=self.span,  # caller's
                          specials=self.specials)  # array
