"""``mxcore.matmul`` as a user calls it with data on the GPU (marker nvidia_gpu), plus the CPU-side input checks.

* No host round trip: for every dtype, with CuPy arrays and with torch CUDA tensors, ``matmul`` returns while the
  stream still runs a spinning kernel launched just before it (any synchronisation or device->host copy of
  stream data inside the call would wait for the spinner), and torch's sync debug mode ("error") raises on any
  torch-side synchronisation; the result then equals the host reference bit for bit (exact inputs).
* Placement: host + device operands, or two GPUs, are a typed DeviceError.
* Batches: (B, M, K) @ (B, K, N) and (B, M, K) @ (K, N) equal the reference element by element; B = 0 is empty.
* Quantize once, multiply many times: a device MXTensor / ScaledTensor is used as it is (quantization is not
  called again), twice with the same result; two such operands keep their plan across calls; an MXTensor with
  block != 32 is refused.
* Non-contiguous and negative-stride device views give the reference's result.
"""

from __future__ import annotations

import numpy as np
import pytest

import mxcore
from conftest import FLOAT_DTYPES, dtype_id
from mxcore.errors import DeviceError, InputTypeError, MXCoreError

FP8_DTYPES = ["fp8", "e5m2", ("e4m3fn", "e5m2")]
MX_DTYPES = ["mxfp8", "mxfp8_e5m2", "mxfp6", "mxfp6_e3m2", "mxfp4", ("mxfp8", "mxfp4")]
ALL_DTYPES = FLOAT_DTYPES + FP8_DTYPES + MX_DTYPES


_id = dtype_id


def _exact(rng, shape):
    """Small integers times powers of two: every product and partial sum is exact in fp32, and every value is
    exactly representable in every format (|x| <= 4: e2m1 holds 0, 0.5 .. 6 with steps that cover these)."""
    ints = rng.integers(-3, 4, size=shape).astype(np.float64)
    return (ints * np.exp2(rng.integers(-1, 1, size=shape))).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------
# CPU: input checks that hold on every path
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["fp32", "tf32", "fp16", "bf16", "fp8", "mxfp4"])
@pytest.mark.parametrize("bad", ["int32", "bool", "complex64", "str"])
def test_non_real_inputs_are_refused_on_every_dtype_path(dtype, bad):
    a = np.ones((4, 8), dtype=bad) if bad != "str" else np.array([["1"] * 8] * 4)
    b = np.ones((8, 3), dtype=np.float32)
    with pytest.raises(InputTypeError, match="dtype"):
        mxcore.matmul(a, b, dtype, backend="reference")
    with pytest.raises(InputTypeError, match="dtype"):
        mxcore.matmul(b.T.copy(), a.T.copy(), dtype, backend="reference")


def test_batch_zero_and_shared_weight_on_the_reference():
    rng = np.random.default_rng(7)
    a, b = _exact(rng, (3, 5, 16)), _exact(rng, (16, 4))
    got = mxcore.matmul(a, b, "fp16", backend="reference")
    assert got.shape == (3, 5, 4)
    for i in range(3):
        np.testing.assert_array_equal(got[i], mxcore.matmul(a[i], b, "fp16", backend="reference"))
    assert mxcore.matmul(a[:0], b, "fp16", backend="reference").shape == (0, 5, 4)
    assert mxcore.matmul(a[:0], np.zeros((0, 16, 4), np.float32), "fp16", backend="reference").shape == (0, 5, 4)


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
gpu = pytest.mark.nvidia_gpu

_SPIN = r"""
extern "C" __global__ void mx_test_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


def _spin(cp, seconds: float, stream):
    kern = cp.RawKernel(_SPIN, "mx_test_spin")
    with stream:
        kern((1,), (1,), (np.uint64(int(seconds * 1e9)),))
        ev = cp.cuda.Event()
        ev.record(stream)
    return ev


def _to_kind(cp, x, kind):
    if kind == "cupy":
        return cp.asarray(x)
    import torch

    return torch.as_tensor(x, device="cuda")


def _host(x):
    from mxcore.arrays import to_numpy

    out = to_numpy(x)
    return out.astype(np.float64)


def _exact_shape(pair: str, per_call: int, n: int | None = None) -> tuple:
    """(m, k, n), multiples of 128, where the MX path rule as it is (families.MX_EXACT_FROM) takes the exact variant
    for a ``pair`` ("mxfp8" | "mixed") with ``per_call`` operands quantized by the call: K at the rule's bound, N =
    ``n`` (None: K), M the fewest rows that reach its M N bound.  Skips where the rule never takes it (the per-call
    paths choose by the rule alone: they take no options)."""
    from mxcore.backends.cuda import families

    bound = families.MX_EXACT_FROM.get((per_call, pair))
    if bound is None:
        pytest.skip(f"the rule never takes the exact MX path for {pair} with {per_call} operand(s) quantized per call")
    up = lambda x: -(-x // 128) * 128  # noqa: E731
    k = up(bound[0])
    n = k if n is None else n
    m = up(-(-bound[1] // n))
    assert families.exact_pays((1, m, n, k), per_call, pair)
    return m, k, n


@gpu
@pytest.mark.parametrize("kind", ["cupy", "torch"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_id)
def test_device_inputs_never_touch_the_host(cupy_device, kind, dtype):
    import cupy as cp

    if kind == "torch":
        torch = pytest.importorskip("torch")
        from mxcore.backends.cuda.device import external_stream  # (cupy.cuda.ExternalStream is deprecated)

        stream = external_stream(cp, torch.cuda.current_stream().cuda_stream)
    else:
        stream = cp.cuda.get_current_stream()
    rng = np.random.default_rng(11)
    a_h, b_h = _exact(rng, (96, 256)), _exact(rng, (256, 80))
    want = mxcore.matmul(a_h, b_h, dtype, backend="reference")
    a, b = _to_kind(cp, a_h, kind), _to_kind(cp, b_h, kind)
    mxcore.matmul(a, b, dtype, backend="cuda")  # warm-up: compiles and caches kernels, allocates the pools
    stream.synchronize()
    done = _spin(cp, 0.5, stream)
    if kind == "torch":
        import warnings

        import torch

        with warnings.catch_warnings():  # torch warns that the mode is a prototype
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode("error")
        try:
            got = mxcore.matmul(a, b, dtype, backend="cuda")
        finally:
            torch.cuda.set_sync_debug_mode("default")
    else:
        got = mxcore.matmul(a, b, dtype, backend="cuda")
    assert not done.done, "matmul waited for the stream: a synchronisation or device->host copy happened"
    stream.synchronize()
    assert type(got).__module__.split(".")[0] == kind
    np.testing.assert_array_equal(_host(got), want.astype(np.float64))


@gpu
def test_host_and_device_operands_are_a_device_error(cupy_device):
    import cupy as cp

    a = np.ones((8, 16), np.float32)
    with pytest.raises(DeviceError, match="host"):
        mxcore.matmul(a, cp.ones((16, 4), cp.float32), "fp16", backend="cuda")
    with pytest.raises(DeviceError, match="host"):
        mxcore.matmul(cp.asarray(a), np.ones((16, 4), np.float32), "mxfp8", backend="cuda")


@gpu
def test_operands_on_two_gpus_are_a_device_error(cupy_device):
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    a = cp.ones((8, 16), cp.float32)
    with cp.cuda.Device(1):
        b = cp.ones((16, 4), cp.float32)
    with pytest.raises(DeviceError, match="GPU 0.*GPU 1"):
        mxcore.matmul(a, b, "fp16", backend="cuda")


@gpu
def test_second_gpu_computes_there(cupy_device):
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    a_h, b_h = _exact(rng, (64, 128)), _exact(rng, (128, 32))
    for dtype in ("fp16", "bf16", "fp8", "mxfp4"):
        want = mxcore.matmul(a_h, b_h, dtype, backend="reference")
        got = mxcore.matmul(torch.as_tensor(a_h, device="cuda:1"), torch.as_tensor(b_h, device="cuda:1"), dtype,
                            backend="cuda")
        assert got.device.index == 1
        np.testing.assert_array_equal(_host(got), want)
        with cp.cuda.Device(1):
            got = mxcore.matmul(cp.asarray(a_h), cp.asarray(b_h), dtype, backend="cuda")
        assert got.device.id == 1
        np.testing.assert_array_equal(_host(got), want)


@gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "tf32", "fp8", "mxfp8", "mxfp4", ("mxfp8", "mxfp4")], ids=_id)
@pytest.mark.parametrize("shared", [False, True], ids=["batched_b", "shared_b"])
def test_batched(cupy_device, dtype, shared):
    import cupy as cp

    rng = np.random.default_rng(5)
    bsz, m, n, k = 5, 33, 70, 96
    a_h = _exact(rng, (bsz, m, k))
    b_h = _exact(rng, (k, n) if shared else (bsz, k, n))
    got = cp.asnumpy(mxcore.matmul(cp.asarray(a_h), cp.asarray(b_h), dtype, backend="cuda"))
    assert got.shape == (bsz, m, n)
    for i in range(bsz):
        want = mxcore.matmul(a_h[i], b_h if shared else b_h[i], dtype, backend="reference")
        np.testing.assert_array_equal(got[i], want)
    empty = mxcore.matmul(cp.asarray(a_h[:0]), cp.asarray(b_h if shared else b_h[:0]), dtype, backend="cuda")
    assert empty.shape == (0, m, n)


@gpu
@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "fp8"])
def test_quantize_once_multiply_many(cupy_device, monkeypatch, fmt):
    import cupy as cp

    from mxcore import mx

    rng = np.random.default_rng(9)
    a_h, w_h = _exact(rng, (48, 128)), _exact(rng, (128, 40))
    w = cp.asarray(w_h)
    qw = mx.quantize_tensor(w, "e4m3fn") if fmt == "fp8" else mx.quantize_mx(w, fmt, axis=0)
    assert type(qw.codes).__module__.startswith("cupy"), "device quantization must keep the codes on the GPU"
    want = mxcore.matmul(a_h, w_h, fmt, backend="reference")
    calls = []
    real_mx, real_t = mx.quantize_mx, mx.quantize_tensor

    def count_mx(x, *args, **kw):
        calls.append(type(x).__name__)
        return real_mx(x, *args, **kw)

    def count_t(x, *args, **kw):
        calls.append(type(x).__name__)
        return real_t(x, *args, **kw)

    monkeypatch.setattr(mx, "quantize_mx", count_mx)
    monkeypatch.setattr(mx, "quantize_tensor", count_t)
    for _ in range(2):
        got = mxcore.matmul(cp.asarray(a_h), qw, fmt, backend="cuda")
        np.testing.assert_array_equal(cp.asnumpy(got), want)
    # only the activations are quantized: the first call in Python (recorded), the second by the kept replay
    assert calls and set(calls) == {"ndarray"} and len(calls) <= 2, f"only the activations are quantized: {calls}"


@gpu
@pytest.mark.parametrize("kind", ["cupy", "torch"])
@pytest.mark.parametrize("dtype", ["fp8", ("e4m3fn", "e5m2"), "mxfp8", "mxfp6", "mxfp4", ("mxfp8", "mxfp4")], ids=_id)
def test_repeated_calls_replay_the_same_numerics(cupy_device, kind, dtype):
    """Back-to-back calls with fresh device float inputs of one layout take the backend's cached per-call path
    (quantization replayed into kept buffers, staging replayed or re-run, GEMM into a new output): each result equals
    the uncached path (quantize to device objects, then matmul) bit for bit, for several inputs in a row, input
    dtypes float16/bfloat16/float32, both output precisions, shapes on both kernel families; outputs of earlier
    calls are not overwritten by later ones."""
    import cupy as cp

    from mxcore import dtypes as _dt
    from mxcore import mx

    if kind == "torch":
        torch = pytest.importorskip("torch")
    from mxcore.backends import get

    be = get("cuda")
    rng = np.random.default_rng(5)
    from mxcore.backends.codec import Replay

    for (m, k, n), in_dt, out_dt in (((96, 256, 80), "float32", "float32"), ((256, 512, 384), "float16", "float32"),
                                     ((128, 320, 256), "bfloat16", "bfloat16"), ((1024, 512, 2304), "float16",
                                                                                  "float32")):
        if kind == "cupy" and in_dt == "bfloat16":
            continue
        mdt = _dt.resolve(dtype, be.target().arch)
        results = []
        for _ in range(3):
            a_h = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-8, 8)
            b_h = rng.standard_normal((k, n)) * 2.0 ** rng.integers(-8, 8)
            if kind == "torch":
                tdt = getattr(torch, in_dt)
                a, b = (torch.as_tensor(x, device="cuda").to(tdt) for x in (a_h, b_h))
            else:
                a, b = (cp.asarray(x.astype(in_dt)) for x in (a_h, b_h))
            got = mxcore.matmul(a, b, dtype, out_dtype=out_dt, backend="cuda")
            if mdt.kind == "mx":
                qa, qb = mx.quantize_mx(a, mdt.a.name, axis=1), mx.quantize_mx(b, mdt.b.name, axis=0)
            else:
                qa, qb = mx.quantize_tensor(a, mdt.a.element), mx.quantize_tensor(b, mdt.b.element)
            want = be.matmul(qa, qb, mdt, out_dtype=out_dt)  # the uncached path
            results.append((got, _host(want)))
        for got, want in results:  # checked after all calls: a later call must not overwrite an earlier output
            np.testing.assert_array_equal(_host(got), want)
    # the staging replays too (no Python staging per call) wherever it made no copy of its own
    assert any(isinstance(e, tuple) and len(e) == 3 and isinstance(e[2], Replay) for e in be._fast.values())


@gpu
@pytest.mark.parametrize("kind", ["cupy", "torch"])
@pytest.mark.parametrize("dtype", ["fp8", "mxfp8", "mxfp4", ("mxfp8", "mxfp4"), ("bf16", "mxfp4"), ("fp16", "mxfp8")],
                         ids=_id)
def test_weight_quantized_once_replays(cupy_device, kind, dtype):
    """The linear-layer call, float device activations x a device weight quantized once (``fast_weight``): a
    weight's first call runs the generic path (staging it once), the layout's next call records, later ones replay
    (or, weight-only, relaunch the packed kernel with new addresses), switching between the weights of one layout
    (two layers).  Every call equals the uncached path (the backend's own matmul of the quantized operands) bit for
    bit, for fresh activations each call, shapes on both GEMM families and both weight-only paths; earlier outputs
    are not overwritten; one entry serves both weights and keeps neither alive."""
    import gc
    import weakref

    import cupy as cp

    from mxcore import dtypes as _dt
    from mxcore import mx

    torch = pytest.importorskip("torch") if kind == "torch" else None
    from mxcore.backends import get

    be = get("cuda")
    mdt = _dt.resolve(dtype, be.target().arch)
    wonly = mdt.kind == _dt.WONLY_KIND
    rng = np.random.default_rng(11)
    shapes = ((1, 512, 256), (16, 256, 384), (64, 256, 384)) if wonly else ((96, 256, 80), (1024, 512, 2304))
    in_dt = {"bf16": "bfloat16", "fp16": "float16"}.get(mdt.a.name, "float16")
    for m, k, n in shapes:
        ws = []
        for _ in range(2):
            w_h = rng.standard_normal((k, n)) * 2.0 ** rng.integers(-4, 4)
            w = cp.asarray(w_h.astype(np.float32)) if kind == "cupy" else torch.as_tensor(w_h, device="cuda").float()
            ws.append(mx.quantize_tensor(w, mdt.b.element) if mdt.b.kind == "fp8" else mx.quantize_mx(w, mdt.b.name,
                                                                                                      axis=0))
        results = []
        for which in (0, 0, 0, 1, 1, 1, 0):  # per weight: seen, recorded, replayed (then replayed after the other)
            w = ws[which]
            a_h = (rng.standard_normal((m, k)) * 2.0 ** rng.integers(-8, 8)).astype(np.float32)
            if kind == "cupy" and in_dt == "bfloat16":
                a = cp.asarray(a_h)
            elif kind == "cupy":
                a = cp.asarray(a_h.astype(in_dt))
            else:
                a = torch.as_tensor(a_h, device="cuda").to(getattr(torch, in_dt))
            got = mxcore.matmul(a, w, dtype, out_dtype="float32", backend="cuda")
            qa = a if wonly else (mx.quantize_tensor(a, mdt.a.element) if mdt.a.kind == "fp8"
                                  else mx.quantize_mx(a, mdt.a.name, axis=1))
            results.append((got, _host(be.matmul(qa, w, mdt, out_dtype="float32"))))
        for got, want in results:
            np.testing.assert_array_equal(_host(got), want)
        mine = [e for key, e in be._fast.items()  # this test's layout (the cache holds other tests' entries too)
                if key[:2] == ("w", kind) and key[5] == (m, k) and key[9] == (k, n) and key[10] == mdt.name]
        if wonly and kind == "cupy" and in_dt == "bfloat16":  # float32 activations rounded by the staging: generic
            assert mine == [False], mine
        else:
            assert len(mine) == 1 and isinstance(mine[0], tuple), f"not kept for {m}x{k}: {mine}"
        refs = [weakref.ref(x) for x in ws]
        del ws, w, results, got
        gc.collect()
        assert all(r() is None for r in refs), "the kept entry holds a weight alive"


@gpu
def test_kept_wonly_layout_swaps_in_only_weights_its_kernel_takes(cupy_device):
    """A kept weight-only layout whose plan runs the fold-only wgmma build (M above 32, every scale code of its
    first weight folds) relaunches for another weight only when that one folds too; a weight with a code outside
    the fold range goes the generic way (the fp32 block-scale path): every call equals the uncached path bit for
    bit and none gives NaN."""
    import cupy as cp

    from mxcore import dtypes as _dt
    from mxcore import mx
    from mxcore.backends import get
    from mxcore.backends.cuda import wonly
    from mxcore.mx import MXTensor

    torch = pytest.importorskip("torch")
    be = get("cuda")
    if be.target().arch != "sm_90":
        pytest.skip("the wgmma kernel runs on sm_90")
    mdt = _dt.resolve(("bf16", "mxfp4"), "sm_90")
    m, k, n = 40, 256, 4352  # 34 record groups: the wgmma kernel on 132 SMs
    rng = np.random.default_rng(5)
    folds = mx.quantize_mx(cp.asarray(rng.standard_normal((k, n)).astype(np.float32)), "mxfp4", axis=0)
    host = folds.to_host()
    sc = np.array(host.scales)
    sc[:, 7] = wonly.fold_range("e2m1", "bf16")[1] + 1  # 2^2: outside the fold range, no overflow
    apart = MXTensor(host.codes, sc, "mxfp4", 0).to_device(folds.codes)
    assert not wonly.mx_weight_folds(apart, "bf16", "e2m1") and wonly.mx_weight_folds(folds, "bf16", "e2m1")
    for which in (folds, folds, folds, apart, apart, folds, apart):  # seen, recorded, kept; the other; back
        ta = torch.as_tensor(rng.standard_normal((m, k)), device="cuda").to(torch.bfloat16)
        got = _host(mxcore.matmul(ta, which, ("bf16", "mxfp4"), out_dtype="float32", backend="cuda"))
        want = _host(be.matmul(ta, which, mdt, out_dtype="float32"))
        assert np.isfinite(got).all() and np.array_equal(got, want)
    mine = [e for key, e in be._fast.items() if key[:2] == ("w", "torch") and key[5] == (m, k) and key[9] == (k, n)
            and key[10] == mdt.name]
    assert len(mine) == 1 and isinstance(mine[0], tuple) and mine[0][1].variant_.fold_only, mine


def test_operands_quantized_by_the_call_are_marked():
    """The MX path rule weighs per-call staging by the operands a call quantized itself: quantize_on_device marks
    what it makes from float data (and a batch element of a marked batch is marked); a caller's quantized
    objects pass through unmarked."""
    from mxcore import dtypes as _dt
    from mxcore import mx, operands
    from mxcore.backends.cuda.backend import _item

    x = np.ones((2, 8, 64), np.float32)
    for name in ("mxfp8", "fp8"):
        od = _dt.resolve(name, "sm_90").a
        q = operands.quantize_on_device(x[0], od, "a")
        assert operands.made_per_call(q)
        user = mx.quantize_mx(x[0], "mxfp8", axis=1) if name == "mxfp8" else mx.quantize_tensor(x[0], "e4m3fn")
        assert operands.quantize_on_device(user, od, "a") is user and not operands.made_per_call(user)
    qb = operands.quantize_on_device(x, _dt.resolve("mxfp8", "sm_90").a, "a", batched=True)
    assert operands.made_per_call(qb) and operands.made_per_call(_item(qb, 1))
    assert not operands.made_per_call(_item(mx.quantize_mx(x, "mxfp8", axis=2), 1))
    assert not operands.made_per_call(x) and not operands.made_per_call(3)


def test_exact_path_bounds():
    """The MX path rule's bounds (families.exact_pays over a given table): the exact variant from K and M N at the
    bounds of the (per_call, pair) entry, decoding below either, for no shape, and where the entry is None or
    missing."""
    from mxcore.backends.cuda import families

    m, n, k = 2048, 2048, 512
    table = {(0, "mxfp8"): (k, m * n), (1, "mxfp8"): None}
    assert families.exact_pays((1, m, n, k), 0, "mxfp8", table)
    assert families.exact_pays((1, m, n + 128, k + 32), 0, "mxfp8", table)
    assert not families.exact_pays((1, m, n, k - 32), 0, "mxfp8", table)
    assert not families.exact_pays((1, m, n - 1, k), 0, "mxfp8", table)
    assert not families.exact_pays(None, 0, "mxfp8", table)
    assert not families.exact_pays((1, m, n, k), 1, "mxfp8", table)
    assert not families.exact_pays((1, m, n, k), 0, "mixed", table)
    assert families.exact_pays((1, m, n, k), 2, "mixed") == families.exact_pays((1, m, n, k), 2, "mixed",
                                                                                  families.MX_EXACT_FROM)


@gpu
def test_rule_agrees_between_a_weights_first_call_and_its_kept_layout(cupy_device, monkeypatch):
    """At a shape where the rule's bounds (families.MX_EXACT_FROM, as they are) take the exact MX path only for two
    quantized objects of the caller: float activations x a weight quantized once decode both on the weight's first
    (generic) call and in the kept layout, so the layout is kept and serves a second weight (each call equal to the
    uncached decode path bit for bit); two quantized objects take the exact path (sm_90, wgmma)."""
    import cupy as cp

    from mxcore import dtypes as _dt
    from mxcore import mx
    from mxcore.backends import get
    from mxcore.backends.cuda import families

    be = get("cuda")
    if be.target().arch != "sm_90":
        pytest.skip("the exact MX path runs on sm_90")
    m, k, n = _exact_shape("mxfp8", 0, n=8192)  # two quantized objects: the exact path
    if families.exact_pays((1, m, n, k), 1, "mxfp8"):
        pytest.skip("the rule's bounds take the exact MX path for float activations at this shape too")
    from mxcore.backends.cuda.callcache import CallCache

    monkeypatch.setattr(be, "_fast", CallCache())  # this test's entries only (a layout kept by another test serves it)
    mdt = _dt.resolve("mxfp8", be.target().arch)
    rng = np.random.default_rng(17)
    ws = [mx.quantize_mx(cp.asarray(rng.standard_normal((k, n)).astype(np.float32)), "mxfp8", axis=0)
          for _ in range(2)]
    for which in (0, 0, 1, 1, 0):
        a = cp.asarray(rng.standard_normal((m, k)).astype(np.float16))
        got = mxcore.matmul(a, ws[which], "mxfp8", backend="cuda")
        want = be.matmul(mx.quantize_mx(a, "mxfp8", axis=1), ws[which], mdt, mx_path="decode")
        np.testing.assert_array_equal(_host(got), _host(want))
    mine = [e for key, e in be._fast.items() if key[0] == "w"]
    assert len(mine) == 1 and isinstance(mine[0], tuple), mine
    assert "_mx32" not in mine[0][1].variant, mine[0][1].variant
    qa = mx.quantize_mx(a, "mxfp8", axis=1)
    for _ in range(2):
        mxcore.matmul(qa, ws[0], "mxfp8", backend="cuda")
    pair = [e for key, e in be._fast.items() if key[0] == "qq"]
    assert len(pair) == 1 and isinstance(pair[0], tuple) and "_mx32" in pair[0][0].variant, pair


@gpu
@pytest.mark.parametrize("kind", ["cupy", "torch"])
@pytest.mark.parametrize("dtype", ["fp8", "mxfp8", "mxfp4", ("mxfp8", "mxfp4"), "mxfp8-exact", "mxfp8+mxfp4-exact"],
                         ids=_id)
def test_two_operands_quantized_once_keep_the_plan(cupy_device, monkeypatch, kind, dtype):
    """Two device operands quantized once (``fast_pair``): an operand's first call runs the generic path (staging
    it once), the layout's first call with both staged keeps the plan, later calls point it at their staged
    operands and launch into a new output, switching between two A's and two B's of one layout.  Every call equals
    the uncached path (the backend's own matmul of the same objects, a plan each) bit for bit; earlier outputs are
    not overwritten; a kept call builds no plan; one entry serves all four operands and keeps none alive.
    "-exact": the exact MX path on sm_90 (the lossy fold, the GEMM, mx_lo_fix), whose kept plan is rebound, at a
    shape where the rule takes it (these calls take no options)."""
    import gc
    import weakref

    import cupy as cp

    from mxcore import dtypes as _dt
    from mxcore import mx
    from mxcore.backends import get

    torch = pytest.importorskip("torch") if kind == "torch" else None
    be = get("cuda")
    exact = isinstance(dtype, str) and dtype.endswith("-exact")
    if exact:
        if be.target().arch != "sm_90":
            pytest.skip("the exact MX path runs on sm_90")
        dtype = dtype[:-len("-exact")]
        dtype = tuple(dtype.split("+")) if "+" in dtype else dtype
        exact_mkn = _exact_shape("mxfp8" if dtype == "mxfp8" else "mixed", 0, n=8704)  # the rule takes the exact path
    from mxcore.backends.cuda.callcache import CallCache

    monkeypatch.setattr(be, "_fast", CallCache())  # this test's entries only
    mdt = _dt.resolve(dtype, be.target().arch)
    rng = np.random.default_rng(13)

    def quantized(shape, role):
        x_h = rng.standard_normal(shape) * 2.0 ** rng.integers(-6, 6)
        x = cp.asarray(x_h.astype(np.float32)) if kind == "cupy" else torch.as_tensor(x_h, device="cuda").float()
        od = mdt.a if role == "a" else mdt.b
        return mx.quantize_tensor(x, od.element) if od.kind == "fp8" else mx.quantize_mx(x, od.name,
                                                                                       axis=1 if role == "a" else 0)

    cases = [(exact_mkn, "float32")] if exact else [((96, 256, 80), "float32"), ((96, 256, 80), "bfloat16"),
                                                             ((1024, 512, 2304), "float32")]
    for (m, k, n), od in cases:
        As, Bs = [quantized((m, k), "a") for _ in range(2)], [quantized((k, n), "b") for _ in range(2)]
        results = []
        for i, j in ((0, 0), (0, 0), (0, 0), (1, 0), (1, 1), (0, 1), (1, 1)):  # seen, kept, relaunched, new ones
            got = mxcore.matmul(As[i], Bs[j], dtype, out_dtype=od, backend="cuda")
            results.append((got, _host(be.matmul(As[i], Bs[j], mdt, out_dtype=od))))
        real_plan = be.plan

        def no_plan(*args, **kw):
            raise AssertionError("a kept layout built a plan")

        monkeypatch.setattr(be, "plan", no_plan)
        got = mxcore.matmul(As[1], Bs[0], dtype, out_dtype=od, backend="cuda")
        monkeypatch.setattr(be, "plan", real_plan)
        results.append((got, _host(be.matmul(As[1], Bs[0], mdt, out_dtype=od))))
        for got, want in results:  # checked after all calls: a later call must not overwrite an earlier output
            assert type(got).__module__.split(".")[0] == ("torch" if kind == "torch" else "cupy")
            np.testing.assert_array_equal(_host(got), want)
        mine = [e for key, e in be._fast.items()
                if key[0] == "qq" and key[5] == (m, k) and key[8] == (k, n) and key[9] == mdt.name and key[10] == od]
        assert len(mine) == 1 and isinstance(mine[0], tuple), f"not kept for {m}x{k}x{n}: {mine}"
        if exact:
            assert "_mx32" in mine[0][0].variant, mine[0][0].variant
        refs = [weakref.ref(x) for x in As + Bs]
        del As, Bs, results, got
        gc.collect()
        assert all(r() is None for r in refs), "the kept entry holds an operand alive"


@gpu
@pytest.mark.parametrize("dtype", [("bf16", "mxfp4"), ("bf16", "mxfp8"), "fp8", "mxfp8", "mxfp8-exact",
                                   "mxfp8+mxfp4-exact", "mxfp4", "bf16"], ids=_id)
@pytest.mark.parametrize("m", [1, 16, 256])
def test_linear_calls_capture_in_a_cuda_graph(cupy_device, dtype, m):
    """A region of linear calls (two layers, two weights; quantized once where the dtype is quantized) whose layouts
    ran on a stream (seen, kept, replayed) is captured on it into a torch CUDA graph.  Each replay on new
    activations (copied into the graph's input) equals the same calls made eagerly on that data bit for bit, also
    after an eviction of the backend's per-call cache (the graph's entries are pinned); M = 256 takes the weight-only
    pairs' staged path; "-exact" takes the exact MX path on sm_90 (the lossy fold, the GEMM, then mx_lo_fix by
    programmatic dependent launch; K = N and M at the rule's bounds for float activations, where it takes that
    path by itself: these calls take no options), whose staging the kept entries replay (with mxfp4 weights too:
    their fold writes the transposed elements mx_lo_fix reads).  A layout not warmed up on the capture stream is a
    typed error raised before anything is enqueued, not a broken capture."""
    import warnings

    torch = pytest.importorskip("torch")
    from mxcore import dtypes as _dt
    from mxcore.backends import get
    from mxcore.errors import UnsupportedError

    be = get("cuda")
    exact = isinstance(dtype, str) and dtype.endswith("-exact")
    if exact:
        if be.target().arch != "sm_90" or m != 256:
            pytest.skip("the exact MX path runs on sm_90, at the rule's own shape (once: the M = 256 case)")
        dtype = dtype[:-len("-exact")]
        dtype = tuple(dtype.split("+")) if "+" in dtype else dtype
        # float activations x weights quantized once, both layers (N = K) where the rule takes the exact path
        m, k, n = _exact_shape("mxfp8" if dtype == "mxfp8" else "mixed", 1)
    mdt = _dt.resolve(dtype, be.target().arch)
    quantized = mdt.kind != "float"
    act = torch.bfloat16
    if not exact:
        k, n = 512, 384
    gen = torch.Generator(device="cuda").manual_seed(5)

    def weight(rows, cols):
        w = torch.randn(rows, cols, device="cuda", generator=gen) * 0.5
        if not quantized:
            return w.to(act)
        if mdt.b.kind == "fp8":
            return mxcore.quantize_tensor(w, mdt.b.element)
        return mxcore.quantize_mx(w, mdt.b.name, axis=0)

    w1, w2 = weight(k, n), weight(n, k)
    x = torch.empty(m, k, device="cuda", dtype=act)  # the graph's input

    def layers():
        h = mxcore.matmul(x, w1, dtype, out_dtype="bfloat16", backend="cuda")
        return mxcore.matmul(h, w2, dtype, out_dtype="float32", backend="cuda")

    def refused():
        g = torch.cuda.CUDAGraph()
        with warnings.catch_warnings():  # torch warns that the (empty) graph is empty
            warnings.simplefilter("ignore")
            with pytest.raises(UnsupportedError, match="CUDA graph"):
                with torch.cuda.graph(g, stream=s):
                    layers()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        refused()  # not warmed up on s
        for _ in range(3):  # seen, kept, replayed
            x.copy_(torch.randn(m, k, device="cuda", generator=gen))
            layers()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            y = layers()
        if exact:  # the kept plans: the exact variant with lost bits added back (mx_lo_fix in the graph), staging
            kept = [e for e in be._fast.values() if isinstance(e, tuple)]  # replayed (no lazy copy made per call)
            mine = [e for e in kept if "lost bits added back" in getattr(e[1], "variant", "")]
            assert mine and all(e[2] is not None for e in mine), [(getattr(e[1], "variant", ""), e[2]) for e in kept]
        be._fast.clear()  # an eviction: the captured entries stay pinned
        for scale in (1.0, 4.0, 0.25):
            x.copy_(torch.randn(m, k, device="cuda", generator=gen) * scale)
            y.fill_(float("nan"))
            g.replay()
            got = y.clone()
            want = layers()  # eager, same stream, same data (the evicted layouts are built again)
            s.synchronize()
            assert not torch.isnan(got).any()
            assert torch.equal(got, want), (got - want).abs().max()
    torch.cuda.current_stream().wait_stream(s)


@gpu
@pytest.mark.parametrize("kind", ["cupy", "torch"])
@pytest.mark.parametrize("mnk", [(1024, 2304, 256), (1, 16896, 128)], ids=["wide", "swapped"])
def test_float_calls_on_wgmma_relaunch(cupy_device, kind, mnk):
    """fp16/bf16 device operands whose problem runs on the wgmma family (``fast_call``'s "sm90" entry): later calls
    encode the operand maps for the new addresses and launch the kept plan; each equals a fresh plan's result bit for
    bit (new data each call, earlier results untouched), the entry holds no operand or result alive, and a CUDA
    graph captured on the stream replays it on new data."""
    import gc
    import weakref

    import cupy as cp

    from mxcore import dtypes as _dt
    from mxcore.backends import get
    from mxcore.backends.cuda.device import torch_stream

    if get("cuda").target().arch != "sm_90":
        pytest.skip("the wgmma family runs on sm_90")
    torch = pytest.importorskip("torch") if kind == "torch" else None
    be = get("cuda")
    m, n, k = mnk
    dtype = "bf16" if kind == "torch" else "fp16"
    mdt = _dt.resolve(dtype, be.target().arch)
    rng = np.random.default_rng(3)

    def operands():
        a, b = _exact(rng, (m, k)), _exact(rng, (k, n))
        if kind == "cupy":
            return cp.asarray(a.astype(np.float16)), cp.asarray(b.astype(np.float16))
        return tuple(torch.as_tensor(x, device="cuda").to(torch.bfloat16) for x in (a, b))

    results = []
    for _ in range(4):  # built, then relaunched
        a, b = operands()
        got = mxcore.matmul(a, b, dtype, backend="cuda")
        p = be.plan(a, b, mdt)
        p.gemm()
        results.append((got, _host(p.result()), weakref.ref(a)))
        assert "wgmma" in p.variant, p.variant
    for got, want, _ in results:
        np.testing.assert_array_equal(_host(got), want)
    stream = torch_stream(torch, 0) if kind == "torch" else cp.cuda.get_current_stream().ptr
    mine = [e for key, e in be._fast.items() if key[0] == kind and key[3] == stream and key[6] == (m, k)]
    assert len(mine) == 1 and mine[0] and mine[0][0] == "sm90", mine
    refs = [r for _, _, r in results]
    del results, got, a, b, p
    gc.collect()
    assert all(r() is None for r in refs), "the kept plan holds an operand alive"
    if kind == "torch":  # captured on the stream it ran on (the key holds the stream): replays on new data
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            a, b = operands()
            x, w = a.clone(), b.clone()
            for _ in range(2):
                mxcore.matmul(x, w, dtype, backend="cuda")
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                y = mxcore.matmul(x, w, dtype, backend="cuda")
            for _ in range(2):
                a, b = operands()
                x.copy_(a)
                w.copy_(b)
                y.fill_(float("nan"))
                g.replay()
                s.synchronize()
                np.testing.assert_array_equal(_host(y), _host(mxcore.matmul(a, b, dtype, backend="cuda")))
        torch.cuda.current_stream().wait_stream(s)


@gpu
def test_mx_block_other_than_32_is_refused(cupy_device):
    import cupy as cp

    from mxcore import mx

    w = cp.asarray(np.ones((64, 16), np.float32))
    q = mx.quantize_mx(w, "mxfp8", axis=0, block=16)
    with pytest.raises(MXCoreError, match="32"):
        mxcore.matmul(cp.ones((8, 64), cp.float32), q, "mxfp8", backend="cuda")


@gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp8", "mxfp4"])
def test_strided_and_negative_stride_views(cupy_device, dtype):
    import cupy as cp

    rng = np.random.default_rng(13)
    a_big, b_big = _exact(rng, (80, 2 * 96)), _exact(rng, (96, 50))
    cases = [(lambda x: x[:, ::2], lambda y: y), (lambda x: x[::-1, ::2], lambda y: y[:, ::-1]),
             (lambda x: x[:, ::2].T.copy().T, lambda y: y[::-1])]
    for fa, fb in cases:
        a_h, b_h = np.ascontiguousarray(fa(a_big)), np.ascontiguousarray(fb(b_big))
        got = mxcore.matmul(fa(cp.asarray(a_big)), fb(cp.asarray(b_big)), dtype, backend="cuda")
        np.testing.assert_array_equal(cp.asnumpy(got), mxcore.matmul(a_h, b_h, dtype, backend="reference"))


@gpu
@pytest.mark.parametrize("dtype", [("bf16", "mxfp4"), ("bf16", "mxfp8"), "fp8", "mxfp4"], ids=_id)
@pytest.mark.parametrize("weight", ["quantized once", "float"])
@pytest.mark.parametrize("m", [2, 16])  # (one row of such a view is contiguous)
def test_column_views_of_activations_stay_on_the_per_call_path(cupy_device, dtype, weight, m):
    """Activations that are some columns of a wider tensor (q of a fused q/k/v output: rows a stride apart) give the
    contiguous call's result bit for bit, take the per-call path (a cache hit from the second call on, not a plan
    per call), and capture in a torch CUDA graph after the documented warm-up, whose replays on new data equal eager
    calls."""
    torch = pytest.importorskip("torch")
    from mxcore import dtypes as _dt
    from mxcore.backends import get

    be = get("cuda")
    mdt = _dt.resolve(dtype, be.target().arch)
    if weight == "float" and mdt.kind not in ("fp8", "mx"):
        pytest.skip("a weight-only pair takes a weight quantized once")
    k, n = 512, 384
    gen = torch.Generator(device="cuda").manual_seed(11)
    w = torch.randn(k, n, device="cuda", generator=gen) * 0.5
    if weight == "float":
        w = w.to(torch.bfloat16)
    elif mdt.b.kind == "fp8":
        w = mxcore.quantize_tensor(w, mdt.b.element)
    else:
        w = mxcore.quantize_mx(w, mdt.b.name, axis=0)
    wide = torch.empty(m, k + 3 * 64, device="cuda", dtype=torch.bfloat16)
    x = wide[:, 64:64 + k]  # rows k + 192 elements apart
    assert not x.is_contiguous()

    def call(a):
        return mxcore.matmul(a, w, dtype, out_dtype="bfloat16", backend="cuda")

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):  # seen, kept, replayed
            wide.copy_(torch.randn(wide.shape, device="cuda", generator=gen))
            got = call(x)
            assert torch.equal(got, call(x.contiguous())), i
        hits = be._fast.hits
        call(x)
        assert be._fast.hits > hits, "a column view planned anew instead of taking its layout's kept entry"
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            y = call(x)
        for scale in (1.0, 4.0):
            wide.copy_(torch.randn(wide.shape, device="cuda", generator=gen) * scale)
            y.fill_(float("nan"))
            g.replay()
            got = y.clone()
            want = call(x.contiguous())
            s.synchronize()
            assert not torch.isnan(got).any()
            assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    torch.cuda.current_stream().wait_stream(s)
