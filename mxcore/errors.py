"""mxcore's error hierarchy: one root, a few typed subclasses.

Every class also inherits the matching builtin, so ``except ValueError`` keeps working
for callers that do not know mxcore.  A message says what was asked, what exists, and
what to do instead.
"""

from __future__ import annotations

__all__ = [
    "MXCoreError",
    "FormatError",
    "UnknownNameError",
    "ShapeError",
    "InputTypeError",
    "UnsupportedError",
    "BackendUnavailableError",
    "LayoutError",
    "KernelCompileError",
    "DeviceError",
]


class MXCoreError(Exception):
    """Root of every error mxcore raises on purpose."""


class FormatError(MXCoreError, ValueError):
    """A value or code that a number format cannot hold (NaN in a no-NaN format, bad code)."""


class UnknownNameError(MXCoreError, KeyError):
    """A dtype, format, instruction or backend name that mxcore does not know."""

    def __str__(self) -> str:  # KeyError would repr() the message; keep it readable
        return str(self.args[0]) if self.args else ""


class ShapeError(MXCoreError, ValueError):
    """Operand shapes that do not fit together (inner dimensions, ndim)."""


class InputTypeError(MXCoreError, TypeError):
    """An input of a kind mxcore does not take (integer, complex, unknown array type)."""


class UnsupportedError(MXCoreError, ValueError):
    """A valid request that the chosen backend or architecture cannot run."""


class BackendUnavailableError(MXCoreError, RuntimeError):
    """A known backend that cannot be used here (no driver, no library, no device)."""


class LayoutError(MXCoreError, ValueError):
    """A fragment-layout table that is not a bijection onto its tile, or a bad layout query."""


class KernelCompileError(MXCoreError, RuntimeError):
    """A device compiler failed; carries the log, source name, options and arch."""

    def __init__(self, message: str, *, log: str = "", source: str = "", options=(), arch: str = ""):
        super().__init__(message)
        self.log = log
        self.source = source
        self.options = tuple(options)
        self.arch = arch

    def __str__(self) -> str:
        head = self.args[0] if self.args else "kernel compile failed"
        parts = [head]
        if self.source or self.arch:
            parts.append(f"(source {self.source or '?'}, arch {self.arch or '?'}, options {list(self.options)})")
        if self.log:
            parts.append("compiler log:\n" + self.log.strip())
        return "\n".join(parts)


class DeviceError(MXCoreError, RuntimeError):
    """A driver/runtime call on the device failed."""
