"""The sm_90a wgmma family (``kernels_cuda/gemm_sm90.cu``, ``backends/cuda/sm90.py``) on a Hopper GPU (marker
nvidia_gpu; skipped without CuPy, a GPU, or when the GPU is not sm_90).  Every call forces ``family="wgmma"``.

* Exact inputs (small integers, times powers of two for the 16-bit/tf32/fp32 dtypes): bit-exact against
  ``mxcore.reference.reference_matmul`` for every dtype, the four A/B majorness combinations (16-bit operands are
  read in place through wgmma's transpose bits; the others are staged K-major), shapes 1x1x1 .. 127x255x4097, and
  at 4096^3, 4096x14336x4096, 8192x1024x8192 and the decode shapes 16/64x8192x8192 against a float64 GPU product.
* fp8 with promotion: integers in [-4, 4] (a 128-K window sums to at most 2^11 in magnitude, within the fp8
  accumulator's measured precision, so each window is exact and the fp32 sum of windows too); fast accumulation
  with K <= 520 and integers in [-2, 2] (every partial sum below 2^11).
* The fp8 tensor-core accumulator's precision, measured: p bits such that 2^e + 1 survives for e < p.
* fp16/bf16 outputs through direct stores and through the TMA-store epilogue (row pitch a multiple of 16 bytes).
* Random normal inputs within |err| <= (K + 2) 2^-23 Σ|ab| (fp16/bf16/tf32), plus 2^-20 Σ|ab| (fp32 3xTF32),
  plus 2^-p Σ|ab| (fp8 promoted: one rounding to p bits per 128-K window), or (K/32 + 1) 2^-p Σ|ab| (fp8 fast:
  one rounding per k32 wgmma into the running sum).
fp8/MX operands are passed as host arrays (quantized on the host: host per-tensor scales, passed by value) and,
in ``test_device_quantized_operands``, as device arrays quantized on the GPU (their scale exponents stay in device
memory and the epilogue reads them).  Shapes with M <= 64 run the swapped (C^T = B^T A^T) variant with split K;
``test_split_tail_bit_exact`` covers the split of the last wave's tiles (sm90.split_tail).  Every launch writes
into an output poisoned with NaN first.
"""

from __future__ import annotations

import numpy as np
import pytest

from mxcore import dtypes as _dt
from mxcore.operands import prepare
from mxcore.reference import reference_matmul
from conftest import FLOAT_DTYPES, FP8_DTYPES, MAJORS, dtype_id, output_values, poisoned_output

pytestmark = pytest.mark.nvidia_gpu

SMALL_SHAPES = [(1, 1, 1), (17, 33, 65), (127, 255, 4097), (130, 260, 520), (300, 600, 1000)]


_id = dtype_id


@pytest.fixture(scope="module")
def backend(sm90_backend):
    return sm90_backend


def _ints(rng, shape, lo, hi, pow2=False):
    x = rng.integers(lo, hi + 1, size=shape).astype(np.float64)
    return x * np.exp2(rng.integers(-1, 2, size=shape)) if pow2 else x


def _place(cp, x, dtype, major="row"):
    """Float dtypes: a device array (read in place or prepared on the GPU).  fp8/MX: a host array, quantized on
    the host with host per-tensor scales (passed to the kernel by value)."""
    quantized = _dt.resolve(dtype, "sm_90").kind != "float"
    d = x if quantized else cp.asarray(x)
    lib = np if quantized else cp
    return lib.asfortranarray(d) if major == "col" else lib.ascontiguousarray(d)


def _operands(cp, a, b, dtype, major):
    mdt = _dt.resolve(dtype, "sm_90")
    storage = np.float16 if (mdt.kind == "float" and mdt.a.name == "fp16") else np.float32
    return _place(cp, a.astype(storage), dtype, major[0]), _place(cp, b.astype(storage), dtype, major[1])


def _run(backend, a, b, dtype, out_dtype="float32", expect_store=None, **options):
    import cupy as cp

    mdt = _dt.resolve(dtype, "sm_90")
    out = poisoned_output(cp, a.shape[0], b.shape[1], out_dtype)
    plan = backend.plan(a, b, mdt, out_dtype=out_dtype, out=out, family="wgmma", **options)
    assert "(wgmma" in plan.variant, plan.variant
    if expect_store is not None:
        assert ("_tmastore" in plan.variant) == expect_store, plan.variant
    plan.gemm()
    return output_values(cp, out, out_dtype)


@pytest.mark.parametrize("shape", SMALL_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("major", MAJORS, ids=lambda m: f"{m[0]}-{m[1]}")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + FP8_DTYPES + ["mxfp8_e4m3", "mxfp4"], ids=_id)
def test_exact_inputs_bit_exact(backend, rng, dtype, major, shape):
    import cupy as cp

    m, n, k = shape
    fp8 = dtype in FP8_DTYPES
    a, b = _ints(rng, (m, k), -4, 4, not fp8), _ints(rng, (k, n), -4, 4, not fp8)
    got = _run(backend, *_operands(cp, a, b, dtype, major), dtype)
    assert not np.isnan(got).any(), "unwritten (NaN-poisoned) outputs"
    np.testing.assert_array_equal(got, reference_matmul(a, b, dtype).astype(np.float64))


@pytest.mark.parametrize("dtype", FP8_DTYPES, ids=_id)
@pytest.mark.parametrize("shape", [(1, 1, 1), (17, 33, 65), (130, 260, 520)], ids=lambda s: "x".join(map(str, s)))
def test_fp8_fast_accumulation_exact(backend, rng, dtype, shape):
    import cupy as cp

    m, n, k = shape
    a, b = _ints(rng, (m, k), -2, 2), _ints(rng, (k, n), -2, 2)
    got = _run(backend, _place(cp, a.astype(np.float32), dtype), _place(cp, b.astype(np.float32), dtype), dtype,
               fp8_accumulate="fast")
    np.testing.assert_array_equal(got, reference_matmul(a, b, dtype).astype(np.float64))


@pytest.mark.parametrize("shape", [(70, 50, 96), (300, 600, 1000), (129, 264, 4100)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "tf32", "e4m3fn", "mxfp4"], ids=_id)
@pytest.mark.parametrize("out_dtype", ["float16", "bfloat16"])
def test_low_precision_outputs(backend, rng, dtype, out_dtype, shape):
    """16-bit outputs: direct stores when N is odd-sized (70x50), the TMA-store epilogue when the row pitch is a
    multiple of 16 bytes (TMA clips the partial tiles at M and N)."""
    import cupy as cp

    m, n, k = shape
    a, b = _ints(rng, (m, k), -4, 4), _ints(rng, (k, n), -4, 4)
    pa, pb = _place(cp, a.astype(np.float32), dtype), _place(cp, b.astype(np.float32), dtype)
    got = _run(backend, pa, pb, dtype, out_dtype, expect_store=n % 8 == 0)
    np.testing.assert_array_equal(got, reference_matmul(a, b, dtype, out_dtype=out_dtype).astype(np.float64))


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (4096, 14336, 4096), (8192, 1024, 8192), (16, 8192, 8192),
                                   (64, 8192, 8192)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "e4m3fn"])
def test_large_shapes_exact(backend, rng, dtype, shape):
    import cupy as cp

    m, n, k = shape
    fp8 = dtype == "e4m3fn"
    da = cp.asarray(_ints(rng, (m, k), -4, 4, not fp8).astype(np.float32))
    db = cp.asarray(_ints(rng, (k, n), -4, 4, not fp8).astype(np.float32))
    want = cp.asnumpy(da.astype(cp.float64) @ db.astype(cp.float64))  # exact: integers/quarters, |sum| < 2^24
    if fp8:
        da, db = cp.asnumpy(da), cp.asnumpy(db)
    got = _run(backend, da, db, dtype)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got, want)


def _fp8_accumulator_bits(backend) -> int:
    """Largest p such that 2^e + 1 (a product 2^e and a product 1 in one k32 wgmma) is exact for all e < p."""
    import cupy as cp

    for e in range(8, 26):
        a = np.zeros((1, 2), np.float32)
        b = np.zeros((2, 1), np.float32)
        a[0] = [2.0 ** (e // 2), 1.0]
        b[:, 0] = [2.0 ** (e - e // 2), 1.0]
        got = _run(backend, a, b, "e4m3fn", fp8_accumulate="fast")[0, 0]
        if got != 2.0**e + 1:
            return e
    return 26


def test_fp8_accumulator_precision(backend):
    """The measured precision that the fp8 bounds and the promotion's exactness argument rest on."""
    p = _fp8_accumulator_bits(backend)
    print(f"fp8 wgmma accumulator: 2^e + 1 exact for e < {p}")
    assert p >= 12, f"fp8 accumulator keeps only {p} bits; the exact-input tests assume >= 12"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + ["e4m3fn", ("e5m2", "e4m3fn"), "fast-e4m3fn"], ids=_id)
def test_random_normal_within_bound(backend, rng, dtype):
    import cupy as cp

    fast = dtype == "fast-e4m3fn"
    dtype = "e4m3fn" if fast else dtype
    m, n, k = 300, 520, 2000
    a = rng.standard_normal((m, k)) * 3.0
    b = rng.standard_normal((k, n)) * 0.5
    mdt = _dt.resolve(dtype, "sm_90")
    got = _run(backend, _place(cp, a.astype(np.float32), dtype), _place(cp, b.astype(np.float32), dtype), dtype,
               **({"fp8_accumulate": "fast"} if fast else {}))
    opa, opb = prepare(a.astype(np.float32), b.astype(np.float32), mdt)
    a64, b64 = opa.to_float64(), opb.to_float64()
    ref, scale = a64 @ b64, np.abs(a64) @ np.abs(b64)
    bound = (k + 2) * 2.0**-23 * scale
    if dtype == "fp32":
        ref = a.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64)
        bound = bound + 2.0**-20 * scale
    elif mdt.kind == "fp8":
        p = _fp8_accumulator_bits(backend)
        bound = bound + ((k / 32 + 1) if fast else 1) * 2.0**-p * scale
    err = np.abs(got - ref)
    assert not np.isnan(got).any()
    assert (err <= bound).all(), f"max err {err.max():.3g} vs bound {bound[err > bound].min():.3g}"


def test_family_rule_picks_wgmma_for_large_problems(backend, rng):
    import cupy as cp

    a = cp.asarray(rng.standard_normal((2048, 1024)).astype(np.float16))
    b = cp.asarray(rng.standard_normal((1024, 2048)).astype(np.float16))
    mdt = _dt.resolve("fp16", "sm_90")
    assert backend.plan(a, b, mdt).variant.endswith("(wgmma)")
    assert backend.plan(a[:16], b, mdt).variant.endswith("(mma.sync)")  # decode: mma.sync with split K
    assert backend.plan(a, b, mdt, family="mma_sync").variant.endswith("(mma.sync)")


def test_wgmma_layout_probes(backend):
    """The accumulator of m64n64k16 and the register-A forms of m64n16k16 (f16) / m64n16k8 (tf32), read lane by
    lane from the hardware (arange probes, backends/probes/wgmma.py), equal mxcore.layouts.hopper's records."""
    import cupy as cp

    from mxcore.backends.probes import wgmma as probe
    from mxcore.layouts import hopper

    got = probe.run_probes(cp)
    np.testing.assert_array_equal(got["d"], hopper.accumulator(64).coords)
    np.testing.assert_array_equal(got["a_k16"], hopper.register_a(16).coords)
    np.testing.assert_array_equal(got["a_k8"], hopper.register_a(8).coords)


def test_shared_weight_batch_folds_into_one_wgmma_launch(backend, rng):
    """(B, M, K) @ (K, N) with a contiguous A is one (B*M, K) @ (K, N) problem: it runs on wgmma when asked, and
    the family rule (which judges the folded problem) picks wgmma by itself when the folded problem is large."""
    import cupy as cp

    a, b = _ints(rng, (4, 512, 1024), -4, 4, True), _ints(rng, (1024, 2048), -4, 4, True)
    da, db = cp.asarray(a.astype(np.float16)), cp.asarray(b.astype(np.float16))
    plan = backend.plan(da, db, _dt.resolve("fp16", "sm_90"), family="wgmma")
    assert plan.variant.endswith("(wgmma)"), plan.variant
    plan.gemm()
    got = cp.asnumpy(plan.result()).astype(np.float64)
    np.testing.assert_array_equal(got, np.stack([reference_matmul(x, b, "fp16") for x in a]).astype(np.float64))
    a, b = _ints(rng, (16, 512, 256), -4, 4, True), _ints(rng, (256, 4096), -4, 4, True)  # 64 x 16 tiles folded
    plan = backend.plan(cp.asarray(a.astype(np.float16)), cp.asarray(b.astype(np.float16)), _dt.resolve("fp16", "sm_90"))
    assert plan.variant.endswith("(wgmma)"), plan.variant
    plan.gemm()
    got = cp.asnumpy(plan.result()).astype(np.float64)
    np.testing.assert_array_equal(got, np.stack([reference_matmul(x, b, "fp16") for x in a]).astype(np.float64))


@pytest.mark.parametrize("dtype", ["e4m3fn", ("e4m3fn", "e5m2"), "mxfp8_e4m3", "mxfp4"], ids=_id)
@pytest.mark.parametrize("shape", [(17, 33, 65), (300, 600, 1000), (2048, 2048, 512)], ids=lambda s: "x".join(map(str, s)))
def test_device_quantized_operands(backend, rng, dtype, shape):
    """fp8/MX operands quantized on the GPU carry their scale exponents in device memory (a device ScaledTensor's
    scale_exp, a device MXTensor's scale_max): the wgmma epilogue reads them there, and the result equals the
    reference bit for bit (exact inputs, scaled by powers of two so that the scale is not 1)."""
    import cupy as cp

    m, n, k = shape
    a, b = _ints(rng, (m, k), -4, 4) * 2.0 ** 9, _ints(rng, (k, n), -4, 4) * 2.0 ** -7
    got = _run(backend, cp.asarray(a.astype(np.float32)), cp.asarray(b.astype(np.float32)), dtype)
    assert not np.isnan(got).any(), "unwritten (NaN-poisoned) outputs"
    np.testing.assert_array_equal(got, reference_matmul(a, b, dtype).astype(np.float64))


#: dtypes of the split-tail test: every accumulation form of the kernel (16-bit on clusters of 2, tf32, fp8 promoted
#: and fast, mixed fp8, exact MX per-32 blocks and MX folded into e4m3)
SPLIT_DTYPES = ["fp16", "tf32", "e4m3fn", "fast-e4m3fn", ("e5m2", "e4m3fn"), "mxfp8_e4m3", "mxfp4", "mxfp6_e3m2"]


def _split_shape(backend, cp, dtype, form, opts):
    """(M, N, K) for ``form``: "tail" fills one wave of the plan's resident blocks (clusters) and 4 tiles more, so
    that the last wave's tiles split along K (sm90.split_tail); "few" has fewer tiles than half the blocks (every
    tile split).  M and N are not tile multiples and K not a multiple of the ring stage's K (K tails)."""
    probe = backend.plan(cp.ones((256, 256), cp.float32), cp.ones((256, 256), cp.float32),
                         _dt.resolve("e4m3fn" if _dt.resolve(dtype, "sm_90").kind != "float" else dtype, "sm_90"),
                         family="wgmma", **{k: v for k, v in opts.items() if k == "fp8_accumulate"})
    v, resident = probe.variant_, probe._resident
    if form == "few":
        return 300, 500, 4100
    rows = -(-(resident + 4) // 2)  # 2 tile columns: rows x 2 = resident + 4 (+1)
    return rows * 128 * v.cluster - 5, 2 * v.bn - 7, 2100


@pytest.mark.parametrize("form", ["tail", "few"])
@pytest.mark.parametrize("dtype", SPLIT_DTYPES, ids=_id)
def test_split_tail_bit_exact(backend, rng, dtype, form):
    """The tiles of the last, partial wave (or all tiles of a problem with fewer tiles than SMs) split along K over
    the idle SMs (sm90.split_tail; kernel: unit_work, split_fixup): bit-exact on exact inputs, the plan did split,
    and on random normal inputs two launches give the same bits (the partials are summed in split order whichever
    unit finishes last; the counters reset themselves)."""
    import cupy as cp

    fast = dtype == "fast-e4m3fn"
    dtype = "e4m3fn" if fast else dtype
    mdt = _dt.resolve(dtype, "sm_90")
    opts = {"fp8_accumulate": "fast"} if fast else ({"mx_path": "exact"} if mdt.kind == "mx" else {})
    m, n, k = _split_shape(backend, cp, dtype, form, opts)
    v = 2 if mdt.kind == "mx" or fast else 4  # MX: a folded window sums blocks at shifts: keep it within ~14 bits
    a, b = _ints(rng, (m, k), -v, v, mdt.kind == "float"), _ints(rng, (k, n), -v, v, mdt.kind == "float")
    if fast:  # fast accumulation is exact while every running sum stays below 2^11: a sparse A keeps it there
        a *= rng.random((m, k)) < 0.02
    pa, pb = _operands(cp, a, b, dtype, ("row", "row"))
    out = poisoned_output(cp, m, n, "float32")
    plan = backend.plan(pa, pb, mdt, out=out, family="wgmma", **opts)
    assert plan._splits > 1 and (plan._tail0 > 0) == (form == "tail"), (plan._tail0, plan._splits, plan._resident)
    assert ("_mx32" in plan.variant) == (mdt.kind == "mx"), plan.variant
    plan.gemm()
    got = output_values(cp, out, "float32")
    assert not np.isnan(got).any(), "unwritten (NaN-poisoned) outputs"
    np.testing.assert_array_equal(got, reference_matmul(a, b, dtype).astype(np.float64))
    x, y = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    runs = []
    for _ in range(2):
        out = poisoned_output(cp, m, n, "float32")
        p = backend.plan(*_operands(cp, x, y, dtype, ("row", "row")), mdt, out=out, family="wgmma", **opts)
        p.gemm()
        p.gemm()  # the second launch reuses the counters the first one reset
        runs.append(output_values(cp, out, "float32"))
    assert not np.isnan(runs[0]).any()
    np.testing.assert_array_equal(runs[0], runs[1])
