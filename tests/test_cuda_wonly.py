"""Weight-only MX on an NVIDIA GPU: fp16/bf16 activations x MX weights on both paths (backends/cuda/wonly/) and
every kernel of the registers path (direct loads, "gemv", with and without programmatic dependent launch on sm_90;
cp.async ring, "ring"; sm_90a's wgmma kernel, "wg", also with its activations by tensor copy, "wg-tma"; each forced
at every M through the backend's ``config=`` option), against the float64 reference.
Every output is poisoned with NaN before the launch.

* exactly representable inputs: bit-exact (the registers path for every pair, any scale codes per column:
  0x00, 0x01, 0x7F, 0xFE; the staged path with scales spanning a few binades), NaN blocks (scale 0xFF) poison
  exactly the columns that read them, K tails, M from 1 to 130 (one m8 tile to several m64 row blocks), split K;
* random MX weights quantized from normal data: within (K + 2) 2^-23 (|A| @ |B|) (+ the output rounding);
* byte codes that are NaN or inf give NaN / inf in exactly their columns, and a weight without them takes the
  wgmma kernel's plain decode with the same bits;
* programmatic dependent launch: a chain of launches, each reading the previous one's output as its activations
  right after a normal kernel poisoned it, gives the bits of the same chain run with a synchronization between
  launches;
* the API: torch CUDA tensors and CuPy arrays, an MXTensor weight reused across calls (its packed form cached),
  device float weights quantized on the GPU, a shared weight under a 3-D batch.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import output_values, poisoned_output

import mxcore
from mxcore import dtypes, formats
from mxcore.mx import MXTensor

pytestmark = pytest.mark.nvidia_gpu

MX = ["mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2"]
ACTS = ["bf16", "fp16"]
SHAPES = [(1, 16, 32), (5, 33, 65), (8, 130, 200), (16, 128, 1000), (37, 200, 96), (64, 256, 512), (130, 72, 160)]


def _act_values(rng, m, k, act, small=False):
    """Exactly representable activations: integers in [-8, 8] times 2^-2 (times 2^-16 when ``small``: then a
    column of 2^127 blocks cannot overflow and one of 2^-127 blocks stays a multiple of 2^-149)."""
    a = rng.integers(-8, 9, (m, k)).astype(np.float64) / 4
    return a * 2.0 ** -14 if small else a


def _mx_weight(rng, k, n, fmt, scale_codes):
    """A host MXTensor (blocks along K) with random codes of magnitude 0 or in [1/4, 8] (at most 4 significant
    bits: with the activations above every partial sum is exact in fp32) and per-column scales drawn from
    ``scale_codes`` (one code for all blocks of a column)."""
    spec = formats.get(dtypes.MX_ELEMENT[dtypes.canonical_operand(fmt)])
    codes = rng.integers(0, 1 << spec.bits, (k, n)).astype(np.uint8)
    vals = np.abs(formats.decode(codes, spec.name).astype(np.float64))
    codes[~((vals >= 0.25) & (vals <= 8))] = 0
    nb = -(-k // 32)
    col = rng.choice(np.asarray(scale_codes, np.uint8), n)
    return MXTensor(codes, np.repeat(col[None, :], nb, axis=0), fmt, 0)


def _plan_out(cuda_backend, a, b, pair, path, out_dtype="float32", **kw):
    import cupy as cp

    out = poisoned_output(cp, a.shape[0], b.shape[1], out_dtype)
    p = cuda_backend.plan(a, b, dtypes.resolve(pair, "sm_90"), out_dtype=out_dtype, out=out, wonly_path=path, **kw)
    p.gemm()
    cp.cuda.get_current_stream().synchronize()
    return output_values(cp, out, out_dtype), p


def _ref(a, b, pair, out_dtype="float32"):
    return mxcore.matmul(a, b, pair, out_dtype=out_dtype, backend="reference").astype(np.float64)


def _device_act(a, act):
    import torch

    return torch.as_tensor(a, device="cuda").to(torch.float16 if act == "fp16" else torch.bfloat16)


KERNELS = ["gemv", "gemv-pdl", "ring", "wg", "wg-tma"]


def _force_kernel(kernel: str) -> dict:
    """The plan options that run the registers path on one kernel whatever M is (``config=``, a kernel form of
    wonly.KERNEL_FORMS): "gemv" (direct loads), "gemv-pdl" (the same launched with programmatic dependent launch,
    sm_90), "ring" (cp.async ring), "wg" (wgmma with the weight as register A, sm_90a, with PDL, the activations
    gathered) or "wg-tma" (the same with the activations by tensor copy from their permuted copy, at every M)."""
    import cupy as cp

    sm90 = cp.cuda.Device().compute_capability == "90"
    if kernel in ("gemv-pdl", "wg", "wg-tma") and not sm90:
        pytest.skip(f"the {kernel} kernel runs on sm_90 only")
    return {"config": kernel}


def _check_kernel(p, kernel: str) -> None:
    """The plan runs the forced kernel, launched with PDL where it should be."""
    name, _, pdl = kernel.partition("-")
    assert "registers" in p.variant and p.variant_.kernel == name, p.variant
    sm90 = p.dev.arch.startswith("sm_90")
    assert p.variant_.pdl == (p._launch.ex is not None) == (sm90 and (name == "wg" or bool(pdl)))
    assert p.variant_.tma_x == (kernel == "wg-tma") == (p._xperm is not None), p.variant


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("fmt", MX)
@pytest.mark.parametrize("act", ACTS)
def test_registers_exact(cuda_backend, rng, act, fmt, shape, kernel):
    kw = _force_kernel(kernel)
    m, n, k = shape
    a = _act_values(rng, m, k, act, small=True)
    b = _mx_weight(rng, k, n, fmt, [0x00, 0x01, 0x7F, 0x80, 0xFE] if fmt == "mxfp4" else [0x70, 0x7F, 0x85])
    got, p = _plan_out(cuda_backend, _device_act(a, act), b.to_device(_device_act(a[:1, :1], act)), (act, fmt),
                       "registers", **kw)
    _check_kernel(p, kernel)
    want = _ref(a, b, (act, fmt))
    assert np.array_equal(got, want, equal_nan=True), (np.nanmax(np.abs(got - want)), p.variant)


@pytest.mark.parametrize("kernel", ["wg", "wg-tma"])
@pytest.mark.parametrize("fmt", MX)
@pytest.mark.parametrize("act", ACTS)
def test_wg_folded_and_fp32_chunks(cuda_backend, rng, act, fmt, kernel):
    """The wgmma kernel decodes a chunk whose every scale code lies in wonly.fold_range straight to scaled 16-bit
    values, any other chunk through the fp32 block-scale path.  Bit-exact on exact inputs with per-column codes at
    both ends of the range and inside it (every chunk folded); within the bound on blocks whose codes vary along K,
    inside the range, and with one 32-K block row of codes outside it (that chunk on the fp32 path, the others
    folded); K tails, M across the wgmma N of 8..32 and row blocks beyond.  M above 32 runs the fold-only build
    (wgmma N = M rounded up to 8) exactly where every code folds."""
    from mxcore.backends.cuda import wonly

    kw = _force_kernel(kernel)
    spec = dtypes.MX_ELEMENT[dtypes.canonical_operand(fmt)]
    lo, hi, _ = wonly.fold_range(spec, "f16" if act == "fp16" else "bf16")
    assert lo <= hi
    inside = np.asarray([lo, hi, (lo + hi) // 2], np.uint8)
    outside = np.asarray([c for c in (lo - 1, hi + 1, 0xFE, 0x00) if 0 <= c <= 0xFE and not lo <= c <= hi], np.uint8)
    for m, n, k in [(5, 160, 200), (16, 256, 1000), (33, 128, 384), (64, 300, 520), (72, 128, 128)]:
        a = _act_values(rng, m, k, act, small=True)
        b = _mx_weight(rng, k, n, fmt, inside)  # one code per column: exact sums
        dev_a = _device_act(a, act)
        got, p = _plan_out(cuda_backend, dev_a, b.to_device(_device_act(a[:1, :1], act)), (act, fmt), "registers", **kw)
        _check_kernel(p, kernel)
        assert p.variant_.fold_only == (m > 32) and p.variant_.mt == min(-(-m // 8), 8), p.variant
        want = _ref(a, b, (act, fmt))
        assert np.array_equal(got, want, equal_nan=True), ("folded", m, n, k, np.nanmax(np.abs(got - want)))
        nb = -(-k // 32)
        scales = rng.choice(inside, (nb, n))
        variants = [("varying", scales)]
        if nb > 2 and outside.size:
            mixed = scales.copy()
            mixed[nb // 2, :] = rng.choice(outside, n)
            variants.append(("mixed", mixed))
        for what, sc in variants:
            w = MXTensor(b.codes, sc, fmt, 0)
            got, p = _plan_out(cuda_backend, dev_a, w.to_device(_device_act(a[:1, :1], act)), (act, fmt), "registers",
                               **kw)
            assert p.variant_.fold_only == (m > 32 and what == "varying"), (what, p.variant)
            wf = mxcore.dequantize(w, dtype=np.float64)
            exact = a @ wf
            bound = (k + 2) * 2.0 ** -23 * (np.abs(a) @ np.abs(wf)) + np.abs(exact) * 2.0 ** -24
            err = np.abs(got - exact)
            assert np.isfinite(got).all() and (err <= bound).all(), (what, m, n, k, float((err / bound).max()))


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e3m2", "mxfp8_e4m3"])
def test_packed_scale_ranges(cuda_backend, rng, fmt):
    """After the records, pack_weight stores each record group's chunk's least and greatest scale code (pad rows and
    blocks: 127), which the wgmma kernel's fold test reads: against the MXTensor's own scales (every code, 0xFF
    included), on a weight whose N and K leave pad rows and blocks."""
    from mxcore.backends.cuda.wonly import records as wr

    kw = _force_kernel("wg")
    m, n, k = 8, 300, 520
    elem = dtypes.MX_ELEMENT[dtypes.canonical_operand(fmt)]
    nb = -(-k // 32)
    sc = rng.integers(0, 256, (nb, n)).astype(np.uint8)
    w = MXTensor(_mx_weight(rng, k, n, fmt, [0x7F]).codes, sc, fmt, 0)
    a = _device_act(_act_values(rng, m, k, "bf16"), "bf16")
    _, p = _plan_out(cuda_backend, a, w.to_device(a), ("bf16", fmt), "registers", **kw)
    _check_kernel(p, "wg")
    kc = wr.chunk_k(elem)
    nchunks, groups, body = -(-k // kc), wr.record_groups(n), wr.packed_bytes(elem, k, n)
    full = np.full((nchunks * kc // 32, groups * 128), 127, np.uint8)
    full[:nb, :n] = sc
    want = full.reshape(nchunks, kc // 32, groups, 128).transpose(2, 0, 1, 3).reshape(groups, nchunks, -1)
    buf = p.db.buf.get()
    assert buf.size == body + 2 * groups * nchunks
    got = buf[body:].reshape(groups, nchunks, 2)
    assert np.array_equal(got[..., 0], want.min(-1)) and np.array_equal(got[..., 1], want.max(-1))
    assert p.db.span == (int(full.min()), int(full.max()))  # what the fold-only rule reads


@pytest.mark.parametrize("kernel", ["wg", "wg-tma"])
@pytest.mark.parametrize("act", ACTS)
def test_wg_fold_only_never_wrong(cuda_backend, rng, act, kernel):
    """The fold-only build (here n40) has no fp32 block-scale path: a chunk whose stored scale-code range leaves
    the fold range (records changed after the plan chose it) turns the columns of its record group into NaN in
    every row, and the other columns keep their exact values."""
    import cupy as cp

    from mxcore.backends.cuda.wonly import records as wr

    kw = _force_kernel(kernel)
    m, n, k, fmt = 40, 384, 520, "mxfp4"
    a = _act_values(rng, m, k, act, small=True)
    b = _mx_weight(rng, k, n, fmt, [0x70, 0x7F])
    dev_a = _device_act(a, act)
    got, p = _plan_out(cuda_backend, dev_a, b.to_device(_device_act(a[:1, :1], act)), (act, fmt), "registers", **kw)
    _check_kernel(p, kernel)
    assert p.variant_.fold_only, p.variant
    want = _ref(a, b, (act, fmt))
    assert np.array_equal(got, want), np.nanmax(np.abs(got - want))
    elem = dtypes.MX_ELEMENT[dtypes.canonical_operand(fmt)]
    nchunks, body = -(-k // wr.chunk_k(elem)), wr.packed_bytes(elem, k, n)
    group, chunk = 1, nchunks - 1  # columns 128..255; the last (partial) chunk
    p.db.buf[body + 2 * (group * nchunks + chunk) + 1] = 0xFF  # its greatest scale code: the NaN scale
    out = p.out
    out.fill(np.float32(7.0))
    p.gemm()
    got = output_values(cp, out, "float32")
    bad = np.zeros(n, bool)
    bad[128:256] = True
    assert np.isnan(got[:, bad]).all() and np.array_equal(got[:, ~bad], want[:, ~bad])


@pytest.mark.parametrize("fmt", MX)
def test_staged_exact_bf16(cuda_backend, rng, fmt):
    for m, n, k in [(3, 40, 70), (200, 300, 257), (512, 1024, 384)]:
        a = _act_values(rng, m, k, "bf16")
        b = _mx_weight(rng, k, n, fmt, [0x78, 0x7F, 0x81])
        got, p = _plan_out(cuda_backend, _device_act(a, "bf16"), b, ("bf16", fmt), "staged")
        assert "registers" not in p.variant
        want = _ref(a, b, ("bf16", fmt))
        assert np.array_equal(got, want, equal_nan=True), (m, n, k, np.nanmax(np.abs(got - want)))


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_bf16_fp8_weights_above_32_rows(cuda_backend, rng, fmt):
    """bf16 x fp8 codes with M in (32, 64] on sm_90 (by the rule, no path forced): the fold-only wgmma build where
    every scale code of the MXTensor folds, the staged bf16 GEMM where one does not (a column of the code above the
    range); both bit-exact on exact inputs, on a host and on a device MXTensor."""
    import cupy as cp

    from mxcore.backends.cuda import wonly

    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the wgmma kernel runs on sm_90 only")
    m, n, k = 40, 4352, 96  # 34 record groups: more than a quarter per SM on 132 SMs
    a = _act_values(rng, m, k, "bf16", small=True)
    dev_a = _device_act(a, "bf16")
    hi = wonly.fold_range(dtypes.MX_ELEMENT[dtypes.canonical_operand(fmt)], "bf16")[1]
    folds = _mx_weight(rng, k, n, fmt, [0x70, 0x7F, hi])
    sc = np.array(folds.scales)
    sc[:, 5] = hi + 1
    apart = MXTensor(folds.codes, sc, fmt, 0)
    for w, fold in ((folds, True), (apart, False), (folds.to_device(dev_a), True), (apart.to_device(dev_a), False)):
        got, p = _plan_out(cuda_backend, dev_a, w, ("bf16", fmt), None)
        assert ("registers" in p.variant and p.variant_.kernel == "wg" and p.variant_.fold_only) == fold, p.variant
        assert fold or "registers" not in p.variant, p.variant
        want = _ref(a, w.to_host(), ("bf16", fmt))
        assert np.array_equal(got, want), (fold, np.nanmax(np.abs(got - want)))


@pytest.mark.parametrize("path", [f"registers-{k}" for k in KERNELS] + ["staged"])
def test_nan_blocks_and_out_dtypes(cuda_backend, rng, path):
    path, _, kernel = path.partition("-")
    kw = _force_kernel(kernel) if kernel else {}
    m, n, k = 9, 48, 130
    a = _act_values(rng, m, k, "bf16", small=True)
    b = _mx_weight(rng, k, n, "mxfp4", [0x7E, 0x7F])
    scales = b.scales.copy()
    scales[1, 5] = 0xFF  # one NaN block: column 5 is NaN for every row
    scales[4, 17] = 0xFF  # the partial last block (K tail)
    b = MXTensor(b.codes, scales, "mxfp4", 0)
    for out_dtype in ("float32", "bfloat16", "float16"):
        got, _ = _plan_out(cuda_backend, _device_act(a, "bf16"), b, ("bf16", "mxfp4"), path, out_dtype, **kw)
        want = _ref(a, b, ("bf16", "mxfp4"), out_dtype)
        assert np.isnan(got[:, [5, 17]]).all() and not np.isnan(np.delete(got, [5, 17], axis=1)).any()
        assert np.array_equal(got, want, equal_nan=True), out_dtype


@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("kernel", ["wg", "gemv", "ring"])
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
@pytest.mark.parametrize("act", ACTS)
def test_special_element_codes(cuda_backend, rng, act, fmt, kernel, m):
    """Byte codes that are NaN (e4m3fn 0x7F / 0xFF, e5m2 0x7D-0x7F) or inf (e5m2 0x7C / 0xFC) give NaN / inf in
    exactly the columns that read them; the packed weight records whether it holds such codes, and the wgmma
    kernel decodes a weight without them through its format's plain twin (no fix), with the same bits."""
    kw = _force_kernel(kernel)
    n, k = 96, 256
    a = np.abs(_act_values(rng, m, k, act, small=True)) + 2.0 ** -16  # every product counts: no 0 * inf
    plain = _mx_weight(rng, k, n, fmt, [0x7F, 0x81])
    codes = plain.codes.copy()
    marks = {3: 0x7F, 40: 0xFF} if fmt == "mxfp8_e4m3" else {3: 0x7C, 40: 0xFC, 77: 0x7E}
    for col, code in marks.items():
        codes[rng.integers(0, k), col] = code
    special = MXTensor(codes, plain.scales, fmt, 0)
    like = _device_act(a[:1, :1], act)
    for b, has in ((plain, False), (special, True)):
        got, p = _plan_out(cuda_backend, _device_act(a, act), b.to_device(like), (act, fmt), "registers", **kw)
        want = _ref(a, b, (act, fmt))
        assert p.db.specials == has
        assert p._plain == (p.variant_.plain_twin and not has), p.variant
        assert np.array_equal(got, want, equal_nan=True), (fmt, has, p.variant)
        bad = ~np.isfinite(got)
        assert bad[:, sorted(marks)].all() == has and not np.delete(bad, sorted(marks), axis=1).any()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e2m3", "mxfp8_e4m3"])
@pytest.mark.parametrize("act", ACTS)
def test_random_within_bound(cuda_backend, rng, act, fmt, kernel):
    kw = _force_kernel(kernel)
    for (m, n, k), split in [((1, 4096, 4096), 0), ((16, 512, 2048), 3), ((64, 384, 1111), 0), ((300, 256, 512), 0)]:
        a = rng.standard_normal((m, k))
        w = rng.standard_normal((k, n))
        b = mxcore.quantize_mx(w, fmt, axis=0)
        got, p = _plan_out(cuda_backend, _device_act(a, act), b, (act, fmt), "registers", split_k=split, **kw)
        _check_kernel(p, kernel)
        a16 = np.asarray(_device_act(a, act).float().cpu(), np.float64)
        bf = mxcore.dequantize(b, dtype=np.float64)
        bound = (k + 2) * 2.0 ** -23 * (np.abs(a16) @ np.abs(bf)) + np.abs(a16 @ bf) * 2.0 ** -24
        err = np.abs(got - a16 @ bf)
        assert (err <= bound).all(), (m, n, k, p.variant, float((err / bound).max()))


@pytest.mark.parametrize("kernel", ["gemv-pdl", "wg", "wg-tma"])
def test_pdl_chain(cuda_backend, rng, kernel):
    """Launches with programmatic dependent launch read their activations only after their predecessor finished: a
    chain x -> y1 -> y2 -> y1 ... (each launch's fp16 output is the next one's activations, read in place, and a
    normal fill poisons y1 with NaN right before the launch that writes it) gives the bits of the same chain with a
    synchronization after every launch; split K (workspace, counters) in every launch."""
    import cupy as cp

    kw = _force_kernel(kernel)
    m, n, k = 4, 2048, 2048
    x = cp.asarray(_act_values(rng, m, k, "fp16").astype(np.float16))
    w1, w2 = (_mx_weight(rng, k, n, "mxfp4", [0x79, 0x7A]).to_device(x) for _ in range(2))
    y1, y2 = cp.empty((m, n), cp.float16), cp.empty((m, n), cp.float16)
    mdt = dtypes.resolve(("fp16", "mxfp4"), "sm_90")
    plans = [cuda_backend.plan(src, w, mdt, out_dtype="float16", out=dst, wonly_path="registers", **kw)
             for src, w, dst in ((x, w1, y1), (y1, w2, y2), (y2, w1, y1))]
    for p, src in zip(plans, (x, y1, y2)):
        _check_kernel(p, kernel)
        assert p.da.buf.data.ptr == src.data.ptr and p._splits > 1, p.variant  # read in place, split K

    def chain(sync: bool):
        for _ in range(8):
            for i, p in enumerate(plans):
                if i != 1:
                    y1.fill(np.nan)  # a normal kernel right before the launch that writes y1
                p.gemm()
                if sync:
                    cp.cuda.get_current_stream().synchronize()
        cp.cuda.get_current_stream().synchronize()
        return cp.asnumpy(y1), cp.asnumpy(y2)

    want = chain(True)
    assert np.isfinite(want[0]).all() and np.isfinite(want[1]).all()
    for _ in range(3):
        got = chain(False)
        assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_api_paths_and_reuse(cuda_backend, rng):
    import cupy as cp
    import torch

    k, n = 256, 192
    w = rng.standard_normal((k, n)).astype(np.float32)
    wq = mxcore.quantize_mx(torch.as_tensor(w, device="cuda"), "mxfp4", axis=0)  # device MXTensor
    for m in (1, 7, 64, 65, 300):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        y = mxcore.matmul(x, wq)  # dtype inferred: (bf16, mxfp4)
        assert isinstance(y, torch.Tensor) and y.shape == (m, n) and y.dtype == torch.float32
        ref = mxcore.matmul(x.float().cpu().numpy(), wq.to_host(), ("bf16", "mxfp4"), backend="reference")
        bound = (k + 2) * 2.0 ** -23 * (np.abs(x.float().cpu().numpy()) @ np.abs(mxcore.dequantize(wq.to_host())))
        assert (np.abs(y.cpu().numpy() - ref) <= bound + 1e-30).all(), m
    # device float weight quantized on the GPU; fp16 activations; CuPy arrays
    xa = cp.asarray(rng.standard_normal((5, k)).astype(np.float16))
    y = mxcore.matmul(xa, cp.asarray(w), ("fp16", "mxfp8"))
    ref = mxcore.matmul(cp.asnumpy(xa), w, ("fp16", "mxfp8"), backend="reference")
    deq = mxcore.dequantize(mxcore.quantize_mx(w, "mxfp8", axis=0), dtype=np.float64)
    bound = (k + 2) * 2.0 ** -23 * (np.abs(cp.asnumpy(xa).astype(np.float64)) @ np.abs(deq)) + np.abs(ref) * 2.0 ** -24
    assert isinstance(y, cp.ndarray) and (np.abs(cp.asnumpy(y) - ref) <= bound).all()
    # a shared weight under a 3-D batch (folded into M)
    xb = torch.randn(3, 4, k, device="cuda", dtype=torch.bfloat16)
    yb = mxcore.matmul(xb, wq)
    y0 = mxcore.matmul(xb.reshape(12, k), wq).reshape(3, 4, n)
    assert torch.equal(yb, y0)
