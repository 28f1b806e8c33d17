"""Probe kernels: run exactly one mma.sync / ldmatrix / MFMA instruction on register contents from the table.

A probe kernel knows no layout.  Each lane loads its A, B, C (and, for scaled instructions, scale) registers
from lane-major buffers of raw 32-bit words (``buf[lane * registers + r]``), executes one instruction and
writes D's registers back the same way.  Everything layout-specific happens on the host, from the
:mod:`mxcore.layouts` record:

* ``mxcore.emulate.scatter`` / ``pack`` turn a matrix into per-lane slots and those into register words;
  ``unpack`` / ``gather`` read D back (:mod:`.registers`).
* one module per instruction family describes its kernel (source file, ``-D`` defines, entry point
  ``mx_probe_<instruction suffix>``, what its machine code must contain) and runs it: :mod:`.nvidia`
  (mma.sync and ldmatrix, through CuPy), :mod:`.amd` (MFMA, through the hip backend's runtime).
* :mod:`.experiments`: the instruction as a tiny GEMM (:func:`run_matrices`), the "where did each element go"
  experiment (:func:`arange_probe`, :func:`where_elements`) and test inputs with one right answer.
* :mod:`.wgmma`: the Hopper wgmma layout probes (B comes from shared memory through a descriptor, so that
  family has its own driver instead of the register protocol below).

Adding a register-fed family: a module beside these with ``DEVICE`` ("cuda" | "hip"),
``handles(layout) -> bool``, ``probe_kernel(layout) -> ProbeKernel`` and ``run(layout, a_regs, b_regs,
c_regs, *, scale_a=None, scale_b=None) -> D slots``, listed in :data:`FAMILIES` before the family it
specialises (first match wins).

Importing this package imports neither CuPy nor hip-python.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

from mxcore.errors import UnsupportedError

__all__ = [
    "FAMILIES",
    "ProbeKernel",
    "arange_probe",
    "error_bound",
    "exact_grid",
    "exact_values",
    "expected_mfma",
    "expected_sass",
    "family",
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

#: instruction-family modules of this package, tried in order (first ``handles(layout)`` wins)
FAMILIES = ("amd", "nvidia")


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


def family(layout):
    """The family module (:data:`FAMILIES`) that builds and runs the probe for ``layout``."""
    for name in FAMILIES:
        module = importlib.import_module(f"{__name__}.{name}")
        if module.handles(layout):
            return module
    raise UnsupportedError(f"no probe kernel for {getattr(layout, 'vendor', '?')} instruction "
                           f"{getattr(layout, 'name', layout)!r}; probe families: {', '.join(FAMILIES)}")


def probe_kernel(layout) -> ProbeKernel:
    """The probe kernel for one mma.sync (NVIDIA) or MFMA (AMD) record (an AMD scaled record's op_sel bytes
    come from its ``scale_opsel``)."""
    return family(layout).probe_kernel(layout)


from .amd import expected_mfma, parse_mfma, run_hip  # noqa: E402
from .experiments import (  # noqa: E402
    arange_probe,
    error_bound,
    exact_grid,
    exact_values,
    random_values,
    reference_d,
    run_matrices,
    where_elements,
)
from .nvidia import (  # noqa: E402
    expected_sass,
    ldmatrix_count,
    ldmatrix_expected,
    ldmatrix_probe_kernel,
    ldmatrix_row_offsets,
    run_cuda,
    run_cuda_ldmatrix,
)
from .registers import scale_words  # noqa: E402
