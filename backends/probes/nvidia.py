"""NVIDIA probe kernels: one ``mma.sync`` (``kernels_cuda/probe_mma.cu``) or ``ldmatrix``
(``kernels_cuda/probe_ldmatrix.cu``) per kernel, run through CuPy; what their SASS must contain."""

from __future__ import annotations

import functools
import re

import numpy as np

from mxcore import dtypes as _dt
from mxcore.errors import BackendUnavailableError, LayoutError, UnsupportedError
from mxcore.layouts import LdMatrixLayout
from mxcore.layouts.nvidia import PTX_TYPE

from .common import ProbeKernel, probe_entry
from .registers import d_values, scale_words, words

__all__ = ["DEVICE", "expected_sass", "handles", "ldmatrix_count", "ldmatrix_expected", "ldmatrix_probe_kernel",
           "ldmatrix_row_offsets", "probe_kernel", "run", "run_cuda", "run_cuda_ldmatrix"]

DEVICE = "cuda"
_NV_ARCHS = ("sm_80", "sm_89", "sm_90")  # the archs the offline compile checks cover
_NV_ARCH_SPECIFIC = ("sm_120a",)  # arch-specific records (block-scaled mma.sync) are compile-checked here


def handles(layout) -> bool:
    """mma.sync records (ldmatrix records have their own :func:`ldmatrix_probe_kernel`; wgmma records, whose B is
    in shared memory, theirs in :mod:`.wgmma`)."""
    from mxcore.layouts import WgmmaLayout

    return getattr(layout, "vendor", None) == "nvidia" and not isinstance(layout, WgmmaLayout)


def _ptx_text(layout) -> str:
    ptx = getattr(layout, "ptx", None) or getattr(layout, "mnemonic", None) or layout.name
    return ptx.strip().rstrip(";")


def is_block_scaled(layout) -> bool:
    """An sm_120a ``mma.sync ... .block_scale`` record (scale operands chosen by {byte-id, thread-id})."""
    return getattr(layout, "vendor", None) == "nvidia" and getattr(layout, "scale_a", None) is not None


def _is_fp8_mma(layout) -> bool:
    if is_block_scaled(layout):
        return False
    return any(_dt.KINDS.get(f) == "fp8" for f in (layout.a_format, layout.b_format))


def _nv_archs(layout) -> tuple:
    if is_block_scaled(layout):
        return tuple(a for a in layout.archs if a in _NV_ARCH_SPECIFIC)
    archs = tuple(a for a in getattr(layout, "archs", _NV_ARCHS) if a in _NV_ARCHS)
    if _is_fp8_mma(layout):  # fp8 mma.sync needs sm_89+ (QMMA on sm_89, emulated on sm_90)
        archs = tuple(a for a in archs if a != "sm_80")
    return archs


def probe_kernel(layout) -> ProbeKernel:
    """The probe kernel of one mma.sync record (block-scaled sm_120a records: scale selectors in the entry), or
    of an ldmatrix record."""
    if isinstance(layout, LdMatrixLayout):
        return ldmatrix_probe_kernel(layout)
    c_f32 = layout.c_format == "fp32"
    if not c_f32 and layout.c_format != "fp16":
        raise UnsupportedError(f"{layout.name}: probe_mma.cu handles fp32 or fp16 accumulators, not {layout.c_format}")
    if layout.c.registers != (4 if c_f32 else 2):
        raise LayoutError(f"{layout.name}: C/D of an m16n8 mma has {4 if c_f32 else 2} registers per lane, "
                          f"the table says {layout.c.registers}")
    defines = (
        ("MX_PROBE_ENTRY", probe_entry(layout.name)),
        ("MX_PTX", f'"{_ptx_text(layout)}"'),
        ("MX_A_REGS", layout.a.registers),
        ("MX_B_REGS", layout.b.registers),
        ("MX_C_REGS", layout.c.registers),
        ("MX_C_F32", int(c_f32)),
    )
    entry = probe_entry(layout.name)
    if is_block_scaled(layout):
        (byte_a, byte_b), (thr_a, thr_b) = layout.scale_opsel, layout.scale_thread
        if any((byte_a, byte_b, thr_a, thr_b)):
            entry = probe_entry(layout.name, f"sel{byte_a}{thr_a}{byte_b}{thr_b}")
        defines = ((defines[0][0], entry),) + defines[1:] + (
            ("MX_BLOCK_SCALED", 1), ("MX_SCALE_BYTE_A", byte_a), ("MX_SCALE_THREAD_A", thr_a),
            ("MX_SCALE_BYTE_B", byte_b), ("MX_SCALE_THREAD_B", thr_b))
        return ProbeKernel(layout.name, "nvidia", "probe_mma.cu", entry, defines, _nv_archs(layout),
                           layout.a_format, layout.b_format, byte_a, byte_b, True)
    return ProbeKernel(layout.name, "nvidia", "probe_mma.cu", entry, defines, _nv_archs(layout),
                       layout.a_format, layout.b_format)


# ---- ldmatrix ----------------------------------------------------------------------------------------------------
def ldmatrix_count(layout) -> int:
    """Number of 8x8 matrices (= registers per lane) of an ldmatrix record: 1, 2 or 4."""
    num = getattr(layout, "num", None)
    if num is not None:
        return int(num)
    m = re.search(r"\.x([124])\b", _ptx_text(layout))
    if not m:
        raise LayoutError(f"{layout.name}: cannot tell .x1/.x2/.x4 from the instruction text")
    return int(m.group(1))


def ldmatrix_row_offsets(layout) -> np.ndarray:
    """Per lane, the element offset of the row it supplies (``address_lane[j, r]`` supplies row r of matrix
    j, stored densely at ``(j * 8 + r) * 8``); lanes that supply no address get 0."""
    offs = np.zeros(32, dtype=np.uint32)
    addr = np.asarray(layout.address_lane)
    for j in range(addr.shape[0]):
        for r in range(addr.shape[1]):
            offs[int(addr[j, r])] = (j * 8 + r) * 8
    return offs


def ldmatrix_probe_kernel(layout) -> ProbeKernel:
    n = ldmatrix_count(layout)
    defines = (
        ("MX_PROBE_ENTRY", probe_entry(layout.name)),
        ("MX_LDSM_PTX", f'"{_ptx_text(layout)}"'),
        ("MX_LDSM_REGS", n),
    )
    archs = tuple(a for a in getattr(layout, "archs", _NV_ARCHS) if a in _NV_ARCHS)
    return ProbeKernel(layout.name, "nvidia", "probe_ldmatrix.cu", probe_entry(layout.name), defines, archs)


# ---- what the machine code must contain ---------------------------------------------------------------------------
def _sass(fmt: str) -> str:
    """cuobjdump's spelling of an element type (E4M3, E2M1, ...): the PTX type in upper case."""
    return PTX_TYPE[fmt].upper()


def expected_sass(layout, arch: str) -> dict:
    """What the probe's SASS must hold for ``arch``: {"opcode": (count, required line fragment), ...}.

    mma.sync m16n8kK -> one ``HMMA.16n8K`` (e.g. HMMA.16816); fp8 m16n8k32 -> one ``QMMA.16832.F32.<A>.<B>``
    on sm_89, and on sm_90 (no fp8 tensor cores for mma.sync) F2FP conversions plus two ``HMMA.16816.F32``.
    ldmatrix .xN -> one ``LDSM.16.M88.N`` (no ``.N`` for .x1; ``MT88`` with .trans)."""
    text = _ptx_text(layout)
    if text.startswith("ldmatrix"):
        n = ldmatrix_count(layout)
        suffix = "" if n == 1 else f".{n}"  # cuobjdump prints LDSM.16.M88 for .x1, LDSM.16.M88.2 / .4 otherwise
        return {"LDSM": (1, f"LDSM.16.{'MT88' if '.trans' in text else 'M88'}{suffix}")}
    m = re.search(r"\.m(\d+)n(\d+)k(\d+)\.", text)
    if not m:
        raise LayoutError(f"{layout.name}: no .mMnNkK shape in {text!r}")
    shape = "".join(m.groups())
    if is_block_scaled(layout):  # sm_120a: QMMA.SF.16832 (kind::mxf8f6f4) / OMMA.SF.16864 (kind::mxf4*), E8 scales
        op = "QMMA" if shape == "16832" else "OMMA"
        return {op: (1, f"{op}.SF.{shape}.F32.{_sass(layout.a_format)}.{_sass(layout.b_format)}.E8")}
    if _is_fp8_mma(layout):
        if arch == "sm_89":
            return {"QMMA": (1, f"QMMA.{shape}.F32.{_sass(layout.a_format)}.{_sass(layout.b_format)}")}
        return {"HMMA": (2, "HMMA.16816.F32"), "F2FP": (None, "F2FP")}
    acc = ".F32" if layout.c_format == "fp32" else ".F16"
    return {"HMMA": (1, f"HMMA.{shape}{acc}")}


# ---- running -------------------------------------------------------------------------------------------------------
@functools.cache
def _cupy_function(probe: ProbeKernel):
    import cupy

    module = cupy.RawModule(code=probe.source(), options=probe.options)
    return module.get_function(probe.entry)


def _cupy():
    try:
        import cupy
    except ImportError as exc:
        raise BackendUnavailableError(f"running probe kernels on NVIDIA needs CuPy ({exc}); "
                                      "pip install 'mxcore[cuda]'") from exc
    return cupy


def run_cuda(layout, a_regs, b_regs, c_regs, *, scale_a=None, scale_b=None) -> np.ndarray:
    """Execute ``layout``'s mma.sync once on the current CUDA device.

    ``a_regs``, ``b_regs``, ``c_regs``: per-lane slots (``(lanes, slots)``, codes or values, as from
    ``mxcore.emulate.scatter``); ``scale_a``/``scale_b`` the same for the block-scaled sm_120a records
    (E8M0 codes; lanes that supply no scale get decoys).  Returns D's per-lane slots as float64 values."""
    cp = _cupy()
    probe = probe_kernel(layout)
    fn = _cupy_function(probe)
    bufs = [cp.asarray(words(layout, n, r).ravel()) for n, r in (("a", a_regs), ("b", b_regs), ("c", c_regs))]
    if probe.scaled:
        if scale_a is None or scale_b is None:
            raise UnsupportedError(f"{layout.name} is block-scaled: pass scale_a and scale_b (E8M0 codes)")
        bufs += [cp.asarray(scale_words(layout, "scale_a", scale_a)), cp.asarray(scale_words(layout, "scale_b", scale_b))]
    d = cp.full(layout.lanes * layout.c.registers, 0x7FC00000, dtype=cp.uint32)  # poisoned with NaN
    fn((1,), (layout.lanes,), (*bufs, d))
    cp.cuda.runtime.deviceSynchronize()
    return d_values(layout, cp.asnumpy(d).reshape(layout.lanes, layout.c.registers))


def run_cuda_ldmatrix(layout) -> np.ndarray:
    """Execute ``layout``'s ldmatrix once on an arange tile (matrix j, row r, column c holds code
    ``(j * 8 + r) * 8 + c``), every lane supplying the row address the table's ``address_lane`` gives it.
    Returns what each lane received as element codes ``(32, 2 * N)`` (slot 2i = register i's low half)."""
    cp = _cupy()
    probe = ldmatrix_probe_kernel(layout)
    fn = _cupy_function(probe)
    n = ldmatrix_count(layout)
    tile = cp.arange(n * 64, dtype=cp.uint16)
    offs = cp.asarray(ldmatrix_row_offsets(layout))
    out = cp.full(32 * n, 0xFFFFFFFF, dtype=cp.uint32)
    fn((1,), (32,), (tile, offs, out))
    cp.cuda.runtime.deviceSynchronize()
    got = cp.asnumpy(out).reshape(32, n).astype(np.uint64)
    halves = np.stack([got & np.uint64(0xFFFF), got >> np.uint64(16)], axis=-1)
    return halves.reshape(32, 2 * n).astype(np.int64)


def ldmatrix_expected(layout) -> np.ndarray:
    """The codes the table says each lane receives from run_cuda_ldmatrix's arange tile, ``(32, 2 * N)``."""
    from mxcore import emulate

    n = ldmatrix_count(layout)
    return np.asarray(emulate.ldmatrix(layout, np.arange(n * 64).reshape(n, 8, 8)), dtype=np.int64)


run = run_cuda
