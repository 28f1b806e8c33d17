"""Offline HIP compile tools: clang-22 to an AMDGPU code object, llvm-objdump-22, kernel resources.

No GPU and no ROCm needed.  :func:`compile_hip` compiles the *same source string* that the runtime
hands to hiprtc, with Debian's clang-22::

    clang-22 -x hip --offload-arch=ARCH --cuda-device-only --no-gpu-bundle-output -nogpulib -nogpuinc
             -include hip_shim.h -O3 -std=c++17 [options] source.hip -o out.co

``kernels_hip/hip_shim.h`` supplies what hiprtc predefines (``__global__``, ``threadIdx``,
``__syncthreads`` ...).  Resources (VGPR/AGPR/SGPR counts, LDS and scratch bytes) are read from the
code object's ``NT_AMDGPU_METADATA`` note (MessagePack), decoded here, so they work equally for a
hiprtc-built code object.  Code objects are kept in the disk cache (:class:`mxcore.kernels.DiskCache`, kind
``clang``) under a hash of the source text, name, arch, every flag and the force-included shim's text, and
``clang-22 --version``; clang runs as a subprocess, so a thread pool compiles in parallel.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass, field

from ..errors import KernelCompileError
from ..kernels import DiskCache, cache_key

__all__ = [
    "CLANG",
    "LLD",
    "OBJDUMP",
    "HipBinary",
    "code_object_metadata",
    "compile_hip",
    "disassemble",
    "have_clang",
    "kernel_resources",
    "mfma_instructions",
]

CLANG = os.environ.get("MXCORE_CLANG", "clang-22")
LLD = os.environ.get("MXCORE_LLD", "ld.lld-22")
OBJDUMP = os.environ.get("MXCORE_OBJDUMP", "llvm-objdump-22")

# flags every offline compile gets; hiprtc gets the equivalent (backends/hip/cache.py COMMON_OPTIONS)
BASE_FLAGS = ("-x", "hip", "--cuda-device-only", "--no-gpu-bundle-output", "-nogpulib", "-nogpuinc")
DEFAULT_OPTIONS = ("-O3", "-std=c++17")
SUPPORTED_ARCHS = ("gfx942", "gfx950")


def have_clang() -> str | None:
    """None when clang-22, ld.lld-22 and llvm-objdump-22 are all on PATH; else which are missing."""
    missing = [tool for tool in (CLANG, LLD, OBJDUMP) if shutil.which(tool) is None]
    if missing:
        return f"not found on PATH: {', '.join(missing)} (Debian: apt-get install clang-22 lld-22 llvm-22)"
    return None


@functools.lru_cache(maxsize=1)
def clang_version() -> str:
    """First line of ``clang-22 --version`` (part of cache keys); '' when clang is absent."""
    if shutil.which(CLANG) is None:
        return ""
    out = subprocess.run([CLANG, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0].strip() if out.stdout else ""


@dataclass
class HipBinary:
    """A compiled code object plus what can be read from it without a GPU."""

    code_object: bytes
    name: str = ""
    arch: str = ""
    options: tuple = ()
    _disasm: str | None = field(default=None, repr=False)

    @property
    def disasm(self) -> str:
        """``llvm-objdump-22 -d`` of the code object (computed once)."""
        if self._disasm is None:
            self._disasm = disassemble(self.code_object)
        return self._disasm

    @functools.cached_property
    def metadata(self) -> dict:
        return code_object_metadata(self.code_object)

    @property
    def resources(self) -> dict:
        """kernel name -> {"vgpr", "agpr", "sgpr", "lds_bytes", "scratch_bytes", "vgpr_spill", "sgpr_spill"}."""
        return kernel_resources(self.code_object)


def _shim_text() -> str:
    from ..kernels import kernel_source

    return kernel_source("amd", "hip_shim.h")


_COMPILED = DiskCache("clang", ".co")


def compile_hip(source: str, *, name: str, arch: str, options=(), cache: bool = True) -> HipBinary:
    """Compile ``source`` for ``arch`` with clang-22; raise KernelCompileError with the log on failure.  With
    ``cache`` the code object comes from / goes to the disk cache (failures are never cached)."""
    why = have_clang()
    if why is not None:
        raise KernelCompileError(f"cannot compile {name} offline: {why}", source=name, options=options, arch=arch)
    opts = tuple(options)
    shim_text = _shim_text()
    key = cache_key("clang", CLANG, source, name, arch, BASE_FLAGS, DEFAULT_OPTIONS, opts, shim_text, clang_version())
    blob = _COMPILED.get(key) if cache else None
    if blob is None or blob[:4] != b"\x7fELF":
        blob = _clang_compile(source, name, arch, opts, shim_text)
        if cache:
            _COMPILED.put(key, blob)
    return HipBinary(blob, name=name, arch=arch, options=opts)


def _clang_compile(source: str, name: str, arch: str, opts: tuple, shim_text: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="mxcore_hip_") as tmp:
        shim = os.path.join(tmp, "hip_shim.h")
        src = os.path.join(tmp, "kernel.hip")
        out = os.path.join(tmp, "kernel.co")
        with open(shim, "w") as f:
            f.write(shim_text)
        with open(src, "w") as f:
            f.write(source)
        # -ffile-prefix-map and -cuid: the temp path must not leak into the code object (reproducible builds)
        cuid = re.sub(r"\W", "_", name) or "mxcore"
        cmd = [CLANG, *BASE_FLAGS, f"--offload-arch={arch}", f"-ffile-prefix-map={tmp}=mxcore", f"-cuid={cuid}",
               "-include", shim, *DEFAULT_OPTIONS, *opts, src, "-o", out]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
        except subprocess.TimeoutExpired as exc:
            raise KernelCompileError(f"clang-22 timed out compiling {name}", source=name, options=opts, arch=arch) from exc
        if proc.returncode != 0 or not os.path.exists(out):
            raise KernelCompileError(
                f"clang-22 failed to compile {name} for {arch} (exit {proc.returncode})",
                log=proc.stderr + proc.stdout,
                source=name,
                options=opts,
                arch=arch,
            )
        with open(out, "rb") as f:
            return f.read()


def disassemble(code_object: bytes) -> str:
    """``llvm-objdump-22 -d`` text of a code object (raises KernelCompileError when objdump fails)."""
    with tempfile.TemporaryDirectory(prefix="mxcore_hipdis_") as tmp:
        path = os.path.join(tmp, "k.co")
        with open(path, "wb") as f:
            f.write(code_object)
        proc = subprocess.run([OBJDUMP, "-d", path], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise KernelCompileError("llvm-objdump-22 failed on a code object", log=proc.stderr)
    return proc.stdout


_MFMA_LINE = re.compile(r"^\s*(v_mfma\S*)\s*(.*)$")
_MODIFIER = re.compile(r"\b(cbsz|abid|blgp|op_sel|op_sel_hi|neg_lo|neg_hi):(\[[^\]]*\]|\d+)")


def mfma_instructions(disasm: str) -> list[str]:
    """The v_mfma* instructions of a disassembly: mnemonic plus modifiers, e.g.
    ``"v_mfma_scale_f32_32x32x64_f8f6f4 cbsz:4 blgp:4"``.  Default-valued op_sel_hi:[0,0,0] is dropped."""
    found = []
    for line in disasm.splitlines():
        m = _MFMA_LINE.match(line.split("//")[0])
        if not m:
            continue
        mods = [f"{k}:{v}" for k, v in _MODIFIER.findall(m.group(2)) if not (k == "op_sel_hi" and v == "[0,0,0]")]
        found.append(" ".join([m.group(1), *mods]))
    return found


def mnemonics(disasm: str) -> list[str]:
    """Every instruction mnemonic of a disassembly, in order (for scratch / LDS / load-width checks)."""
    out = []
    for line in disasm.splitlines():
        s = line.strip()
        if not s or s.endswith(">:") or s.startswith(("Disassembly", ";")) or ":" in s.split()[0]:
            continue
        out.append(s.split()[0])
    return out


# ----------------------------------------------------------------------------- code object metadata
NT_AMDGPU_METADATA = 32


def _elf_notes(blob: bytes):
    """Yield (owner, type, desc) of every note in the ELF64 little-endian image ``blob``."""
    if blob[:4] != b"\x7fELF" or blob[4] != 2 or blob[5] != 1:
        raise KernelCompileError("not an ELF64 little-endian code object")
    (shoff,) = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", blob, 0x3A)
    for i in range(shnum):
        base = shoff + i * shentsize
        sh_type = struct.unpack_from("<I", blob, base + 4)[0]
        if sh_type != 7:  # SHT_NOTE
            continue
        off, size = struct.unpack_from("<QQ", blob, base + 0x18)
        pos, end = off, off + size
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", blob, pos)
            pos += 12
            owner = blob[pos : pos + namesz].rstrip(b"\0").decode("ascii", "replace")
            pos += (namesz + 3) & ~3
            desc = blob[pos : pos + descsz]
            pos += (descsz + 3) & ~3
            yield owner, ntype, desc


def _msgpack(buf: bytes, pos: int = 0):
    """Decode one MessagePack value at ``pos``; return (value, next_pos).  Enough for AMDGPU notes."""
    b = buf[pos]
    pos += 1
    if b <= 0x7F:
        return b, pos
    if b >= 0xE0:
        return b - 0x100, pos
    if 0x80 <= b <= 0x8F:
        return _msgpack_map(buf, pos, b & 0x0F)
    if 0x90 <= b <= 0x9F:
        return _msgpack_array(buf, pos, b & 0x0F)
    if 0xA0 <= b <= 0xBF:
        n = b & 0x1F
        return buf[pos : pos + n].decode("utf-8", "replace"), pos + n
    fixed = {0xC0: None, 0xC2: False, 0xC3: True}
    if b in fixed:
        return fixed[b], pos
    ints = {0xCC: "<B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}
    if b in ints:
        fmt = ints[b]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if b in (0xCA, 0xCB):
        fmt = ">f" if b == 0xCA else ">d"
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    strs = {0xD9: ">B", 0xDA: ">H", 0xDB: ">I", 0xC4: ">B", 0xC5: ">H", 0xC6: ">I"}
    if b in strs:
        fmt = strs[b]
        (n,) = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        raw = buf[pos : pos + n]
        return (raw if b >= 0xC4 and b <= 0xC6 else raw.decode("utf-8", "replace")), pos + n
    if b in (0xDC, 0xDD):
        fmt = ">H" if b == 0xDC else ">I"
        (n,) = struct.unpack_from(fmt, buf, pos)
        return _msgpack_array(buf, pos + struct.calcsize(fmt), n)
    if b in (0xDE, 0xDF):
        fmt = ">H" if b == 0xDE else ">I"
        (n,) = struct.unpack_from(fmt, buf, pos)
        return _msgpack_map(buf, pos + struct.calcsize(fmt), n)
    raise KernelCompileError(f"unsupported MessagePack byte 0x{b:02x} in the code object's metadata note")


def _msgpack_array(buf, pos, n):
    out = []
    for _ in range(n):
        v, pos = _msgpack(buf, pos)
        out.append(v)
    return out, pos


def _msgpack_map(buf, pos, n):
    out = {}
    for _ in range(n):
        k, pos = _msgpack(buf, pos)
        v, pos = _msgpack(buf, pos)
        out[k] = v
    return out, pos


def code_object_metadata(code_object: bytes) -> dict:
    """The decoded NT_AMDGPU_METADATA map of a code object (amdhsa.kernels, amdhsa.target, ...)."""
    for owner, ntype, desc in _elf_notes(code_object):
        if owner == "AMDGPU" and ntype == NT_AMDGPU_METADATA:
            value, _ = _msgpack(desc, 0)
            return value
    raise KernelCompileError("code object has no AMDGPU metadata note (NT_AMDGPU_METADATA)")


def kernel_resources(code_object: bytes) -> dict:
    """kernel name -> {"vgpr", "agpr", "sgpr", "lds_bytes", "scratch_bytes", "vgpr_spill", "sgpr_spill",
    "wavefront_size", "max_workgroup_size"} from the metadata note."""
    out = {}
    for k in code_object_metadata(code_object).get("amdhsa.kernels", []):
        out[k[".name"]] = {
            "vgpr": int(k.get(".vgpr_count", 0)),
            "agpr": int(k.get(".agpr_count", 0)),
            "sgpr": int(k.get(".sgpr_count", 0)),
            "lds_bytes": int(k.get(".group_segment_fixed_size", 0)),
            "scratch_bytes": int(k.get(".private_segment_fixed_size", 0)),
            "vgpr_spill": int(k.get(".vgpr_spill_count", 0)),
            "sgpr_spill": int(k.get(".sgpr_spill_count", 0)),
            "wavefront_size": int(k.get(".wavefront_size", 64)),
            "max_workgroup_size": int(k.get(".max_flat_workgroup_size", 0)),
            "dynamic_stack": bool(k.get(".uses_dynamic_stack", False)),
        }
    return out


def code_object_arch(code_object: bytes) -> str:
    """The gfx target named in the metadata (``amdgcn-amd-amdhsa--gfx950`` -> ``gfx950``)."""
    target = str(code_object_metadata(code_object).get("amdhsa.target", ""))
    return target.rsplit("-", 1)[-1].split(":")[0]
