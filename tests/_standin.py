"""Run ``python -m mxcore selftest`` on the stand-in HIP runtime (tests/standin_hip): the real hip-python wheels,
clang-22 as "hiprtc", and launches executed on the CPU.

``python tests/_standin.py [selftest options]`` runs in a subprocess whose environment is
:func:`standin_hip.standin.environment`; it installs a launch hook that executes

* ``mx_gemm_*`` launches with the kernels' CPU mirror (``standin_hip.scenario._gemm``: argument bytes read at
  the code object's kernel-argument offsets);
* ``mx_probe_*`` launches (``kernels_hip/probe_mfma.hip``: lane-major words a, b, c -> d, scale words) with the
  emulator on the layout record captured HERE, before the selftest runs: the "hardware" is independent of what
  the selftest process later believes about layouts.  The scale byte is taken from the op_sel the probe was
  compiled with (its -D options), not from the table.

``MXSELFTEST_PLANT=layout`` plants a wrong layout in the selftest's view: the host side scatters operand A of
the first probed instruction with lanes 0 and 5 swapped (as a wrong table would), so the probe must fail.

Exit status: the selftest's, or 3 when the hook itself failed (its tracebacks are printed).
"""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def _probe_records(arch: str) -> dict:
    """{probe entry point: layout record} for every instruction the HIP kernels use on ``arch``."""
    from mxcore.backends import probes
    from mxcore.backends.hip import kernel_specs

    return {probes.probe_kernel(s.layout()).entry: s.layout() for s in kernel_specs(arch)}


def _run_probe(dev, rec, raw: bytes) -> None:
    from mxcore import emulate
    from mxcore.backends import probes

    probe = probes.probe_kernel(rec)
    a, b, c, d, sa, sb = np.frombuffer(raw, "<u8", 6)
    lanes = rec.lanes

    def words(addr, regs):
        return dev.view(int(addr))[: lanes * regs * 4].view(np.uint32).reshape(lanes, regs)

    regs = [emulate.unpack(rec, role, words(addr, getattr(rec, role).registers))
            for role, addr in (("a", a), ("b", b), ("c", c))]
    kw = {}
    if probe.scaled:
        defs = dict(probe.defines)
        kw = {name: ((words(addr, 1)[:, 0] >> np.uint32(8 * defs[sel])) & 0xFF).astype(np.uint8).reshape(lanes, 1)
              for name, addr, sel in (("scale_a", sa, "MX_OPSEL_A"), ("scale_b", sb, "MX_OPSEL_B"))}
    out = emulate.pack(rec, "c", emulate.execute(rec, *regs, **kw))
    words(d, rec.c.registers)[:] = np.asarray(out, np.uint32).reshape(lanes, rec.c.registers)


def attach(lib_dir: str, arch: str):
    """Install the stand-in's launch hook with the probe kernels run through the emulator; returns the object
    that keeps it alive."""
    from standin_hip import scenario

    records = _probe_records(arch)

    def probe(dev, name, raw):
        if name not in records:
            raise AssertionError(f"the stand-in cannot execute kernel {name}")
        _run_probe(dev, records[name], raw)

    return scenario.attach(lib_dir, other=probe)


def _plant_wrong_layout() -> None:
    """The selftest's host side scatters A of the first probed record with lanes 0 and 5 swapped."""
    from mxcore.backends.probes import experiments, registers

    real, first = registers.slots, []

    def slots(layout, role, matrix):
        out = real(layout, role, matrix)
        if not first:
            first.append(layout.name)
        if role == "a" and layout.name == first[0]:
            out = out.copy()
            out[[0, 5]] = out[[5, 0]]
        return out

    experiments.slots = slots


def main(argv) -> int:
    from standin_hip import scenario

    import mxcore.tools.cli

    arch = os.environ.get("MXSTANDIN_ARCH", "gfx950").split(":")[0]
    dev = attach(os.environ["MXSTANDIN_LIB_DIR"], arch)
    if os.environ.get("MXSELFTEST_PLANT") == "layout":
        _plant_wrong_layout()
    rc = mxcore.tools.cli.main(["selftest", *argv])
    del dev
    if scenario.ERRORS:
        print("stand-in launch hook errors:\n" + "\n".join(scenario.ERRORS), file=sys.stderr)
        return 3
    return rc


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    sys.exit(main(sys.argv[1:]))
