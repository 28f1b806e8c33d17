"""Offline CUDA compile tools: NVRTC (pip wheels) to cubin, cuobjdump SASS, resource usage.  No GPU needed.

Used by CI (tests/test_cuda_compile.py), by ``CudaBackend.emit_kernels`` and by the probes helper.

* ``have_nvrtc()`` / ``have_cuobjdump()``: ``None`` when the tool is usable, else the reason.
* ``compile_cuda(source, name=, arch=, options=, name_expressions=) -> CudaBinary``: compiles for a *real*
  architecture (``sm_80``, ``sm_89``, ``sm_90``, ``sm_90a``, ``sm_120`` ...), so ptxas runs and PTX errors show
  up here rather than on a user's GPU.  A failure raises :class:`KernelCompileError` carrying the log.
* ``CudaBinary``: ``cubin``, ``ptx``, ``log``, ``lowered_names``, ``resources`` (per kernel: registers,
  shared_bytes (static), local_bytes (stack frame), spill_stores, spill_loads, barriers) and ``sass``
  (``cuobjdump -sass`` text; needs cuobjdump and nvdisasm, e.g. from the ``nvidia-cuda-cuobjdump`` and
  ``nvidia-cuda-nvdisasm`` wheels).
* ``sass_counts(sass) -> Counter`` of opcode mnemonics (first dotted part: ``HMMA``, ``LDSM``, ``LDGSTS`` ...).

Every import of ``cuda.bindings`` happens inside a function: importing this module imports no CUDA library.
"""

from __future__ import annotations

import collections
import functools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mxcore.errors import KernelCompileError

__all__ = [
    "CudaBinary",
    "compile_cuda",
    "cuobjdump_path",
    "disassemble",
    "have_cuobjdump",
    "have_nvrtc",
    "nvrtc_version",
    "sass_counts",
    "sass_lines",
]

_ARCH_RE = re.compile(r"^sm_(\d+)([af]?)$")


# ----------------------------------------------------------------------------------------------------------------
# tool discovery
# ----------------------------------------------------------------------------------------------------------------
def _nvidia_bin_dirs() -> list[Path]:
    """bin/ folders of the NVIDIA pip wheels (nvidia/cu13/bin, nvidia/cuda_*/bin), if installed."""
    out: list[Path] = []
    try:
        import importlib.util

        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return out
    for loc in spec.submodule_search_locations:
        root = Path(loc)
        out.extend(sorted(p for p in root.glob("*/bin") if p.is_dir()))
    return out


def _find_exe(name: str) -> str | None:
    for d in _nvidia_bin_dirs():
        cand = d / name
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    found = shutil.which(name)
    if found:
        return found
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    cand = Path(cuda_home) / "bin" / name
    return str(cand) if cand.is_file() else None


def cuobjdump_path() -> str | None:
    return _find_exe("cuobjdump")


@functools.lru_cache(maxsize=1)
def have_nvrtc() -> str | None:
    """None when NVRTC (cuda.bindings.nvrtc over the nvidia-cuda-nvrtc wheel) works, else why not."""
    try:
        from cuda.bindings import nvrtc
    except Exception as exc:  # ImportError, or a loader error inside the bindings
        return f"cuda.bindings.nvrtc cannot be imported ({exc}); pip install cuda-bindings nvidia-cuda-nvrtc"
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # the shared library is missing
        return f"libnvrtc cannot be loaded ({exc}); pip install nvidia-cuda-nvrtc"
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return f"nvrtcVersion failed: {err}"
    return None


def nvrtc_version() -> tuple[int, int] | None:
    if have_nvrtc() is not None:
        return None
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    return (major, minor)


@functools.lru_cache(maxsize=1)
def have_cuobjdump() -> str | None:
    """None when ``cuobjdump -sass`` works (it needs nvdisasm beside it or on PATH), else why not."""
    exe = cuobjdump_path()
    if exe is None:
        return "cuobjdump not found (pip install nvidia-cuda-cuobjdump, or put CUDA's bin/ on PATH)"
    if _find_exe("nvdisasm") is None:
        return "nvdisasm not found; cuobjdump -sass needs it (pip install nvidia-cuda-nvdisasm)"
    return None


def _tool_env() -> dict:
    env = dict(os.environ)
    nvd = _find_exe("nvdisasm")
    if nvd:
        env["PATH"] = str(Path(nvd).parent) + os.pathsep + env.get("PATH", "")
    return env


# ----------------------------------------------------------------------------------------------------------------
# compile
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class CudaBinary:
    """What one NVRTC compile produced."""

    name: str
    arch: str
    cubin: bytes
    ptx: str
    log: str
    options: tuple = ()
    lowered_names: dict = field(default_factory=dict)
    resources: dict = field(default_factory=dict)
    _sass: str | None = field(default=None, repr=False)

    @property
    def sass(self) -> str:
        """``cuobjdump -sass`` of the cubin (computed once)."""
        if self._sass is None:
            self._sass = _cuobjdump(self.cubin, "-sass")
        return self._sass

    def resource_usage(self) -> str:
        """``cuobjdump -res-usage`` text (registers, stack, static shared memory per function)."""
        return _cuobjdump(self.cubin, "-res-usage")

    def write(self, directory, stem: str | None = None) -> tuple[Path, Path]:
        """Write ``<stem>.cubin`` and ``<stem>.ptx`` into ``directory``; return both paths."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        stem = stem or self.name
        cubin_path, ptx_path = d / f"{stem}.cubin", d / f"{stem}.ptx"
        cubin_path.write_bytes(self.cubin)
        ptx_path.write_text(self.ptx)
        return cubin_path, ptx_path


def _check_arch(arch: str) -> None:
    if not _ARCH_RE.match(arch):
        raise KernelCompileError(
            f"compile_cuda needs a real architecture like 'sm_80', 'sm_89', 'sm_90' or 'sm_90a', got {arch!r}",
            arch=arch,
        )


def compile_cuda(source: str, *, name: str, arch: str, options=(), name_expressions=()) -> CudaBinary:
    """Compile CUDA C++ ``source`` with NVRTC to a cubin for ``arch`` (ptxas runs: PTX errors are caught here).

    ``options`` are extra NVRTC options (``-DNAME=VALUE``, ``-std=c++17`` ...).  ``name_expressions`` are C++
    names (template instantiations) whose mangled names come back in ``lowered_names``.
    """
    _check_arch(arch)
    reason = have_nvrtc()
    if reason is not None:
        raise KernelCompileError(f"cannot compile {name}: {reason}", source=name, options=options, arch=arch)
    from cuda.bindings import nvrtc

    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    opts = [f"--gpu-architecture={arch}", "-Xptxas=-v", *options]
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    if err != ok:
        raise KernelCompileError(f"nvrtcCreateProgram failed: {err}", source=name, options=opts, arch=arch)
    try:
        for expr in name_expressions:
            (err,) = nvrtc.nvrtcAddNameExpression(prog, expr.encode())
            if err != ok:
                raise KernelCompileError(f"nvrtcAddNameExpression({expr!r}) failed: {err}", source=name, arch=arch)
        (cerr,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.rstrip(b"\x00 ").decode(errors="replace")
        if cerr != ok:
            raise KernelCompileError(f"NVRTC failed to compile {name} for {arch}: {cerr}", log=log, source=name,
                                     options=opts, arch=arch)
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        if err != ok or size == 0:
            raise KernelCompileError(f"NVRTC made no cubin for {name} ({err})", log=log, source=name, options=opts,
                                     arch=arch)
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        ptx = ""
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        if err == ok and size:
            pbuf = b" " * size
            nvrtc.nvrtcGetPTX(prog, pbuf)
            ptx = pbuf.rstrip(b"\x00").decode(errors="replace")
        lowered = {}
        for expr in name_expressions:
            err, low = nvrtc.nvrtcGetLoweredName(prog, expr.encode())
            if err == ok:
                lowered[expr] = low.decode() if isinstance(low, bytes) else str(low)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return CudaBinary(name=name, arch=arch, cubin=bytes(cubin), ptx=ptx, log=log, options=tuple(opts),
                      lowered_names=lowered, resources=parse_ptxas_log(log))


_RE_ENTRY = re.compile(r"Compiling entry function '([^']+)' for")
_RE_PROPS = re.compile(r"Function properties for (\S+)")
_RE_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_RE_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


def parse_ptxas_log(log: str) -> dict:
    """ptxas ``-v`` output -> {kernel: {registers, shared_bytes, local_bytes, spill_stores, spill_loads, barriers}}."""
    out: dict = {}
    current = None
    for line in log.splitlines():
        m = _RE_ENTRY.search(line) or _RE_PROPS.search(line)  # a function's first line names it
        if m:
            current = m.group(1)
            out.setdefault(current, {"registers": 0, "shared_bytes": 0, "local_bytes": 0, "spill_stores": 0,
                                     "spill_loads": 0, "barriers": 0})
            continue
        if current is None:
            continue
        m = _RE_STACK.search(line)
        if m:
            out[current].update(local_bytes=int(m.group(1)), spill_stores=int(m.group(2)),
                                spill_loads=int(m.group(3)))
            continue
        m = _RE_USED.search(line)
        if m:
            out[current]["registers"] = int(m.group(1))
            if m.group(2):
                out[current]["barriers"] = int(m.group(2))
            if m.group(3):
                out[current]["shared_bytes"] = int(m.group(3))
    return out


# ----------------------------------------------------------------------------------------------------------------
# disassembly
# ----------------------------------------------------------------------------------------------------------------
def _cuobjdump(cubin: bytes, flag: str) -> str:
    reason = have_cuobjdump()
    if reason is not None:
        raise KernelCompileError(f"cannot run cuobjdump {flag}: {reason}")
    with tempfile.TemporaryDirectory(prefix="mxcore_sass_") as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        proc = subprocess.run([cuobjdump_path(), flag, str(path)], capture_output=True, text=True, env=_tool_env(),
                              timeout=300)
    if proc.returncode != 0:
        raise KernelCompileError(f"cuobjdump {flag} failed (exit {proc.returncode})", log=proc.stderr + proc.stdout)
    return proc.stdout


def disassemble(cubin: bytes) -> str:
    """``cuobjdump -sass`` of a cubin given as bytes (e.g. one read back from an emitted kernel folder)."""
    return _cuobjdump(cubin, "-sass")


_RE_SASS = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]+\s+)?([A-Z][A-Z0-9_]*)(?:\.[A-Z0-9_.]+)?")


def sass_counts(sass: str) -> collections.Counter:
    """Counter of SASS opcode mnemonics (without modifiers), e.g. ``{"HMMA": 64, "LDSM": 24, ...}``."""
    counts: collections.Counter = collections.Counter()
    for line in sass.splitlines():
        m = _RE_SASS.search(line)
        if m:
            counts[m.group(1)] += 1
    return counts


def sass_lines(sass: str, opcode: str) -> list[str]:
    """The SASS instruction texts whose mnemonic is ``opcode`` (e.g. all ``HMMA.16816.F32.BF16`` lines)."""
    out = []
    for line in sass.splitlines():
        m = _RE_SASS.search(line)
        if m and m.group(1) == opcode:
            out.append(line.split(";")[0].split("*/", 1)[1].strip())
    return out
