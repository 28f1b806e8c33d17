"""``python -m mxcore COMMAND``: info, demo, formats, layout, kernels, bench.

Every command reports a failure the same way: one line on stderr (``mxcore CMD: error: ...``, spelled with the
command line's options, e.g. ``--backend auto``) and exit status 2; no traceback for a mistake in the request.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

# subcommands implemented by their owning modules as _cli(argv) -> int
_DELEGATED = {
    "formats": ("mxcore.formats", "print format properties and code tables: formats [NAME] [--table]"),
    "layout": ("mxcore.layouts", "show an instruction's fragment layout: layout NAME --operand A [--out f.svg]"),
    "bench": ("mxcore.bench", "benchmark against the vendor library: bench [--backend cuda] [--dtype ...]"),
    "selftest": ("mxcore.selftest", "check this GPU: layout probes, GEMM matrix, compiler output: selftest [--out F]"),
}

DEMO_DTYPES = ["fp32", "tf32", "fp16", "bf16", "fp8", "e5m2", "e4m3fnuz", "e5m2fnuz",
               "mxfp8", "mxfp8_e5m2", "mxfp6", "mxfp6_e3m2", "mxfp4", ("mxfp8", "mxfp4")]


def _cmd_info(argv) -> int:
    argparse.ArgumentParser(prog="mxcore info", description="backends, devices, archs and versions").parse_args(argv)
    import mxcore

    print(mxcore.info())
    return 0


def _cmd_demo(argv) -> int:
    p = argparse.ArgumentParser(prog="mxcore demo", description="matmul for every dtype the backend supports")
    p.add_argument("--backend", default="auto")
    p.add_argument("--size", type=int, default=512, help="M = N = K (default 512)")
    args = p.parse_args(argv)
    if args.size < 1:
        p.error(f"--size must be a positive integer, got {args.size}")
    from . import dtypes, matmul
    from .backends import select
    from .errors import MXCoreError

    be = select(args.backend)
    arch = be.target().arch
    n = args.size
    rng = np.random.default_rng(0)  # the same inputs on every run, so runs and machines compare
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    print(f"mxcore demo: backend {be.name} ({', '.join(be.devices())}), {n}x{n}x{n}, standard-normal inputs")
    print(f"{'dtype':>18s}  {'rel. error vs float64':>22s}  {'time (ms)':>10s}   (time: one whole call, numpy in and out)")
    for dt in DEMO_DTYPES:
        label = dt if isinstance(dt, str) else ",".join(dt)
        try:
            mdt = dtypes.resolve(dt, arch)
        except MXCoreError:
            continue
        if be.supports(mdt) is not None:
            print(f"{label:>18s}  {'not supported: ' + be.supports(mdt)}")
            continue
        try:
            matmul(a, b, dt, backend=be.name)  # compile and warm up on the same shape
            t0 = time.perf_counter()
            c = np.asarray(matmul(a, b, dt, backend=be.name))
            ms = (time.perf_counter() - t0) * 1e3  # the whole call: quantize, copy in, GEMM, copy out
        except MXCoreError as exc:
            print(f"{label:>18s}  failed: {exc}")
            return 1
        err = np.linalg.norm(c.astype(np.float64) - exact) / np.linalg.norm(exact)
        print(f"{label:>18s}  {err:22.3e}  {ms:10.2f}")
    return 0


def _cmd_kernels(argv) -> int:
    p = argparse.ArgumentParser(prog="mxcore kernels",
                                description="compile every kernel variant for an arch (no GPU needed) and write a manifest")
    p.add_argument("--vendor", required=True, choices=["nvidia", "amd"])
    p.add_argument("--arch", required=True, help="sm_80, sm_89, sm_90 (nvidia) or gfx942, gfx950 (amd)")
    p.add_argument("--emit", required=True, metavar="DIR", help="folder for binaries and manifest.json")
    args = p.parse_args(argv)
    from .backends import KernelRecord, get
    from .dtypes import check_arch

    arch = check_arch(args.arch, args.vendor)
    backend = get("cuda" if args.vendor == "nvidia" else "hip")
    if not backend.supported_dtypes(arch):
        from .support import TARGETS

        have = ", ".join(a for _, name, a in TARGETS if name == backend.name)
        raise CLIError(f"the {backend.name} backend has no kernels for {arch}; the support matrix lists {have}")
    out = Path(args.emit)
    if out.exists() and not out.is_dir():
        raise CLIError(f"--emit {args.emit}: exists and is not a folder; name a new or existing folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CLIError(f"--emit {args.emit}: cannot create the folder ({exc.strerror})") from None
    rows = [r.as_dict() if isinstance(r, KernelRecord) else dict(r) for r in backend.emit_kernels(arch, out)]
    (out / "manifest.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    keys = [k for k in ("kernel", "dtype", "tile", "registers", "vgpr", "agpr", "shared_bytes", "lds_bytes") if
            any(k in r for r in rows)]
    print("  ".join(f"{k:>12s}" for k in keys))
    for r in rows:
        print("  ".join(f"{str(r.get(k, '')):>12s}" for k in keys))
    print(f"{len(rows)} variants for {args.vendor} {args.arch} written to {out} (manifest.json)")
    return 0


_LOCAL = {
    "info": (_cmd_info, "backends, devices, archs and versions"),
    "demo": (_cmd_demo, "run matmul for every supported dtype on 512x512x512 and print error and time"),
    "kernels": (_cmd_kernels, "compile every kernel variant offline: kernels --vendor V --arch A --emit DIR"),
}


class CLIError(Exception):
    """A command-line request that cannot be carried out (printed as one line, exit status 2)."""


# Python keyword spellings in library messages -> the command line's options
_OPTIONS = ("backend", "dtype", "out_dtype", "arch")


def command_line_spelling(message: str) -> str:
    """``pass backend='auto'`` -> ``pass --backend auto``: library messages as a command-line user types them."""
    pattern = r"\b(" + "|".join(_OPTIONS) + r")=(?:'([^']*)'|\"([^\"]*)\")"
    return re.sub(pattern, lambda m: f"--{m.group(1).replace('_', '-')} {m.group(2) or m.group(3) or ''}".rstrip(),
                  message)


def _compile_line(exc) -> str:
    """One line for a failed compile: the message and the log's first error line (not the whole log)."""
    head = exc.args[0] if exc.args else "kernel compile failed"
    errors = [ln.strip() for ln in (exc.log or "").splitlines() if "error" in ln.lower()]
    where = f" for {exc.arch}" if exc.arch else ""
    return f"{head}{where}" + (f": {errors[0]}" if errors else "")


def _usage() -> str:
    lines = ["usage: python -m mxcore COMMAND [options]", "", "commands:"]
    for name, (_, text) in {**_LOCAL, **_DELEGATED}.items():
        lines.append(f"  {name:8s} {text}")
    lines.append("\n'python -m mxcore COMMAND --help' for a command's options")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    cmd, rest = argv[0], argv[1:]
    from .errors import KernelCompileError, MXCoreError

    try:
        if cmd in _LOCAL:
            return int(_LOCAL[cmd][0](rest) or 0)
        if cmd in _DELEGATED:
            module = importlib.import_module(_DELEGATED[cmd][0])
            return int(module._cli(rest) or 0)
    except KernelCompileError as exc:
        print(f"mxcore {cmd}: error: {_compile_line(exc)}", file=sys.stderr)
        return 2
    except MXCoreError as exc:
        print(f"mxcore {cmd}: error: {command_line_spelling(str(exc))}", file=sys.stderr)
        return 2
    except CLIError as exc:
        print(f"mxcore {cmd}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `python -m mxcore formats --table | head`
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    print(f"unknown command {cmd!r}\n\n{_usage()}", file=sys.stderr)
    return 2
