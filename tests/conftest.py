"""Shared test helpers: toolchain requirements that fail in CI, GPU fixtures, fixed per-test random seeds."""

from __future__ import annotations

import os
import secrets
import zlib

import numpy as np
import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def require_tool(name: str, ok, why: str = "") -> None:
    """Skip (locally) or fail (CI=true) when a compile toolchain is missing.

    ``ok``: True/None means present; False or a reason string means missing.
    """
    if ok is True or ok is None:
        return
    reason = ok if isinstance(ok, str) else why
    message = f"{name} is not available: {reason or 'not found'}"
    if IN_CI:
        pytest.fail(f"{message} -- CI must have every compile toolchain (.ci/run installs them)", pytrace=False)
    pytest.skip(message)


def pytest_report_header(config):
    """The versions a run used (CI resolves the newest that pyproject allows)."""
    import ml_dtypes

    parts = [f"numpy {np.__version__}", f"ml_dtypes {ml_dtypes.__version__}"]
    try:
        import torch

        parts.append(f"torch {torch.__version__}")
    except ImportError:
        parts.append("torch absent")
    return "mxcore deps: " + ", ".join(parts)


@pytest.fixture
def rng(request):
    """A generator with a fixed seed per test (crc32 of the test's id: every run draws the same inputs); set
    MXCORE_TEST_SEED to an integer for other inputs, or to "random" for a fresh seed.  Printed on failure."""
    env = os.environ.get("MXCORE_TEST_SEED", "")
    seed = (secrets.randbits(32) if env == "random" else int(env) if env
            else zlib.crc32(request.node.nodeid.encode()))
    request.node.user_properties.append(("seed", seed))
    print(f"random seed {seed} (rerun with MXCORE_TEST_SEED={seed})")
    return np.random.default_rng(seed)


def _cupy_reason():
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no NVIDIA GPU"
        return None
    except Exception as exc:  # ImportError, CUDARuntimeError...
        return f"CuPy/NVIDIA GPU not usable: {exc}"


def _hip_reason():
    try:
        from mxcore.backends import get

        return get("hip").is_available()
    except Exception as exc:  # the backend itself is broken: a failure, not an absence
        return f"FAILURE: hip backend failed to load: {type(exc).__name__}: {exc}"


def _is_failure(reason) -> bool:
    """A GPU library and device are present but initialisation failed: the GPU tests FAIL, never skip."""
    from mxcore.backends._contract import is_failure

    return is_failure(reason)


@pytest.fixture(scope="session")
def cupy_device():
    reason = _cupy_reason()
    if reason:
        pytest.skip(reason)
    import cupy

    return cupy.cuda.Device()


#: the CUDA GEMM tests' dtype and operand-majorness matrices (both kernel families run the same cases)
FLOAT_DTYPES = ["fp16", "bf16", "tf32", "fp32"]
FP8_DTYPES = ["e4m3fn", "e5m2", ("e4m3fn", "e5m2"), ("e5m2", "e4m3fn")]
MAJORS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]


def poisoned_output(cp, m: int, n: int, out_dtype: str):
    """An (m, n) CuPy output in the storage of ``out_dtype`` (bfloat16 as uint16 bits) filled with NaN, so that
    an element the kernel does not write fails the comparison."""
    store = {"float32": cp.float32, "float16": cp.float16, "bfloat16": cp.uint16}[out_dtype]
    out = cp.empty((m, n), dtype=store)
    out.fill(0x7FC0 if out_dtype == "bfloat16" else np.nan)  # 0x7FC0: bfloat16 NaN bits
    return out


def output_values(cp, out, out_dtype: str) -> np.ndarray:
    """A CuPy output (bfloat16 stored as uint16 bits) as float64 host values."""
    host = cp.asnumpy(out)
    if out_dtype == "bfloat16":
        import ml_dtypes

        host = host.view(ml_dtypes.bfloat16)
    return host.astype(np.float64)


def mx_special_rows(spec, rng, k: int) -> np.ndarray:
    """Rows of length ``k`` that the MX quantizer tests (host build and GPU) run through every kernel: zeros and
    -0, blocks holding NaN / +-inf, magnitudes from 2^-150 to 2^127 (blocks straddling 2^-127, float32 and float16
    subnormals, huge blocks), the amax edges of both scale rules (max_normal * 2^e exactly and one float32 ulp
    above), half-subnormal patterns, and fresh random magnitudes per element."""
    rows = [np.zeros(k), -np.zeros(k)]
    for r in (rng.standard_normal(k), np.ones(k)):
        r[min(40, k - 1)] = np.nan
        rows.append(r)
    r = rng.standard_normal(k)
    r[0], r[-1] = np.inf, -np.inf
    rows += [r, np.where(np.arange(k) == 3, -np.inf, 2.0)]
    for e in (-150, -140, -135, -133, -130, -128, -127, -126, -120, -20, -5, 0, 7, 100, 120, 126, 127):
        rows.append(rng.standard_normal(k) * 2.0 ** e)
    for e in (-127, 0, 60):  # amax exactly max_normal * 2^e, and one float32 ulp above (rceil's edge)
        r = rng.uniform(-1, 1, k) * spec.max_normal * 2.0 ** e
        r[::7] = spec.max_normal * 2.0 ** e
        rows.append(r)
        rows.append(np.where(np.arange(k) % 7 == 0, np.nextafter(np.float32(spec.max_normal * 2.0 ** e),
                                                                  np.float32(np.inf)).astype(np.float64), r))
    rows += [rng.standard_normal(k) * 2.0 ** rng.integers(-30, 30, k),
             rng.standard_normal(k) * 2.0 ** rng.integers(-40, 40, k)]
    rows.append(rng.standard_normal(k) * 2.0 ** -20)  # float16 subnormals
    rows.append(np.where(np.arange(k) % 3 == 0, 2.0 ** -24, 3 * 2.0 ** -24))
    rows.append(np.where(rng.random(k) < 0.5, 2.0 ** -127 * rng.standard_normal(k), rng.standard_normal(k)))
    return np.stack(rows)


def dtype_id(d):
    """A test id for a dtype name or an (A, B) pair of names."""
    return d if isinstance(d, str) else "+".join(d)


@pytest.fixture(scope="module")
def cuda_backend(cupy_device):
    """The cuda backend (skips with its reason when it cannot run here)."""
    from mxcore.backends import get

    be = get("cuda")
    if be.is_available():
        pytest.skip(be.is_available())
    return be


@pytest.fixture(scope="module")
def sm90_backend(cuda_backend):
    """The cuda backend on an sm_90 GPU (the wgmma family's tests)."""
    import cupy as cp

    if int(cp.cuda.Device().compute_capability) != 90:
        pytest.skip("the wgmma family needs an sm_90 GPU (H100/H200/GH200)")
    return cuda_backend


@pytest.fixture(scope="session")
def hip_device():
    reason = _hip_reason()
    if reason:
        if _is_failure(reason):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    from mxcore.backends import get

    return get("hip")


def pytest_collection_modifyitems(config, items):
    """GPU-marked tests skip cleanly (with the reason) when that GPU is absent."""
    reasons = {}
    for item in items:
        for marker, probe in (("nvidia_gpu", _cupy_reason), ("amd_gpu", _hip_reason)):
            if marker in item.keywords:
                if marker not in reasons:
                    reasons[marker] = probe()
                if reasons[marker] and not _is_failure(reasons[marker]):
                    item.add_marker(pytest.mark.skip(reason=reasons[marker]))


def pytest_runtest_setup(item):
    """amd_gpu tests fail (not skip) when the AMD runtime failed to initialise on a machine that has a GPU."""
    if "amd_gpu" in item.keywords:
        reason = _hip_reason()
        if _is_failure(reason):
            pytest.fail(reason, pytrace=False)
