"""AMD probe kernels: one MFMA per kernel (``kernels_hip/probe_mfma.hip``), run through the hip backend's runtime;
what their disassembly must show."""

from __future__ import annotations

import re

import numpy as np

from mxcore import dtypes as _dt
from mxcore.errors import LayoutError, UnsupportedError

from .common import ProbeKernel, probe_entry
from .registers import d_values, scale_words, words

__all__ = ["DEVICE", "expected_mfma", "handles", "parse_mfma", "probe_kernel", "run", "run_hip"]

DEVICE = "hip"
_AMD_ARCHS = ("gfx942", "gfx950")  # the archs the offline compile checks cover


def handles(layout) -> bool:
    return getattr(layout, "vendor", None) == "amd"


def _is_f8f6f4(layout) -> bool:
    return "f8f6f4" in layout.name


def _arg_type(layout, role: str) -> str:
    """The ``kernels_hip/mx_types.h`` typedef the intrinsic takes for A, B or C (the hip backend's rule)."""
    from ..hip.fragments import frag_type

    return frag_type(layout, role)


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
    code = _dt.F8F6F4_CODES.get(fmt)
    recorded = getattr(layout, field_name, None)
    if recorded is not None and code is not None and int(recorded) != code:
        raise LayoutError(f"{layout.name}: {field_name}={recorded} but {operand_name.upper()} is {fmt} (code {code})")
    if code is None:
        raise UnsupportedError(f"{layout.name}: {fmt} is not an f8f6f4 format ({', '.join(_dt.F8F6F4_CODES)})")
    return code


def _opsel(layout) -> tuple[int, int]:
    sel = getattr(layout, "scale_opsel", None) or (0, 0)
    sa, sb = (int(x) for x in sel)
    if not (0 <= sa <= 3 and 0 <= sb <= 3):
        raise LayoutError(f"{layout.name}: op_sel selects a byte 0..3 of the scale register, got {sel}")
    return sa, sb


def probe_kernel(layout) -> ProbeKernel:
    scaled = getattr(layout, "scale_a", None) is not None
    opsel_a, opsel_b = _opsel(layout)
    extra: list = []
    defines = [
        ("MX_INTRINSIC", _hip_intrinsic(layout)),
        ("MX_A_T", _arg_type(layout, "a")),
        ("MX_B_T", _arg_type(layout, "b")),
        ("MX_C_T", _arg_type(layout, "c")),
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


# ---- what the machine code must contain ---------------------------------------------------------------------------
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


# ---- running -------------------------------------------------------------------------------------------------------
def run_hip(layout, a_regs, b_regs, c_regs, *, scale_a=None, scale_b=None) -> np.ndarray:
    """Execute ``layout``'s MFMA once on the current AMD device through hip-python (hiprtc); return D's
    per-lane slots as float64 values.  Scales (E8M0 codes per lane, as scatter gives them) are packed at
    the record's op_sel byte; the other bytes of the scale register get different codes, so reading the
    wrong byte shows."""
    probe = probe_kernel(layout)
    launch = _hip_launcher()
    lanes = layout.lanes
    bufs = [words(layout, n, r).ravel() for n, r in (("a", a_regs), ("b", b_regs), ("c", c_regs))]
    if probe.scaled:
        bufs += [scale_words(layout, "scale_a", scale_a), scale_words(layout, "scale_b", scale_b)]
    else:
        bufs += [np.zeros(lanes, dtype=np.uint32)] * 2
    d = launch(probe, bufs, lanes * layout.c.registers, lanes)
    return d_values(layout, np.asarray(d, dtype=np.uint32).reshape(lanes, layout.c.registers))


def _hip_launcher():
    """A callable (probe, input word arrays, output word count, threads) -> output words, on the hip backend's
    runtime (``HipBackend.runtime()``: hiprtc compile for the device's arch, code-object cache, module load)."""
    import ctypes

    from .. import get

    rt = get("hip").runtime()  # raises BackendUnavailableError (with the reason) without ROCm / an AMD GPU

    def launch(probe, inputs, out_words, threads):
        func = rt.function(probe.source(), probe.entry, probe.options)
        allocs = []
        try:
            for host in inputs:
                allocs.append(rt.upload(np.ascontiguousarray(host, dtype=np.uint32)))
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
    from .. import hip as _hip

    return _hip.device_address(ptr)


run = run_hip
