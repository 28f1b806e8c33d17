"""``python -m mxcore COMMAND``: info, demo, formats, layout, kernels, bench, selftest; ``--version``.

Every command reports a failure the same way: one line on stderr (``mxcore CMD: error: ...``, spelled with the
command line's options, e.g. ``--backend auto``) and exit status 2 for a mistake in the request (a malformed
option, a missing optional dependency, an unwritable path); an unexpected failure is one line too, with exit
status 1 (``MXCORE_DEBUG=1`` shows its traceback).  Never a traceback by default.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

# subcommands implemented by their owning modules as _cli(argv) -> int
_DELEGATED = {
    "formats": ("mxcore.formats", "print format properties and code tables: formats [NAME] [--table]"),
    "layout": ("mxcore.layouts", "show an instruction's fragment layout: layout NAME --operand A [--out f.svg]"),
    "bench": ("mxcore.tools.bench", "benchmark against the vendor library: bench [--backend cuda] [--dtype ...]; "
                                    "bench --first-call: import + first matmul, empty caches"),
    "selftest": ("mxcore.tools.selftest",
                 "check this GPU: layout probes, GEMM matrix, compiler output: selftest [--out F]"),
}

DEMO_DTYPES = ["fp32", "tf32", "fp16", "bf16", "fp8", "e5m2", "e4m3fnuz", "e5m2fnuz",
               "mxfp8", "mxfp8_e5m2", "mxfp6", "mxfp6_e3m2", "mxfp4", ("mxfp8", "mxfp4")]


def _cmd_info(argv) -> int:
    argparse.ArgumentParser(prog="mxcore info", description="backends, devices, archs and versions").parse_args(argv)
    from ._info import info

    print(info())
    return 0


# The largest demo size: the reference backend computes in numpy (about a minute at 1024 for every dtype); a GPU
# holds the inputs and their float64 product (3 x 2 GiB at 16384).
DEMO_MAX_SIZE = {"cpu": 1024, "gpu": 16384}


def _cmd_demo(argv) -> int:
    p = argparse.ArgumentParser(prog="mxcore demo", description="matmul for every dtype the backend supports")
    p.add_argument("--backend", default="auto")
    p.add_argument("--size", type=positive_int, default=512, help="M = N = K (default 512)")
    args = p.parse_args(argv)
    from .. import dtypes, matmul
    from ..backends import select
    from ..errors import MXCoreError

    be = select(args.backend)
    arch = be.target().arch
    n = args.size
    limit = DEMO_MAX_SIZE["cpu" if be.vendor == "cpu" else "gpu"]
    if n > limit:
        raise CLIError(f"--size {n} is more than the demo runs on the {be.name} backend; pass --size {limit} or less")
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
    if "--prebuild" in argv:  # the default kernels compiled ahead of a first call (backends/cuda/prebuilt.py)
        from mxcore.backends.cuda.prebuild import cli

        return cli(argv)
    p = argparse.ArgumentParser(prog="mxcore kernels",
                                description="compile the kernels the default choice launches on an arch (NVIDIA: one "
                                            "per build; no GPU needed) and write a manifest")
    p.add_argument("--vendor", required=True, choices=["nvidia", "amd"])
    p.add_argument("--arch", required=True, help="sm_80, sm_89, sm_90 (nvidia) or gfx942, gfx950 (amd)")
    p.add_argument("--emit", required=True, metavar="DIR", help="folder for binaries and manifest.json")
    args = p.parse_args(argv)
    from ..backends import KernelRecord, get
    from ..layouts import check_arch

    arch = check_arch(args.arch, args.vendor)
    backend = get("cuda" if args.vendor == "nvidia" else "hip")
    if not backend.supported_dtypes(arch):
        from ..support import TARGETS

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
    "kernels": (_cmd_kernels, "compile the default kernels offline: kernels --vendor V --arch A --emit DIR; "
                              "kernels --prebuild [--arch A] [--jobs N]: the default kernels into the cache"),
}


class CLIError(Exception):
    """A command-line request that cannot be carried out (printed as one line, exit status 2)."""


def positive_int(text: str) -> int:
    """argparse ``type=`` for counts and sizes: a positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; pass a positive integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive; pass a positive integer")
    return value


def parse_sizes(text: str, option: str = "--sizes") -> list[int]:
    """``"256,512"`` -> [256, 512]: a comma list of positive integers (empty items are skipped)."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if item:
            try:
                out.append(positive_int(item))
            except argparse.ArgumentTypeError as exc:
                raise CLIError(f"{option} {text!r}: {exc}, e.g. {option} 256,512") from None
    return out


def parse_shapes(text: str, option: str = "--shapes", dims=(3,), words=()) -> list:
    """``"16x32x64,8x8x8"`` -> [(16, 32, 64), (8, 8, 8)]: a comma list of shapes of ``dims`` positive integers
    joined by ``x`` (``words``: names that stand for themselves, e.g. ``llm``)."""
    want = " or ".join({3: "MxNxK", 4: "BxMxNxK"}.get(d, "x".join(["N"] * d)) for d in dims)
    out = []
    for item in (x.strip().lower() for x in text.split(",")):
        if not item:
            continue
        if item in words:
            out.append(item)
            continue
        parts = item.split("x")
        try:
            shape = tuple(positive_int(v) for v in parts)
        except argparse.ArgumentTypeError:
            shape = None
        if shape is None or len(shape) not in dims:
            extra = f" (or {', '.join(words)})" if words else ""
            raise CLIError(f"{option} {text!r}: {item!r} is not {want} of positive integers{extra}, "
                           f"e.g. {option} 16x32x64")
        out.append(shape)
    return out


def check_writable(path: str, option: str) -> None:
    """Refuse an output file that cannot be written before any work is done (not after a long run).  The file is
    opened for appending, the one test that holds for root and for odd filesystems; a file made by the test is
    removed again."""
    target = Path(path)
    if target.is_dir():
        raise CLIError(f"{option} {path}: is a folder; name a file")
    folder = target.parent
    if not folder.is_dir():
        raise CLIError(f"{option} {path}: the folder {folder} does not exist; create it or name another file")
    existed = target.exists()
    try:
        with open(target, "a"):
            pass
    except OSError as exc:
        raise CLIError(f"{option} {path}: cannot write the file ({exc.strerror}); name a file in a writable "
                       "folder") from None
    if not existed:
        target.unlink()


# options that name an output file, in every command that has them
_OUTPUT_OPTIONS = ("--out", "--json")


# shape options of delegated commands whose own parsers check less than the command needs (the number of dims)
_SHAPE_OPTIONS = {"selftest": {"--shapes": (3,)}}


def _option_values(argv, opt: str):
    for i, arg in enumerate(argv):
        if arg == opt and i + 1 < len(argv):
            yield argv[i + 1]
        elif arg.startswith(opt + "="):
            yield arg[len(opt) + 1:]


def _check_options(cmd: str, argv) -> None:
    """What can be checked before a command starts: output files are writable, shapes well formed."""
    if "-h" in argv or "--help" in argv:
        return
    for opt in _OUTPUT_OPTIONS:
        for value in _option_values(argv, opt):
            check_writable(value, opt)
    for opt, dims in _SHAPE_OPTIONS.get(cmd, {}).items():
        for value in _option_values(argv, opt):
            parse_shapes(value, opt, dims)


@contextlib.contextmanager
def _one_line_usage_errors():
    """argparse reports a bad option as a usage block and an error line; the CLI's promise is one line.  The
    subcommands build plain ``argparse`` parsers in their own modules, so the promise is kept here, for the
    duration of one command."""
    original = argparse.ArgumentParser.error

    def error(parser, message):
        raise CLIError(f"{message} ('{parser.prog} --help' lists the options)")

    argparse.ArgumentParser.error = error
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original


# optional dependencies a command may need: module -> how to install it
_INSTALL = {
    "torch": "pip install torch",
    "cupy": 'pip install "mxcore[cuda]"',
    "cupy_backends": 'pip install "mxcore[cuda]"',
    "PIL": 'pip install "mxcore[png]"',
    "hip": 'pip install "mxcore[hip]"',
}


def _missing_module_line(exc: ImportError) -> str:
    name = (exc.name or "").split(".")[0]
    how = _INSTALL.get(name)
    return f"needs {name or 'a module that is not installed'} ({exc}); " + (how or "install it") + " and retry"


def _version() -> str:
    """The installed distribution's version, else this source tree's ``mxcore.__version__``."""
    from importlib import metadata

    try:
        return metadata.version("mxcore")
    except metadata.PackageNotFoundError:
        from .. import __version__

        return __version__


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
    lines = ["usage: python -m mxcore COMMAND [options]   |   python -m mxcore --version", "", "commands:"]
    for name, (_, text) in {**_LOCAL, **_DELEGATED}.items():
        lines.append(f"  {name:8s} {text}")
    lines.append("\n'python -m mxcore COMMAND --help' for a command's options")
    return "\n".join(lines)


def _run(cmd: str, rest: list) -> int:
    _check_options(cmd, rest)
    with _one_line_usage_errors():
        if cmd in _LOCAL:
            return int(_LOCAL[cmd][0](rest) or 0)
        if cmd == "bench" and "--first-call" in rest:  # fresh processes, empty caches (backends/cuda/first_call.py)
            from mxcore.backends.cuda.first_call import cli

            return int(cli(rest) or 0)
        module = importlib.import_module(_DELEGATED[cmd][0])
        return int(module._cli(rest) or 0)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("--version", "-V"):
        print(f"mxcore {_version()}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in _LOCAL and cmd not in _DELEGATED:
        print(f"mxcore: error: unknown command {cmd!r}; commands: {', '.join({**_LOCAL, **_DELEGATED})} "
              "('python -m mxcore --help' says what each does)", file=sys.stderr)
        return 2
    from ..errors import KernelCompileError, MXCoreError

    def fail(line: str, status: int = 2) -> int:
        print(f"mxcore {cmd}: error: {' '.join(line.split())}", file=sys.stderr)
        return status

    try:
        return _run(cmd, rest)
    except KernelCompileError as exc:
        return fail(_compile_line(exc))
    except MXCoreError as exc:
        return fail(command_line_spelling(str(exc)))
    except CLIError as exc:
        return fail(str(exc))
    except ImportError as exc:  # an optional dependency (torch, CuPy, Pillow) this command needs
        return fail(_missing_module_line(exc))
    except BrokenPipeError:  # e.g. `python -m mxcore formats --table | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a file or folder the command reads or writes
        where = f"{exc.filename}: " if exc.filename else ""
        return fail(f"{where}{exc.strerror or exc}; check the path and its permissions")
    except MemoryError:
        return fail("not enough memory for this request; pass smaller sizes")
    except KeyboardInterrupt:
        print(f"mxcore {cmd}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 (a bug, not a bad request: still one line, and the way to see more)
        if os.environ.get("MXCORE_DEBUG"):
            raise
        return fail(f"internal error: {type(exc).__name__}: {exc}. Rerun with MXCORE_DEBUG=1 for the traceback "
                    "and report it", status=1)
