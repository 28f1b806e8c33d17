"""Offline compile of every HIP variant (``python -m mxcore kernels --vendor amd``): code objects, disassembly
and one :class:`~backends._contract.KernelRecord` per variant.

hiprtc compiles when a ROCm runtime is present (the code object the device would load), else clang-22
(the same source string and -D options; no GPU needed).  Vendor figures go to ``extra``: the instruction,
AGPRs, SGPRs, the compiler identity and, with the LLVM tools present, the MFMAs of the disassembly.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

from .._contract import KernelRecord
from .cache import offline_compile
from .variants import compile_inputs, kernel_specs, tile_name

__all__ = ["emit_kernels"]


def _record(spec, binary, compiler: str, out_dir: str, disasm: bool) -> KernelRecord:
    from .. import hip_tools

    path = os.path.join(out_dir, f"{spec.entry}.co")
    with open(path, "wb") as f:
        f.write(binary.code_object)
    res = binary.resources.get(spec.entry, {})
    extra = {"instruction": spec.instruction, "agpr": res.get("agpr", 0), "sgpr": res.get("sgpr", 0),
             "sgpr_spill": res.get("sgpr_spill", 0), "compiler": compiler}
    if disasm:
        text = binary.disasm
        with open(os.path.join(out_dir, f"{spec.entry}.s"), "w") as f:
            f.write(text)
        extra["mfma"] = sorted(set(hip_tools.mfma_instructions(text)))
        extra["disasm"] = f"{spec.entry}.s"
    return KernelRecord(
        kernel=spec.entry, variant=spec.entry, dtype=" ".join(spec.dtypes), arch=spec.arch,
        file=os.path.basename(path), tile=tile_name(spec), registers=res.get("vgpr", 0),
        shared_bytes=res.get("lds_bytes", 0), local_bytes=res.get("scratch_bytes", 0),
        spill_stores=res.get("vgpr_spill", 0), spill_loads=0, threads=spec.threads,
        options=tuple(compile_inputs(spec)[1]), extra=extra)


def emit_kernels(arch: str, out_dir, *, runtime=None, workers: int | None = None) -> list[KernelRecord]:
    """Write every variant's code object for ``arch`` (through ``runtime``'s hiprtc when given, else clang-22)
    and, with the LLVM tools present, its disassembly; return the records (also written to manifest.json)."""
    from .. import hip_tools

    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    disasm = hip_tools.have_clang() is None

    def one(spec):
        if runtime is not None:
            source, options = compile_inputs(spec)
            blob = runtime.code_object(source, spec.entry, arch, options)
            binary = hip_tools.HipBinary(blob, name=spec.entry, arch=arch, options=options)
            compiler = runtime.compiler_id()
        else:
            binary = offline_compile(spec)
            compiler = "clang:" + hip_tools.clang_version()
        return _record(spec, binary, compiler, out_dir, disasm)

    workers = workers or min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        records = list(pool.map(one, kernel_specs(arch)))
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump([r.as_dict() for r in records], f, indent=1)
    return records
