"""What every probe family shares: the :class:`ProbeKernel` record, probe entry-point names, and the lookup of the
family module that handles a layout record (:data:`FAMILIES`)."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

from mxcore.errors import UnsupportedError

__all__ = ["FAMILIES", "ProbeKernel", "family", "probe_entry", "probe_kernel"]

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
        module = importlib.import_module(f"{__package__}.{name}")
        if module.handles(layout):
            return module
    raise UnsupportedError(f"no probe kernel for {getattr(layout, 'vendor', '?')} instruction "
                           f"{getattr(layout, 'name', layout)!r}; probe families: {', '.join(FAMILIES)}")


def probe_kernel(layout) -> ProbeKernel:
    """The probe kernel for one mma.sync (NVIDIA) or MFMA (AMD) record (an AMD scaled record's op_sel bytes
    come from its ``scale_opsel``)."""
    return family(layout).probe_kernel(layout)
