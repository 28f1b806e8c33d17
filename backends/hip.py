"""AMD backend: CDNA3 (gfx942) and CDNA4 (gfx950) MFMA GEMM kernels through hip-python + hiprtc.

What runs where (one source, ``kernels_hip/gemm_mfma.hip``, specialised by -D defines):

===========  =================================================  =====================================
arch         dtype                                              instruction (both shapes are variants)
===========  =================================================  =====================================
both         fp32                                               v_mfma_f32_32x32x2_f32 / 16x16x4_f32
gfx942       tf32                                               v_mfma_f32_32x32x4_xf32 / 16x16x8_xf32
gfx950       tf32 (inputs rounded to tf32 by mxcore; exact      v_mfma_f32_32x32x2_f32 / 16x16x4_f32
             products, so the fp32 instruction computes the     (CDNA4 dropped the xf32 MFMAs)
             same products)
gfx942       fp16, bf16                                         v_mfma_f32_32x32x8_{f16,bf16} / 16x16x16
gfx942       e4m3fnuz / e5m2fnuz, all four A/B pairs (FNUZ)     v_mfma_f32_32x32x16_{fp8,bf8}_{fp8,bf8} / 16x16x32
gfx950       fp16, bf16                                         v_mfma_f32_32x32x16_{f16,bf16} / 16x16x32
gfx950       e4m3fn / e5m2 (OCP), all pairs, unit scales 127    v_mfma_scale_f32_32x32x64_f8f6f4 / 16x16x128
gfx950       mxfp8(_e5m2), mxfp6(_e3m2), mxfp4, any A/B pair    v_mfma_scale_f32_32x32x64_f8f6f4 / 16x16x128
===========  =================================================  =====================================

Design targets (peak rates from AMD's published specifications, *not* measurements; nothing here has
run on AMD hardware yet): MI355X (gfx950) dense fp16/bf16 2.5 PFLOP/s needs the CDNA4 full-rate
16x16x32 / 32x32x16 instructions (the CDNA3-shaped 32x32x8 / 16x16x16 run at half that rate there);
MI355X fp8 5 PF, fp6/fp4 10 PF through the f8f6f4 family (fp8 operands take the longer cycle count);
MI325X (gfx942) fp16 1.3 PF, fp8 2.6 PF.  The kernels are correct-first: LDS double buffering and
16-byte global loads, but no tuned pipelines yet, so expect well below these peaks.

Per-lane index arithmetic is not written by hand: :func:`fragment_constants` fits the kernel's
parametric lane map to the instruction's record in :mod:`mxcore.layouts` (raising LayoutError when a
record does not fit), and tests/test_hip_index.py runs the same constants through a Python mirror of
the kernel and :mod:`mxcore.emulate`.

fp8 encodings: ``dtype="fp8"`` means e4m3fnuz on gfx942 and e4m3fn (OCP) on gfx950
(:func:`mxcore.dtypes.resolve`).  Bytes of the other encoding are refused with an error naming both,
unless ``matmul(..., fp8_convert=True)`` (or :func:`convert_fp8`): values are decoded and re-encoded
(RNE), exact wherever the target can hold the value.  What is not exact:

* OCP e4m3fn -> e4m3fnuz: magnitudes in (240, 448] saturate to +-240 (FNUZ max); -0 becomes +0.
* e4m3fnuz -> OCP e4m3fn: FNUZ subnormals that are odd multiples of 2^-10 round to OCP's 2^-9 grid.
* OCP e5m2 -> e5m2fnuz: +-inf becomes NaN (0x80, FNUZ has no inf); -0 becomes +0.
* e5m2fnuz -> OCP e5m2: odd multiples of 2^-17 round to OCP's 2^-16 grid.
* NaN stays NaN (0x80 in FNUZ, 0x7F / 0x7E-style codes in OCP).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from .. import dtypes as _dt
from ..errors import (
    BackendUnavailableError,
    DeviceError,
    FormatError,
    KernelCompileError,
    LayoutError,
    UnsupportedError,
)

__all__ = [
    "ARCHS",
    "F8F6F4_CODES",
    "HipBackend",
    "KernelSpec",
    "convert_fp8",
    "fragment_constants",
    "kernel_specs",
    "select_spec",
]

ARCHS = ("gfx942", "gfx950")
SOURCE_FILE = "gemm_mfma.hip"
WAVE = 64

# Format codes of the CDNA4 f8f6f4 family (the cbsz / blgp operands of the scaled MFMA), per element
# format: the layout database's table (one truth), re-exported for validation here.
from ..layouts.cdna4 import FORMAT_CODE as F8F6F4_CODES  # noqa: E402  (pure numpy, no GPU import)

# CDNA3 fp8 MFMA operand names, per FNUZ element format
_CDNA3_FP8 = {"e4m3fnuz": "fp8", "e5m2fnuz": "bf8"}
E8M0_ONE = 127


# ----------------------------------------------------------------------------- kernel variants
@dataclass(frozen=True)
class KernelSpec:
    """One compiled variant of gemm_mfma.hip: an instruction, its operand formats and the tile sizes."""

    arch: str
    dtype: str  # matmul dtype name: "fp16", "e4m3fnuz,e5m2fnuz", "mxfp8_e4m3,mxfp4", ...
    instruction: str  # ISA mnemonic = mxcore.layouts record name (the record supplies the builtin)
    a_format: str  # element formats (mxcore.formats names)
    b_format: str
    afrag: str  # C++ typedef of the builtin's A / B / C operand (from gemm_mfma.hip)
    bfrag: str
    cfrag: str
    elem_bytes: int  # bytes per element in global memory and LDS (sub-byte codes: one per byte)
    scaled: bool = False
    cbsz: int = 0  # scaled: A format code; classic MFMAs: broadcast control, always 0 here
    blgp: int = 0
    waves_m: int = 2
    waves_n: int = 2
    tm: int = 2
    tn: int = 2
    lds_pad: int = 16
    also: tuple = ()  # further matmul dtypes this same kernel serves (OCP fp8 = MX fp8 with unit scales)

    @property
    def dtypes(self) -> tuple:
        return (self.dtype, *self.also)

    @property
    def shape(self) -> tuple:
        m, n, k = (int(x) for x in self.instruction.split("_f32_")[1].split("_")[0].split("x"))
        return m, n, k

    @property
    def bk(self) -> int:
        return max(self.shape[2], 64 // self.elem_bytes)

    @property
    def tile(self) -> tuple:
        m, n, _ = self.shape
        return self.waves_m * self.tm * m, self.waves_n * self.tn * n, self.bk

    @property
    def threads(self) -> int:
        return WAVE * self.waves_m * self.waves_n

    @property
    def entry(self) -> str:
        base = "mx_gemm_" + self.instruction.removeprefix("v_mfma_")
        return f"{base}_{self.a_format}_{self.b_format}" if self.scaled else base

    def layout(self):
        """The instruction's record in mxcore.layouts (operand formats passed for the f8f6f4 family)."""
        from .. import layouts

        if self.scaled:
            return layouts.get(self.instruction, a_format=self.a_format, b_format=self.b_format)
        return layouts.get(self.instruction)

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
            "MX_ENTRY": self.entry,
            "MX_BUILTIN": lay.intrinsic,
            "MX_AFRAG_T": self.afrag,
            "MX_BFRAG_T": self.bfrag,
            "MX_CFRAG_T": self.cfrag,
            "MX_A_REGS": _FRAG_REGS[self.afrag],
            "MX_B_REGS": _FRAG_REGS[self.bfrag],
            "MX_EB": self.elem_bytes,
            "MX_IM": m,
            "MX_IN": n,
            "MX_IK": k,
            "MX_BK": self.bk,
            "MX_WAVES_M": self.waves_m,
            "MX_WAVES_N": self.waves_n,
            "MX_TM": self.tm,
            "MX_TN": self.tn,
            "MX_LDS_PAD": self.lds_pad,
            "MX_SCALED": int(self.scaled),
            "MX_CBSZ": self.cbsz,
            "MX_BLGP": self.blgp,
            **c,
        }
        return tuple(f"-D{key}={value}" for key, value in d.items())


# 32-bit registers of each fragment typedef of gemm_mfma.hip
_FRAG_REGS = {
    "mx_f32": 1,
    "mx_f32x2": 2,
    "mx_f16x4": 2,
    "mx_f16x8": 4,
    "mx_i16x4": 2,
    "mx_bf16x8": 4,
    "mx_i64": 2,
    "mx_i32x8": 8,
}


def _classic(arch, dtype, mn, k, suffix, frag, elem_bytes, fmt):
    cfrag = "mx_f32x16" if mn == 32 else "mx_f32x4"
    return KernelSpec(
        arch=arch,
        dtype=dtype,
        instruction=f"v_mfma_f32_{mn}x{mn}x{k}_{suffix}",
        a_format=fmt,
        b_format=fmt,
        afrag=frag,
        bfrag=frag,
        cfrag=cfrag,
        elem_bytes=elem_bytes,
    )


def _scaled(arch, dtype, mn, fa, fb):
    k = 64 if mn == 32 else 128
    return KernelSpec(
        arch=arch,
        dtype=dtype,
        instruction=f"v_mfma_scale_f32_{mn}x{mn}x{k}_f8f6f4",
        a_format=fa,
        b_format=fb,
        afrag="mx_i32x8",
        bfrag="mx_i32x8",
        cfrag="mx_f32x16" if mn == 32 else "mx_f32x4",
        elem_bytes=1,
        scaled=True,
        cbsz=F8F6F4_CODES[fa],
        blgp=F8F6F4_CODES[fb],
    )


def _pair_name(a: str, b: str) -> str:
    return a if a == b else f"{a},{b}"


@functools.lru_cache(maxsize=None)
def kernel_specs(arch: str) -> tuple:
    """Every variant compiled for ``arch`` (both instruction shapes of every dtype)."""
    if arch not in ARCHS:
        raise UnsupportedError(f"no MFMA kernels for {arch!r}; mxcore's HIP kernels target {', '.join(ARCHS)}")
    specs = []
    for mn, k in ((32, 2), (16, 4)):
        specs.append(_classic(arch, "fp32", mn, k, "f32", "mx_f32", 4, "fp32"))
    if arch == "gfx942":
        for mn, k in ((32, 4), (16, 8)):
            specs.append(_classic(arch, "tf32", mn, k, "xf32", "mx_f32x2", 4, "tf32"))
        for mn, k in ((32, 8), (16, 16)):
            specs.append(_classic(arch, "fp16", mn, k, "f16", "mx_f16x4", 2, "fp16"))
            specs.append(_classic(arch, "bf16", mn, k, "bf16", "mx_i16x4", 2, "bf16"))
        for mn, k in ((32, 16), (16, 32)):
            for fa in ("e4m3fnuz", "e5m2fnuz"):
                for fb in ("e4m3fnuz", "e5m2fnuz"):
                    pa, pb = _CDNA3_FP8[fa], _CDNA3_FP8[fb]
                    spec = _classic(arch, _pair_name(fa, fb), mn, k, f"{pa}_{pb}", "mx_i64", 1, fa)
                    specs.append(replace(spec, b_format=fb))
    else:  # gfx950
        for mn, k in ((32, 16), (16, 32)):
            specs.append(_classic(arch, "fp16", mn, k, "f16", "mx_f16x8", 2, "fp16"))
            specs.append(_classic(arch, "bf16", mn, k, "bf16", "mx_bf16x8", 2, "bf16"))
        mx = {_dt.MX_ELEMENT[name]: name for name in ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4")}
        ocp = {"e4m3fn": "e4m3fn", "e5m2": "e5m2"}
        for mn in (32, 16):
            for ea, na in mx.items():
                for eb, nb in mx.items():
                    spec = _scaled(arch, _pair_name(na, nb), mn, ea, eb)
                    if ea in ocp and eb in ocp:  # plain OCP fp8: the same kernel, scale bytes 127
                        spec = replace(spec, also=(_pair_name(ocp[ea], ocp[eb]),))
                    specs.append(spec)
    return tuple(specs)


def validate_spec(spec: KernelSpec) -> None:
    """Check the immediate operands the compiler would accept silently (format codes, cbsz/abid/blgp)."""
    if spec.scaled:
        for role, fmt, code in (("A", spec.a_format, spec.cbsz), ("B", spec.b_format, spec.blgp)):
            if fmt not in F8F6F4_CODES:
                raise FormatError(
                    f"{spec.instruction}: operand {role} format {fmt!r} is not an f8f6f4 format; "
                    f"valid: {', '.join(F8F6F4_CODES)}"
                )
            if code != F8F6F4_CODES[fmt]:
                raise FormatError(
                    f"{spec.instruction}: operand {role} format code {code} does not name {fmt} "
                    f"(codes: {F8F6F4_CODES}); the hardware would read the bytes as another format"
                )
        if spec.arch != "gfx950":
            raise UnsupportedError(f"{spec.instruction} exists only on gfx950 (CDNA4), not {spec.arch}")
    else:
        if spec.cbsz or spec.blgp:
            raise FormatError(
                f"{spec.instruction}: cbsz={spec.cbsz} blgp={spec.blgp}; these are broadcast controls on "
                "classic MFMAs and mxcore's kernels need 0 (no broadcast)"
            )
        if "fnuz" in spec.a_format + spec.b_format and spec.arch != "gfx942":
            raise UnsupportedError(f"FNUZ fp8 MFMAs ({spec.instruction}) are CDNA3 (gfx942) only; gfx950 reads OCP fp8")
    if spec.elem_bytes not in (1, 2, 4):
        raise FormatError(f"element storage of {spec.elem_bytes} bytes; the kernel stores 1, 2 or 4")


# ----------------------------------------------------------------------------- lane constants from the layout
def _fit_operand(op, role: str, frag_rows: int, kernel_bits: int, name: str) -> dict:
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
    koff = ks[0]
    klane = int(ks[frag_rows, 0] - ks[0, 0]) if lanes > frag_rows else 0
    chunk = slots
    for s in range(1, slots):
        if koff[s] != koff[0] + s:
            chunk = s
            break
    cstride = int(koff[chunk] - koff[0]) if chunk < slots else chunk
    s = np.arange(slots)
    model = klane * (lane // frag_rows) + (s // chunk) * cstride + s % chunk
    if koff[0] != 0 or slots % chunk or not np.array_equal(ks, model):
        raise LayoutError(f"{name} operand {role.upper()}: K map does not fit KLANE*(l//FR) + chunked slots")
    bits = int(op.bits)
    offsets = tuple(getattr(op, "bit_offsets", None) or range(0, slots * bits, bits))
    if offsets != tuple(range(0, slots * bits, bits)):
        raise LayoutError(f"{name} operand {role.upper()}: slots are not packed at slot*bits; the kernel packs that way")
    if bits != kernel_bits:
        raise LayoutError(f"{name} operand {role.upper()}: layout says {bits}-bit elements, kernel variant {kernel_bits}")
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
    r0 = rows[0]
    rlane = int(rows[n, 0] - rows[0, 0]) if lanes > n else 0
    group = slots
    for s in range(1, slots):
        if r0[s] != r0[0] + s:
            group = s
            break
    gstride = int(r0[group] - r0[0]) if group < slots else group
    s = np.arange(slots)
    model = rlane * (lane // n) + (s // group) * gstride + s % group
    if r0[0] != 0 or not np.array_equal(rows, model):
        raise LayoutError(f"{name} C/D: row map does not fit RLANE*(l//N) + grouped slots")
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


def fragment_constants(layout, spec: KernelSpec) -> dict:
    """The MX_* lane constants of ``spec`` derived from its layout record (raises LayoutError on mismatch)."""
    m, n, k = spec.shape
    if (layout.m, layout.n, layout.k) != (m, n, k) or int(layout.lanes) != WAVE:
        raise LayoutError(f"{layout.name}: record is {layout.m}x{layout.n}x{layout.k}/{layout.lanes} lanes, "
                          f"kernel variant expects {m}x{n}x{k}/64")
    bits = {"fp32": 32, "tf32": 32, "fp16": 16, "bf16": 16}
    abits = bits.get(spec.a_format, 8 if spec.elem_bytes == 1 and not spec.scaled else None)
    bbits = bits.get(spec.b_format, 8 if spec.elem_bytes == 1 and not spec.scaled else None)
    if spec.scaled:
        from .. import formats

        abits, bbits = formats.get(spec.a_format).bits, formats.get(spec.b_format).bits
    out = {}
    out.update(_fit_operand(layout.a, "a", m, abits, layout.name))
    out.update(_fit_operand(layout.b, "b", n, bbits, layout.name))
    out.update(_fit_c(layout.c, n, layout.name))
    if spec.scaled:
        out.update(_fit_scale(layout.scale_a, "a", m, layout.name))
        out.update(_fit_scale(layout.scale_b, "b", n, layout.name))
    else:
        out.update({"MX_SA_FR": m, "MX_SB_FR": n})
    for p in ("A", "B"):
        if (out[f"MX_{p}_CHUNK"] * spec.elem_bytes) % 4 and out[f"MX_{p}_CHUNK"] < out[f"MX_{p}_SLOTS"]:
            raise LayoutError(f"{layout.name}: operand {p} chunks of {out[f'MX_{p}_CHUNK']} elements are not whole words")
    return out


def select_spec(arch: str, mdt, m: int, n: int) -> KernelSpec:
    """The variant that runs ``mdt`` on ``arch``: the 32x32 shape when both M and N reach its 128 tile,
    else the 16x16 one (less padding on small or skinny problems)."""
    name = mdt if isinstance(mdt, str) else _spec_dtype_name(mdt, arch)
    cands = [s for s in kernel_specs(arch) if name in s.dtypes]
    if not cands:
        have = sorted({d for s in kernel_specs(arch) for d in s.dtypes})
        raise UnsupportedError(f"no {arch} kernel for dtype {name!r}; {arch} runs: {', '.join(have)}")
    big = [s for s in cands if s.shape[0] == 32]
    small = [s for s in cands if s.shape[0] == 16]
    if big and min(m, n) >= 128 or not small:
        return big[0]
    return small[0]


def _spec_dtype_name(mdt, arch: str) -> str:
    a, b = mdt.a.name, mdt.b.name
    if arch == "gfx950" and a == "tf32":
        return "fp32"  # CDNA4 has no xf32 MFMA: tf32-rounded values through the fp32 instruction
    return _pair_name(a, b)


# ----------------------------------------------------------------------------- host side of a launch
def operand_storage(op, spec: KernelSpec, role: str) -> np.ndarray:
    """What the kernel reads for a prepared :class:`mxcore.operands.Operand`: a 2-D array of
    ``spec.elem_bytes``-wide unsigned storage units (fp32/tf32 bits, fp16/bf16 bits, one code per byte),
    logical shape (M, K) for A and (K, N) for B.  tf32 is rounded here (RNE) so that the xf32 MFMA and
    gfx950's fp32 MFMA both see exactly the values the reference uses."""
    fmt = spec.a_format if role == "a" else spec.b_format
    if op.codes is not None:
        codes = np.asarray(op.codes)
        if codes.dtype != np.uint8:
            raise FormatError(f"operand {role}: element codes must be uint8, got {codes.dtype}")
        bits = {"e2m1": 4, "e2m3": 6, "e3m2": 6}.get(fmt, 8)
        if codes.size and int(codes.max()) >= 1 << bits:
            raise FormatError(f"operand {role}: {fmt} codes are {bits}-bit, found code {int(codes.max())}; "
                              "pass one unpacked code per byte (mxcore.mx.MXTensor.codes)")
        return codes
    vals = np.asarray(op.values)
    if fmt == "fp32":
        return np.ascontiguousarray(vals, dtype=np.float32).view(np.uint32)
    if fmt == "tf32":
        from .. import formats

        return formats.round_to(vals, "tf32").astype(np.float32).view(np.uint32)
    if fmt == "fp16":
        return np.asarray(vals, dtype=np.float16).view(np.uint16)
    if fmt == "bf16":
        import ml_dtypes

        return np.asarray(vals).astype(ml_dtypes.bfloat16).view(np.uint16)
    raise FormatError(f"operand {role}: no storage rule for element format {fmt!r}")


@dataclass(frozen=True)
class Launch:
    """Grid, block and the scalar kernel arguments of one GEMM launch (strides in elements)."""

    grid: tuple
    block: tuple
    sam: int
    sak: int
    sbk: int
    sbn: int
    ldd: int
    m: int
    n: int
    k: int
    a_vec_ok: int
    b_vec_ok: int
    out_scale: float = 1.0


def _vec_ok(strides: tuple, contiguous_axis: int, base_addr: int, elem_bytes: int) -> int:
    other = strides[1 - contiguous_axis]
    return int(strides[contiguous_axis] == 1 and base_addr % 16 == 0 and (other * elem_bytes) % 16 == 0)


def plan_launch(spec: KernelSpec, m: int, n: int, k: int, a_strides: tuple, b_strides: tuple, *,
                a_addr: int = 0, b_addr: int = 0, ldd: int | None = None, out_scale: float = 1.0) -> Launch:
    """Arguments for ``spec`` on an (m, k) x (k, n) problem.  ``a_strides`` = (stride of m, stride of k),
    ``b_strides`` = (stride of k, stride of n), in elements; one stride of each operand must be 1.
    ``a_addr``/``b_addr``: device addresses (16-byte alignment enables the vector loads)."""
    if min(m, n, k) < 1:
        raise UnsupportedError(f"kernel launch needs M, N, K >= 1, got {m}, {n}, {k} (the API handles empty shapes)")
    for name, st in (("A", a_strides), ("B", b_strides)):
        if 1 not in st:
            raise UnsupportedError(f"operand {name} strides {st}: the kernel needs one unit stride; copy it first")
    limit = 2**31 - 1
    if max(m * k, k * n, m * n) > limit or max(m, n, k) > limit:
        raise UnsupportedError(f"{m}x{n}x{k}: the kernel indexes with 32-bit tile offsets; split the problem")
    bm, bn, _ = spec.tile
    a_cont = 1 if a_strides[1] == 1 else 0  # K-contiguous A: axis 1
    b_cont = 0 if b_strides[0] == 1 else 1  # K-contiguous B: axis 0
    return Launch(
        grid=(-(-n // bn), -(-m // bm), 1),
        block=(spec.threads, 1, 1),
        sam=int(a_strides[0]), sak=int(a_strides[1]), sbk=int(b_strides[0]), sbn=int(b_strides[1]),
        ldd=int(n if ldd is None else ldd), m=m, n=n, k=k,
        a_vec_ok=_vec_ok(tuple(a_strides), a_cont, a_addr, spec.elem_bytes),
        b_vec_ok=_vec_ok(tuple(b_strides), b_cont, b_addr, spec.elem_bytes),
        out_scale=float(out_scale),
    )
