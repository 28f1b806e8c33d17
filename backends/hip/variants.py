"""The HIP GEMM variants, enumerated from the MFMA records of :mod:`mxcore.layouts`.

One :class:`KernelSpec` per (arch, instruction, A format, B format): ``gemm_mfma.hip`` specialised by the
``-D`` defines of :meth:`KernelSpec.defines`.  Which instructions exist, their shapes, builtins, format codes
and register counts are read from the records; nothing here spells an instruction name.  The rule that picks
the records (:func:`kernel_specs`):

* every AMD record that runs on ``arch`` is a candidate; the f8f6f4 family enters through its scaled form
  (``v_mfma_scale_*``) for every pair of its operand formats (with unit scales it is the unscaled form);
* for each (instruction M, A format, B format) the record with the largest K wins (CDNA4's full-rate
  16x16x32 / 32x32x16 fp16 over the CDNA3 shapes; the f8f6f4 MFMA over the classic OCP fp8 one), a scaled
  record over an unscaled one of the same K;
* a record serves every matmul dtype whose element format it reads (:data:`mxcore.dtypes.ELEMENT`): MX
  dtypes on scaled records, plain fp8 dtypes on the same scaled kernel with scale bytes 127;
* every 32x32 instruction also gets a large 8-wave tile (:data:`BIG_TILE`: 256x256 on gfx950, 256x128 on
  gfx942) where its LDS fits the arch (:data:`LDS_BYTES`) and a K-tile row is at most 64 bytes (fp6's
  96-byte rows would spill registers); :func:`select_spec` picks it for problems of at least
  :data:`BIG_TILES` such tiles;
* tf32 where no record reads tf32 (CDNA4 has no xf32 MFMA) runs on the fp32 records: the inputs are rounded
  to tf32 on the host and the products are exact, so the fp32 instruction computes the same sums.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from ... import dtypes as _dt
from ...errors import FormatError, LayoutError, UnsupportedError
from .fragments import WAVE, frag_type, fragment_constants
from .launch import XCDS
from .staging import K_PAD

__all__ = ["ARCHS", "BIG_TILE", "BIG_TILES", "LDS_BYTES", "SOURCE_FILE", "KernelSpec", "ceiling_defines", "compile_inputs", "kernel_specs",
           "scaled_spec", "select_spec", "supported_dtype_names", "tile_name", "tile_names", "validate_spec"]

ARCHS = ("gfx942", "gfx950")
SOURCE_FILE = "gemm_mfma.hip"
LDS_BYTES = {"gfx942": 64 * 1024, "gfx950": 160 * 1024}  # LDS per workgroup (CDNA3 / CDNA4)
# the large tile of the 32x32 instructions: (waves_m, waves_n, tm, tn) -> 256x256 on gfx950, 256x128 on gfx942
# (8 waves, two per SIMD); chosen by select_spec for problems of at least BIG_TILES such tiles
BIG_TILE = {"gfx942": (4, 2, 2, 2), "gfx950": (2, 4, 4, 2)}
BIG_TILES = 1024


@dataclass(frozen=True)
class KernelSpec:
    """One compiled variant of gemm_mfma.hip: an instruction, its operand formats and the tile sizes."""

    arch: str
    dtype: str  # matmul dtype name: "fp16", "e4m3fnuz,e5m2fnuz", "mxfp8_e4m3,mxfp4", ...
    instruction: str  # ISA mnemonic = mxcore.layouts record name
    a_format: str  # element formats of the record (mxcore.formats names)
    b_format: str
    shape: tuple  # (M, N, K) of the instruction (from the record)
    afrag: str  # mx_types.h typedefs of the builtin's A / B / C operand (fragments.frag_type)
    bfrag: str
    cfrag: str
    elem_bytes: int  # bytes per storage unit in global memory and LDS (sub-byte operands: one byte)
    scaled: bool = False
    cbsz: int = 0  # scaled: A format code (the record's); classic MFMAs: broadcast control, always 0 here
    blgp: int = 0
    waves_m: int = 2
    waves_n: int = 2
    tm: int = 2
    tn: int = 2
    lds_pad: int = 16
    also: tuple = ()  # further matmul dtypes this same kernel serves (OCP fp8 = MX fp8 with unit scales)
    a_bits: int = 0  # element bits of A / B as stored (fp4 / fp6: packed along K, staging.pack_k); 0: 8 * elem_bytes
    b_bits: int = 0

    def stored_bits(self, role: str) -> int:
        """Bits per element of operand ``role`` in global memory and LDS."""
        return (self.a_bits if role == "a" else self.b_bits) or 8 * self.elem_bytes

    def packed(self, role: str) -> bool:
        """Operand ``role`` is stored packed along K (sub-byte codes): the kernel needs it K-contiguous."""
        return self.stored_bits(role) < 8 * self.elem_bytes

    @property
    def dtypes(self) -> tuple:
        return (self.dtype, *self.also)

    @property
    def name(self) -> str:
        return self.entry

    @property
    def bk(self) -> int:
        """K elements per tile: a multiple of the instruction's K (at least 64 bytes of 1-byte elements) whose
        rows are whole 16-byte vectors and whose tiles split evenly into one vector per thread and step."""
        m, n, k = self.shape
        rows = {"a": self.waves_m * self.tm * m, "b": self.waves_n * self.tn * n}
        bk = max(k, 64 // self.elem_bytes)
        while any((bk * self.stored_bits(r)) % 128 or (rows[r] * bk * self.stored_bits(r) // 128) % self.threads
                  for r in rows):
            bk += k
        return bk

    def row_bytes(self, role: str) -> int:
        """LDS row pitch of operand ``role``: one tile row of K and the padding."""
        return self.bk * self.stored_bits(role) // 8 + self.lds_pad

    @property
    def lds_bytes(self) -> int:
        """LDS of the kernel: two buffers of the A and B tiles."""
        bm, bn, _ = self.tile
        return 2 * (bm * self.row_bytes("a") + bn * self.row_bytes("b"))

    @property
    def tile(self) -> tuple:
        m, n, _ = self.shape
        return self.waves_m * self.tm * m, self.waves_n * self.tn * n, self.bk

    @property
    def threads(self) -> int:
        return WAVE * self.waves_m * self.waves_n

    @property
    def big(self) -> bool:
        """The 8-wave large-tile variant (BIG_TILE) of its instruction."""
        return self.waves_m * self.waves_n == 8

    @property
    def entry(self) -> str:
        base = "mx_gemm_" + self.instruction.removeprefix("v_mfma_")
        base = f"{base}_{self.a_format}_{self.b_format}" if self.scaled else base
        return f"{base}_{tile_name(self)}" if self.big else base

    def layout(self):
        """The instruction's record in mxcore.layouts."""
        from ... import layouts

        if self.scaled:
            return layouts.get(self.instruction, a_format=self.a_format, b_format=self.b_format)
        return layouts.get(self.instruction, a_format=self.a_format, b_format=self.b_format, arch=self.arch)

    def defines(self, layout=None) -> tuple:
        """The -D options of this variant: lane constants from the layout record, tile sizes, builtin."""
        validate_spec(self)
        lay = self.layout() if layout is None else layout
        if self.scaled and (lay.cbsz, lay.blgp) != (self.cbsz, self.blgp):
            raise FormatError(f"{self.entry}: cbsz/blgp {self.cbsz}/{self.blgp} disagree with the layout record's "
                              f"{lay.cbsz}/{lay.blgp} for {self.a_format} x {self.b_format}")
        if lay.name != self.instruction or not lay.intrinsic:
            raise LayoutError(f"{self.entry}: layout record {lay.name!r} is not {self.instruction!r} or has no builtin")
        c = fragment_constants(lay, self)
        m, n, k = self.shape
        d = {
            "MX_ENTRY": self.entry, "MX_BUILTIN": lay.intrinsic,
            "MX_AFRAG_T": self.afrag, "MX_BFRAG_T": self.bfrag, "MX_CFRAG_T": self.cfrag,
            "MX_EB": self.elem_bytes, "MX_IM": m, "MX_IN": n, "MX_IK": k, "MX_BK": self.bk,
            "MX_WAVES_M": self.waves_m, "MX_WAVES_N": self.waves_n, "MX_TM": self.tm, "MX_TN": self.tn,
            "MX_LDS_PAD": self.lds_pad, "MX_SCALED": int(self.scaled), "MX_CBSZ": self.cbsz, "MX_BLGP": self.blgp,
            "MX_A_SBITS": self.stored_bits("a"), "MX_B_SBITS": self.stored_bits("b"), "MX_KPAD": K_PAD,
            "MX_XCDS": XCDS,
            **c,
        }
        return tuple(f"-D{key}={value}" for key, value in d.items())


def _spec_from_record(rec, arch: str, dtype: str, also: tuple = ()) -> KernelSpec:
    # 16/32-bit elements keep their width; f8f6f4 operands are byte streams (fp4 / fp6 packed along K)
    elem_bytes = -(-max(rec.a.bits, rec.b.bits) // 8)
    sub = [int(op.bits) if int(op.bits) < 8 * elem_bytes else 0 for op in (rec.a, rec.b)]
    return KernelSpec(
        arch=arch, dtype=dtype, instruction=rec.name, a_format=rec.a_format, b_format=rec.b_format,
        shape=(rec.m, rec.n, rec.k), afrag=frag_type(rec, "a"), bfrag=frag_type(rec, "b"), cfrag=frag_type(rec, "c"),
        elem_bytes=elem_bytes, scaled=rec.scaled, cbsz=int(rec.cbsz or 0) if rec.scaled else 0,
        blgp=int(rec.blgp or 0) if rec.scaled else 0, also=tuple(also), a_bits=sub[0], b_bits=sub[1])


def scaled_spec(arch: str, m: int, a_format: str, b_format: str, dtype: str = "") -> KernelSpec:
    """The f8f6f4 variant of instruction M ``m`` for one pair of operand formats (validation tests)."""
    from ... import layouts

    (rec,) = [r for r in layouts.records("amd", "gfx950") if r.scaled and r.m == m
              and (r.a_format, r.b_format) == (a_format, b_format)]
    return _spec_from_record(rec, arch, dtype or f"{a_format},{b_format}")


def _dtype_names(element: str, kinds) -> list[str]:
    """Canonical matmul dtype names of ``kinds`` whose element format is ``element`` (mxcore.dtypes' table)."""
    return [d.name for d in _dt.DTYPES.values() if d.kind in kinds and d.element == element]


@functools.cache
def kernel_specs(arch: str) -> tuple:
    """Every variant compiled for ``arch`` (both instruction shapes of every dtype); see the module docstring."""
    from ... import layouts

    if arch not in ARCHS:
        raise UnsupportedError(f"no MFMA kernels for {arch!r}; mxcore's HIP kernels target {', '.join(ARCHS)}")
    best: dict = {}
    for rec in layouts.records("amd", arch):
        if rec.cbsz is not None and not rec.scaled:
            continue  # the unscaled f8f6f4 form is the scaled one with unit scales
        key = (rec.m, rec.a_format, rec.b_format)
        if key not in best or (rec.k, rec.scaled) > (best[key].k, best[key].scaled):
            best[key] = rec
    # float dtypes no instruction reads run on the narrowest one that holds them (tf32 -> fp32 on gfx950)
    stand_in = {}
    for d in _dt.DTYPES.values():
        if d.kind == "float":
            via = layouts.instruction_element(d.name, arch)
            if via is not None and via != d.element:
                stand_in.setdefault(via, []).append(d.name)
    specs = []
    for rec in best.values():
        kinds = ("mx", "fp8") if rec.scaled else ("float", "fp8")
        names_a, names_b = _dtype_names(rec.a_format, kinds), _dtype_names(rec.b_format, kinds)
        pairs = [_dt.resolve((na, nb), arch).name for kind in kinds for na in names_a for nb in names_b
                 if _dt.KINDS[na] == _dt.KINDS[nb] == kind]  # MX first on scaled records: they are the MX kernels
        if rec.a_format == rec.b_format:
            pairs += stand_in.get(rec.a_format, [])
        if pairs:
            spec = _spec_from_record(rec, arch, pairs[0], pairs[1:])
            specs.append(spec)
            if rec.m == 32:
                wm, wn, tm, tn = BIG_TILE[arch]
                big = replace(spec, waves_m=wm, waves_n=wn, tm=tm, tn=tn)
                # K-tile rows of at most 64 bytes: staging plus 128 accumulator registers fit the 256 VGPRs of
                # two waves per SIMD (fp6's 96-byte rows would spill)
                if big.lds_bytes <= LDS_BYTES[arch] and max(big.row_bytes(r) - big.lds_pad for r in "ab") <= 64:
                    specs.append(big)
    # stable: record order within a group; the default tile of a shape before its large tile
    return tuple(sorted(specs, key=lambda s: (s.scaled, -s.shape[0], s.big)))


def validate_spec(spec: KernelSpec) -> None:
    """Check the immediate operands the compiler would accept silently (format codes, cbsz/abid/blgp)."""
    FORMAT_CODE = _dt.F8F6F4_CODES

    if spec.scaled:
        for role, fmt, code in (("A", spec.a_format, spec.cbsz), ("B", spec.b_format, spec.blgp)):
            if fmt not in FORMAT_CODE:
                raise FormatError(f"{spec.instruction}: operand {role} format {fmt!r} is not an f8f6f4 format; "
                                  f"valid: {', '.join(FORMAT_CODE)}")
            if code != FORMAT_CODE[fmt]:
                raise FormatError(f"{spec.instruction}: operand {role} format code {code} does not name {fmt} "
                                  f"(codes: {FORMAT_CODE}); the hardware would read the bytes as another format")
        if spec.arch != "gfx950":
            raise UnsupportedError(f"{spec.instruction} exists only on gfx950 (CDNA4), not {spec.arch}")
    else:
        if spec.cbsz or spec.blgp:
            raise FormatError(f"{spec.instruction}: cbsz={spec.cbsz} blgp={spec.blgp}; these are broadcast controls "
                              "on classic MFMAs and mxcore's kernels need 0 (no broadcast)")
        try:
            spec.layout()
        except LayoutError as exc:
            raise UnsupportedError(f"{spec.instruction} ({spec.a_format} x {spec.b_format}) does not exist on "
                                   f"{spec.arch}: {exc}") from exc
    if spec.elem_bytes not in (1, 2, 4):
        raise FormatError(f"element storage of {spec.elem_bytes} bytes; the kernel stores 1, 2 or 4")


def select_spec(arch: str, mdt, m: int, n: int, *, tile: str | None = None) -> KernelSpec:
    """The variant that runs ``mdt`` on ``arch``: the 32x32 shape's large 8-wave tile (256x256 on gfx950,
    256x128 on gfx942) when the problem holds at least BIG_TILES of them (enough blocks for every CU twice
    over), else its 128x128 tile when both M and N reach 128, else the 16x16 shape (less padding on small or
    skinny problems).  ``tile``: one of :func:`tile_names`."""
    name = mdt if isinstance(mdt, str) else mdt.name  # kernel_specs lists kernels under MatmulDType names
    cands = [s for s in kernel_specs(arch) if name in s.dtypes]
    if not cands:
        have = sorted({d for s in kernel_specs(arch) for d in s.dtypes})
        raise UnsupportedError(f"no {arch} kernel for dtype {name!r}; {arch} runs: {', '.join(have)}")
    if tile is not None:
        for s in cands:
            if tile_name(s) == tile:
                return s
        raise UnsupportedError(f"tile {tile!r} for {name} on {arch}: choose one of "
                               f"{', '.join(tile_name(s) for s in cands)}")
    large = [s for s in cands if s.shape[0] == 32 and not s.big]
    small = [s for s in cands if s.shape[0] == 16]
    huge = [s for s in cands if s.big]
    if huge and (-(-m // huge[0].tile[0])) * (-(-n // huge[0].tile[1])) >= BIG_TILES:
        return huge[0]
    if large and min(m, n) >= 128 or not small:
        return large[0]
    return small[0]


def tile_name(spec: KernelSpec) -> str:
    """The block tile, e.g. "128x128": what ``plan(..., tile=...)`` takes."""
    bm, bn, _ = spec.tile
    return f"{bm}x{bn}"


def tile_names(arch: str, dtype: str) -> tuple:
    return tuple(tile_name(s) for s in kernel_specs(arch) if dtype in s.dtypes)


def supported_dtype_names(arch: str) -> list[str]:
    """Canonical matmul dtype names (single-format; A/B pairs of the same kind also run) on ``arch``."""
    names = {d for s in kernel_specs(arch) for d in s.dtypes if "," not in d}
    order = list(_dt.KINDS)
    return sorted(names, key=order.index)


@functools.cache
def compile_inputs(spec: KernelSpec) -> tuple:
    """(source, options) of a variant: the one source string and -D options that go to hiprtc at run
    time and to clang-22 in CI (both add -O3 -std=c++17 and the arch).  Computed once per variant."""
    from ...kernels import kernel_source

    return kernel_source("amd", SOURCE_FILE), spec.defines()


def ceiling_defines(spec: KernelSpec, chains: int) -> tuple:
    """-D options of gemm_ceiling.hip for the instruction of ``spec``."""
    c = dict(o[2:].split("=", 1) for o in spec.defines())
    keep = ("MX_BUILTIN", "MX_AFRAG_T", "MX_CFRAG_T", "MX_C_SLOTS", "MX_SCALED", "MX_CBSZ", "MX_BLGP")
    return tuple(f"-D{k}={c[k]}" for k in keep) + (f"-DMX_CHAINS={chains}",)

