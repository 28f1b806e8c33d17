"""The subprocess half of the stand-in-runtime tests: mxcore's AMD backend through a REAL hip-python wheel.

Run as ``python scenario.py <name>`` by :func:`standin.run_scenario` with PYTHONPATH holding one hip-python
release (and tests/), and LD_LIBRARY_PATH / ROCM_PATH naming the stand-in runtime built from
``standin_hip.c``.  Prints one line ``STANDIN_RESULT <json>`` for the test to assert on.

Launches are executed here: :func:`attach` installs a hook in the stand-in library (the same instance that
hip-python dlopens), which for every ``mx_gemm_*`` launch

* reads the argument bytes hip-python packed at the offsets and sizes of the code object's kernel-argument
  metadata (``NT_AMDGPU_METADATA``, decoded by ``hip_tools``), typed by the entry point's parameter list in
  the kernel source -- so a wrong order, size or alignment of any argument is a failed launch or wrong D;
* checks that the -D options hiprtc compiled the module with are the variant's ``KernelSpec.defines()``;
* runs the kernel with the CPU mirror (tests/_hip_mirror.py) (its -D constants, per-lane fragments and
  the layout records), one grid-Y piece and batch at a time, and writes D into the stand-in's device memory.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
import traceback

import numpy as np

HOOK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint),
                        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t)
C_SCALARS = {"int": "<i4", "unsigned": "<u4", "unsigned int": "<u4", "long long": "<i8", "float": "<f4"}
LAUNCHES: list = []
ERRORS: list = []


def entry_parameters(source: str) -> list[tuple[str, str]]:
    """(name, C type) of each parameter of the ``MX_ENTRY`` kernel in ``source``; pointers are 'pointer'."""
    m = re.search(r"void\s+MX_ENTRY\s*\((.*?)\)\s*\{", source, re.S)
    if m is None:
        raise AssertionError("no `void MX_ENTRY(...)` entry point in the GEMM source")
    out = []
    for param in m.group(1).split(","):
        decl = " ".join(param.split())
        name = re.search(r"(\w+)$", decl).group(1)
        ctype = "pointer" if "*" in decl else decl[: -len(name)].replace("const", "").strip()
        out.append((name, ctype))
    return out


class StandIn:
    """The stand-in library as the hook sees it: device-memory views by address."""

    def __init__(self, lib_dir: str):
        self.lib = ctypes.CDLL(os.path.join(lib_dir, "libamdhip64.so"))
        self.lib.standin_extent.restype = ctypes.c_size_t
        self.lib.standin_extent.argtypes = [ctypes.c_void_p]

    def view(self, addr: int) -> np.ndarray:
        """Writable bytes from ``addr`` to the end of its allocation (asserts it is device memory)."""
        n = int(self.lib.standin_extent(ctypes.c_void_p(addr)))
        if n == 0:
            raise AssertionError(f"kernel argument {addr:#x} is not stand-in device memory")
        return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(addr))


def _compile_options(entry: str) -> list[str]:
    """The options of the last hiprtc compile of ``entry``, from the stand-in's log."""
    found = None
    with open(os.environ["MXSTANDIN_LOG"]) as f:
        for line in f:
            words = line.split()
            if words and words[0] == "hiprtc" and f"-DMX_ENTRY={entry}" in words:
                found = words[2:]
    if found is None:
        raise AssertionError(f"{entry} was launched but never compiled through hiprtc")
    return found


def _gemm(dev: StandIn, name: str, grid, block, raw: bytes, code: bytes) -> dict:
    from mxcore.backends import hip, hip_tools
    from mxcore.kernels import kernel_source
    from _hip_mirror import consts, mirror_gemm

    kernels = hip_tools.code_object_metadata(code)["amdhsa.kernels"]
    (meta,) = [k for k in kernels if k[".name"] == name]
    explicit = [a for a in meta[".args"] if not a[".value_kind"].startswith("hidden_")]
    params = entry_parameters(kernel_source("amd", hip.SOURCE_FILE))
    assert len(params) == len(explicit), f"{name}: source declares {len(params)} parameters, metadata {len(explicit)}"
    end = max(a[".offset"] + a[".size"] for a in explicit)
    assert len(raw) == end, f"{name}: hip-python packed {len(raw)} argument bytes; the kernel's arguments end at {end}"
    args, layout = {}, []
    for (pname, ctype), arg in zip(params, explicit):
        off, size = arg[".offset"], arg[".size"]
        pointer = ctype == "pointer"
        assert pointer == (arg[".value_kind"] == "global_buffer"), f"{name}.{pname}: {ctype} vs {arg}"
        fmt = "<u8" if pointer else C_SCALARS[ctype]
        assert np.dtype(fmt).itemsize == size, f"{name}.{pname}: {ctype} is not {size} bytes"
        value = np.frombuffer(raw, fmt, 1, off)[0]
        args[pname] = int(value) if value.dtype.kind in "iu" else float(value)
        layout.append((pname, off, size))

    arch = os.environ.get("MXSTANDIN_ARCH", "gfx950").split(":")[0]
    (spec,) = [s for s in hip.kernel_specs(arch) if s.entry == name]
    assert _compile_options(name)[-len(spec.defines()):] == list(spec.defines()), f"{name}: hiprtc -D options"
    c = consts(spec)
    eb, bm = c["MX_EB"], c["MX_WAVES_M"] * c["MX_TM"] * c["MX_IM"]
    kb = -(-args["k"] // 32)
    for z in range(grid[2]):
        batch = args["batch0"] + z
        r0 = args["m_tile0"] * bm  # this piece's first row
        m = min(args["m"] - r0, grid[1] * bm)
        assert m > 0, f"{name}: piece m_tile0={args['m_tile0']} starts beyond M={args['m']}"
        a = dev.view(args["a"] + (batch * args["sab"] + r0 * args["sam"]) * eb)
        b = dev.view(args["b"] + batch * args["sbb"] * eb)
        sa = dev.view(args["sa"] + batch * args["ssa"] + r0 * kb)[: m * kb] if args["sa"] else None
        sb = dev.view(args["sb"] + batch * args["ssb"])[: kb * args["n"]] if args["sb"] else None
        piece = hip.Launch((grid[0], grid[1], 1), tuple(block), args["sam"], args["sak"], args["sbk"], args["sbn"],
                           args["ldd"], m, args["n"], args["k"], args["a_vec_ok"], args["b_vec_ok"], args["out_scale"])
        out = mirror_gemm(c, piece, a, b, sa, sb, spec.layout())
        d_addr = args["d"] + (batch * args["sdb"] + r0 * args["ldd"]) * 4
        d = dev.view(d_addr)[: m * args["ldd"] * 4].view(np.float32).reshape(m, args["ldd"])
        written = ~np.isnan(out)
        d[:, : args["n"]][written] = out[written]
    return {"name": name, "grid": list(grid), "block": list(block), "args": args, "layout": layout,
            "packed_bytes": len(raw)}


def attach(lib_dir: str, other=None) -> StandIn:
    """Install the launch hook (kept alive on the returned object): GEMM launches run through the CPU mirror;
    any other kernel is logged, or handed to ``other(dev, name, raw)`` when given (e.g. the selftest's probes)."""
    dev = StandIn(lib_dir)

    def hook(name, grid, block, args, size, code, code_size):
        try:
            name = name.decode()
            g, b = [grid[i] for i in range(3)], [block[i] for i in range(3)]
            raw = ctypes.string_at(args, size) if size else b""
            if name.startswith("mx_gemm_"):
                LAUNCHES.append(_gemm(dev, name, g, b, raw, ctypes.string_at(code, code_size)))
            elif other is not None:
                other(dev, name, raw)
            else:
                LAUNCHES.append({"name": name, "grid": g, "block": b, "packed_bytes": size})
            return 0
        except Exception:  # noqa: BLE001  (reported to the test; the launch fails with hipErrorLaunchFailure)
            ERRORS.append(traceback.format_exc())
            return 1

    dev.hook = HOOK(hook)
    dev.lib.standin_set_launch_hook(dev.hook)
    return dev


# ----------------------------------------------------------------------------- scenarios
def _exact(rng, shape_a, shape_b):
    """Inputs exactly representable in fp16 with exact fp32 sums (small multiples of 1/2)."""
    from _hip_mirror import HALVES

    return rng.choice(HALVES, shape_a).astype(np.float32), rng.choice(HALVES, shape_b).astype(np.float32)


def _backend_facts(be) -> dict:
    from mxcore.backends._contract import is_failure

    reason = be.is_available()
    facts = {"reason": reason, "failure": is_failure(reason)}
    if reason is None:
        rt = be.runtime()
        facts.update(devices=be.devices(), props_returned=rt.convention.props_returned, arch=be.target().arch)
    return facts


def scenario_main(out: dict) -> None:
    """Device description, fp16 matmul (both majors), events, a hiprtc compile error."""
    import mxcore
    from mxcore.backends import get
    from mxcore.errors import KernelCompileError
    from mxcore.reference import reference_matmul

    be = get("hip")
    out.update(_backend_facts(be))
    arch = out["arch"]
    rng = np.random.default_rng(1234)
    a, b = _exact(rng, (37, 70), (70, 45))
    want = reference_matmul(a, b, "fp16", arch=arch)
    out["matmul"] = mxcore.matmul(a, b, "fp16", backend="hip").tolist()
    out["matmul_colmajor"] = mxcore.matmul(np.asfortranarray(a), np.asfortranarray(b), "fp16", backend="hip").tolist()
    out["want"] = want.tolist()
    out["a_shape"], out["b_shape"] = a.shape, b.shape
    # MX block scales (two scale pointers, a mixed pair): gfx950's f8f6f4 kernel
    from mxcore.mx import quantize_mx

    xa, xb = _exact(rng, (40, 96), (96, 24))
    xa *= np.exp2(np.repeat(rng.integers(-3, 4, (40, 3)), 32, axis=1))  # a different scale per 32-K block
    qa, qb = quantize_mx(xa, "mxfp4", axis=1), quantize_mx(xb, "mxfp6_e3m2", axis=0)
    out["mx"] = mxcore.matmul(qa, qb, ("mxfp4", "mxfp6_e3m2"), backend="hip").tolist()
    out["mx_want"] = reference_matmul(qa, qb, ("mxfp4", "mxfp6_e3m2")).tolist()
    out["elapsed"] = be.timer()(lambda: None)
    out["runtime_errors"] = _runtime_errors(be.runtime(), arch)
    try:
        be.runtime().function("this is not C++ __global__", "mx_broken", ())
        out["compile_error"] = None
    except KernelCompileError as exc:
        out["compile_error"] = {"message": str(exc), "log": getattr(exc, "log", "") or ""}


def _runtime_errors(rt, arch: str) -> dict:
    """hip error codes through hip-python's enums into DeviceError: a code object for another gfx target, a
    kernel name the module lacks, an unknown pointer, a block of 2048 threads."""
    from mxcore import dtypes as _dt
    from mxcore.backends.hip import compile_inputs, select_spec
    from mxcore.errors import DeviceError

    other = "gfx942" if arch == "gfx950" else "gfx950"
    spec = select_spec(arch, _dt.resolve("fp16", arch), 64, 64)
    source, options = compile_inputs(spec)
    foreign = select_spec(other, _dt.resolve("fp16", other), 64, 64)
    foreign_source, foreign_options = compile_inputs(foreign)
    blob = rt.code_object(foreign_source, foreign.entry, other, foreign_options)
    attempts = {
        "wrong_arch": lambda: rt.check(rt.hip.hipModuleLoadData(blob), "hipModuleLoadData"),
        "missing_kernel": lambda: rt.function(source, "mx_not_a_kernel", options),
        "bad_free": lambda: rt.free(0x1234),
        "block_too_big": lambda: rt.launch(rt.function(source, spec.entry, options), (1, 1, 1), (2048, 1, 1), ()),
    }
    found = {}
    for label, attempt in attempts.items():
        try:
            attempt()
            found[label] = None
        except DeviceError as exc:
            found[label] = str(exc)
    return found


def scenario_split(out: dict) -> None:
    """A grid taller than the device's grid-Y limit (MXSTANDIN_GRID_Y) and a batch in grid Z."""
    import mxcore
    from mxcore.backends import get
    from mxcore.reference import reference_matmul

    be = get("hip")
    out.update(_backend_facts(be))
    arch = out["arch"]
    rng = np.random.default_rng(99)
    a, b = _exact(rng, (300, 64), (64, 40))
    out["matmul"] = mxcore.matmul(a, b, "fp16", backend="hip").tolist()
    out["want"] = reference_matmul(a, b, "fp16", arch=arch).tolist()
    ab, bb = _exact(rng, (2, 20, 33), (2, 33, 24))
    out["batched"] = mxcore.matmul(ab, bb, "fp16", backend="hip").tolist()
    out["batched_want"] = [reference_matmul(ab[i], bb[i], "fp16", arch=arch).tolist() for i in range(2)]
    fa, fb = _exact(rng, (24, 64), (64, 16))
    fa *= 1024.0  # beyond e4m3fnuz's 240: a per-tensor scale, applied by the kernel's out_scale argument
    out["fp8"] = mxcore.matmul(fa, fb, "fp8", backend="hip").tolist()
    out["fp8_want"] = reference_matmul(fa, fb, "fp8", arch=arch).tolist()


def scenario_absent_or_failed(out: dict) -> None:
    """Availability under MXSTANDIN_FAIL / device count / arch settings changed between fresh backends."""
    from mxcore.backends.hip import HipBackend
    from mxcore.tools import info

    os.environ["MXSTANDIN_FAIL"] = "hipGetDevicePropertiesR0600"
    out["info"] = str(info())  # what `python -m mxcore info` prints
    cases = {}
    for label, env in (("props_fail", {"MXSTANDIN_FAIL": "hipGetDevicePropertiesR0600"}),
                       ("get_device_fail", {"MXSTANDIN_FAIL": "hipGetDevice"}),
                       ("no_device", {"MXSTANDIN_FAIL": "", "MXSTANDIN_DEVICE_COUNT": "0"}),
                       ("other_arch", {"MXSTANDIN_DEVICE_COUNT": "1", "MXSTANDIN_ARCH": "gfx90a:sramecc+:xnack-"})):
        os.environ.update(env)
        cases[label] = _backend_facts(HipBackend())
    out["cases"] = cases


def scenario_no_runtime(out: dict) -> None:
    """The wheel imports but no libamdhip64.so can be opened."""
    from mxcore.backends.hip import HipBackend

    out.update(_backend_facts(HipBackend()))


SCENARIOS = {"main": scenario_main, "split": scenario_split, "absent_or_failed": scenario_absent_or_failed,
             "no_runtime": scenario_no_runtime}


def main(name: str) -> int:
    import hip  # the wheel under test, from PYTHONPATH

    out = {"hip_python": os.path.dirname(hip.__file__)}
    dev = attach(os.environ["MXSTANDIN_LIB_DIR"]) if os.environ.get("MXSTANDIN_LIB_DIR") else None
    try:
        SCENARIOS[name](out)
    except Exception:  # noqa: BLE001  (reported with the hook's errors)
        out["exception"] = traceback.format_exc()
    out["launches"], out["hook_errors"] = LAUNCHES, ERRORS
    del dev  # the hook lives as long as this
    print("STANDIN_RESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
