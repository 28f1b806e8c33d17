"""pytest plugin: run mxcore's ``amd_gpu`` tests against the stand-in HIP runtime (``-p standin_hip.plugin``).

With MXSTANDIN_LIB_DIR naming the stand-in's lib folder (and LD_LIBRARY_PATH / ROCM_PATH / PYTHONPATH set as
:func:`standin.run_scenario` sets them), this installs the launch hook of :mod:`scenario` before any test runs,
so GEMM launches made through hip-python execute on the CPU mirror and the tests see real results.  A hook
error fails the session (the launch itself already failed with hipErrorLaunchFailure).
"""

from __future__ import annotations

import os

_DEVICE = None


def pytest_configure(config):
    global _DEVICE
    from standin_hip import scenario

    lib = os.environ.get("MXSTANDIN_LIB_DIR")
    if not lib:
        raise RuntimeError("standin_hip.plugin needs MXSTANDIN_LIB_DIR (the stand-in runtime's lib folder)")
    _DEVICE = scenario.attach(lib)


def pytest_sessionfinish(session, exitstatus):
    from standin_hip import scenario

    if scenario.ERRORS:
        print("\nstand-in launch hook errors:\n" + "\n".join(scenario.ERRORS))
        session.exitstatus = 1
