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

from .amd import expected_mfma, parse_mfma, run_hip
from .common import FAMILIES, ProbeKernel, family, probe_entry, probe_kernel
from .experiments import (
    arange_probe,
    error_bound,
    exact_grid,
    exact_values,
    random_values,
    reference_d,
    run_matrices,
    where_elements,
)
from .nvidia import (
    expected_sass,
    ldmatrix_count,
    ldmatrix_expected,
    ldmatrix_probe_kernel,
    ldmatrix_row_offsets,
    run_cuda,
    run_cuda_ldmatrix,
)
from .registers import scale_words
