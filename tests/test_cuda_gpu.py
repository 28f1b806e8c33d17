"""CUDA backend on a real NVIDIA GPU (marker nvidia_gpu; skipped without CuPy and a GPU).

* Exact inputs (small integers times powers of two: every product and partial sum is exact in fp32): the
  kernel must equal ``mxcore.reference.reference_matmul`` bit for bit, for every dtype, the four A/B
  majorness combinations, shapes from 1x1x1 to 127x255x4097, aligned and misaligned operands.
* Random normal inputs: within the stated bound |out - ref| <= (K + 2) * 2^-23 * (|A| @ |B|) (+ the output
  rounding), with the decoded operands from ``mxcore.operands.prepare``.
* Large shapes (4096^3, 16x8192x8192, 8192x1024x8192) for fp16/bf16 (and fp8/mxfp4/tf32 at 4096^3), exact
  inputs, compared with a float64 product computed on the GPU.
* Every launchable tile, forced split K, the native fp8 kernel (forced on sm_90), torch/numpy/float64 inputs,
  fp16/bf16 outputs, in-place fp16 operands with K tails, misaligned bases and non-unit strides.
* inf and NaN propagate as the reference (IEEE for the float dtypes) for every dtype; batched operands run as one
  launch; device float inputs never touch the host; device properties are read once, not per call; the
  operands' device ordinal is honoured; quantized operands with device codes are staged once and reused.
Every launch writes into an output buffer poisoned with NaN first.  About 2.5 minutes on an H100.
"""

from __future__ import annotations

import numpy as np
import pytest

from mxcore import dtypes as _dt
from mxcore.backends import cuda
from mxcore.operands import prepare
from mxcore.reference import reference_matmul
from conftest import FLOAT_DTYPES, FP8_DTYPES, MAJORS, dtype_id, output_values, poisoned_output

pytestmark = pytest.mark.nvidia_gpu

MX_DTYPES = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", ("mxfp8_e4m3", "mxfp4")]
ALL_DTYPES = FLOAT_DTYPES + FP8_DTYPES + MX_DTYPES
SMALL_SHAPES = [(1, 1, 1), (17, 33, 65), (127, 255, 4097), (130, 260, 520), (72, 136, 200)]


_id = dtype_id


@pytest.fixture(scope="module")
def backend(cuda_backend):
    return cuda_backend


def _exact(rng, shape):
    """Small integers times powers of two: products and sums over K <= 8192 stay exact in fp32."""
    ints = rng.integers(-4, 5, size=shape).astype(np.float64)
    return ints * np.exp2(rng.integers(-1, 2, size=shape))


def _layout(cp, x, major):
    d = cp.asarray(x)
    return cp.asfortranarray(d) if major == "col" else cp.ascontiguousarray(d)


def _run(backend, a, b, dtype, out_dtype="float32", **options):
    import cupy as cp

    mdt = _dt.resolve(dtype, "sm_90")
    out = poisoned_output(cp, a.shape[0], b.shape[1], out_dtype)
    res = backend.matmul(a, b, mdt, out_dtype=out_dtype, out=out, **options)
    assert res is out or isinstance(res, np.ndarray)
    return output_values(cp, out, out_dtype)


@pytest.mark.parametrize("shape", SMALL_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("major", MAJORS, ids=lambda m: f"{m[0]}-{m[1]}")
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_id)
def test_exact_inputs_bit_exact(backend, rng, dtype, major, shape):
    import cupy as cp

    m, n, k = shape
    a, b = _exact(rng, (m, k)), _exact(rng, (k, n))
    mdt = _dt.resolve(dtype, "sm_90")
    if mdt.kind == "float":
        storage = {"fp16": np.float16, "bf16": np.float32, "tf32": np.float32, "fp32": np.float32}[mdt.a.name]
        da, db = _layout(cp, a.astype(storage), major[0]), _layout(cp, b.astype(storage), major[1])
    else:
        da, db = _layout(cp, a.astype(np.float32), major[0]), _layout(cp, b.astype(np.float32), major[1])
    got = _run(backend, da, db, dtype)
    want = reference_matmul(a, b, dtype).astype(np.float64)
    assert not np.isnan(got).any(), "unwritten (NaN-poisoned) outputs"
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "tf32", "e4m3fn", "mxfp4"], ids=_id)
@pytest.mark.parametrize("out_dtype", ["float16", "bfloat16"])
def test_low_precision_outputs(backend, rng, dtype, out_dtype):
    import cupy as cp

    a, b = _exact(rng, (70, 96)), _exact(rng, (96, 50))
    got = _run(backend, cp.asarray(a.astype(np.float32)), cp.asarray(b.astype(np.float32)), dtype, out_dtype)
    want = reference_matmul(a, b, dtype, out_dtype=out_dtype).astype(np.float64)
    np.testing.assert_array_equal(got, want)


def test_fp16_direct_paths(backend, rng):
    """In-place fp16 operands: K tail with an aligned leading dimension (padded views), misaligned base."""
    import cupy as cp

    m, n, k = 70, 90, 65
    a, b = _exact(rng, (m, k)), _exact(rng, (k, n))
    want = reference_matmul(a, b, "fp16")
    big_a = cp.zeros((m, 72), dtype=cp.float16)
    big_a[:, :k] = cp.asarray(a.astype(np.float16))
    big_b = cp.zeros((k, 96), dtype=cp.float16)
    big_b[:, :n] = cp.asarray(b.astype(np.float16))
    np.testing.assert_array_equal(_run(backend, big_a[:, :k], big_b[:, :n], "fp16"), want)
    off_a = cp.zeros((m, k + 1), dtype=cp.float16)
    off_a[:, 1:] = cp.asarray(a.astype(np.float16))
    np.testing.assert_array_equal(_run(backend, off_a[:, 1:], big_b[:, :n], "fp16"), want)
    strided = cp.zeros((2 * m, 2 * k), dtype=cp.float16)
    strided[::2, ::2] = cp.asarray(a.astype(np.float16))
    np.testing.assert_array_equal(_run(backend, strided[::2, ::2], big_b[:, :n], "fp16"), want)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "tf32", "fp32", "e4m3fn", "e5m2", "mxfp8_e4m3", "mxfp6_e2m3",
                                   "mxfp4", ("mxfp8_e5m2", "mxfp6_e3m2")], ids=_id)
def test_random_normal_within_bound(backend, rng, dtype):
    import cupy as cp

    m, n, k = 200, 300, 1000
    a = rng.standard_normal((m, k)) * 3.0
    b = rng.standard_normal((k, n)) * 0.5
    mdt = _dt.resolve(dtype, "sm_90")
    got = _run(backend, cp.asarray(a.astype(np.float32)), cp.asarray(b.astype(np.float32)), dtype)
    opa, opb = prepare(a.astype(np.float32), b.astype(np.float32), mdt)
    a64, b64 = opa.to_float64(), opb.to_float64()
    ref = a64 @ b64
    scale = np.abs(a64) @ np.abs(b64)
    bound = (k + 2) * 2.0**-23 * scale
    if dtype == "fp32":
        # 3xTF32 drops small*small and rounds the residual: <= 2^-20 relative per product
        ref = a.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64)
        bound = bound + 2.0**-20 * scale
    err = np.abs(got - ref)
    assert not np.isnan(got).any()
    assert (err <= bound).all(), f"max err {err.max():.3g} vs bound {bound[err > bound].min():.3g}"


def test_torch_and_numpy_inputs(backend, rng):
    torch = pytest.importorskip("torch")
    import mxcore

    a, b = _exact(rng, (33, 40)), _exact(rng, (40, 21))
    want = reference_matmul(a, b, "bf16")
    ta = torch.tensor(a, dtype=torch.bfloat16, device="cuda")
    tb = torch.tensor(b, dtype=torch.bfloat16, device="cuda")
    got = mxcore.matmul(ta, tb, "bf16", backend="cuda")
    assert isinstance(got, torch.Tensor) and got.is_cuda
    np.testing.assert_array_equal(got.cpu().numpy(), want)
    got_np = mxcore.matmul(a.astype(np.float32), b.astype(np.float32), "fp16", backend="cuda")
    assert isinstance(got_np, np.ndarray)
    np.testing.assert_array_equal(got_np, reference_matmul(a, b, "fp16"))


@pytest.mark.parametrize("path", ["native", "convert", "decode"])
def test_every_fp8_path_on_any_fp8_arch(backend, rng, path):
    """All three fp8 paths agree bit for bit on exact inputs, on any sm_89+ GPU: the m16n8k32 kernel (native on
    sm_89/sm_120, compiler-emulated on sm_90), fp8 fragments converted to f16 in registers (sm_90's default),
    and whole operands decoded to f16 before the f16 kernel.  Edges and a K tail included."""
    import cupy as cp

    if int(cp.cuda.Device().compute_capability) < 89:
        pytest.skip("fp8 mma needs sm_89+")
    for (m, k, n) in ((100, 200, 70), (129, 4100, 257), (64, 192, 128)):  # the last: in-place A, fast B transpose
        a, b = _exact(rng, (m, k)), _exact(rng, (k, n))
        for dtype in ("e4m3fn", ("e5m2", "e4m3fn"), ("e4m3fn", "e5m2"), "e5m2"):
            got = _run(backend, cp.asarray(a.astype(np.float32)), cp.asarray(b.astype(np.float32)), dtype,
                       fp8_path=path)
            np.testing.assert_array_equal(got, reference_matmul(a, b, dtype))


@pytest.mark.parametrize("dtype", ["fp16", "tf32", "e4m3fn", "mxfp4"])
def test_loop_diagnostics_launch_and_leave_gemm_intact(backend, rng, dtype):
    """The benchmark's loop diagnostics (gemm_diag.cu) run on the plan's own operands; a gemm() afterwards is
    exact again (the diagnostics write no product)."""
    import cupy as cp

    a, b = _exact(rng, (256, 96)), _exact(rng, (96, 384))  # short K: one K slice (no split K) for every dtype
    p = backend.plan(cp.asarray(a.astype(np.float32)), cp.asarray(b.astype(np.float32)), _dt.resolve(dtype, "sm_90"),
                     family="mma_sync")
    assert p.diagnostics == ("smem", "mma", "feed")
    p.gemm()
    want = cp.asnumpy(p.result()).copy()
    for name in p.diagnostics:
        p.gemm_diagnostic(name)
    cp.cuda.get_current_stream().synchronize()
    p.result().fill(cp.nan)
    p.gemm()
    np.testing.assert_array_equal(cp.asnumpy(p.result()), want)
    np.testing.assert_array_equal(want, reference_matmul(a, b, dtype))


def test_transpose_bytes_kernel(backend):
    """mx_transpose_bytes (fp8 B operands to K-major) against CuPy's transpose on random bytes, and the in-place
    / transposed / fallback choice of _stage_bytes."""
    import cupy as cp

    from mxcore.backends.cuda.stage import Stager

    dev = cp.cuda.Device().id
    k = backend.kernels.prep(cp, dev, "mx_transpose_bytes")
    for rows, cols in ((64, 64), (192, 320), (4096, 128)):
        src = cp.random.randint(0, 256, (rows, cols), dtype=cp.uint8)
        out = cp.full((cols, rows), 0xAB, dtype=cp.uint8)
        k((cols // 64, rows // 64), (256,), (src, np.int32(rows), np.int32(cols), np.int64(cols), out, np.int64(rows)))
        assert bool((out == src.T).all()), (rows, cols)
    stager = Stager(cp, dev, backend.kernels, 132)
    a = cp.random.randint(0, 256, (128, 192), dtype=cp.uint8)
    buf, ld = stager._stage_bytes(a, "a", "e4m3")
    assert buf.data.ptr == a.data.ptr and ld == 192  # K-major already: used in place
    buf, ld = stager._stage_bytes(a, "b", "e4m3")  # B is K x N = 128 x 192: transposed
    assert ld == 128 and bool((buf[:, :128] == a.T).all())
    odd = cp.random.randint(0, 256, (100, 70), dtype=cp.uint8)
    buf, ld = stager._stage_bytes(odd, "b", "e4m3")  # fallback: padded copy
    assert ld % 16 == 0 and bool((buf[:, :100] == odd.T).all())


@pytest.mark.parametrize("tile", list(cuda.TILES))
def test_every_tile(backend, rng, tile):
    import cupy as cp

    a, b = _exact(rng, (304, 520)), _exact(rng, (520, 400))
    assert tile in backend.tiles("fp16")
    for major in MAJORS:
        got = _run(backend, _layout(cp, a.astype(np.float16), major[0]), _layout(cp, b.astype(np.float16), major[1]),
                   "fp16", tile=tile)
        np.testing.assert_array_equal(got, reference_matmul(a, b, "fp16"))


BIG = [((4096, 4096, 4096), "fp16"), ((4096, 4096, 4096), "bf16"), ((16, 8192, 8192), "fp16"),
       ((16, 8192, 8192), "bf16"), ((8192, 1024, 8192), "bf16"), ((8192, 1024, 8192), "fp16"),
       ((4096, 4096, 4096), "e4m3fn"), ((4096, 4096, 4096), "mxfp4"), ((4096, 4096, 4096), "tf32")]


@pytest.mark.parametrize(("shape", "dtype"), BIG, ids=[f"{'x'.join(map(str, s))}-{d}" for s, d in BIG])
def test_large_shapes_exact(backend, rng, shape, dtype):
    import cupy as cp

    m, n, k = shape
    mdt = _dt.resolve(dtype, "sm_90")
    a, b = _exact(rng, (m, k)).astype(np.float32), _exact(rng, (k, n)).astype(np.float32)
    majors = [("row", "row"), ("col", "col")] if mdt.kind == "float" else [("row", "col")]
    for ma, mb in majors:
        if mdt.a.name == "fp16":
            da, db = _layout(cp, a.astype(np.float16), ma), _layout(cp, b.astype(np.float16), mb)
        else:
            da, db = _layout(cp, a, ma), _layout(cp, b, mb)
        got = cp.asarray(_run(backend, da, db, dtype))
        opa, opb = prepare(a, b, mdt)
        want = cp.asarray(opa.to_float64()) @ cp.asarray(opb.to_float64())
        assert not bool(cp.isnan(got).any())
        assert bool((got == want.astype(cp.float32)).all()), f"{ma}/{mb}: max |diff| {float(cp.abs(got - want).max())}"


@pytest.mark.parametrize("dtype", ["fp16", "tf32", "fp32", "mxfp4", "e4m3fn"], ids=_id)
@pytest.mark.parametrize("splits", [2, 3])
def test_split_k_bit_exact(backend, rng, dtype, splits):
    """Split K (partial products in fp32 slices, summed in order) on exact inputs, incl. a K tail."""
    import cupy as cp

    for m, n, k in ((17, 33, 650), (100, 70, 4097)):
        a, b = _exact(rng, (m, k)), _exact(rng, (k, n))
        for out_dtype in ("float32", "bfloat16"):
            got = _run(backend, cp.asarray(a.astype(np.float32)), cp.asarray(b.astype(np.float32)), dtype,
                       out_dtype, split_k=splits)
            np.testing.assert_array_equal(got, reference_matmul(a, b, dtype, out_dtype=out_dtype))


@pytest.mark.parametrize("dtype", ["bf16", "tf32", "fp32"])
@pytest.mark.parametrize("family", ["mma_sync", "wgmma"])
def test_subnormal_results_exact(backend, rng, dtype, family):
    """Results that are fp32 subnormals (products of 2^-70 (2^-74 for K = 4096) and 2^-62 times small integers:
    multiples of 2^-136, sums exact in fp32) come out bit-exact: the tensor cores keep them, and the epilogue's scale and the split-K
    sum are IEEE fp32 under CuPy's -ftz=true (which would flush them); fp32 and bf16 outputs, with and without
    split K (the mma.sync family's ordered reduction, the wgmma family's in-kernel sum)."""
    import cupy as cp

    if family == "wgmma" and cp.cuda.Device().compute_capability != "90":
        pytest.skip("the wgmma family needs an sm_90 GPU")
    for m, n, k, split in ((130, 70, 520, None), (64, 48, 4096, 2)):
        a = rng.integers(-4, 5, size=(m, k)) * 2.0**(-70 if k < 1000 else -74)  # long sums: further down
        b = rng.integers(-4, 5, size=(k, n)) * 2.0**-62
        want = reference_matmul(a, b, dtype)
        assert ((want != 0) & (np.abs(want) < 2.0**-126)).sum() > m * n // 4  # mostly subnormal results
        opts = {"family": family, **({"split_k": split} if split and family == "mma_sync" else {})}
        for out_dtype in ("float32", "bfloat16"):
            got = _run(backend, cp.asarray(a.astype(np.float32)), cp.asarray(b.astype(np.float32)), dtype, out_dtype,
                       **opts)
            np.testing.assert_array_equal(got, reference_matmul(a, b, dtype, out_dtype=out_dtype))


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "tf32", "fp32"])
def test_float64_device_inputs_round_once(backend, rng, dtype):
    """CuPy float64 inputs take the exact double-precision rounding path of mx_prep_float."""
    import cupy as cp

    a = rng.standard_normal((40, 300)) * 1e3
    b = rng.standard_normal((300, 30))
    got = _run(backend, cp.asarray(a), cp.asarray(b), dtype)
    mdt = _dt.resolve(dtype, "sm_90")
    opa, opb = prepare(a, b, mdt)  # the oracle's rounding of the same float64 values
    a64, b64 = opa.to_float64(), opb.to_float64()
    if dtype == "fp32":
        bound = (300 + 2) * 2.0**-23 * (np.abs(a64) @ np.abs(b64)) + 2.0**-20 * (np.abs(a64) @ np.abs(b64))
    else:
        bound = (300 + 2) * 2.0**-23 * (np.abs(a64) @ np.abs(b64))
    assert (np.abs(got - a64 @ b64) <= bound).all()


def _specials(rng, m, k, n):
    """Random exact operands with inf, -inf and NaN in A and B and a zero column meeting an inf (inf * 0)."""
    a, b = _exact(rng, (m, k)), _exact(rng, (k, n))
    a[0, 0], a[1, 5], a[2, 3] = np.inf, -np.inf, np.nan
    b[0, 1], b[7, 2], b[9, 4] = 0.0, np.inf, -np.inf
    return a, b


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_id)
def test_inf_and_nan_propagate_like_the_reference(backend, rng, dtype):
    """inf and NaN in the inputs give what the reference gives (for fp16/bf16/tf32/fp32: IEEE x*y sums, e.g.
    [[inf, 1]] @ [[1], [1]] = inf, not the NaN of a 3xTF32 split of inf)."""
    import cupy as cp

    a, b = _specials(rng, 6, 64, 5)
    want = reference_matmul(a, b, dtype)
    for out_dtype in ("float32", "bfloat16"):
        got = _run(backend, cp.asarray(a.astype(np.float32)), cp.asarray(b.astype(np.float32)), dtype, out_dtype)
        np.testing.assert_array_equal(got, reference_matmul(a, b, dtype, out_dtype=out_dtype).astype(np.float64))
    if _dt.resolve(dtype, "sm_90").kind == "float":
        with np.errstate(invalid="ignore"):
            ieee = a @ b
        np.testing.assert_array_equal(np.isnan(want), np.isnan(ieee))
        np.testing.assert_array_equal(want[np.isinf(ieee)], ieee[np.isinf(ieee)])
    one = _run(backend, cp.asarray(np.array([[np.inf, 1.0]], np.float32)), cp.asarray(np.ones((2, 1), np.float32)),
               dtype)
    np.testing.assert_array_equal(one, reference_matmul(np.array([[np.inf, 1.0]]), np.ones((2, 1)), dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_batched_runs_as_one_launch(backend, rng, dtype):
    """mma.sync family: (B, M, K) @ (B, K, N), (B, M, K) @ (K, N) (shared weight: folded into M when A is
    contiguous, else a zero batch stride), (M, K) @ (B, K, N), transposed batches and B = 0: one GEMM launch,
    equal to the reference per batch element."""
    import cupy as cp

    storage = np.float16 if dtype == "fp16" else np.float32
    mdt = _dt.resolve(dtype, "sm_90")
    nb, m, k, n = 3, 70, 96, 50
    a3, b3, b2 = _exact(rng, (nb, m, k)), _exact(rng, (nb, k, n)), _exact(rng, (k, n))
    a_t = cp.asarray(_exact(rng, (nb, k, m)).astype(storage)).transpose(0, 2, 1)  # M-contiguous batches
    cases = [(cp.asarray(a3.astype(storage)), cp.asarray(b3.astype(storage)), None),
             (cp.asarray(a3.astype(storage)), cp.asarray(b2.astype(storage)), "folded"),
             (a_t, cp.asarray(b2.astype(storage)), None),
             (cp.asarray(a3[0].astype(storage)), cp.asarray(b3.astype(storage)), None)]
    for da, db, how in cases:
        p = backend.plan(da, db, mdt, family="mma_sync")
        if how == "folded":
            assert p.batch == nb and p.m == nb * m and p._grid[1] == 1  # one 2-D GEMM over the stacked rows
        else:
            assert p.batch == nb and p._grid[1] == nb  # the batch is the grid's y dimension: one launch
        p.gemm()
        got = cp.asnumpy(p.result())
        assert got.shape == (nb, m, n)
        ha, hb = cp.asnumpy(da).astype(np.float64), cp.asnumpy(db).astype(np.float64)
        for i in range(nb):
            want = reference_matmul(ha[i] if ha.ndim == 3 else ha, hb[i] if hb.ndim == 3 else hb, dtype)
            np.testing.assert_array_equal(got[i], want)
    for family in ("mma_sync", None):  # None: the family rule's choice for this device
        p = backend.plan(cp.zeros((0, m, k), storage), cp.zeros((0, k, n), storage), mdt, family=family)
        p.gemm()
        assert p.result().shape == (0, m, n)


def test_batched_split_k(backend, rng):
    import cupy as cp

    a3, b3 = _exact(rng, (2, 17, 650)), _exact(rng, (2, 650, 33))
    p = backend.plan(cp.asarray(a3.astype(np.float32)), cp.asarray(b3.astype(np.float32)), _dt.resolve("tf32"),
                     split_k=3)
    assert p._grid[1:] == (2, 3)
    p.gemm()
    got = cp.asnumpy(p.result())
    for i in range(2):
        np.testing.assert_array_equal(got[i], reference_matmul(a3[i], b3[i], "tf32"))


def test_device_float_inputs_never_touch_the_host(backend, rng, monkeypatch):
    """fp16/bf16/tf32/fp32 with CuPy or torch CUDA inputs: staging and result stay on the device (mxcore's host
    copies go through cupy.asnumpy, mxcore.arrays.to_numpy or torch's .cpu() / .numpy(), all made to fail here)."""
    import cupy as cp

    from mxcore import arrays

    torch = pytest.importorskip("torch")
    a, b = _exact(rng, (40, 72)), _exact(rng, (72, 24))
    dev_inputs = {"cupy": (cp.asarray(a.astype(np.float32)), cp.asarray(b.astype(np.float32))),
                  "torch": (torch.tensor(a, dtype=torch.float32, device="cuda"),
                            torch.tensor(b, dtype=torch.float32, device="cuda"))}
    expected = {d: reference_matmul(a, b, d) for d in FLOAT_DTYPES}

    def no_host(*args, **kwargs):
        raise AssertionError("device->host copy on the device path")

    results = {}
    with monkeypatch.context() as mp:
        mp.setattr(cp, "asnumpy", no_host)
        mp.setattr(arrays, "to_numpy", no_host)
        mp.setattr(torch.Tensor, "cpu", no_host)
        mp.setattr(torch.Tensor, "numpy", no_host)
        for kind, (x, y) in dev_inputs.items():
            for d in FLOAT_DTYPES:
                mdt = _dt.resolve(d, "sm_90")
                results[kind, d] = backend.matmul(x, y, mdt)
    for (kind, d), r in results.items():
        host = cp.asnumpy(r) if kind == "cupy" else r.cpu().numpy()
        np.testing.assert_array_equal(host, expected[d])


def test_no_device_property_queries_per_call(backend, rng, monkeypatch):
    """Device properties are read once per device; warm calls query none (each costs ~1 ms)."""
    import cupy as cp

    a, b = cp.asarray(_exact(rng, (64, 64)).astype(np.float16)), cp.asarray(_exact(rng, (64, 64)).astype(np.float16))
    mdt = _dt.resolve("fp16")
    backend.matmul(a, b, mdt)
    calls = []
    real = cp.cuda.runtime.getDeviceProperties
    monkeypatch.setattr(cp.cuda.runtime, "getDeviceProperties", lambda i: calls.append(i) or real(i))
    for _ in range(5):
        backend.matmul(a, b, mdt)
    assert backend.supports(mdt) is None and backend.target().arch.startswith("sm_")
    assert calls == []


def test_quantized_operands_with_device_codes_are_staged_once(backend, rng):
    """MXTensor / ScaledTensor whose codes and scales are CuPy arrays: used as they are, staged once and reused
    (quantize once, multiply many times); an MXTensor with blocks other than 32 is refused."""
    import cupy as cp

    from mxcore import mx
    from mxcore.backends.cuda import stage
    from mxcore.errors import UnsupportedError

    a, b = _exact(rng, (64, 96)), _exact(rng, (96, 48))
    like = cp.zeros(1, dtype=cp.float32)
    ta, tb = mx.quantize_mx(a, "mxfp8", axis=1).to_device(like), mx.quantize_mx(b, "mxfp4", axis=0).to_device(like)
    assert isinstance(ta.codes, cp.ndarray) and isinstance(tb.scales, cp.ndarray)  # device codes and scales
    mdt = _dt.resolve(("mxfp8", "mxfp4"), "sm_90")
    first = cp.asnumpy(backend.matmul(ta, tb, mdt))
    staged = dict(stage._STAGED[ta])
    second = cp.asnumpy(backend.matmul(ta, tb, mdt))
    assert all(stage._STAGED[ta][k] is v for k, v in staged.items())
    np.testing.assert_array_equal(first, reference_matmul(a, b, ("mxfp8", "mxfp4")))
    np.testing.assert_array_equal(second, first)
    sa = mx.quantize_tensor(a, "e4m3fn").to_device(like)
    if int(cp.cuda.Device().compute_capability) >= 89:
        got = backend.matmul(sa, cp.asarray(b.astype(np.float32)), _dt.resolve("e4m3fn"))
        np.testing.assert_array_equal(cp.asnumpy(got), reference_matmul(a, b, "e4m3fn"))
    t16 = mx.quantize_mx(a, "mxfp8", axis=1, block=16)
    with pytest.raises(UnsupportedError, match="blocks of 16"):
        backend.matmul(t16, tb, mdt)


def test_device_ordinal_and_stream(backend, rng):
    """Operands on device 1 run there and come back there (CuPy and torch); operands on two devices are refused
    naming both.  Needs two GPUs."""
    import cupy as cp

    from mxcore.errors import UnsupportedError

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    a, b = _exact(rng, (33, 40)), _exact(rng, (40, 21))
    mdt = _dt.resolve("fp16")
    with cp.cuda.Device(1):
        a1, b1 = cp.asarray(a.astype(np.float16)), cp.asarray(b.astype(np.float16))
    got = backend.matmul(a1, b1, mdt)
    assert got.device.id == 1
    np.testing.assert_array_equal(cp.asnumpy(got), reference_matmul(a, b, "fp16"))
    with cp.cuda.Device(0):
        b0 = cp.asarray(b.astype(np.float16))
    with pytest.raises(UnsupportedError, match="device 1.*device 0"):
        backend.matmul(a1, b0, mdt)
    torch = pytest.importorskip("torch")
    ta = torch.tensor(a, dtype=torch.bfloat16, device="cuda:1")
    tb = torch.tensor(b, dtype=torch.bfloat16, device="cuda:1")
    got = backend.matmul(ta, tb, _dt.resolve("bf16"))
    assert got.device == ta.device
    np.testing.assert_array_equal(got.float().cpu().numpy(), reference_matmul(a, b, "bf16"))


@pytest.mark.parametrize("dtype", ["e4m3fn", "mxfp4", ("mxfp8_e4m3", "mxfp6_e2m3")], ids=_id)
def test_batched_quantized_dtypes(backend, rng, dtype):
    """fp8/MX batches (3-D float operands, shared or batched B): each batch element quantized on its own, equal to
    the reference per element; B = 0 gives an empty (0, M, N) result."""
    import cupy as cp

    if _dt.resolve(dtype).kind == "fp8" and int(cp.cuda.Device().compute_capability) < 89:
        pytest.skip("fp8 needs sm_89+")
    nb, m, k, n = 3, 40, 96, 24
    a3, b3, b2 = _exact(rng, (nb, m, k)), _exact(rng, (nb, k, n)), _exact(rng, (k, n))
    mdt = _dt.resolve(dtype)
    for hb in (b3, b2):
        got = cp.asnumpy(backend.matmul(cp.asarray(a3.astype(np.float32)), cp.asarray(hb.astype(np.float32)), mdt))
        assert got.shape == (nb, m, n)
        for i in range(nb):
            np.testing.assert_array_equal(got[i], reference_matmul(a3[i], hb[i] if hb.ndim == 3 else hb, dtype))
    empty = backend.matmul(cp.zeros((0, m, k), np.float32), cp.zeros((0, k, n), np.float32), mdt)
    assert empty.shape == (0, m, n)


def test_per_call_fast_path_relaunch_is_exact(backend, rng):
    """fp16/bf16 device operands read in place: the first call of a layout builds the plan, later calls of the
    same layout relaunch it with the new addresses (one launch, or split K's launch + ordered reduction) into a
    fresh output (torch-allocated for torch inputs).  Every call equals the reference; new inputs, new results."""
    import cupy as cp

    from mxcore.arrays import to_numpy

    torch = pytest.importorskip("torch")
    backend._fast.clear()
    cases = [("cupy", "fp16", cp.float16), ("torch", "fp16", torch.float16), ("torch", "bf16", torch.bfloat16)]
    for m, k, n in ((64, 128, 48), (16, 4096, 64)):  # the second splits K
        for kind, d, store in cases:
            for out_dtype in ("float32", "bfloat16"):
                mdt = _dt.resolve(d)
                for _ in range(3):
                    a, b = _exact(rng, (m, k)), _exact(rng, (k, n))
                    if kind == "cupy":
                        x, y = cp.asarray(a.astype(np.float16)), cp.asarray(b.astype(np.float16))
                    else:
                        x = torch.tensor(a, device="cuda").to(store)
                        y = torch.tensor(b, device="cuda").to(store)
                    got = backend.matmul(x, y, mdt, out_dtype=out_dtype)
                    assert type(got).__module__.split(".")[0] == kind and tuple(got.shape) == (m, n)
                    host = to_numpy(got)
                    if kind == "cupy" and out_dtype == "bfloat16":  # CuPy has no bfloat16: the bits as uint16
                        import ml_dtypes

                        host = host.view(ml_dtypes.bfloat16)
                    np.testing.assert_array_equal(host.astype(np.float64),
                                                  reference_matmul(a, b, d, out_dtype=out_dtype).astype(np.float64))
    from mxcore.backends.cuda.families import family_for

    arch = backend.target().arch
    mma_sync = [s for s in ((64, 128, 48), (16, 4096, 64))
                if family_for(arch, _dt.resolve("fp16"), (1, s[0], s[2], s[1])) == "mma_sync"]
    entries = [e for e in backend._fast.values() if e and e[0] == "relaunch"]
    assert len(entries) == len(mma_sync) * len(cases) * 2  # one per (shape, kind/dtype, out_dtype) on mma.sync
    assert all((e[1].red is None) == (e[2] != (16, 64)) for e in entries)  # 16x64x4096 splits K
