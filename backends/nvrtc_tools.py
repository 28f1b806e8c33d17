"""Offline CUDA compile tools: NVRTC (pip wheels) to cubin, SASS disassembly, resource usage.  No GPU needed.

Used by CI (tests/test_cuda_compile.py), by the CUDA backend's ``emit_kernels`` and by the probes.

* ``have_nvrtc()`` / ``have_cuobjdump()``: ``None`` when the tool is usable, else the reason.
* ``compile_cuda(source, name=, arch=, options=, name_expressions=) -> CudaBinary``: compiles for a *real*
  architecture (``sm_80``, ``sm_89``, ``sm_90``, ``sm_90a``, ``sm_120`` ...), so ptxas runs and PTX errors show
  up here rather than on a user's GPU.  A failure raises :class:`KernelCompileError` carrying the log.  Results
  are kept in the disk cache (:class:`mxcore.kernels.DiskCache`, kind ``nvrtc``) under a hash of the source text,
  arch, options, name expressions and the NVRTC identity (the program name too when debug or line information is
  asked for: only then does it reach the output).  NVRTC releases the GIL, so a thread pool compiles in parallel;
  threads asking for the same inputs at once share one compile.
* ``CudaBinary``: ``cubin``, ``ptx``, ``log``, ``lowered_names``, ``resources`` (per kernel: registers,
  shared_bytes (static), local_bytes (stack frame), spill_stores, spill_loads, barriers) and ``sass``.
* ``disassemble_many(cubins) -> [sass text]``: SASS of many cubins with one ``nvdisasm`` run per architecture
  (nvdisasm's start-up costs more than disassembling a large kernel): the code sections of all cubins go through
  ``nvdisasm --binary SMxx`` as one raw instruction stream and the listing is cut back at the section bounds.
  Per cubin the text has one ``Function : name`` header per kernel and ``/*offset*/ INSTR ;`` lines (offsets
  from the kernel's start, branch labels numbered per cubin); it is cached on disk (kind ``sass``).
  ``disassemble(cubin)`` is the one-cubin case.  Both need nvdisasm (the ``nvidia-cuda-nvdisasm`` wheel).
* ``sass_counts(sass) -> Counter`` of opcode mnemonics (first dotted part: ``HMMA``, ``LDSM``, ``LDGSTS`` ...);
  ``sass_lines(sass, opcode)`` the instruction texts of one opcode.

Every import of ``cuda.bindings`` happens inside a function: importing this module imports no CUDA library.
"""

from __future__ import annotations

import base64
import collections
import functools
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from mxcore.errors import KernelCompileError
from mxcore.kernels import DiskCache, cache_key

__all__ = [
    "CudaBinary",
    "compile_cuda",
    "cuobjdump_path",
    "disassemble",
    "disassemble_many",
    "have_cuobjdump",
    "have_nvrtc",
    "nvrtc_identity",
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
def nvrtc_identity() -> str:
    """NVRTC's version plus the versions of the wheels that carry it (part of every compile cache key)."""
    from importlib import metadata

    wheels = []
    for dist in ("nvidia-cuda-nvrtc", "cuda-bindings"):
        try:
            wheels.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    return " ".join([f"nvrtc {nvrtc_version()}", *wheels])


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
        """SASS of the cubin (:func:`disassemble`; computed once)."""
        if self._sass is None:
            self._sass = disassemble(self.cubin)
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


_COMPILED = DiskCache("nvrtc", ".json.z")

#: NVRTC options every mxcore CUDA kernel is compiled with, offline (here) and at run time (``cuda/compile.py``,
#: the device codecs' module in ``codec_runtime.py``):
#: everything in a kernel source is device code, and NVRTC 13.0 (the version torch's CUDA 13 wheels pin) takes a
#: generic lambda inside a kernel for a host function without ``-default-device`` (later versions do not)
DEVICE_FLAGS = ("-default-device",)
_CACHE_FORMAT = 1  # bump when what a cache entry holds changes


def compile_cuda(source: str, *, name: str, arch: str, options=(), name_expressions=(),
                 cache: bool = True) -> CudaBinary:
    """Compile CUDA C++ ``source`` with NVRTC to a cubin for ``arch`` (ptxas runs: PTX errors are caught here).

    ``options`` are extra NVRTC options (``-DNAME=VALUE``, ``-std=c++17`` ...).  ``name_expressions`` are C++
    names (template instantiations) whose mangled names come back in ``lowered_names``.  With ``cache`` the
    result comes from / goes to the disk cache, keyed on the inputs that decide NVRTC's output plus
    :func:`nvrtc_identity` (the cache holds NVRTC's own outputs; ``resources`` are parsed from the cached log
    each time).  Failures are never cached.
    """
    _check_arch(arch)
    reason = have_nvrtc()
    if reason is not None:
        raise KernelCompileError(f"cannot compile {name}: {reason}", source=name, options=options, arch=arch)
    opts = [f"--gpu-architecture={arch}", "-Xptxas=-v", *DEVICE_FLAGS, *options]
    # The program name reaches NVRTC's output only through debug and line information.
    named = name if any(o.split("=")[0] in _DEBUG_OPTIONS for o in opts) else None
    key = cache_key("nvrtc", _CACHE_FORMAT, source, named, opts, list(name_expressions), nvrtc_identity())
    if cache:
        entry = _once(key, lambda: _load_entry(key) or _store_entry(key, _nvrtc_compile(
            source, name, arch, opts, tuple(name_expressions))))
    else:
        entry = _nvrtc_compile(source, name, arch, opts, tuple(name_expressions))
    return CudaBinary(name=name, arch=arch, cubin=entry["cubin"], ptx=entry["ptx"], log=entry["log"],
                      options=tuple(opts), lowered_names=dict(entry["lowered"]), resources=parse_ptxas_log(entry["log"]))


_DEBUG_OPTIONS = frozenset({"-G", "--device-debug", "-lineinfo", "--generate-line-info", "-dopt", "--dopt"})
_INFLIGHT: dict = {}
_INFLIGHT_LOCK = threading.Lock()


def _once(key: str, make):
    """``make()`` for ``key``, run by one thread at a time per key: threads asking for a key that another thread
    is compiling wait for that result instead of compiling it again."""
    with _INFLIGHT_LOCK:
        lock = _INFLIGHT.setdefault(key, threading.Lock())
    with lock:
        return make()


def _store_entry(key: str, entry: dict) -> dict:
    _COMPILED.put(key, zlib.compress(json.dumps({**entry, "cubin": base64.b64encode(entry["cubin"]).decode()})
                                     .encode(), 1))
    return entry


def _load_entry(key: str) -> dict | None:
    blob = _COMPILED.get(key)
    if blob is None:
        return None
    try:
        entry = json.loads(zlib.decompress(blob))
        entry["cubin"] = base64.b64decode(entry["cubin"])
        if entry["cubin"][:4] == b"\x7fELF" and {"ptx", "log", "lowered"} <= set(entry):
            return entry
    except (ValueError, KeyError, TypeError, zlib.error):
        pass
    return None


def _nvrtc_compile(source: str, name: str, arch: str, opts: list, name_expressions: tuple) -> dict:
    """One NVRTC compile: {"cubin", "ptx", "log", "lowered"}; raises KernelCompileError with the log."""
    from cuda.bindings import nvrtc

    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
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
    return {"cubin": bytes(cubin), "ptx": ptx, "log": log, "lowered": lowered}


_RE_ENTRY = re.compile(r"Compiling entry function '([^']+)' for")
_RE_PROPS = re.compile(r"Function properties for (\S+)")
_RE_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
# (ptxas puts ", N bytes cumulative stack size" between the barriers and the smem of a function with a stack frame)
_RE_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, \d+ bytes cumulative stack size)?"
                      r"(?:, (\d+) bytes smem)?")


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


_SASS = DiskCache("sass", ".txt.z")
_SASS_FORMAT = 1  # bump when the text disassemble_many makes changes


@functools.lru_cache(maxsize=1)
def _nvdisasm() -> tuple[str, str, frozenset]:
    """(path, version line, the --binary architecture names it accepts)."""
    reason = have_cuobjdump()
    if reason is not None:
        raise KernelCompileError(f"cannot disassemble: {reason}")
    exe = _find_exe("nvdisasm")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    helptext = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60).stdout
    archs = frozenset(re.findall(r"'(SM\d+[a-z]?)'", helptext))
    return exe, version.splitlines()[-1] if version else "", archs


def _elf_sections(blob: bytes) -> list[tuple[str, int, int, int, int]]:
    """(name, type, flags, offset, size) of every section of an ELF64 little-endian image."""
    if blob[:4] != b"\x7fELF" or blob[4] != 2 or blob[5] != 1:
        raise KernelCompileError("not an ELF64 little-endian cubin")
    (shoff,) = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    names_at = heads[shstrndx][4]
    out = []
    for name, typ, flags, _addr, off, size in heads:
        start = names_at + name
        out.append((blob[start:blob.index(b"\0", start)].decode(), typ, flags, off, size))
    return out


def _code_sections(cubin: bytes) -> tuple[int, list[tuple[str, bytes]]]:
    """(SM number, [(kernel or function name, machine code)]) of a cubin, code sections in file order."""
    flags, abi = struct.unpack_from("<I", cubin, 0x30)[0], cubin[8]
    sm = (flags >> 8) & 0xFF if abi >= 8 else flags & 0xFF  # e_flags layout changed with ELF ABI version 8
    code = [(name[len(".text."):], cubin[off:off + size]) for name, typ, fl, off, size in _elf_sections(cubin)
            if typ == 1 and fl & 0x4 and name.startswith(".text.") and size]  # PROGBITS, SHF_EXECINSTR
    return sm, code


_RE_INSTR = re.compile(r"^(\s*/\*)([0-9a-f]{4,})(\*/\s+)(.*)$")
_RE_OPCODE = re.compile(r"^(?:@!?U?P[0-9T]+\s+)?([A-Z][A-Z0-9_]*)")
_BRANCHES = frozenset({"BRA", "BRX", "BSSY", "CALL", "JMP", "JMX", "RET", "SSY", "PBK", "PCNT"})  # code-address operands
_RE_HEX = re.compile(r"\b0x([0-9a-f]+)\b")


def disassemble_many(cubins) -> list[str]:
    """The SASS of each cubin (see the module docstring), with one nvdisasm run per architecture among the
    cubins not yet in the disk cache."""
    cubins = [bytes(c) for c in cubins]
    exe, version, archs = _nvdisasm()
    keys = [cache_key("sass", _SASS_FORMAT, c, version) for c in cubins]
    out: list = [None] * len(cubins)
    groups: dict = {}
    for i, (cubin, key) in enumerate(zip(cubins, keys)):
        blob = _SASS.get(key)
        if blob is not None:
            out[i] = zlib.decompress(blob).decode()
            continue
        sm, code = _code_sections(cubin)
        name = next((a for a in (f"SM{sm}a", f"SM{sm}") if a in archs), None)  # "a": the arch-specific superset
        if name is None:
            raise KernelCompileError(f"nvdisasm ({version}) cannot decode sm_{sm}; it knows {', '.join(sorted(archs))}")
        if any(len(c) % 16 for _, c in code):
            raise KernelCompileError(f"a code section of this sm_{sm} cubin is not a whole number of 16-byte "
                                     "instructions; disassemble it with cuobjdump -sass")
        groups.setdefault(name, []).append((i, code))
    for name, members in groups.items():
        for i, text in _disassemble_raw(exe, name, members):
            out[i] = text
            _SASS.put(keys[i], zlib.compress(text.encode(), 1))
    return out


def _disassemble_raw(exe: str, arch_name: str, members: list) -> list[tuple[int, str]]:
    """One ``nvdisasm --binary`` run over the concatenated code of ``members`` ([(index, [(fn, code)])]); the
    listing cut back per function, offsets and branch targets made function-relative."""
    import bisect

    raw = bytearray()
    spans = []  # (start, end, member position, function name)
    for pos, (_, code) in enumerate(members):
        for fn, blob in code:
            spans.append((len(raw), len(raw) + len(blob), pos, fn))
            raw += blob
    starts = [sp[0] for sp in spans]
    with tempfile.TemporaryDirectory(prefix="mxcore_sass_") as tmp:
        path = Path(tmp) / "code.bin"
        path.write_bytes(bytes(raw))
        proc = subprocess.run([exe, "--binary", arch_name, str(path)], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise KernelCompileError(f"nvdisasm --binary {arch_name} failed (exit {proc.returncode})",
                                 log=proc.stderr[-4000:])
    lines: list = [[] for _ in spans]
    for line in proc.stdout.splitlines():
        m = _RE_INSTR.match(line)
        if not m:
            continue
        off = int(m.group(2), 16)
        k = bisect.bisect_right(starts, off) - 1
        start, end = spans[k][0], spans[k][1]
        body = m.group(4)
        op = _RE_OPCODE.match(body)
        if op and op.group(1) in _BRANCHES:
            body = _RE_HEX.sub(lambda h: f"0x{int(h.group(1), 16) - start:x}"
                               if start <= int(h.group(1), 16) < end else h.group(0), body)
        lines[k].append(f"{m.group(1)}{off - start:04x}{m.group(3)}{body}")
    texts: dict = {}
    for k, (_, _, pos, fn) in enumerate(spans):
        texts.setdefault(pos, []).append(f"\t\tFunction : {fn}\n" + "\n".join(lines[k]) + "\n")
    return [(members[pos][0], "".join(texts.get(pos, []))) for pos in range(len(members))]


def disassemble(cubin: bytes) -> str:
    """SASS of one cubin given as bytes (e.g. read back from an emitted kernel folder): :func:`disassemble_many`."""
    return disassemble_many([cubin])[0]


_RE_SASS = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]+\s+)?([A-Z][A-Z0-9_]*)(?:\.[A-Z0-9_.]+)?")


def sass_counts(sass: str) -> collections.Counter:
    """Counter of SASS opcode mnemonics (without modifiers), e.g. ``{"HMMA": 64, "LDSM": 24, ...}``."""
    counts: collections.Counter = collections.Counter()
    for line in sass.splitlines():
        m = _RE_SASS.search(line)
        if m:
            counts[m.group(1)] += 1
    return counts


#: CuPy compiles every kernel with -ftz=true: fp32 arithmetic written in plain C then flushes subnormal inputs and
#: results to zero (FFMA.FTZ ...); kernels that must keep them use explicit PTX (mx_common.cuh: f32_fma ...)
FTZ_FLAG = "-ftz=true"
_RE_FTZ = re.compile(r"\bF(?:FMA|ADD|MUL)\.FTZ\b")


def ftz_ops(sass: str) -> list[str]:
    """The fp32 FMA / add / multiply instructions of ``sass`` that flush subnormals (``.FTZ``)."""
    return _RE_FTZ.findall(sass)


def sass_function(sass: str, name: str) -> str:
    """The SASS text of kernel ``name`` alone (from its ``Function : name`` header to the next one)."""
    return sass.split(f"Function : {name}\n", 1)[1].split("Function : ", 1)[0]


def sass_lines(sass: str, opcode: str) -> list[str]:
    """The SASS instruction texts whose mnemonic is ``opcode`` (e.g. all ``HMMA.16816.F32.BF16`` lines)."""
    out = []
    for line in sass.splitlines():
        m = _RE_SASS.search(line)
        if m and m.group(1) == opcode:
            out.append(line.split(";")[0].split("*/", 1)[1].strip())
    return out
