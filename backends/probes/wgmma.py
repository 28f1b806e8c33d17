"""Probes of the Hopper ``wgmma.mma_async`` layouts (``kernels_cuda/probe_wgmma.cu``, sm_90a, through CuPy).

The probe kernels know no layout: each runs one wgmma on arange-coded operands and writes every lane's
accumulator registers in register order.  This module builds the inputs, decodes the values into coordinates
and returns them as ``(lanes, slots, 2)`` arrays to compare with :mod:`mxcore.layouts.hopper`:

* ``"d"`` — D of m64n64k16 (f16 from shared memory): A[i, 0] = i, A[i, 1] = 1, B[0, j] = 256, B[1, j] = j, so the
  value in (lane, slot) is 256 i + j: the accumulator's (row, col), read straight from the hardware.
* ``"a_k16"`` / ``"a_k8"`` — the register-A form of m64n16k16 (f16) / m64n16k8 (tf32): slot s of lane t holds
  t·slots + s, B[k, j] = (k == j), so D[i, j] = A[i, j]; D is located through the measured ``"d"`` map
  (columns < 16 of m64n64 and m64n16 share the per-n8-block layout), giving who holds A[i, j].

(This family's records are not ``InstructionLayout`` objects — B is read from shared memory through a
descriptor — so it is not in the register-probe protocol of :data:`backends.probes.FAMILIES`.)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

__all__ = ["PROBE_FILE", "PROBE_KERNELS", "WgmmaInputs", "emulate_wgmma", "run_probes", "run_wgmma", "wgmma_inputs",
           "wgmma_probe_kernel"]

PROBE_FILE = "probe_wgmma.cu"
PROBE_KERNELS = ("probe_wgmma_d", "probe_wgmma_a_f16", "probe_wgmma_a_tf32")
_OPTIONS = ("--gpu-architecture=sm_90a", "-std=c++17")


def _kernels(cp):
    from mxcore.backends.cuda.compile import source

    mod = cp.RawModule(code=source(PROBE_FILE), options=_OPTIONS)
    return {name: mod.get_function(name) for name in PROBE_KERNELS}


def _rows_bytes(mat: np.ndarray) -> np.ndarray:
    """rows x cols elements -> rows x 128 bytes (K-major rows of the swizzled tile, zero padded)."""
    raw = mat.view(np.uint8).reshape(mat.shape[0], -1)
    out = np.zeros((mat.shape[0], 128), np.uint8)
    out[:, :raw.shape[1]] = raw
    return out


def _decode_d(vals: np.ndarray) -> np.ndarray:
    v = vals.astype(np.int64)
    return np.stack([v // 256, v % 256], axis=-1)


def run_probes(cp) -> dict:
    """Run the three probes on the current device (an sm_90 GPU); {name: (lanes, slots, 2) coordinates}."""
    k = _kernels(cp)
    # D: 256 i + j
    a = np.zeros((64, 64), np.float16)
    a[:, 0], a[:, 1] = np.arange(64), 1
    b = np.zeros((64, 64), np.float16)  # rows n, K-major
    b[:, 0], b[:, 1] = 256, np.arange(64)
    out = cp.full(128 * 32, np.nan, dtype=cp.float32)
    k["probe_wgmma_d"]((1,), (128,), (cp.asarray(_rows_bytes(a)), cp.asarray(_rows_bytes(b)), out))
    d = _decode_d(cp.asnumpy(out).reshape(128, 32))
    res = {"d": d}
    # where D[i, j] (j < 16) sits in the m64n16 accumulator: the first 8 slots of the measured map
    where = np.full((64, 16, 2), -1, np.int64)
    lane, slot = np.meshgrid(np.arange(128), np.arange(8), indexing="ij")
    where[d[:, :8, 0], d[:, :8, 1], 0], where[d[:, :8, 0], d[:, :8, 1], 1] = lane, slot
    for name, kern, dtype, kk, slots in (("a_k16", "probe_wgmma_a_f16", np.float16, 16, 8),
                                        ("a_k8", "probe_wgmma_a_tf32", np.float32, 8, 4)):
        eye = np.zeros((16, kk), dtype)  # rows n, K-major: B[k, j] = (k == j)
        eye[np.arange(kk), np.arange(kk)] = 1
        out = cp.full(128 * 8, np.nan, dtype=cp.float32)
        k[kern]((1,), (128,), (cp.asarray(_rows_bytes(eye)), out))
        dvals = cp.asnumpy(out).reshape(128, 8)
        coords = np.full((128, slots, 2), -1, np.int64)
        for i in range(64):
            for j in range(kk):
                code = int(dvals[where[i, j, 0], where[i, j, 1]])
                coords[code // slots, code % slots] = (i, j)
        res[name] = coords
    return res


# ---- one wgmma from its record ---------------------------------------------------------------------------------
IMAGE_BYTES = 40960  # probe_wgmma.cu's MX_WG_SMEM_BYTES


def wgmma_probe_kernel(rec, *, a_smem: bool = True, mn_major: bool = False):
    """The :class:`~backends.probes.ProbeKernel` that runs ``rec``'s wgmma once: A from shared memory
    (``a_smem``) or registers, operands M/N-major (``mn_major``: imm-trans 1, 16-bit formats) or K-major."""
    from mxcore.errors import LayoutError

    from . import ProbeKernel, probe_entry

    if rec.c_format != "fp32":
        raise LayoutError(f"{rec.name}: the wgmma probe runs fp32 accumulators")
    if mn_major and not rec.transpose:
        raise LayoutError(f"{rec.name}: {rec.a_format} operands are K-major only")
    acc = rec.c.registers
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(acc))
    if a_smem:
        a_op, ins, nxt = f"%{acc}", '"l"(da), "l"(db), "r"(1)', acc + 1
    else:
        a_op = "{" + ", ".join(f"%{acc + i}" for i in range(rec.a.registers)) + "}"
        ins = ", ".join(f'"r"(a[{i}])' for i in range(rec.a.registers)) + ', "l"(db), "r"(1)'
        nxt = acc + rec.a.registers
    trans = ""
    if rec.transpose:
        t = int(mn_major)
        trans = f", {t}, {t}" if a_smem else f", {t}"
    d = ", ".join(f"%{i}" for i in range(acc))
    asm = (f"{{ .reg .pred p; setp.ne.b32 p, %{nxt + 1}, 0; {rec.name} {{{d}}}, {a_op}, %{nxt}, p, 1, 1{trans}; }}")
    entry = probe_entry(rec.name, "ss" if a_smem else "rs", "mn" if mn_major else "")
    defines = (("MX_WG_ENTRY", entry), ("MX_WG_ACC", acc), ("MX_WG_AREGS", 0 if a_smem else rec.a.registers),
               ("MX_WG_ASM", f'"{asm}"'), ("MX_WG_OUTS", outs), ("MX_WG_INS", ins))
    return ProbeKernel(rec.name, "nvidia", PROBE_FILE, entry, defines, ("sm_90a",),
                       rec.a_format, rec.b_format)


@dataclass(frozen=True)
class WgmmaInputs:
    """What one wgmma probe launch reads: the shared-memory image, the descriptors (start relative to the image),
    A's register words (lane-major, or None when A is in shared memory) and C's words."""

    image: np.ndarray
    desc_a: int
    desc_b: int
    a_regs: np.ndarray | None
    a_words: np.ndarray | None
    c_regs: np.ndarray
    c_words: np.ndarray
    mn_major: bool


def wgmma_inputs(rec, a, b, c, *, a_smem: bool = True, mn_major: bool = False, swizzle: str = "128B",
                 lbo: int | None = None, sbo: int | None = None) -> WgmmaInputs:
    """Lay out tiles ``a`` (64 x K), ``b`` (K x N), ``c`` (64 x N) as one wgmma reads them: B at byte 0 of the
    image, A (when ``a_smem``) at the next 1024-byte boundary, both in the canonical layout of ``swizzle``
    (M/N-major when ``mn_major``); codes for fp8, values otherwise."""
    from mxcore import emulate

    major = "MN" if mn_major else "K"
    image, desc_b = emulate.smem_write(rec, "b", b, major=major, swizzle=swizzle, lbo=lbo, sbo=sbo)
    desc_a, a_regs, a_words = 0, None, None
    if a_smem:
        start = -(-image.size // 1024) * 1024
        image, desc_a = emulate.smem_write(rec, "a", a, image, start=start, major=major, swizzle=swizzle, lbo=lbo,
                                           sbo=sbo)
    else:
        a_regs = emulate.scatter(rec, "a", a)
        a_words = emulate.pack(rec, "a", a_regs)
    if image.size > IMAGE_BYTES:
        raise ValueError(f"{rec.name}: the operands need {image.size} bytes of shared memory, the probe has {IMAGE_BYTES}")
    full = np.zeros(IMAGE_BYTES, np.uint8)
    full[:image.size] = image
    c_regs = emulate.scatter(rec, "c", np.asarray(c, np.float32))
    return WgmmaInputs(full, int(desc_a), int(desc_b), a_regs, a_words, c_regs, emulate.pack(rec, "c", c_regs),
                       mn_major)


def emulate_wgmma(rec, inp: WgmmaInputs) -> np.ndarray:
    """D (64 x N, float64) that ``mxcore.emulate.execute`` computes from the probe's inputs."""
    from mxcore import emulate

    a = inp.a_regs if inp.a_words is not None else inp.desc_a
    d = emulate.execute(rec, a, inp.desc_b, inp.c_regs, smem=inp.image, trans_a=inp.mn_major and inp.a_words is None,
                        trans_b=inp.mn_major)
    return emulate.gather(rec, "d", d).astype(np.float64)


@functools.cache
def _wgmma_function(probe):
    import cupy

    return cupy.RawModule(code=probe.source(), options=(*probe.options, *_OPTIONS)
                          ).get_function(probe.entry)


def run_wgmma(rec, inp: WgmmaInputs, cp=None) -> np.ndarray:
    """D (64 x N, float64) that the GPU's wgmma computes from the probe's inputs (an sm_90 device, CuPy)."""
    from mxcore import emulate

    from .nvidia import _cupy

    cp = cp or _cupy()
    probe = wgmma_probe_kernel(rec, a_smem=inp.a_words is None, mn_major=inp.mn_major)
    fn = _wgmma_function(probe)
    a_words = inp.a_words if inp.a_words is not None else np.zeros((128, 4), np.uint32)
    out = cp.full(128 * rec.c.registers, 0x7FC00000, dtype=cp.uint32)  # poisoned with NaN
    fn((1,), (128,), (cp.asarray(inp.image), cp.asarray(np.ascontiguousarray(a_words).ravel()),
                      cp.asarray(inp.c_words.ravel()), out, np.uint64(inp.desc_a), np.uint64(inp.desc_b)))
    cp.cuda.runtime.deviceSynchronize()
    words = cp.asnumpy(out).reshape(128, rec.c.registers)
    return emulate.gather(rec, "d", emulate.unpack(rec, "c", words)).astype(np.float64)
