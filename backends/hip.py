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

Design-target sources: the MI325X / MI355X tables and the MFMA cycle counts of the AMD matrix-core guide
(../shared/seeds/002, section 1 and the MFMA table; peak = 2*M*N*K * matrix cores * clock / cycles).

Kernel structure (``gemm_mfma.hip``): 4 waves per block, each 2x2 instruction tiles (block tile 128x128
for the 32x32 shapes, 64x64 for the 16x16 ones; the 16x16 shape is picked when M or N < 128), BK =
max(instruction K, 64 bytes); global -> registers with 16-byte loads where the operand is contiguous,
aligned and inside the matrix (element loads with zero fill at the edges: any M, N, K >= 1) -> LDS (two
buffers, one barrier per K tile) -> per-lane fragments.  A and B may each be row- or column-major.
Output fp32; ``out_dtype`` float16/bfloat16 is rounded from the fp32 result on the host (a second
rounding, unlike the reference's single one).  Per-tensor fp8 scales (powers of two) are applied in the
epilogue; MX block scales go through the scale operands of the f8f6f4 MFMA (op_sel 0, byte 0), one
E8M0 per lane per 32-K block as the layout record says.  MX element codes are staged one code per byte
(fp4/fp6 are packed into the instruction's registers in the kernel), which costs global bandwidth
against packed storage -- a known limit of this first version.

Runtime: hip-python is imported lazily; ``is_available()`` says why the backend is unusable (no
hip-python, no ROCm runtime -- hip-python raises a plain RuntimeError on its first call then --, no AMD
GPU, or an arch other than gfx942/gfx950).  Kernels are compiled with hiprtc for the device's
``gcnArchName``; code objects are cached on disk (:func:`cache_dir`) under a hash of (source, sorted
options, arch, hiprtc + ROCm version, mxcore version), written atomically and verified by SHA-256 on
read (a corrupt entry is deleted and rebuilt).  Every hip/hiprtc call goes through ``_Runtime.check``
(DeviceError / KernelCompileError with the hiprtc log).  numpy inputs are copied; ROCm device arrays
(DLPack device type 10, or ``__cuda_array_interface__``) of the matmul's own float type are read in place.

Per-lane index arithmetic is not written by hand: :func:`fragment_constants` fits the kernel's
parametric lane map to the instruction's record in :mod:`mxcore.layouts` (raising LayoutError when a
record does not fit), and tests/test_hip_index.py runs the same constants through a Python mirror of
the kernel and :mod:`mxcore.emulate`.

fp8 encodings: ``dtype="fp8"`` means e4m3fnuz on gfx942 and e4m3fn (OCP) on gfx950
(:func:`mxcore.dtypes.resolve`).  Bytes of the other encoding are refused with an error naming both,
unless ``HipBackend.matmul(..., fp8_convert=True)`` (or :func:`convert_fp8`): values are decoded and re-encoded
(RNE), exact wherever the target can hold the value.  What is not exact:

* OCP e4m3fn -> e4m3fnuz: magnitudes in (240, 448] saturate to +-240 (FNUZ max); -0 becomes +0.
* e4m3fnuz -> OCP e4m3fn: FNUZ subnormals that are odd multiples of 2^-10 round to OCP's 2^-9 grid.
* OCP e5m2 -> e5m2fnuz: +-inf becomes NaN (0x80, FNUZ has no inf); -0 becomes +0.
* e5m2fnuz -> OCP e5m2: odd multiples of 2^-17 round to OCP's 2^-16 grid.
* NaN becomes the target's NaN code (0x80 in FNUZ).
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
    "device_address",
    "fragment_constants",
    "kernel_specs",
    "select_spec",
]

ARCHS = ("gfx942", "gfx950")
SOURCE_FILE = "gemm_mfma.hip"
WAVE = 64

# Format codes of the CDNA4 f8f6f4 family (the cbsz / blgp operands of the scaled MFMA), per element
# format: the layout database's table (one truth), re-exported for validation here.
from ..layouts.cdna4 import FORMAT_CODE as F8F6F4_CODES

# CDNA3 fp8 MFMA operand names, per FNUZ element format
_CDNA3_FP8 = {"e4m3fnuz": "fp8", "e5m2fnuz": "bf8"}


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
    def name(self) -> str:
        return self.entry

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


@functools.cache
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
    fit = _fit_affine(ks, frag_rows)
    if fit is None or slots % fit[1]:
        raise LayoutError(f"{name} operand {role.upper()}: K map does not fit KLANE*(l//FR) + chunked slots")
    klane, chunk, cstride = fit
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
    if getattr(op.dtype, "name", None) == "tf32":
        fmt = "tf32"  # also on gfx950, where tf32 runs through the fp32 instruction
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
        return np.asarray(vals, dtype=np.float32).view(np.uint32)  # keeps a column-major input column-major
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
    if max(m, n, k) > 2**31 - 1024:  # addresses are 64-bit; row/column/k indices are 32-bit ints
        raise UnsupportedError(f"{m}x{n}x{k}: a dimension beyond 2^31 elements; split the problem")
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


# ----------------------------------------------------------------------------- compile inputs, cache
def compile_inputs(spec: KernelSpec) -> tuple:
    """(source, options) of a variant: the one source string and -D options that go to hiprtc at run
    time and to clang-22 in CI (both add -O3 -std=c++17 and the arch)."""
    from ..kernels import kernel_source

    return kernel_source("amd", SOURCE_FILE), spec.defines()


COMMON_OPTIONS = ("-O3", "-std=c++17")


def cache_dir() -> str:
    """Where compiled code objects are kept: $MXCORE_CACHE_DIR/hip, else $XDG_CACHE_HOME (~/.cache)/mxcore/hip."""
    root = os.environ.get("MXCORE_CACHE_DIR")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mxcore")
    return os.path.join(root, "hip")


def hiprtc_options(arch: str, options) -> list[str]:
    """The exact option list :meth:`_Runtime.hiprtc_compile` hands to hiprtc, in order."""
    return [f"--offload-arch={arch}", *COMMON_OPTIONS, *options]


def clang_options(arch: str, options, name: str) -> list[str]:
    """What :func:`offline_compile`'s clang-22 call gets (hip_tools.compile_hip), for the cache key: its flags
    in order, the force-included shim named by a hash of its text, and no per-call temp paths."""
    from ..kernels import kernel_source
    from . import hip_tools

    shim = hashlib.sha256(kernel_source("amd", "hip_shim.h").encode()).hexdigest()
    return [*hip_tools.BASE_FLAGS, f"--offload-arch={arch}", f"-cuid={name}", "-include", f"hip_shim.h@{shim}",
            *hip_tools.DEFAULT_OPTIONS, *options]


def cache_key(source: str, arch: str, options, compiler: str) -> str:
    """Hash of (source, arch, options, compiler identity incl. ROCm version, mxcore version).

    ``options``: the full option list the compiler receives, in order (:func:`hiprtc_options`,
    :func:`clang_options`), so a change to COMMON_OPTIONS or the offline flags never reuses a stale entry.
    """
    try:
        from .. import __version__ as version
    except ImportError:
        version = "0"
    blob = json.dumps([hashlib.sha256(source.encode()).hexdigest(), arch, list(options), compiler, version])
    return hashlib.sha256(blob.encode()).hexdigest()[:40]


_MAGIC = b"MXCOv1 "


def cache_read(key: str) -> bytes | None:
    """The cached code object for ``key``, or None.  A corrupt or truncated entry is deleted, never trusted."""
    path = os.path.join(cache_dir(), key + ".co")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    head, sep, body = raw.partition(b"\n")
    if head.startswith(_MAGIC) and sep and hashlib.sha256(body).hexdigest().encode() == head[len(_MAGIC):]:
        return body
    try:
        os.unlink(path)
    except OSError:
        pass
    return None


def cache_write(key: str, blob: bytes) -> None:
    """Store atomically (temp file in the same folder + os.replace) with a SHA-256 header."""
    d = cache_dir()
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp_", suffix=".co")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + hashlib.sha256(blob).hexdigest().encode() + b"\n" + blob)
            os.replace(tmp, os.path.join(d, key + ".co"))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError:
        pass  # a read-only or full cache folder costs a recompile, nothing else


def offline_compile(spec: KernelSpec, *, use_cache: bool = True):
    """clang-22 code object of ``spec`` (hip_tools.HipBinary), through the disk cache."""
    from . import hip_tools

    source, options = compile_inputs(spec)
    key = cache_key(source, spec.arch, clang_options(spec.arch, options, spec.entry),
                    "clang:" + hip_tools.clang_version())
    blob = cache_read(key) if use_cache else None
    if blob is None:
        binary = hip_tools.compile_hip(source, name=spec.entry, arch=spec.arch, options=options)
        if use_cache:
            cache_write(key, binary.code_object)
        return binary
    return hip_tools.HipBinary(blob, name=spec.entry, arch=spec.arch, options=tuple(options))


# ----------------------------------------------------------------------------- fp8 encodings
_FP8_PEER = {"e4m3fn": "e4m3fnuz", "e4m3fnuz": "e4m3fn", "e5m2": "e5m2fnuz", "e5m2fnuz": "e5m2"}


def convert_fp8(codes, src: str, dst: str) -> np.ndarray:
    """Re-encode fp8 bytes from ``src`` to ``dst`` (OCP <-> FNUZ): exact where ``dst`` holds the value,
    RNE otherwise, magnitudes beyond ``dst``'s max saturate (e4m3fn 448 -> e4m3fnuz 240), NaN -> NaN,
    OCP inf -> FNUZ NaN.  See the module docstring for the list."""
    from .. import formats

    if _FP8_PEER.get(src) != dst:
        raise UnsupportedError(f"convert_fp8 converts between e4m3fn<->e4m3fnuz and e5m2<->e5m2fnuz, not {src}->{dst}")
    vals = formats.decode(np.asarray(codes, dtype=np.uint8), src, dtype=np.float64)
    bad = ~np.isfinite(vals)
    out = formats.encode(np.where(bad, 0.0, vals), dst, rounding="rne", overflow="saturate")
    dspec = formats.get(dst)
    nan_code = dspec.nan_codes[0] if dspec.nan_codes else 0x80
    out = np.where(np.isnan(vals) | (np.isinf(vals) & (not dspec.has_inf)), np.uint8(nan_code), out)
    if dspec.has_inf:
        inf_codes = formats.encode(np.array([np.inf, -np.inf]), dst, overflow="saturate")
        out = np.where(np.isposinf(vals), inf_codes[0], np.where(np.isneginf(vals), inf_codes[1], out))
    return out.astype(np.uint8)


def _fp8_input_convert(x, want: str, convert: bool):
    """An ml_dtypes fp8 array of the peer encoding: convert it (if asked) or leave it for prepare() to refuse."""
    name = getattr(getattr(x, "dtype", None), "name", "")
    if not name.startswith("float8_"):
        return x
    have = name.removeprefix("float8_")
    if have == want or _FP8_PEER.get(have) != want or not convert:
        return x
    import ml_dtypes

    codes = convert_fp8(np.asarray(x).view(np.uint8), have, want)
    return codes.view(getattr(ml_dtypes, f"float8_{want}"))


# ----------------------------------------------------------------------------- hip-python runtime
class _Runtime:
    """hip-python, imported lazily; every hip / hiprtc call goes through :meth:`check`."""

    def __init__(self):
        from hip import hip, hiprtc

        self.hip = hip
        self.hiprtc = hiprtc
        self.lock = threading.Lock()
        self.modules: dict = {}
        props = hip.hipDeviceProp_t()
        self.check(hip.hipGetDeviceProperties(props, 0), "hipGetDeviceProperties")
        self.props = props
        raw = props.gcnArchName
        full = raw.decode() if isinstance(raw, (bytes, bytearray)) else str(raw)
        self.arch_full = full
        self.arch = full.split(":")[0]
        nm = props.name
        self.name = nm.decode() if isinstance(nm, (bytes, bytearray)) else str(nm)
        self.cus = int(getattr(props, "multiProcessorCount", 0))
        try:
            self.runtime_version = int(self.check(hip.hipRuntimeGetVersion(), "hipRuntimeGetVersion"))
        except DeviceError:
            self.runtime_version = 0

    def check(self, result, what: str):
        """The one checker: hip-python returns (err, *values); raise DeviceError / KernelCompileError."""
        hip, hiprtc = self.hip, self.hiprtc
        if not isinstance(result, tuple):
            result = (result,)
        err, values = result[0], result[1:]
        if isinstance(err, hip.hipError_t) and err != hip.hipError_t.hipSuccess:
            msg = hip.hipGetErrorString(err)
            msg = msg[-1] if isinstance(msg, tuple) else msg
            msg = msg.decode() if isinstance(msg, (bytes, bytearray)) else str(msg)
            raise DeviceError(f"{what} failed: {err.name}: {msg}")
        if isinstance(err, hiprtc.hiprtcResult) and err != hiprtc.hiprtcResult.HIPRTC_SUCCESS:
            raise KernelCompileError(f"{what} failed: {err.name}")
        if not values:
            return None
        return values[0] if len(values) == 1 else values

    # -- compile and load
    def hiprtc_compile(self, source: str, name: str, arch: str, options) -> bytes:
        hiprtc = self.hiprtc
        opts = hiprtc_options(arch, options)
        prog = self.check(hiprtc.hiprtcCreateProgram(source.encode(), name.encode(), 0, [], []), "hiprtcCreateProgram")
        try:
            enc = [o.encode() for o in opts]
            result = hiprtc.hiprtcCompileProgram(prog, len(enc), enc)
            err = result[0] if isinstance(result, tuple) else result
            if err != hiprtc.hiprtcResult.HIPRTC_SUCCESS:
                size = self.check(hiprtc.hiprtcGetProgramLogSize(prog), "hiprtcGetProgramLogSize")
                log = bytearray(int(size))
                self.check(hiprtc.hiprtcGetProgramLog(prog, log), "hiprtcGetProgramLog")
                raise KernelCompileError(f"hiprtc failed to compile {name} ({err.name})",
                                         log=log.decode(errors="replace"), source=name, options=opts, arch=arch)
            size = self.check(hiprtc.hiprtcGetCodeSize(prog), "hiprtcGetCodeSize")
            code = bytearray(int(size))
            self.check(hiprtc.hiprtcGetCode(prog, code), "hiprtcGetCode")
            return bytes(code)
        finally:
            self.check(hiprtc.hiprtcDestroyProgram(prog.createRef()), "hiprtcDestroyProgram")

    def compiler_id(self) -> str:
        try:
            ver = self.check(self.hiprtc.hiprtcVersion(), "hiprtcVersion")
        except (DeviceError, KernelCompileError, AttributeError):
            ver = "?"
        return f"hiprtc:{ver}:rocm{self.runtime_version}"

    def code_object(self, source: str, name: str, arch: str, options) -> bytes:
        key = cache_key(source, arch, hiprtc_options(arch, options), self.compiler_id())
        blob = cache_read(key)
        if blob is None:
            blob = self.hiprtc_compile(source, name, arch, options)
            cache_write(key, blob)
        return blob

    def function(self, source: str, name: str, options):
        """The loaded kernel ``name`` (compiled for this device, cached on disk and in memory)."""
        key = (hashlib.sha256(source.encode()).hexdigest(), name, tuple(options))
        with self.lock:
            if key not in self.modules:
                blob = self.code_object(source, name, self.arch, options)
                module = self.check(self.hip.hipModuleLoadData(blob), "hipModuleLoadData")
                func = self.check(self.hip.hipModuleGetFunction(module, name.encode()), f"hipModuleGetFunction({name})")
                self.modules[key] = (module, func)
            return self.modules[key][1]

    # -- memory
    def alloc(self, nbytes: int):
        return self.check(self.hip.hipMalloc(max(int(nbytes), 1)), "hipMalloc")

    def free(self, ptr) -> None:
        self.check(self.hip.hipFree(ptr), "hipFree")

    def upload(self, host: np.ndarray):
        host = np.ascontiguousarray(host)
        ptr = self.alloc(host.nbytes)
        if host.nbytes:
            kind = self.hip.hipMemcpyKind.hipMemcpyHostToDevice
            self.check(self.hip.hipMemcpy(ptr, host, host.nbytes, kind), "hipMemcpy H2D")
        return ptr

    def download(self, ptr, host: np.ndarray) -> np.ndarray:
        kind = self.hip.hipMemcpyKind.hipMemcpyDeviceToHost
        self.check(self.hip.hipMemcpy(host, ptr, host.nbytes, kind), "hipMemcpy D2H")
        return host

    def memset(self, ptr, byte: int, nbytes: int) -> None:
        self.check(self.hip.hipMemset(ptr, byte, nbytes), "hipMemset")

    def launch(self, func, grid, block, args) -> None:
        self.check(self.hip.hipModuleLaunchKernel(func, *grid, *block, sharedMemBytes=0, stream=None,
                                                  kernelParams=None, extra=tuple(args)), "hipModuleLaunchKernel")

    def synchronize(self) -> None:
        self.check(self.hip.hipDeviceSynchronize(), "hipDeviceSynchronize")


def device_address(ptr) -> int:
    """Integer device address of a hip-python pointer (e.g. from ``runtime().alloc``/``upload``), a
    __cuda_array_interface__ producer, a ctypes.c_void_p, or an int.  Raises DeviceError otherwise."""
    if isinstance(ptr, int):
        return ptr
    if isinstance(ptr, ctypes.c_void_p):  # int() would parse its buffer as text
        return int(ptr.value or 0)
    try:
        return int(ptr)  # hip-python's Pointer / DeviceArray convert to their address
    except (TypeError, ValueError):
        pass
    cai = getattr(ptr, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    value = getattr(ptr, "value", None)  # ctypes.c_void_p
    if value is not None:
        return int(value)
    raise DeviceError(f"cannot read a device address from {type(ptr).__name__}")


_address = device_address  # the internal name used throughout this module


# ----------------------------------------------------------------------------- DLPack / CAI device inputs
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


KDL_ROCM = 10
_DL_NAMES = {(2, 32): "float32", (2, 16): "float16", (4, 16): "bfloat16"}


@dataclass
class DeviceView:
    """A 2-D device array seen through DLPack or __cuda_array_interface__: address, element strides, dtype."""

    addr: int
    shape: tuple
    strides: tuple  # in elements
    dtype: str  # "float32" | "float16" | "bfloat16"
    owner: object = field(default=None, repr=False)  # keeps the producer (and capsule) alive


def device_view(x) -> DeviceView | None:
    """A ROCm device view of ``x`` (torch on ROCm, CuPy-ROCm, anything with DLPack or CAI), or None for host data."""
    dev = getattr(x, "__dlpack_device__", None)
    if callable(dev):
        try:
            dev_type, _ = dev()
        except Exception:  # noqa: BLE001  (a producer that cannot say: treat as host)
            dev_type = None
        if dev_type == KDL_ROCM:
            cap = x.__dlpack__()
            get = ctypes.pythonapi.PyCapsule_GetPointer
            get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
            t = _DLTensor.from_address(get(cap, b"dltensor"))
            name = _DL_NAMES.get((t.dtype.code, t.dtype.bits))
            if name is None or t.ndim != 2 or t.dtype.lanes != 1:
                return None
            shape = (t.shape[0], t.shape[1])
            strides = (t.strides[0], t.strides[1]) if t.strides else (shape[1], 1)
            return DeviceView(int(t.data or 0) + int(t.byte_offset), shape, strides, name, owner=(x, cap))
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None and len(cai.get("shape", ())) == 2:
        names = {"<f4": "float32", "<f2": "float16"}
        name = names.get(cai["typestr"])
        if name is None:
            return None
        item = int(cai["typestr"][2:])
        shape = tuple(int(s) for s in cai["shape"])
        st = cai.get("strides")
        strides = (shape[1], 1) if st is None else (st[0] // item, st[1] // item)
        return DeviceView(int(cai["data"][0]), shape, strides, name, owner=x)
    return None


# ----------------------------------------------------------------------------- the backend
def supported_dtype_names(arch: str) -> list[str]:
    """Canonical matmul dtype names (single-format; A/B pairs of the same kind also run) on ``arch``."""
    names = {d for s in kernel_specs(arch) for d in s.dtypes if "," not in d}
    if arch == "gfx950":
        names.add("tf32")
    order = list(_dt.KINDS)
    return sorted(names, key=order.index)


def ceiling_defines(spec: KernelSpec, chains: int) -> tuple:
    c = dict(o[2:].split("=", 1) for o in spec.defines())
    keep = ("MX_BUILTIN", "MX_AFRAG_T", "MX_CFRAG_T", "MX_C_SLOTS", "MX_SCALED", "MX_CBSZ", "MX_BLGP")
    return tuple(f"-D{k}={c[k]}" for k in keep) + (f"-DMX_CHAINS={chains}",)


class HipPlan:
    """One staged GEMM on the device (see :meth:`HipBackend.plan`); frees its device memory on close."""

    def __init__(self, backend, rt, spec, a, b, mdt, scale_rounding, fp8_convert):
        self.backend, self.rt, self.spec, self.variant = backend, rt, spec, spec
        self.a, self.b, self.mdt = a, b, mdt
        self.scale_rounding, self.fp8_convert = scale_rounding, fp8_convert
        self.m, self.k, self.n = int(a.shape[0]), int(a.shape[1]), int(b.shape[1])
        self.staged_allocs: list = []
        self.ops = None
        self.launch = None
        self.d = rt.alloc(self.m * self.n * 4)

    def prep(self) -> None:
        """Stage A and B: in place for ROCm device arrays of the matmul's float type, else host-side
        quantization/rounding (mxcore.operands.prepare) and an upload."""
        from ..arrays import array_kind, to_numpy
        from ..operands import prepare

        self._free(self.staged_allocs)
        ops = HipBackend._device_operands(self.a, self.b, self.mdt)
        if ops is None:
            host = [x if array_kind(x) in ("mx", "numpy") else to_numpy(x) for x in (self.a, self.b)]
            host = [_fp8_input_convert(x, od.name, self.fp8_convert) for x, od in zip(host, (self.mdt.a, self.mdt.b))]
            opa, opb = prepare(host[0], host[1], self.mdt, scale_rounding=self.scale_rounding)
            ops = [HipBackend._stage(self.rt, op, self.spec, role, self.staged_allocs)
                   for op, role in ((opa, "a"), (opb, "b"))]
        (a_addr, a_str, a_scale, _, _), (b_addr, b_str, b_scale, _, _) = ops
        self.ops = ops
        self.launch = plan_launch(self.spec, self.m, self.n, self.k, a_str, b_str, a_addr=a_addr, b_addr=b_addr,
                                  out_scale=a_scale * b_scale)

    def poison(self) -> None:
        self.rt.memset(self.d, 0xFF, self.m * self.n * 4)

    def gemm(self) -> None:
        if self.launch is None:
            self.prep()
        (a_addr, _, _, sa, _), (b_addr, _, _, sb, _) = self.ops
        self.backend._launch(self.rt, self.spec, self.launch, a_addr, b_addr, _address(self.d), sa, sb)

    def result(self) -> np.ndarray:
        self.rt.synchronize()
        return self.rt.download(self.d, np.empty((self.m, self.n), np.float32))

    def _free(self, ptrs) -> None:
        while ptrs:
            p = ptrs.pop()
            try:
                self.rt.free(p)
            except DeviceError:
                pass

    def close(self) -> None:
        self._free(self.staged_allocs)
        if self.d is not None:
            self._free([self.d])
            self.d = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class HipBackend:
    """mxcore.matmul on AMD Instinct GPUs (gfx942, gfx950) through hip-python; see the module docstring."""

    name = "hip"
    vendor = "amd"

    def __init__(self):
        self.unavailable_cause = None
        self._rt = None
        self._reason = None
        self._probed = False

    # -- availability (never raises)
    def is_available(self) -> str | None:
        if self._probed:
            return self._reason
        self._probed = True
        try:
            import hip  # noqa: F401
        except ImportError as exc:
            self.unavailable_cause = exc
            self._reason = "hip-python is not installed (pip install hip-python matching your ROCm version)"
            return self._reason
        try:
            from hip import hip as _hip

            count = _hip.hipGetDeviceCount()
            err, n = count if isinstance(count, tuple) else (count, 0)
            if err != _hip.hipError_t.hipSuccess or int(n) < 1:
                self._reason = f"no AMD GPU visible to the ROCm runtime ({getattr(err, 'name', err)})"
                return self._reason
            self._rt = _Runtime()
        except RuntimeError as exc:  # hip-python without a ROCm runtime raises a plain RuntimeError
            self.unavailable_cause = exc
            self._reason = f"no ROCm runtime: {exc}"
            return self._reason
        except Exception as exc:  # noqa: BLE001  (is_available must never raise)
            self.unavailable_cause = exc
            self._reason = f"hip-python failed to initialise: {type(exc).__name__}: {exc}"
            return self._reason
        if self._rt.arch not in ARCHS:
            self._reason = (f"device {self._rt.name} is {self._rt.arch}; mxcore's MFMA kernels target "
                            f"{', '.join(ARCHS)} (CDNA3/CDNA4)")
            return self._reason
        return None

    def runtime(self) -> _Runtime:
        """The device runtime, for launching extra kernels (probes): ``function(source, name, options)``
        (hiprtc compile for this device's arch through the code-object cache, module load), ``upload``,
        ``alloc``, ``download``, ``free``, ``launch(func, grid, block, args)``, ``synchronize``; pass
        pointers to kernels as ``ctypes.c_void_p(device_address(ptr))``.  Raises BackendUnavailableError
        (with the reason) without hip-python, ROCm or a supported AMD GPU."""
        reason = self.is_available()
        if reason is not None:
            raise BackendUnavailableError(f"hip backend not usable: {reason}") from self.unavailable_cause
        return self._rt

    _runtime = runtime  # the internal name used throughout this module

    def devices(self) -> list[str]:
        if self.is_available() is not None:
            return []
        return [f"{self._rt.name} ({self._rt.arch_full})"]

    def target(self):
        from . import Target

        rt = self._runtime()
        return Target("amd", rt.arch, WAVE)

    # -- capabilities
    def supported_dtypes(self, arch=None) -> list[str]:
        arch = arch or self.target().arch
        if arch not in ARCHS:
            return []
        return supported_dtype_names(arch)

    def supports(self, mdt) -> str | None:
        arch = self.target().arch
        return self._supports_on(mdt, arch)

    @staticmethod
    def _supports_on(mdt, arch: str) -> str | None:
        if arch not in ARCHS:
            return f"{arch} is not a CDNA3/CDNA4 arch ({', '.join(ARCHS)})"
        name = _spec_dtype_name(mdt, arch)
        if not any(name in s.dtypes for s in kernel_specs(arch)):
            fnuz = any(x.name.endswith("fnuz") for x in (mdt.a, mdt.b))
            if fnuz and arch == "gfx950":
                return "gfx950 (CDNA4) reads OCP fp8 (e4m3fn/e5m2), not FNUZ; use dtype='fp8' or fp8_convert=True"
            if mdt.kind == "fp8" and arch == "gfx942":
                return "gfx942 (CDNA3) reads FNUZ fp8 (e4m3fnuz/e5m2fnuz), not OCP; use dtype='fp8' or fp8_convert=True"
            if mdt.kind == "mx":
                return "block-scaled MX formats need gfx950 (CDNA4) f8f6f4 MFMAs"
            return f"no {arch} kernel for {mdt}"
        return None

    # -- matmul
    force_tile = None  # bench hook: 16 or 32 forces that instruction shape

    def plan(self, a, b, mdt, *, scale_rounding="floor", fp8_convert=False) -> HipPlan:
        """A reusable launch for ``a @ b``: ``prep()`` stages the operands (quantize, upload), ``gemm()``
        launches the kernel (asynchronously, null stream), ``result()`` waits and copies D back."""
        rt = self._runtime()
        reason = self._supports_on(mdt, rt.arch)
        if reason is not None:
            raise UnsupportedError(f"dtype {mdt} on {rt.arch}: {reason}")
        m, n = int(a.shape[0]), int(b.shape[1])
        spec = select_spec(rt.arch, mdt, m, n)
        if self.force_tile:
            spec = next((s for s in kernel_specs(rt.arch) if spec.dtype in s.dtypes and s.shape[0] == int(self.force_tile)),
                        spec)
        return HipPlan(self, rt, spec, a, b, mdt, scale_rounding, fp8_convert)

    def matmul(self, a, b, mdt, *, out_dtype="float32", scale_rounding="floor", fp8_convert=False, poison=False):
        """``a @ b`` on the AMD GPU.  ``fp8_convert``: accept fp8 bytes of the other encoding (OCP vs FNUZ)
        and re-encode them (see :func:`convert_fp8`).  ``poison``: fill the output with NaN before the launch
        (tests check that every element is written)."""
        from ..arrays import like_input
        from ..reference import round_output

        out_dtype = _dt.canonical_out_dtype(out_dtype)
        with self.plan(a, b, mdt, scale_rounding=scale_rounding, fp8_convert=fp8_convert) as p:
            p.prep()
            if poison:
                p.poison()
            p.gemm()
            d32 = p.result()
        result = d32 if out_dtype == "float32" else round_output(d32.astype(np.float64), out_dtype)
        return like_input(result, a, b)

    @staticmethod
    def _device_operands(a, b, mdt):
        """Both operands already on the GPU in the matmul's own float type, one unit stride each: use them
        in place (no copy).  Else None (the host path)."""
        want = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
        if mdt.kind != "float" or mdt.a.name not in want:
            return None
        views = [device_view(x) for x in (a, b)]
        if any(v is None or v.dtype != want[mdt.a.name] or 1 not in v.strides for v in views):
            return None
        return [(v.addr, v.strides, 1.0, None, v) for v in views]

    @staticmethod
    def _stage(rt, op, spec, role, allocs):
        """Upload one prepared operand (its storage units, and MX block scales) in its own major."""
        store = operand_storage(op, spec, role)
        if store.flags.f_contiguous and not store.flags.c_contiguous:
            dev, strides = rt.upload(store.T), (1, store.shape[0])  # column-major kept: the kernel reads either
        else:
            dev, strides = rt.upload(np.ascontiguousarray(store)), (store.shape[1], 1)
        allocs.append(dev)
        scales = None
        if op.scales is not None:
            scales = rt.upload(np.ascontiguousarray(op.scales, dtype=np.uint8))
            allocs.append(scales)
        return (_address(dev), strides, op.tensor_scale, scales, None)

    def _launch(self, rt, spec, launch, a_addr, b_addr, d_addr, sa, sb):
        source, options = compile_inputs(spec)
        func = rt.function(source, spec.entry, options)
        c = ctypes
        args = (c.c_void_p(a_addr), c.c_void_p(b_addr), c.c_void_p(d_addr),
                c.c_void_p(_address(sa) if sa is not None else 0), c.c_void_p(_address(sb) if sb is not None else 0),
                c.c_longlong(launch.sam), c.c_longlong(launch.sak), c.c_longlong(launch.sbk), c.c_longlong(launch.sbn),
                c.c_longlong(launch.ldd), c.c_int(launch.m), c.c_int(launch.n), c.c_int(launch.k),
                c.c_int(launch.a_vec_ok), c.c_int(launch.b_vec_ok), c.c_float(launch.out_scale))
        rt.launch(func, launch.grid, launch.block, args)

    # -- offline
    def emit_kernels(self, arch, out_dir, *, jobs: int = 2) -> list[dict]:
        """Write every variant's code object (hiprtc when a ROCm runtime is present, else clang-22) and, with
        clang-22 tools present, its disassembly; returns manifest rows (also written to manifest.json)."""
        from . import hip_tools

        os.makedirs(out_dir, exist_ok=True)
        use_rtc = self.is_available() is None
        specs = kernel_specs(arch)

        def one(spec):
            source, options = compile_inputs(spec)
            if use_rtc:
                blob = self._rt.code_object(source, spec.entry, arch, options)
                binary = hip_tools.HipBinary(blob, name=spec.entry, arch=arch, options=options)
                compiler = self._rt.compiler_id()
            else:
                binary = offline_compile(spec)
                compiler = "clang:" + hip_tools.clang_version()
            path = os.path.join(out_dir, f"{spec.entry}.co")
            with open(path, "wb") as f:
                f.write(binary.code_object)
            res = binary.resources.get(spec.entry, {})
            row = {
                "kernel": spec.entry, "dtype": " ".join(spec.dtypes), "arch": arch, "instruction": spec.instruction,
                "tile": "x".join(str(t) for t in spec.tile), "file": os.path.basename(path),
                "vgpr": res.get("vgpr"), "agpr": res.get("agpr"), "sgpr": res.get("sgpr"),
                "registers": res.get("vgpr"), "lds_bytes": res.get("lds_bytes"),
                "shared_bytes": res.get("lds_bytes"), "scratch_bytes": res.get("scratch_bytes"), "compiler": compiler,
            }
            if hip_tools.have_clang() is None:
                disasm = binary.disasm
                with open(os.path.join(out_dir, f"{spec.entry}.s"), "w") as f:
                    f.write(disasm)
                row["mfma"] = sorted(set(hip_tools.mfma_instructions(disasm)))
            return row

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            rows = list(pool.map(one, specs))
        with open(os.path.join(out_dir, "manifest.json"), "w") as f:
            json.dump(rows, f, indent=1)
        return rows

    # -- bench hooks
    def timer(self):
        """``measure(fn) -> seconds``: runs ``fn()`` between two hipEvents on the null stream and waits
        (mxcore.bench's device timer; added by the cuda helper for the vendor-neutral bench)."""
        rt = self._runtime()
        hip = rt.hip

        def measure(fn) -> float:
            start = rt.check(hip.hipEventCreate(), "hipEventCreate")
            stop = rt.check(hip.hipEventCreate(), "hipEventCreate")
            try:
                rt.check(hip.hipEventRecord(start, None), "hipEventRecord")
                fn()
                rt.check(hip.hipEventRecord(stop, None), "hipEventRecord")
                rt.check(hip.hipEventSynchronize(stop), "hipEventSynchronize")
                return rt.check(hip.hipEventElapsedTime(start, stop), "hipEventElapsedTime") * 1e-3
            finally:
                rt.check(hip.hipEventDestroy(start), "hipEventDestroy")
                rt.check(hip.hipEventDestroy(stop), "hipEventDestroy")

        return measure

    def instruction_ceiling(self, dtype: str, *, iters: int = 4096, chains: int = 4) -> tuple[str, float]:
        """(mnemonic, TFLOP/s) of a register-only loop of the MFMA that ``dtype`` uses on this device."""
        from ..kernels import kernel_source

        rt = self._runtime()
        mdt = _dt.resolve(dtype, rt.arch)
        spec = select_spec(rt.arch, mdt, 1 << 20, 1 << 20)
        source = kernel_source("amd", "gemm_ceiling.hip")
        func = rt.function(source, "mx_mfma_ceiling", ceiling_defines(spec, chains))
        blocks = max(1, rt.cus) * 8
        out = rt.alloc(blocks * 256 * 4)
        hip = rt.hip
        try:
            args = (ctypes.c_void_p(_address(out)), ctypes.c_int(iters), ctypes.c_uint(1))
            rt.launch(func, (blocks, 1, 1), (256, 1, 1), args)
            rt.synchronize()
            start = rt.check(hip.hipEventCreate(), "hipEventCreate")
            stop = rt.check(hip.hipEventCreate(), "hipEventCreate")
            times = []
            for _ in range(5):
                rt.check(hip.hipEventRecord(start, None), "hipEventRecord")
                rt.launch(func, (blocks, 1, 1), (256, 1, 1), args)
                rt.check(hip.hipEventRecord(stop, None), "hipEventRecord")
                rt.check(hip.hipEventSynchronize(stop), "hipEventSynchronize")
                times.append(rt.check(hip.hipEventElapsedTime(start, stop), "hipEventElapsedTime") * 1e-3)
            rt.check(hip.hipEventDestroy(start), "hipEventDestroy")
            rt.check(hip.hipEventDestroy(stop), "hipEventDestroy")
        finally:
            rt.free(out)
        m, n, k = spec.shape
        flops = 2.0 * m * n * k * chains * iters * blocks * 4  # 4 waves per 256-thread block
        return spec.instruction, flops / sorted(times)[len(times) // 2] / 1e12

    def vendor_baseline(self, dtype: str, m: int, n: int, k: int):
        """hipBLASLt through a ROCm build of torch (fp32/tf32/fp16/bf16), as (label, callable); else None."""
        try:
            import torch
        except ImportError:
            return None
        if not getattr(torch.version, "hip", None) or not torch.cuda.is_available():
            return None
        from ._torch_baseline import torch_matmul

        d = dtype.lower()
        run = torch_matmul(torch, d, m, n, k)
        if run is None:
            return None
        return f"hipBLASLt {d} (torch.matmul, ROCm {torch.version.hip})", run
