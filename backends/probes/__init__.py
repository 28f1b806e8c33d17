"""Probe kernels: run exactly one mma.sync / ldmatrix / MFMA instruction on register contents from the table.

A probe kernel knows no layout.  Each lane loads its A, B, C (and, for the scaled AMD MFMAs, scale)
registers from lane-major buffers of raw 32-bit words (``buf[lane * registers + r]``), executes one
instruction and writes D's registers back the same way.  Everything layout-specific happens here, on the
host, from the :mod:`mxcore.layouts` record:

* ``mxcore.emulate.scatter`` / ``pack`` turn a matrix into per-lane slots and those into register words
  (slot 0 in register 0's low bits upward, at the record's ``bit_offsets``: fp6 elements straddle
  registers, an op_sel-chosen scale byte sits at 8 * byte); ``unpack`` / ``gather`` read D back.
* :func:`probe_kernel` / :func:`ldmatrix_probe_kernel` describe the kernel for one record: source file,
  ``-D`` defines, entry point ``mx_probe_<instruction suffix>``, and what its machine code must contain.
* :func:`run_cuda` / :func:`run_cuda_ldmatrix` (CuPy) and :func:`run_hip` (hip-python) execute a probe.
* :func:`arange_probe` / :func:`where_elements` drive the "where did each element go" experiment
  (arange values in A or B, identity-like partner, read back from D).

Importing this module imports neither CuPy nor hip-python.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

from mxcore.errors import BackendUnavailableError, LayoutError, UnsupportedError

__all__ = [
    "F8F6F4_CODES",
    "ProbeKernel",
    "arange_probe",
    "error_bound",
    "exact_grid",
    "exact_values",
    "expected_mfma",
    "expected_sass",
    "ldmatrix_count",
    "ldmatrix_expected",
    "ldmatrix_probe_kernel",
    "ldmatrix_row_offsets",
    "parse_mfma",
    "probe_entry",
    "probe_kernel",
    "random_values",
    "reference_d",
    "run_cuda",
    "run_cuda_ldmatrix",
    "run_hip",
    "run_matrices",
    "scale_words",
    "where_elements",
]

# f8f6f4 format code of an element format (the cbsz field for A, blgp for B) -- CDNA4 ISA, MFMA chapter
F8F6F4_CODES = {"e4m3fn": 0, "e5m2": 1, "e2m3": 2, "e3m2": 3, "e2m1": 4}

_NV_ARCHS = ("sm_80", "sm_89", "sm_90")  # the archs the offline compile checks cover
_AMD_ARCHS = ("gfx942", "gfx950")


# ----------------------------------------------------------------------------------------------------------------
# formats
# ----------------------------------------------------------------------------------------------------------------
_WIDE = ("fp32", "tf32", "fp16", "bf16")  # formats whose registers hold values; the others hold codes


# ----------------------------------------------------------------------------------------------------------------
# probe kernel descriptions
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProbeKernel:
    """One probe kernel: which file, which ``-D`` defines, which entry point, for which instruction."""

    instruction: str  # the layout record's name
    vendor: str  # "nvidia" | "amd"
    filename: str  # file in kernels_cuda/ or kernels_hip/
    entry: str  # extern "C" name, mx_probe_<suffix>
    defines: tuple  # (("MX_...", "value"), ...)
    archs: tuple  # archs (of the compile-checked ones) that have the instruction
    a_format: str | None = None
    b_format: str | None = None
    opsel_a: int = 0
    opsel_b: int = 0
    scaled: bool = False

    @property
    def options(self) -> tuple:
        """``-D`` options for NVRTC / hiprtc / clang."""
        return tuple(f"-D{k}={v}" for k, v in self.defines)

    def source(self) -> str:
        from mxcore.kernels import kernel_source

        return kernel_source(self.vendor, self.filename)

    def __str__(self) -> str:
        return self.entry


def _suffix(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", text).strip("_").lower()


def probe_entry(name: str, *extra) -> str:
    """``mx_probe_<suffix>``: the instruction name without ``mma.sync.aligned.`` / ``v_`` / ``.sync.aligned``,
    non-alphanumerics as ``_``, then any ``extra`` parts (formats, op_sel)."""
    base = name
    for prefix in ("mma.sync.aligned.", "v_"):
        base = base.removeprefix(prefix)
    base = base.replace(".sync.aligned", "")
    return "_".join(["mx_probe", _suffix(base), *(_suffix(str(x)) for x in extra if x != "")])


def _ptx_text(layout) -> str:
    ptx = getattr(layout, "ptx", None) or getattr(layout, "mnemonic", None) or layout.name
    return ptx.strip().rstrip(";")


def is_block_scaled(layout) -> bool:
    """An sm_120a ``mma.sync ... .block_scale`` record (scale operands chosen by {byte-id, thread-id})."""
    return getattr(layout, "vendor", None) == "nvidia" and getattr(layout, "scale_a", None) is not None


def _is_fp8_mma(layout) -> bool:
    if is_block_scaled(layout):
        return False
    return layout.a_format in ("e4m3fn", "e5m2") or layout.b_format in ("e4m3fn", "e5m2")


_NV_ARCH_SPECIFIC = ("sm_120a",)  # arch-specific records (block-scaled mma.sync) are compile-checked here


def _nv_archs(layout) -> tuple:
    if is_block_scaled(layout):
        return tuple(a for a in layout.archs if a in _NV_ARCH_SPECIFIC)
    archs = tuple(a for a in getattr(layout, "archs", _NV_ARCHS) if a in _NV_ARCHS)
    if _is_fp8_mma(layout):  # fp8 mma.sync needs sm_89+ (QMMA on sm_89, emulated on sm_90)
        archs = tuple(a for a in archs if a != "sm_80")
    return archs


def probe_kernel(layout) -> ProbeKernel:
    """The probe kernel for one mma.sync (NVIDIA) or MFMA (AMD) record (an AMD scaled record's op_sel bytes
    come from its ``scale_opsel``)."""
    if layout.vendor == "nvidia":
        return _cuda_mma_probe(layout)
    if layout.vendor == "amd":
        return _hip_mfma_probe(layout)
    raise UnsupportedError(f"no probe kernel for vendor {layout.vendor!r} ({layout.name})")


def _cuda_mma_probe(layout) -> ProbeKernel:
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


# ---- AMD MFMA ----------------------------------------------------------------------------------------------------
def _is_f8f6f4(layout) -> bool:
    return "f8f6f4" in layout.name


def _hip_arg_type(layout, operand_name: str) -> str:
    """The typedef in probe_mfma.hip that the intrinsic takes for A or B."""
    op = getattr(layout, operand_name)
    fmt = getattr(layout, f"{operand_name}_format")
    if _is_f8f6f4(layout):
        return "mx_i32x8"
    if fmt == "fp32":
        return "mx_f32x1"
    if fmt in ("tf32", "xf32"):
        return "mx_f32x2"
    if fmt == "fp16":
        return {2: "mx_f16x4", 4: "mx_f16x8"}[op.registers]
    if fmt == "bf16":
        return {2: "mx_i16x4", 4: "mx_bf16x8"}[op.registers]
    if op.bits == 8 and op.registers == 2:  # the CDNA3-style fp8/bf8 MFMAs take one 64-bit value
        return "mx_i64"
    raise UnsupportedError(f"{layout.name}: no probe argument type for {operand_name} ({fmt}, {op.registers} regs)")


def _hip_intrinsic(layout) -> str:
    intr = getattr(layout, "intrinsic", None)
    if _is_f8f6f4(layout):
        # one builtin serves both forms; constant zero scales make the compiler emit the unscaled instruction
        shape = re.search(r"(\d+x\d+x\d+)", layout.name).group(1)
        return f"__builtin_amdgcn_mfma_scale_f32_{shape}_f8f6f4"
    if not intr:
        raise LayoutError(f"{layout.name}: the record names no __builtin_amdgcn_* intrinsic")
    return intr


def _f8f6f4_code(layout, operand_name: str) -> int:
    field_name = "cbsz" if operand_name == "a" else "blgp"
    fmt = getattr(layout, f"{operand_name}_format")
    code = F8F6F4_CODES.get(fmt)
    recorded = getattr(layout, field_name, None)
    if recorded is not None and code is not None and int(recorded) != code:
        raise LayoutError(f"{layout.name}: {field_name}={recorded} but {operand_name.upper()} is {fmt} (code {code})")
    if code is None:
        raise UnsupportedError(f"{layout.name}: {fmt} is not an f8f6f4 format ({', '.join(F8F6F4_CODES)})")
    return code


def _opsel(layout) -> tuple[int, int]:
    sel = getattr(layout, "scale_opsel", None) or (0, 0)
    sa, sb = (int(x) for x in sel)
    if not (0 <= sa <= 3 and 0 <= sb <= 3):
        raise LayoutError(f"{layout.name}: op_sel selects a byte 0..3 of the scale register, got {sel}")
    return sa, sb


def _hip_mfma_probe(layout) -> ProbeKernel:
    scaled = getattr(layout, "scale_a", None) is not None
    opsel_a, opsel_b = _opsel(layout)
    extra: list = []
    defines = [
        ("MX_INTRINSIC", _hip_intrinsic(layout)),
        ("MX_A_T", _hip_arg_type(layout, "a")),
        ("MX_B_T", _hip_arg_type(layout, "b")),
        ("MX_C_T", {4: "mx_f32x4", 16: "mx_f32x16"}[layout.c.registers]),
        ("MX_A_REGS", layout.a.registers),
        ("MX_B_REGS", layout.b.registers),
        ("MX_C_REGS", layout.c.registers),
    ]
    if _is_f8f6f4(layout):
        cbsz, blgp = _f8f6f4_code(layout, "a"), _f8f6f4_code(layout, "b")
        defines += [("MX_F8F6F4", 1), ("MX_SCALED", int(scaled)), ("MX_CBSZ", cbsz), ("MX_BLGP", blgp),
                    ("MX_OPSEL_A", opsel_a), ("MX_OPSEL_B", opsel_b)]
        extra = [layout.a_format, layout.b_format]
        if scaled:
            extra.append(f"opsel{opsel_a}{opsel_b}")
    entry = probe_entry(layout.name, *extra)
    archs = tuple(a for a in getattr(layout, "archs", _AMD_ARCHS) if a in _AMD_ARCHS)
    return ProbeKernel(layout.name, "amd", "probe_mfma.hip", entry, (("MX_PROBE_ENTRY", entry), *defines), archs,
                       layout.a_format, layout.b_format, opsel_a, opsel_b, scaled)


# ----------------------------------------------------------------------------------------------------------------
# what the machine code must contain
# ----------------------------------------------------------------------------------------------------------------
_FP8_SASS = {"e4m3fn": "E4M3", "e5m2": "E5M2"}


_MX_SASS = {"e4m3fn": "E4M3", "e5m2": "E5M2", "e3m2": "E3M2", "e2m3": "E2M3", "e2m1": "E2M1"}


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
        return {op: (1, f"{op}.SF.{shape}.F32.{_MX_SASS[layout.a_format]}.{_MX_SASS[layout.b_format]}.E8")}
    if _is_fp8_mma(layout):
        if arch == "sm_89":
            return {"QMMA": (1, f"QMMA.{shape}.F32.{_FP8_SASS[layout.a_format]}.{_FP8_SASS[layout.b_format]}")}
        return {"HMMA": (2, "HMMA.16816.F32"), "F2FP": (None, "F2FP")}
    acc = ".F32" if layout.c_format == "fp32" else ".F16"
    return {"HMMA": (1, f"HMMA.{shape}{acc}")}


def expected_mfma(probe: ProbeKernel, layout) -> tuple[str, dict]:
    """(mnemonic, modifiers) the disassembly must show for an AMD probe: e.g. ("v_mfma_scale_f32_16x16x128_f8f6f4",
    {"cbsz": "2", "blgp": "4", "op_sel": "[1,1,0]", "op_sel_hi": "[0,1,0]"}).  Modifiers at their default are absent
    from llvm-objdump's text and from this dict."""
    mods: dict = {}
    mnemonic = layout.name
    if _is_f8f6f4(layout):
        shape = re.search(r"(\d+x\d+x\d+)", layout.name).group(1)
        mnemonic = f"v_mfma_{'scale_' if probe.scaled else ''}f32_{shape}_f8f6f4"
        cbsz, blgp = _f8f6f4_code(layout, "a"), _f8f6f4_code(layout, "b")
        if cbsz:
            mods["cbsz"] = str(cbsz)
        if blgp:
            mods["blgp"] = str(blgp)
        lo = [probe.opsel_a & 1, probe.opsel_b & 1, 0]
        hi = [probe.opsel_a >> 1, probe.opsel_b >> 1, 0]
        if any(lo):
            mods["op_sel"] = "[" + ",".join(map(str, lo)) + "]"
        if any(hi):
            mods["op_sel_hi"] = "[" + ",".join(map(str, hi)) + "]"
    return mnemonic, mods


def parse_mfma(line: str) -> tuple[str, dict]:
    """``"v_mfma_x cbsz:4 blgp:4"`` (hip_tools.mfma_instructions' form) -> ("v_mfma_x", {"cbsz": "4", ...})."""
    parts = line.split()
    return parts[0], dict(p.split(":", 1) for p in parts[1:])


# ----------------------------------------------------------------------------------------------------------------
# running probes
# ----------------------------------------------------------------------------------------------------------------
def _words(layout, operand_name: str, regs) -> np.ndarray:
    """Per-lane slots -> the lane-major uint32 words a probe kernel loads (mxcore.emulate.pack)."""
    from mxcore import emulate

    return emulate.pack(layout, operand_name, regs)


def _operand_format(layout, operand_name: str) -> str:
    if operand_name in ("scale_a", "scale_b"):
        return "e8m0"
    return getattr(layout, f"{operand_name}_format")


def _d_values(layout, words) -> np.ndarray:
    from mxcore import emulate

    return np.asarray(emulate.unpack(layout, "c", words), dtype=np.float64)


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
    probe = _cuda_mma_probe(layout)
    fn = _cupy_function(probe)
    bufs = [cp.asarray(_words(layout, n, r).ravel()) for n, r in (("a", a_regs), ("b", b_regs), ("c", c_regs))]
    if probe.scaled:
        if scale_a is None or scale_b is None:
            raise UnsupportedError(f"{layout.name} is block-scaled: pass scale_a and scale_b (E8M0 codes)")
        bufs += [cp.asarray(scale_words(layout, "scale_a", scale_a)), cp.asarray(scale_words(layout, "scale_b", scale_b))]
    d = cp.full(layout.lanes * layout.c.registers, 0x7FC00000, dtype=cp.uint32)  # poisoned with NaN
    fn((1,), (layout.lanes,), (*bufs, d))
    cp.cuda.runtime.deviceSynchronize()
    return _d_values(layout, cp.asnumpy(d).reshape(layout.lanes, layout.c.registers))


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
    words = cp.asnumpy(out).reshape(32, n).astype(np.uint64)
    halves = np.stack([words & np.uint64(0xFFFF), words >> np.uint64(16)], axis=-1)
    return halves.reshape(32, 2 * n).astype(np.int64)


def ldmatrix_expected(layout) -> np.ndarray:
    """The codes the table says each lane receives from run_cuda_ldmatrix's arange tile, ``(32, 2 * N)``."""
    from mxcore import emulate

    n = ldmatrix_count(layout)
    return np.asarray(emulate.ldmatrix(layout, np.arange(n * 64).reshape(n, 8, 8)), dtype=np.int64)


def run_hip(layout, a_regs, b_regs, c_regs, *, scale_a=None, scale_b=None) -> np.ndarray:
    """Execute ``layout``'s MFMA once on the current AMD device through hip-python (hiprtc); return D's
    per-lane slots as float64 values.  Scales (E8M0 codes per lane, as scatter gives them) are packed at
    the record's op_sel byte; the other bytes of the scale register get different codes, so reading the
    wrong byte shows."""
    probe = _hip_mfma_probe(layout)
    launch = _hip_launcher()
    lanes = layout.lanes
    words = [_words(layout, n, r).ravel() for n, r in (("a", a_regs), ("b", b_regs), ("c", c_regs))]
    if probe.scaled:
        words += [scale_words(layout, "scale_a", scale_a), scale_words(layout, "scale_b", scale_b)]
    else:
        words += [np.zeros(lanes, dtype=np.uint32)] * 2
    d = launch(probe, words, lanes * layout.c.registers, lanes)
    return _d_values(layout, np.asarray(d, dtype=np.uint32).reshape(lanes, layout.c.registers))


def scale_words(layout, name: str, regs) -> np.ndarray:
    """One 32-bit scale register per lane: the E8M0 code at the byte the record's op_sel names, and decoy
    codes (code ^ 0x55) in the bytes the instruction must not read."""
    from mxcore import emulate

    op = getattr(layout, name)
    codes = np.asarray(regs).astype(np.uint32).reshape(layout.lanes, op.slots)
    word = emulate.pack(layout, name, codes.astype(np.uint8))[:, 0]
    used = 0
    for off in op.bit_offsets:
        used |= ((1 << int(op.bits)) - 1) << int(off)
    decoy = ((codes[:, 0] ^ 0x55) & 0xFF) * np.uint32(0x01010101)
    out = word | (decoy & np.uint32(~used & 0xFFFFFFFF))
    # lanes that supply no scale (NVIDIA block_scale: thread-id picks the lanes) hold decoys only
    return np.where(op.held.any(axis=1), out, decoy ^ np.uint32(0x01010101)).astype(np.uint32)


def _hip_launcher():
    """A callable (probe, input word arrays, output word count, threads) -> output words, on the hip backend's
    runtime (backends/hip.py: hiprtc compile for the device's arch, code-object cache, module load)."""
    import ctypes

    from . import get

    rt = get("hip").runtime()  # raises BackendUnavailableError (with the reason) without ROCm / an AMD GPU

    def launch(probe, inputs, out_words, threads):
        func = rt.function(probe.source(), probe.entry, probe.options)
        allocs = []
        try:
            for words in inputs:
                allocs.append(rt.upload(np.ascontiguousarray(words, dtype=np.uint32)))
            out = np.full(out_words, 0x7FC00000, dtype=np.uint32)  # poisoned with NaN
            d = rt.upload(out)
            allocs.append(d)
            ptrs = [ctypes.c_void_p(_device_address(x)) for x in allocs]
            a, b, c, sa, sb = (ptrs[i] for i in range(5))
            rt.launch(func, (1, 1, 1), (threads, 1, 1), (a, b, c, ptrs[5], sa, sb))
            rt.synchronize()
            return rt.download(d, out)
        finally:
            for x in allocs:
                rt.free(x)

    return launch


def _device_address(ptr) -> int:
    from . import hip as _hip

    return _hip.device_address(ptr)


# ----------------------------------------------------------------------------------------------------------------
# matrices in, matrices out: the probe (or the emulator) as a tiny GEMM
# ----------------------------------------------------------------------------------------------------------------
def _slots(layout, role: str, matrix) -> np.ndarray:
    """scatter() of a matrix of *values*; element codes for the <= 8-bit formats (what the emulator reads)."""
    from mxcore import emulate

    fmt = _operand_format(layout, role)
    matrix = np.asarray(matrix)
    if fmt not in _WIDE and matrix.dtype.kind == "f":
        from mxcore import formats

        matrix = formats.encode(matrix.astype(np.float64), fmt)
    return emulate.scatter(layout, role, matrix)


def run_matrices(layout, a, b, c, *, scale_a=None, scale_b=None, device: str = "emulate") -> np.ndarray:
    """D = A·B + C through one instruction: ``a`` (M×K), ``b`` (K×N), ``c`` (M×N) are float values exactly
    representable in the layout's formats; ``scale_a``/``scale_b`` E8M0 codes (M×K/32, K/32×N) for the
    scaled MFMAs.  The matrices are scattered by the table, run on ``device`` ("cuda", "hip" or "emulate":
    mxcore.emulate.execute) and D is gathered back by the table; returns float64 (M×N)."""
    from mxcore import emulate

    regs = [_slots(layout, r, x) for r, x in (("a", a), ("b", b), ("c", c))]
    scales = {}
    if getattr(layout, "scale_a", None) is not None:
        if scale_a is None or scale_b is None:
            raise UnsupportedError(f"{layout.name} is block-scaled: pass scale_a and scale_b (E8M0 codes)")
        scales = {"scale_a": emulate.scatter(layout, "scale_a", np.asarray(scale_a, dtype=np.uint8)),
                      "scale_b": emulate.scatter(layout, "scale_b", np.asarray(scale_b, dtype=np.uint8))}
    if device == "cuda":
        d = run_cuda(layout, *regs, **scales)
    elif device == "hip":
        d = run_hip(layout, *regs, **scales)
    elif device == "emulate":
        d = emulate.execute(layout, *regs, **scales)
    else:
        raise UnsupportedError(f"device {device!r}: use 'cuda', 'hip' or 'emulate'")
    return np.asarray(emulate.gather(layout, "c", np.asarray(d, dtype=np.float64)), dtype=np.float64)


# ----------------------------------------------------------------------------------------------------------------
# the arange experiment: where did each element go?
# ----------------------------------------------------------------------------------------------------------------
def _exact_integers(fmt: str, n: int) -> bool:
    """Whether ``fmt`` holds every integer 0..n-1 exactly (significand bits incl. the implicit one)."""
    digits = {"fp32": 24, "tf32": 11, "fp16": 11, "bf16": 8}.get(fmt)
    return digits is not None and n <= (1 << digits) + 1


def arange_probe(layout, operand_name: str, run) -> np.ndarray:
    """Find where each element of A (or B) went.  Returns ``where`` (rows×cols): the row-major index of the
    element the instruction actually used in each position -- equal to arange exactly when the table is right
    (-1 where D held no single element).

    The index goes into the operand directly when its format (and C's) holds 0..N-1 exactly (fp32, tf32,
    fp16, small bf16 tiles); otherwise bit by bit (one run per bit, values 0/1, exact in every format).  The
    partner is identity-like (A: B[k, j] = 1 iff k == j + off; B: A[i, k] = 1 iff k == i + off; off steps
    through K), C is zero, and the index is read back from D.  ``run(a, b, c) -> d`` multiplies matrices of
    values through the instruction (``lambda a, b, c: run_matrices(layout, a, b, c, device="cuda")``)."""
    m, n, k = layout.m, layout.n, layout.k
    rows, cols = (m, k) if operand_name == "a" else (k, n)
    count = rows * cols
    index = np.arange(count, dtype=np.int64).reshape(rows, cols)
    fmt = getattr(layout, f"{operand_name}_format")
    direct = _exact_integers(fmt, count) and _exact_integers(layout.c_format, count)
    planes = [None] if direct else list(range(max(1, int(count - 1).bit_length())))
    where = np.zeros((rows, cols), dtype=np.int64)
    bad = np.zeros((rows, cols), dtype=bool)
    c = np.zeros((m, n))
    step = n if operand_name == "a" else m
    for plane in planes:
        values = (index if plane is None else (index >> plane) & 1).astype(np.float64)
        for off in range(0, k, step):
            width = min(step, k - off)
            if operand_name == "a":  # D[i, j] = A[i, j + off]
                partner = np.zeros((k, n))
                partner[off + np.arange(width), np.arange(width)] = 1.0
                got = run(values, partner, c)[:, :width]
                dst = (slice(None), slice(off, off + width))
            else:  # D[i, j] = B[i + off, j]
                partner = np.zeros((m, k))
                partner[np.arange(width), off + np.arange(width)] = 1.0
                got = run(partner, values, c)[:width, :]
                dst = (slice(off, off + width), slice(None))
            ok = np.isfinite(got) & (got == np.round(got)) & (got >= 0) & ((plane is None) | (got <= 1))
            vals = np.where(ok, got, 0).astype(np.int64)
            bad[dst] |= ~ok
            if plane is None:
                where[dst] = vals
            else:
                where[dst] |= vals << plane
    where[bad] = -1
    return where


def where_elements(layout, operand_name: str, where) -> list[str]:
    """The disagreements between the table and what the instruction did (empty when they agree): for each
    element, the (lane, slot) the hardware read it from versus the table's (lane, slot)."""
    op = getattr(layout, operand_name)
    rows, cols = where.shape
    out = []
    for r in range(rows):
        for c in range(cols):
            e = int(where[r, c])
            if e == r * cols + c:
                continue
            table = tuple(int(x) for x in op.inverse[r, c])
            if 0 <= e < rows * cols:
                lane, slot = (int(x) for x in op.inverse[e // cols, e % cols])
                out.append(f"{operand_name.upper()}[{r},{c}]: the instruction reads it from lane {lane} slot {slot}; "
                           f"the table says lane {table[0]} slot {table[1]}")
            else:
                out.append(f"{operand_name.upper()}[{r},{c}]: D held no single element there; the table says "
                           f"lane {table[0]} slot {table[1]}")
    return out


# ----------------------------------------------------------------------------------------------------------------
# test inputs and the reference
# ----------------------------------------------------------------------------------------------------------------
def _finite_values(fmt: str) -> np.ndarray:
    from mxcore import formats

    spec = formats.get(fmt)
    vals = np.asarray(formats.decode(np.arange(1 << spec.bits, dtype=np.uint8), fmt), dtype=np.float64)
    return np.unique(vals[np.isfinite(vals)])


def exact_values(fmt: str, shape, rng, *, grid: int = 8, vmax: float = 8.0) -> np.ndarray:
    """Random values of ``fmt`` that are multiples of 1/grid with |v| <= vmax (zero included), so that
    products and short sums of them are exact in fp32: D = A·B + C then has one right answer."""
    cand = np.arange(-int(vmax * grid), int(vmax * grid) + 1) / grid
    from mxcore import formats

    keep = cand[formats.round_to(cand, fmt) == cand]
    return rng.choice(keep, size=shape)


def random_values(fmt: str, shape, rng) -> np.ndarray:
    """Random finite values of ``fmt``: any finite code for the <= 8-bit formats, rounded normals otherwise."""
    from mxcore import formats

    if fmt not in _WIDE:
        return rng.choice(_finite_values(fmt), size=shape)
    return formats.round_to(rng.standard_normal(shape) * 4.0, fmt).astype(np.float64)


def exact_grid(layout) -> dict:
    """exact_values() settings for ``layout``: every D = A·B + C exact in C's format."""
    if layout.c_format == "fp16":
        return {"grid": 2, "vmax": 2.0}
    if getattr(layout, "scale_a", None) is not None:
        return {"grid": 8, "vmax": 4.0}
    return {"grid": 8, "vmax": 8.0}


def reference_d(layout, a, b, c, *, scale_a=None, scale_b=None) -> np.ndarray:
    """D = A·B + C from the decoded values, exact products and float64 sum (mxcore.reference's model), one
    rounding to C's format.  ``scale_a`` (M×K/32) and ``scale_b`` (K/32×N) E8M0 codes scale 32-K blocks."""
    from mxcore.reference import round_output

    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if scale_a is not None:
        sa = np.exp2(np.asarray(scale_a, dtype=np.float64) - 127.0)
        a64 = a64 * np.repeat(sa, layout.k // sa.shape[1], axis=1)
    if scale_b is not None:
        sb = np.exp2(np.asarray(scale_b, dtype=np.float64) - 127.0)
        b64 = b64 * np.repeat(sb, layout.k // sb.shape[0], axis=0)
    d = a64 @ b64 + np.asarray(c, dtype=np.float64)
    return round_output(d, "float32" if layout.c_format == "fp32" else "float16").astype(np.float64)


def error_bound(layout, a, b, c, *, scale_a=None, scale_b=None) -> np.ndarray:
    """A loose per-element bound for |hardware - reference| on arbitrary inputs: (K + 2) units of C's last
    place on the sum of magnitudes (fp32 accumulators: 2^-23; fp16: 2^-10).  Matrix cores differ in
    summation order and in how they round partial sums; layout errors are far larger than this."""
    ulp = 2.0 ** (-23 if layout.c_format == "fp32" else -10)
    mag = reference_d(layout, np.abs(a), np.abs(b), np.abs(c), scale_a=scale_a, scale_b=scale_b)
    return (layout.k + 2) * ulp * np.abs(mag) + 2.0 ** -126
