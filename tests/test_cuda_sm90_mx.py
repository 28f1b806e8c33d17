"""Exact OCP-MX fp8 on the sm_90a wgmma family (``SM90_MX`` in ``kernels_cuda/gemm_sm90.cu``, block factors from
``gemm_sm90_mx.cu``, host side ``backends/cuda/sm90.py`` / ``stage.py``; marker nvidia_gpu, skipped without an
sm_90 GPU).  Every launch writes into an output poisoned with NaN first and checks that the exact variant ran
(``_mx32`` in the plan's variant).

* Exact inputs: MXTensors built from codes of small integers (|v| <= 4, so a 32-element block sums to at most
  512 in magnitude, within the fp8 tensor core's accumulator precision) and scale codes in [126, 128], so that
  every product, block sum and fp32 partial sum is exact: bit-exact against ``mxcore.reference`` for e4m3, e5m2
  and both mixed pairs, A/B codes in C and Fortran order (the layouts an MXTensor may hold), K tails (K not a
  multiple of 32 / 128), odd M and N, host and device MXTensors, fp32 / fp16 / bf16 outputs.
* Scale codes at the ends of E8M0: every output gets one nonzero block product (block-diagonal operands), its
  scale pair drawn from codes 0x00, 0x01, 0x7F, 0xFE, ... (E from -254 to 254), so the reference's one rounding is
  the kernel's: equal bit for bit (inf where the product overflows, 0 where it is far below fp32, fp32 subnormals
  between: the kernels' fp32 arithmetic keeps subnormals under CuPy's -ftz=true).  Sums whose results are fp32
  subnormals (elements of halves, scales near 2^-126) through the fast and the exact promotion.  All-zero blocks of code
  0x00 (the quantizer's) beside live blocks keep the fast promotion.  NaN blocks (0xFF) make their whole row of A /
  column of B NaN; e5m2 inf elements give inf / NaN as the reference.
* Random normal inputs quantized by ``quantize_mx``: |err| <= 4 * 2^-p * (|A| @ |B|) + (K/32 + 2) * 2^-23 *
  (|A| @ |B|), p the fp8 tensor core accumulator's measured precision (one rounding of each 32-K block sum inside
  the wgmma; then one fp32 rounding per block added into the main accumulator).
* Quantize-once reuse: a device MXTensor multiplied twice (the second call stages nothing: the staged codes and
  factors are cached on it); device float data quantized on the GPU by the plan.
"""

from __future__ import annotations

import numpy as np
import pytest

from mxcore import dtypes as _dt
from mxcore import formats
from mxcore.mx import MXTensor
from mxcore.reference import reference_matmul
from conftest import dtype_id, output_values, poisoned_output

pytestmark = pytest.mark.nvidia_gpu

PAIRS = ["mxfp8_e4m3", "mxfp8_e5m2", ("mxfp8_e4m3", "mxfp8_e5m2"), ("mxfp8_e5m2", "mxfp8_e4m3")]
#: pairs with an MXFP4 / MXFP6 operand: folded into e4m3 (gemm_sm90_mx.cu's mx_sm90_fold)
FOLD_PAIRS = ["mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", ("mxfp8_e4m3", "mxfp4"), ("mxfp4", "mxfp6_e3m2")]
ALL_PAIRS = PAIRS + FOLD_PAIRS
SHAPES = [(1, 1, 1), (17, 33, 65), (127, 255, 4097), (130, 260, 520), (300, 600, 1000), (129, 200, 4100)]
ORDERS = [("C", "C"), ("C", "F"), ("F", "C"), ("F", "F")]


_id = dtype_id


def _fmts(dtype):
    return (dtype, dtype) if isinstance(dtype, str) else dtype


@pytest.fixture(scope="module")
def backend(sm90_backend):
    return sm90_backend


def _mx(vals, scodes, fmt, axis, order="C"):
    """An MXTensor of ``vals`` (exactly representable element values) with E8M0 codes ``scodes``."""
    codes = formats.encode(np.asarray(vals, dtype=np.float64), _dt.MX_ELEMENT[_dt.canonical_operand(fmt)])
    codes = np.asfortranarray(codes) if order == "F" else np.ascontiguousarray(codes)
    sc = np.asarray(scodes, dtype=np.uint8)
    return MXTensor(codes, np.asfortranarray(sc) if order == "F" else sc, fmt, axis)


def _folds(fmts) -> bool:
    return any(not f.startswith("mxfp8") for f in fmts)


def _exact_operands(rng, m, n, k, fmts, orders=("C", "C"), lo=126, hi=128):
    """Integer elements in [-4, 4] ([-2, 2] when an operand is folded: a folded 128-K window sums 4 blocks at
    shifts of up to 2 + 2 binades in the tensor core, |sum| < 2^13, within its ~14 bits)."""
    kb = -(-k // 32)
    v = 2 if _folds(fmts) else 4
    a = _mx(rng.integers(-v, v + 1, size=(m, k)), rng.integers(lo, hi + 1, size=(m, kb)), fmts[0], 1, orders[0])
    b = _mx(rng.integers(-v, v + 1, size=(k, n)), rng.integers(lo, hi + 1, size=(kb, n)), fmts[1], 0, orders[1])
    return a, b


def _run(backend, a, b, dtype, out_dtype="float32", expect_exact=True, **options):
    import cupy as cp

    mdt = _dt.resolve(dtype, "sm_90")
    m, n = a.shape[0], b.shape[1]
    out = poisoned_output(cp, m, n, out_dtype)
    options.setdefault("family", "wgmma")
    if expect_exact:  # ask for the exact path (the rule takes it only for large mxfp8 problems: MX_EXACT_FROM)
        options.setdefault("mx_path", "exact")
    plan = backend.plan(a, b, mdt, out_dtype=out_dtype, out=out, **options)
    assert ("_mx32" in plan.variant) == expect_exact, plan.variant
    plan.gemm()
    return output_values(cp, out, out_dtype)


def _ref(a, b, dtype, out_dtype="float32"):
    return reference_matmul(a, b, dtype, out_dtype=out_dtype).astype(np.float64)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("orders", ORDERS, ids=lambda o: f"{o[0]}-{o[1]}")
@pytest.mark.parametrize("dtype", ALL_PAIRS, ids=_id)
def test_exact_inputs_bit_exact(backend, rng, dtype, orders, shape):
    m, n, k = shape
    a, b = _exact_operands(rng, m, n, k, _fmts(dtype), orders)
    got = _run(backend, a, b, dtype)
    assert not np.isnan(got).any(), "unwritten (NaN-poisoned) outputs"
    np.testing.assert_array_equal(got, _ref(a, b, dtype))


@pytest.mark.parametrize("dtype", ALL_PAIRS, ids=_id)
@pytest.mark.parametrize("shape", [(70, 50, 96), (300, 608, 1000)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", ["float16", "bfloat16"])
def test_low_precision_outputs(backend, rng, dtype, out_dtype, shape):
    """fp16/bf16 outputs: direct stores (N = 50) and the TMA-store epilogue (row pitch a multiple of 16 bytes)."""
    m, n, k = shape
    a, b = _exact_operands(rng, m, n, k, _fmts(dtype))
    got = _run(backend, a, b, dtype, out_dtype)
    np.testing.assert_array_equal(got, _ref(a, b, dtype, out_dtype))


def _block_diagonal(rng, m, n, nb, k, fmts, a_codes, b_codes, nz_value=(-4, 5)):
    """A (m, k) and B (k, n) whose row r / column c is nonzero only in block r % nb / c % nb, with that block's
    scale code drawn from a_codes / b_codes; every other block is all-zero with scale code 0 (as the quantizer
    writes it).  Each output is then one block product 2^E * s, rounded once by both the kernel and the reference."""
    kb = -(-k // 32)
    va, vb = np.zeros((m, k)), np.zeros((k, n))
    sa, sb = np.zeros((m, kb), np.uint8), np.zeros((kb, n), np.uint8)
    for r in range(m):
        j = r % nb
        va[r, 32 * j:min(k, 32 * j + 32)] = rng.integers(*nz_value, size=min(k, 32 * j + 32) - 32 * j)
        sa[r, j] = rng.choice(a_codes)
    for c in range(n):
        j = c % nb
        vb[32 * j:min(k, 32 * j + 32), c] = rng.integers(*nz_value, size=min(k, 32 * j + 32) - 32 * j)
        sb[j, c] = rng.choice(b_codes)
    return _mx(va, sa, fmts[0], 1), _mx(vb, sb, fmts[1], 0)


def _assert_exact_with_subnormals(got, want):
    """Bit-exact, and some of the reference's results are fp32 subnormals (the test reaches them)."""
    sub = (want != 0) & (np.abs(want) < 2.0**-126)
    assert sub.sum() > 0, "no reference result is an fp32 subnormal"
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ALL_PAIRS, ids=_id)
@pytest.mark.parametrize("k", [128, 200, 4100])
def test_extreme_scale_codes(backend, rng, dtype, k):
    """Scale codes 0x00 (2^-127, live: nonzero elements), 0x01, 0xFE (2^127), 0xFD and middle codes, paired so
    that E = ea + eb spans [-254, 254]: products far below fp32 (0), fp32 subnormals (E from -144 to -125 with
    codes 110 / 120: rounded once, as the reference), normal ones (exact), overflowing ones (inf)."""
    fmts = _fmts(dtype)
    nb = -(-k // 32)
    codes = [0, 1, 2, 110, 120, 127, 128, 200, 253, 254]
    a, b = _block_diagonal(rng, 131, 97, min(nb, 5), k, fmts, codes, codes, nz_value=(-2, 3))
    a = MXTensor(formats.encode(formats.decode(a.codes, a.element) * 2, a.element), a.scales, a.fmt, 1)
    got = _run(backend, a, b, dtype)
    want = _ref(a, b, dtype)
    _assert_exact_with_subnormals(got, want)
    assert np.isinf(want).any() and (want == 0).any() and (np.abs(want) >= 2.0**-126).any()


@pytest.mark.parametrize("dtype", ALL_PAIRS, ids=_id)
@pytest.mark.parametrize("promotion", ["fast", "exact"])
@pytest.mark.parametrize("shape", [(130, 260, 520), (64, 200, 4100)], ids=lambda s: "x".join(map(str, s)))
def test_subnormal_results_exact(backend, rng, dtype, promotion, shape):
    """Sums whose results are fp32 subnormals: elements in halves (|v| <= 1, exact in every MX element format),
    A's scale codes 1..3 (2^-126..2^-124, per block) and B's 127 (fast: every pair's 2^E an fp32 normal, one FMA per
    block) or 120..127 (exact: pairs below 2^-126, two normal factors; one code per column, so that B's windows
    fold whole).  Every term and partial sum is a multiple of 2^-137, so the results are exact in fp32 (subnormals
    included) and equal the reference bit for bit, fp32 and bf16 outputs; (64, 200, 4100) is two tiles, split
    along K (the partials' sum).  e5m2 elements shifted by a lossy fold lose bits: mx_lo_fix adds them back."""
    m, n, k = shape
    fmts = _fmts(dtype)
    kb = -(-k // 32)
    va, vb = rng.integers(-2, 3, size=(m, k)) / 2, rng.integers(-2, 3, size=(k, n)) / 2
    sb = np.full((kb, n), 127) if promotion == "fast" else np.repeat(rng.integers(120, 128, size=(1, n)), kb, 0)
    a, b = _mx(va, rng.integers(1, 4, size=(m, kb)), fmts[0], 1), _mx(vb, sb, fmts[1], 0)
    want = _ref(a, b, dtype)
    _assert_exact_with_subnormals(_run(backend, a, b, dtype), want)
    np.testing.assert_array_equal(_run(backend, a, b, dtype, "bfloat16"), _ref(a, b, dtype, "bfloat16"))


@pytest.mark.parametrize("dtype", ["mxfp8_e4m3", ("mxfp8_e5m2", "mxfp8_e4m3"), "mxfp4", ("mxfp6_e2m3", "mxfp4")],
                         ids=_id)
def test_zero_blocks_keep_fast_promotion_exact(backend, rng, dtype):
    """All-zero blocks with scale code 0x00 (what quantize_mx writes for them) beside ordinary codes: the prep
    makes them neutral, the kernel keeps its fast promotion, results exact."""
    m, n, k = 257, 190, 1000
    a, b = _exact_operands(rng, m, n, k, _fmts(dtype))
    sa, sb = a.scales.copy(), b.scales.copy()
    ca, cb = formats.decode(a.codes, a.element), formats.decode(b.codes, b.element)
    za, zb = rng.random(sa.shape) < 0.3, rng.random(sb.shape) < 0.3
    for r, j in zip(*np.nonzero(za)):
        ca[r, 32 * j:32 * j + 32], sa[r, j] = 0, 0
    for j, c in zip(*np.nonzero(zb)):
        cb[32 * j:32 * j + 32, c], sb[j, c] = 0, 0
    a, b = _mx(ca, sa, a.fmt, 1), _mx(cb, sb, b.fmt, 0)
    got = _run(backend, a, b, dtype)
    np.testing.assert_array_equal(got, _ref(a, b, dtype))


@pytest.mark.parametrize("dtype", ALL_PAIRS, ids=_id)
def test_nan_blocks_and_inf_elements(backend, rng, dtype):
    """A NaN block (scale 0xFF) makes its whole row of A / column of B NaN in the reference, and here; e5m2 inf
    element codes propagate (inf, or NaN where inf meets 0 or -inf) as in the reference."""
    fmts = _fmts(dtype)
    m, n, k = 150, 140, 300
    a, b = _exact_operands(rng, m, n, k, fmts)
    sa, sb = a.scales.copy(), b.scales.copy()
    sa[[3, 77], [1, 9]] = 0xFF
    sb[[0, 5], [11, 139]] = 0xFF
    ca, cb = a.codes.copy(), b.codes.copy()
    pinf, ninf = formats.encode(np.array([1.0, -1.0]) * 2.0**16, "e5m2", overflow="nan")  # rounds up to +-inf
    assert np.isinf(formats.decode(np.array([pinf, ninf], np.uint8), "e5m2")).all()
    if fmts[0] == "mxfp8_e5m2":
        ca[10, 40] = pinf
        ca[11, [5, 6]] = [pinf, ninf]
    if fmts[1] == "mxfp8_e5m2":
        cb[100, 20] = ninf
    a, b = MXTensor(ca, sa, a.fmt, 1), MXTensor(cb, sb, b.fmt, 0)
    got = _run(backend, a, b, dtype)
    want = _ref(a, b, dtype)
    assert np.isnan(want[3]).all() and np.isnan(want[:, 139]).all()
    np.testing.assert_array_equal(got, want)


def _accumulator_bits(backend) -> int:
    """Largest p such that 2^e + 1 (products 2^e and 1 in one 32-K block, scale 1) is exact for all e < p."""
    for e in range(8, 17):
        a = _mx(np.array([[2.0 ** (e // 2), 1.0]]), np.array([[127]]), "mxfp8_e4m3", 1)
        b = _mx(np.array([[2.0 ** (e - e // 2)], [1.0]]), np.array([[127]]), "mxfp8_e4m3", 0)
        if _run(backend, a, b, "mxfp8_e4m3")[0, 0] != 2.0**e + 1:
            return e
    return 17


@pytest.mark.parametrize("dtype", ALL_PAIRS, ids=_id)
def test_random_normal_within_bound(backend, rng, dtype):
    import mxcore

    m, n, k = 300, 520, 2000
    fmts = _fmts(dtype)
    a = mxcore.quantize_mx(rng.standard_normal((m, k)).astype(np.float32) * 3.0, fmts[0], axis=1)
    b = mxcore.quantize_mx(rng.standard_normal((k, n)).astype(np.float32) * 0.5, fmts[1], axis=0)
    _assert_within_bound(backend, a, b, dtype, k)


def _assert_within_bound(backend, a, b, dtype, k):
    """The GPU result against the float64 product of the dequantized operands: |err| <= 4 * 2^-p * (|A| @ |B|) +
    (K/32 + 2) * 2^-23 * (|A| @ |B|), p the tensor core accumulator's measured precision."""
    import mxcore

    got = _run(backend, a, b, dtype)
    a64, b64 = mxcore.dequantize(a, np.float64), mxcore.dequantize(b, np.float64)
    ref, scale = a64 @ b64, np.abs(a64) @ np.abs(b64)
    p = _accumulator_bits(backend)
    bound = 4 * 2.0**-p * scale + (k / 32 + 2) * 2.0**-23 * scale
    err = np.abs(got - ref)
    print(f"accumulator bits {p}; max err / bound {np.max(err / bound):.3g}; "
          f"relative Frobenius error {np.linalg.norm(got - ref) / np.linalg.norm(ref):.3g}")
    assert not np.isnan(got).any()
    assert (err <= bound).all(), f"max err {err.max():.3g} vs bound {bound[err > bound].min():.3g}"


@pytest.mark.parametrize("dtype", ["mxfp8_e4m3", ("mxfp8_e4m3", "mxfp8_e5m2"), "mxfp4"], ids=_id)
def test_device_mxtensor_reuse(backend, rng, dtype):
    """A device MXTensor (CuPy codes and scales) multiplied by two activations: the second plan reuses the staged
    codes and block factors cached on it; both bit-exact.  Device float data is quantized by the plan on the GPU."""
    import cupy as cp

    fmts = _fmts(dtype)
    m, n, k = 260, 384, 1056
    a1, b = _exact_operands(rng, m, n, k, fmts)
    a2, _ = _exact_operands(rng, m, n, k, fmts)
    like = cp.zeros(1)
    bd = b.to_device(like)
    from mxcore.backends.cuda import stage

    for a in (a1, a2):
        got = _run(backend, a.to_device(like), bd, dtype)
        np.testing.assert_array_equal(got, _ref(a, b, dtype))
        assert [key for key in stage._STAGED[bd] if key[1:3] == ("b", "mx_exact")], "B's staging is not cached"
    x = rng.integers(-4, 5, size=(m, k)) * 2.0**9
    y = rng.integers(-4, 5, size=(k, n)) * 2.0**-7
    got = _run(backend, cp.asarray(x.astype(np.float32)), cp.asarray(y.astype(np.float32)), dtype)
    np.testing.assert_array_equal(got, reference_matmul(x, y, dtype).astype(np.float64))


def test_large_exact(backend, rng):
    """4096^3 with exact inputs (device MXTensors) against a float64 GPU product of the dequantized operands."""
    import cupy as cp

    m = n = k = 4096
    a, b = _exact_operands(rng, m, n, k, ("mxfp8_e4m3", "mxfp8_e4m3"))
    like = cp.zeros(1)
    da, db = a.to_device(like), b.to_device(like)
    from mxcore.backends.cuda import families

    rule = families.exact_pays((1, m, n, k), 0, "mxfp8")  # two MXTensors staged once
    got = _run(backend, da, db, "mxfp8_e4m3", expect_exact=rule, family=None, mx_path=None)  # the rule
    a64 = cp.asarray(formats.decode(a.codes, a.element)) * cp.repeat(cp.exp2(cp.asarray(a.scales, cp.float64) - 127),
                                                                       32, axis=1)
    b64 = cp.asarray(formats.decode(b.codes, b.element)) * cp.repeat(cp.exp2(cp.asarray(b.scales, cp.float64) - 127),
                                                                       32, axis=0)
    np.testing.assert_array_equal(got, cp.asnumpy(a64 @ b64).astype(np.float32).astype(np.float64))


def test_rule_and_decode_option(backend, rng):
    """Without options a plan takes the variant the rule (families.exact_pays over MX_EXACT_FROM) names for an mxfp8
    pair; mx_path="decode" runs the bf16-decoded wgmma kernel and mx_path="exact" the exact variant whatever the
    rule says; all bit-exact on exact inputs.  (The rule's bounds themselves: test_gpu_api.test_exact_path_bounds.)"""
    from mxcore.backends.cuda import families

    m, n, k = 2048, 2048, 512
    a, b = _exact_operands(rng, m, n, k, ("mxfp8_e4m3", "mxfp8_e4m3"))
    want = _ref(a, b, "mxfp8_e4m3")
    rule = families.exact_pays((1, m, n, k), 0, "mxfp8")  # the landed bounds: decode at this size
    np.testing.assert_array_equal(_run(backend, a, b, "mxfp8_e4m3", expect_exact=rule, family=None, mx_path=None),
                                  want)
    np.testing.assert_array_equal(_run(backend, a, b, "mxfp8_e4m3", expect_exact=False, mx_path="decode"), want)
    np.testing.assert_array_equal(_run(backend, a, b, "mxfp8_e4m3", mx_path="exact"), want)


@pytest.mark.parametrize("tile", ["128x192", "128x128"])
@pytest.mark.parametrize("dtype", ["mxfp8_e4m3", ("mxfp8_e5m2", "mxfp8_e4m3"), "mxfp4"], ids=_id)
def test_tiles_bit_exact(backend, rng, dtype, tile):
    """The exact variant's tiles on exact inputs and on extreme scale codes (the exact promotion), several tiles per
    block and K tails."""
    fmts = _fmts(dtype)
    for m, n, k in [(300, 600, 1000), (129, 200, 4100), (1000, 520, 384)]:
        a, b = _exact_operands(rng, m, n, k, fmts)
        np.testing.assert_array_equal(_run(backend, a, b, dtype, tile=tile), _ref(a, b, dtype))
    codes = [0, 1, 110, 127, 200, 254]
    a, b = _block_diagonal(rng, 260, 300, 4, 256, fmts, codes, codes, nz_value=(1, 3))
    _assert_exact_with_subnormals(_run(backend, a, b, dtype, tile=tile), _ref(a, b, dtype))


@pytest.mark.parametrize("dtype", FOLD_PAIRS, ids=_id)
@pytest.mark.parametrize("k", [256, 1000, 4100])
def test_fold_tiers(backend, rng, dtype, k):
    """The three forms of a folded operand, each bit-exact (elements +-1 and 0; every partial sum within 24 bits),
    told apart by the prep's flags:
    * "whole": every row's scales span at most formats.exact_shifts(element, "e4m3fn") binades: one factor per
      row over all of K (info[3] = 0), applied in the GEMM's epilogue;
    * "windows": a few rows of A drift by 15 binades between windows 0 and 1 (more than any bound over the row,
      each window within it): those rows fold per 128-K window (info[3] = 1, every window flag set);
    * "wide": those rows' window 0 spans 15 binades itself (blocks 0 and 3 at codes 108 and 123): window 0's flag
      is cleared and that stage runs per 32-K block for every row.
    mxfp8 operands are folded too (lossy, test_mxfp8_lost_bits_bit_exact); their elements here lose nothing."""
    import cupy as cp

    fmts = _fmts(dtype)
    m, n = 200, 300
    kb = -(-k // 32)
    for mode in ("whole", "windows", "wide"):
        sa = rng.integers(120, 124, size=(m, kb))
        sb = rng.integers(126, 129, size=(kb, n))
        va, vb = rng.integers(-1, 2, size=(m, k)), rng.integers(-1, 2, size=(k, n))
        if mode == "windows":
            va[5:9], sa[5:9, :4], sa[5:9, 4:] = 0, 105, 120
            va[5:9, 0:32:3], va[5:9, 128:160:5] = 1, -1
        if mode == "wide":
            va[5:9], sa[5:9, 0], sa[5:9, 3] = 0, 108, 123
            va[5:9, 0:32:3], va[5:9, 96:128:5] = 1, -1
        a, b = _mx(va, sa, fmts[0], 1), _mx(vb, sb, fmts[1], 0)
        out = poisoned_output(cp, m, n, "float32")
        plan = backend.plan(a, b, _dt.resolve(dtype, "sm_90"), out=out, family="wgmma", mx_path="exact")
        plan.gemm()
        np.testing.assert_array_equal(output_values(cp, out, "float32"), _ref(a, b, dtype))
        for d, fmt in zip((plan.da, plan.db), fmts):
            if fmt.startswith("mxfp8"):  # folded with its lost bits kept (test_mxfp8_lost_bits_bit_exact; here 11
                assert d.mx.lo_cnt is not None and int(d.mx.info[4]) == 0  # per row in one window: the epilogue's)
                continue
            f, whole = cp.asnumpy(d.mx.folded), int(d.mx.info[3]) == 0
            assert f.shape == (-(-kb // 4),)
            assert f[1:].all() and f[0] == (0 if mode == "wide" and d is plan.da else 1), f
            assert whole == (mode == "whole" or d is plan.db), (mode, whole)


def test_bench_mx_reports_paths(backend):
    """``python -m mxcore.tools.bench_mx`` runs both paths and names the one each plan took (a smoke run, not a
    timing)."""
    from mxcore.tools.bench_mx import bench_mx

    rows = bench_mx(sizes=(1024,), dtypes=("mxfp4", "mxfp8+mxfp4"), repeats=2, out=lambda *_: None)
    assert [(r["dtype"], r["path"]) for r in rows] == [("mxfp4", "exact"), ("mxfp4", "decode"),
                                                       ("mxfp8+mxfp4", "exact"), ("mxfp8+mxfp4", "decode")]
    assert "folded into e4m3" in rows[0]["variant"] and rows[0]["folded"] == (1.0, 1.0) and rows[0]["whole"]
    assert "lost bits added back" in rows[2]["variant"] and rows[2]["folded"] is not None
    assert rows[2]["lost"] is not None and rows[2]["lost"][0] >= 0 and rows[2]["lost"][1] == 0
    assert "bf16" in rows[1]["variant"] and all(r["tflops"] > 0 for r in rows)


# ----------------------------------------------------------------------------------------------------------------
# MXFP8 folded with its lost bits kept (gemm_sm90_mx.cu: the fold's lossy mode, mx_lo_fix)
# ----------------------------------------------------------------------------------------------------------------
def _unit(fmt) -> float:
    """The element format's smallest subnormal (e4m3 2^-9, e5m2 2^-16)."""
    return 2.0**-16 if fmt == "mxfp8_e5m2" else 2.0**-9


def _lossy_operand(rng, rows, k, fmt, axis, span=3, spread=(124, 127), p_odd=0.002):
    """Rows (A: axis 1) / columns (B: axis 0) whose blocks' scale codes differ (so a fold shifts the lower blocks
    down by up to 3 binades) and whose elements are multiples of 8 times the format's smallest subnormal (|m| <=
    8 span: exact after any such shift) except a few odd multiples (probability p_odd, |m| <= 7): shifted, those
    leave the grid, so the fold drops bits the GEMM must add back.  Block 0 of every row holds the row's largest
    code.  Every product and partial sum stays exact in fp32 and a 128-K window's sum within the tensor core's
    accumulator."""
    kb = -(-k // 32)
    m = 8 * rng.integers(-span, span + 1, size=(rows, k))
    odd = rng.random((rows, k)) < p_odd
    m = np.where(odd, rng.choice([-7, -5, -3, -1, 1, 3, 5, 7], size=(rows, k)), m)
    sc = rng.integers(spread[0], spread[1] + 1, size=(rows, kb))
    sc[:, 0] = spread[1]
    vals = m * _unit(fmt)
    if axis == 0:
        return _mx(vals.T, sc.T, fmt, 0)
    return _mx(vals, sc, fmt, 1)


def _plain_operand(rng, rows, k, fmt, axis):
    kb = -(-k // 32)
    vals = rng.integers(-2, 3, size=(rows, k)).astype(np.float64)
    sc = rng.integers(126, 129, size=(rows, kb))
    return _mx(vals.T, sc.T, fmt, 0) if axis == 0 else _mx(vals, sc, fmt, 1)


LOSSY_PAIRS = PAIRS + [("mxfp8_e4m3", "mxfp4")]


def _lost_bits_pair(rng, m, n, k, fmts, side):
    """A, B and whether each loses bits in its fold: ``side`` "a" / "b" / "both" (B only where it is mxfp8; with
    "both" the elements are smaller, so that every partial sum stays within the tensor core's accumulator), the
    other operand plain (exact after any shift)."""
    lossy_a = side in ("a", "both")
    lossy_b = side in ("b", "both") and fmts[1].startswith("mxfp8")
    span = 1 if side == "both" else 3
    a = _lossy_operand(rng, m, k, fmts[0], 1, span) if lossy_a else _plain_operand(rng, m, k, fmts[0], 1)
    if lossy_b:
        b = _lossy_operand(rng, n, k, fmts[1], 0, span)
    elif fmts[1].startswith("mxfp8"):
        b = _plain_operand(rng, n, k, fmts[1], 0)
    else:
        b = _exact_operands(rng, 1, n, k, fmts)[1]
    return a, b, lossy_a, lossy_b


@pytest.mark.parametrize("dtype", LOSSY_PAIRS, ids=_id)
@pytest.mark.parametrize("side", ["a", "b", "both"])
@pytest.mark.parametrize("shape", [(200, 300, 1000), (129, 200, 4100), (300, 600, 96)],
                         ids=lambda s: "x".join(map(str, s)))
def test_mxfp8_lost_bits_bit_exact(backend, rng, dtype, side, shape):
    """Operands whose fold drops bits (small odd elements in blocks below the row's largest scale): the lists are
    not empty, no row overflowed, every row folds whole (one factor per row), and the result is bit-exact against
    the reference, i.e. the GEMM added every dropped bit back; fp32 and bf16 outputs."""
    import cupy as cp

    fmts = _fmts(dtype)
    m, n, k = shape
    if side == "both" and k > 512:
        k = 512  # both sides' small elements: keep every partial sum within the tensor core's accumulator
    a, b, lossy_a, lossy_b = _lost_bits_pair(rng, m, n, k, fmts, side)
    for out_dtype in ("float32", "bfloat16"):
        out = poisoned_output(cp, m, n, out_dtype)
        plan = backend.plan(a, b, _dt.resolve(dtype, "sm_90"), out_dtype=out_dtype, out=out, family="wgmma",
                            mx_path="exact")
        assert "lost bits added back" in plan.variant, plan.variant
        plan.gemm()
        np.testing.assert_array_equal(output_values(cp, out, out_dtype), _ref(a, b, dtype, out_dtype))
    for d, lossy in ((plan.da, lossy_a), (plan.db, lossy_b)):
        if d.mx.lo_cnt is None:
            continue
        cnt = cp.asnumpy(d.mx.lo_cnt)
        assert int(d.mx.info[4]) == 0 and int(d.mx.info[3]) == 0 and cnt.max() <= 64
        assert (cnt.sum() > 0) == lossy, cnt.sum()
        if lossy:  # each row's list sorted by k, entries within K
            ent = cp.asnumpy(d.mx.lo_ent)
            r = int(np.argmax(cnt))
            ks = ent[r, :cnt[r], 0]
            assert (np.diff(ks) > 0).all() and ks.min() >= 32 and ks.max() < k, ks


@pytest.mark.parametrize("dtype", ["mxfp8_e4m3", ("mxfp8_e4m3", "mxfp8_e5m2")], ids=_id)
def test_mxfp8_lost_bits_many_per_tile(backend, rng, dtype):
    """More dropped bits in 32 rows of A than mx_lo_fix's shared list of the rows' entries holds (12 per row: 384 >
    FIX_LIST), and in 256 columns of B (the first 128: four per column, 512 > FIX_CLIST) than its list of the
    columns' entries holds, each list within its cap: the rows' entries past the list are read from global memory
    in order, and the columns past the list add their own entries; still bit-exact (fp32 and bf16 outputs)."""
    import cupy as cp

    fmts = _fmts(dtype)
    m, n, k = 96, 300, 512
    a = _lossy_operand(rng, m, k, fmts[0], 1)
    b = _lossy_operand(rng, n, k, fmts[1], 0)
    va, sa = formats.decode(a.codes, a.element), a.scales.copy()
    va[0:64, 128:140] = 3 * _unit(fmts[0])  # block 4: twelve odd elements per row, 2 binades down
    sa[0:64, 4] = sa[0:64, 0] - 2
    a = _mx(va, sa, fmts[0], 1)
    vb, sb = formats.decode(b.codes, b.element), b.scales.copy()  # (k, n), scales (blocks, n)
    vb[256:260, 0:128] = 3 * _unit(fmts[1])  # block 8: four odd elements per column, 2 binades down
    sb[8, 0:128] = sb[0, 0:128] - 2
    b = _mx(vb, sb, fmts[1], 0)
    for out_dtype in ("float32", "bfloat16"):
        got = _run(backend, a, b, dtype, out_dtype)
        np.testing.assert_array_equal(got, _ref(a, b, dtype, out_dtype))
    plan = backend.plan(a, b, _dt.resolve(dtype, "sm_90"), family="wgmma", mx_path="exact")
    cnt = cp.asnumpy(plan.da.mx.lo_cnt)
    assert int(plan.da.mx.info[4]) == 0 and cnt[:32].sum() > 256 and cnt.max() <= 64, cnt[:32]
    cnt_b = cp.asnumpy(plan.db.mx.lo_cnt)
    assert int(plan.db.mx.info[4]) == 0 and cnt_b[:256].sum() > 256 and cnt_b.max() <= 64, cnt_b[:256]


@pytest.mark.parametrize("dtype", ["mxfp8_e4m3", ("mxfp8_e5m2", "mxfp8_e4m3")], ids=_id)
def test_mxfp8_lost_bits_overflow_refolds(backend, rng, dtype):
    """Rows with more dropped bits than a list holds (every element of blocks 7 binades below the row's largest,
    odd): the prep flags the overflow (info[4]) and folds the operand again without loss (lists emptied, blocks of
    different scales per 32-K block): still bit-exact."""
    import cupy as cp

    fmts = _fmts(dtype)
    m, n, k = 150, 200, 512
    a = _lossy_operand(rng, m, k, fmts[0], 1)
    va, sa = formats.decode(a.codes, a.element), a.scales.copy()
    va[7:12, 32:] = 3 * _unit(fmts[0])
    sa[7:12, 1:] = 120
    a = _mx(va, sa, fmts[0], 1)
    b = _plain_operand(rng, n, k, fmts[1], 0)
    got = _run(backend, a, b, dtype)
    np.testing.assert_array_equal(got, _ref(a, b, dtype))
    plan = backend.plan(a, b, _dt.resolve(dtype, "sm_90"), family="wgmma", mx_path="exact")
    assert int(plan.da.mx.info[4]) == 1 and int(cp.asnumpy(plan.da.mx.lo_cnt).sum()) == 0


def test_mxfp8_lost_bits_meet_inf(backend, rng):
    """An e4m3 element whose shifted value truncates to 0 is kept as the smallest subnormal of its sign (its list
    entry the negative rest), so an e5m2 inf in B at that k still gives the reference's signed inf, and the list
    entry is not multiplied by the inf (which would give inf - inf = NaN)."""
    m, n, k = 64, 96, 256
    fmts = ("mxfp8_e4m3", "mxfp8_e5m2")
    va = np.zeros((m, k))
    sa = np.full((m, k // 32), 127)
    va[:, 0] = 1.0
    sa[:, 1] = 117  # block 1: 10 binades below block 0
    va[:, 40] = 2.0**-9 * np.where(np.arange(m) % 2, 1, -1)  # 2^-19 after the shift: below the grid
    vb = np.ones((k, n))
    sb = np.full((k // 32, n), 127)
    b = _mx(vb, sb, fmts[1], 0)
    cb = b.codes.copy()
    pinf = formats.encode(np.array([2.0**16]), "e5m2", overflow="nan")[0]
    cb[40, 5] = pinf
    a, b = _mx(va, sa, fmts[0], 1), MXTensor(cb, b.scales, b.fmt, 0)
    got = _run(backend, a, b, fmts)
    want = _ref(a, b, fmts)
    assert np.isinf(want[:, 5]).all() and (np.sign(want[:, 5]) == np.where(np.arange(m) % 2, 1, -1)).all()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", PAIRS, ids=_id)
def test_mxfp8_heavy_tails_within_bound(backend, rng, dtype):
    """Student-t (3 degrees of freedom) data quantized by quantize_mx: wide scale spreads within rows, many
    dropped bits; within the bound of test_random_normal_within_bound, and the lists were used (not overflowed)."""
    import mxcore

    m, n, k = 256, 384, 4096
    fmts = _fmts(dtype)
    a = mxcore.quantize_mx(rng.standard_t(3, (m, k)).astype(np.float32), fmts[0], axis=1)
    b = mxcore.quantize_mx(rng.standard_t(3, (k, n)).astype(np.float32), fmts[1], axis=0)
    _assert_within_bound(backend, a, b, dtype, k)
    plan = backend.plan(a, b, _dt.resolve(dtype, "sm_90"), family="wgmma", mx_path="exact")
    import cupy as cp

    lost = [int(cp.asnumpy(d.mx.lo_cnt).sum()) for d in (plan.da, plan.db)]
    print(f"lost-bit entries A {lost[0]}, B {lost[1]}; overflow {int(plan.da.mx.info[4])}/{int(plan.db.mx.info[4])}")
    assert sum(lost) > 0 or "mxfp8_e4m3" not in fmts  # e5m2's range keeps t(3) data whole at these spreads


@pytest.mark.parametrize("dtype", ["mxfp8_e4m3", ("mxfp8_e5m2", "mxfp8_e4m3")], ids=_id)
def test_mxfp8_lost_bits_window_tier(backend, rng, dtype):
    """Rows whose scales span more than a whole-row fold allows (27 binades between windows 0 and 1): those rows fold
    per 128-K window (info[3] = 1), so the GEMM promotes per stage and mx_lo_fix adds the lost bits after it, in true
    units with their block factors: bit-exact."""
    import cupy as cp

    fmts = _fmts(dtype)
    m, n, k = 140, 200, 768
    a = _lossy_operand(rng, m, k, fmts[0], 1)
    va, sa = formats.decode(a.codes, a.element), a.scales.copy()
    sa[3:7, 4:] -= 27  # windows 1.. of rows 3..6, 27 binades below window 0
    va[3:7, :128] = 0  # window 0 of those rows sums to exactly 0 (B's rows 0 and 1 equal): the rest stays exact
    va[3:7, 0], va[3:7, 1] = 8 * _unit(fmts[0]), -8 * _unit(fmts[0])
    a = _mx(va, sa, fmts[0], 1)
    b = _plain_operand(rng, n, k, fmts[1], 0)
    vb = formats.decode(b.codes, b.element)
    vb[1] = vb[0]
    b = _mx(vb, b.scales, fmts[1], 0)
    got = _run(backend, a, b, dtype)
    np.testing.assert_array_equal(got, _ref(a, b, dtype))
    plan = backend.plan(a, b, _dt.resolve(dtype, "sm_90"), family="wgmma", mx_path="exact")
    assert int(plan.da.mx.info[3]) == 1 and int(cp.asnumpy(plan.da.mx.lo_cnt).sum()) > 0


@pytest.mark.parametrize("tile", [None, "128x128"])
def test_mxfp8_lost_bits_tiles(backend, rng, tile):
    """A lossy fold's lost bits added by mx_lo_fix after the exact variant's GEMM (its default tile, and 128 x 128):
    bit-exact."""
    m, n, k = 200, 300, 512
    a = _lossy_operand(rng, m, k, "mxfp8_e4m3", 1, span=1)
    b = _lossy_operand(rng, n, k, "mxfp8_e4m3", 0, span=1)
    got = _run(backend, a, b, "mxfp8_e4m3", tile=tile)
    np.testing.assert_array_equal(got, _ref(a, b, "mxfp8_e4m3"))
