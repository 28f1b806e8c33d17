"""The per-call path under streams, threads, CUDA graphs (torch and CuPy), in-place updates and memory accounting:
every result is compared bit for bit with a plain single-threaded call on the default stream."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import numpy as np
import pytest

import mxcore
from mxcore.tools.bench_decode import graphed

pytestmark = pytest.mark.nvidia_gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs torch with a CUDA GPU", allow_module_level=True)
cp = pytest.importorskip("cupy")

M, K, N = 16, 1024, 768


def _poison():
    """Leave NaN-filled blocks in torch's caching allocator, so an output that a kernel does not write shows."""
    blocks = [torch.full((1 << 20,), float("nan"), device="cuda") for _ in range(16)]
    torch.cuda.synchronize()
    del blocks


def _same(x, y) -> bool:
    x, y = x.float().cpu().numpy(), y.float().cpu().numpy()
    return np.array_equal(x.view(np.uint32), y.view(np.uint32))


def _operands(seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=g)
    return x, w


def _cases(x, w):
    """(label, call) over the dtype mixes, quantize-once operands included."""
    w4 = mxcore.quantize_mx(w, "mxfp4", axis=0)
    w8 = mxcore.quantize_mx(w, "mxfp8", axis=0)
    wf8 = mxcore.quantize_tensor(w, "e4m3fn")
    x8 = mxcore.quantize_mx(x, "mxfp8", axis=1)
    x16, w16 = x.half(), w.half()
    xt, wt = x.t().contiguous().t(), w.t().contiguous().t()  # the same values, transposed layouts (a training step's)
    wt4 = mxcore.quantize_mx(wt, "mxfp4", axis=0)  # quantized without a copy: codes and scales as transposed views
    return [
        ("fp16", lambda: mxcore.matmul(x16, w16, "fp16")),
        ("bf16", lambda: mxcore.matmul(x, w, "bf16", out_dtype="bfloat16")),
        ("fp8", lambda: mxcore.matmul(x, w, "fp8")),
        ("mxfp8", lambda: mxcore.matmul(x, w, "mxfp8")),
        ("mxfp4", lambda: mxcore.matmul(x, w, "mxfp4")),
        ("bf16 x mxfp4 weight", lambda: mxcore.matmul(x, w4, out_dtype="bfloat16")),
        ("bf16 x mxfp8 weight", lambda: mxcore.matmul(x, w8, out_dtype="bfloat16")),
        ("fp8 x fp8 weight", lambda: mxcore.matmul(x, wf8, "fp8")),
        ("mxfp8 pair", lambda: mxcore.matmul(x8, w8, "mxfp8")),
        ("mxfp8 transposed", lambda: mxcore.matmul(xt, wt, "mxfp8")),
        ("mxfp4 transposed", lambda: mxcore.matmul(xt, wt, "mxfp4")),
        ("bf16 x mxfp4 transposed weight", lambda: mxcore.matmul(x, wt4, out_dtype="bfloat16")),
    ]


@pytest.fixture(autouse=True)
def _fresh():
    mxcore.clear_cache()
    yield
    torch.cuda.synchronize()


def test_quantized_operands_across_two_streams():
    x, w = _operands(1)
    cases = _cases(x, w)
    expect = {label: fn().clone() for label, fn in cases}
    torch.cuda.synchronize()
    mxcore.clear_cache()  # the staged forms cached on the operands stay: the point of the test
    for label, fn in cases:
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        s1.wait_stream(torch.cuda.current_stream())
        s2.wait_stream(torch.cuda.current_stream())
        _poison()
        with torch.cuda.stream(s1):
            y1 = fn()
        with torch.cuda.stream(s2):  # right after, on another stream, no synchronisation by the caller
            y2 = fn()
        torch.cuda.synchronize()
        assert _same(y1, expect[label]) and _same(y2, expect[label]), label


def test_fresh_weight_first_used_on_a_side_stream():
    x, w = _operands(2)
    w4 = mxcore.quantize_mx(w, "mxfp4", axis=0)
    torch.cuda.synchronize()
    expect = mxcore.matmul(x, mxcore.quantize_mx(w, "mxfp4", axis=0), out_dtype="bfloat16").clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mxcore.matmul(x, w4, out_dtype="bfloat16")  # stages the weight on the side stream
    y = mxcore.matmul(x, w4, out_dtype="bfloat16")  # the default stream reads the staged form at once
    torch.cuda.synchronize()
    assert _same(y, expect)


@pytest.mark.parametrize("threads", [8])
def test_many_threads_mixed_dtypes(threads):
    x, w = _operands(3)
    cases = _cases(x, w)
    expect = {label: fn().clone() for label, fn in cases}
    torch.cuda.synchronize()
    errors, bad = [], []

    def work(t: int):
        try:
            for i in range(12):
                label, fn = cases[(t + i) % len(cases)]
                y = fn()
                torch.cuda.current_stream().synchronize()
                if not _same(y, expect[label]):
                    bad.append((t, label))
        except Exception as exc:  # noqa: BLE001  (the test reports every error)
            errors.append(f"{type(exc).__name__}: {exc}")

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert not errors, errors[:3]
    assert not bad, bad[:5]


def test_threads_on_their_own_streams():
    x, w = _operands(4)
    w4 = mxcore.quantize_mx(w, "mxfp4", axis=0)
    expect = mxcore.matmul(x, w4, out_dtype="bfloat16").clone()
    out, errors = {}, []

    def work(t: int):
        try:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                ys = [mxcore.matmul(x, w4, out_dtype="bfloat16") for _ in range(8)]
            s.synchronize()
            out[t] = ys
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{type(exc).__name__}: {exc}")

    pool = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert not errors, errors[:3]
    assert all(_same(y, expect) for ys in out.values() for y in ys)


def _recipe(step):
    return graphed(torch, step)


def test_torch_graph_recipe_every_dtype():
    x, w = _operands(5)
    xs = x.clone()
    for label, fn in _cases(xs, w):
        g, y = _recipe(fn)
        x2, _ = _operands(50)
        xs.copy_(x2)  # new activations in place: the replay must see them
        g.replay()
        torch.cuda.synchronize()
        eager = fn()  # the eager call after the capture: a new entry, not the graph's buffers
        torch.cuda.synchronize()
        assert _same(y, eager), label
        xs.copy_(x)
        g.replay()
        torch.cuda.synchronize()
        again = fn()
        torch.cuda.synchronize()
        assert _same(y, again), label
        del g


def test_torch_graph_batched_activations_and_weight_only():
    g0 = torch.Generator(device="cuda").manual_seed(6)
    x3 = torch.randn(2, 8, K, device="cuda", dtype=torch.bfloat16, generator=g0)
    w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=g0)
    w4 = mxcore.quantize_mx(w, "mxfp4", axis=0)
    flat = mxcore.matmul(x3.reshape(16, K), w4, out_dtype="bfloat16")
    y3 = mxcore.matmul(x3, w4, out_dtype="bfloat16")
    assert tuple(y3.shape) == (2, 8, N) and _same(y3.reshape(16, N), flat)
    g, y = _recipe(lambda: mxcore.matmul(x3, w4, out_dtype="bfloat16"))
    g.replay()
    torch.cuda.synchronize()
    assert _same(y.reshape(16, N), flat)


@pytest.mark.parametrize("kind", ["torch", "cupy"])
def test_batched_activations_equal_their_rows(kind):
    """(B, T, K) activations times a 2-D operand (kept per-call entries of their own, the rows read in place) equal
    the same product of the B T rows, bit for bit, on the layout's first call and on later ones (poisoned blocks
    around each result: an element the kernel leaves unwritten shows)."""
    g0 = torch.Generator(device="cuda").manual_seed(8)
    act = torch.float16 if kind == "cupy" else torch.bfloat16  # (CuPy has no bfloat16)
    w = torch.randn(K, N, device="cuda", dtype=act, generator=g0)
    w4, w8 = mxcore.quantize_mx(w, "mxfp4", axis=0), mxcore.quantize_mx(w, "mxfp8", axis=0)
    conv = (lambda t: cp.asarray(t)) if kind == "cupy" else (lambda t: t)
    if kind == "cupy":
        w4, w8 = (mxcore.MXTensor(cp.asarray(q.codes), cp.asarray(q.scales), q.fmt, q.axis) for q in (w4, w8))
    out = "float16" if kind == "cupy" else "bfloat16"
    for label, dtype, wq in (("float", None, conv(w)), ("x mxfp4", None, w4), ("x mxfp8", None, w8)):
        for step in range(3):
            x3 = conv(torch.randn(2, 8, K, device="cuda", dtype=act, generator=g0))
            _poison()
            y3 = mxcore.matmul(x3, wq, dtype, out_dtype=out)
            rows = mxcore.matmul(x3.reshape(16, K), wq, dtype, out_dtype=out)
            y3, rows = torch.as_tensor(y3, device="cuda"), torch.as_tensor(rows, device="cuda")
            assert tuple(y3.shape) == (2, 8, N), (label, step, y3.shape)
            assert _same(y3.reshape(16, N), rows), (label, step)
            del y3, rows


def test_cupy_stream_capture_split_k():
    rng = np.random.default_rng(7)
    a = cp.asarray(rng.standard_normal((64, 16384)).astype(np.float16))
    b = cp.asarray(rng.standard_normal((16384, 64)).astype(np.float16))
    expect = mxcore.matmul(a, b, "fp16")
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        for _ in range(3):
            mxcore.matmul(a, b, "fp16")
        s.synchronize()
        s.begin_capture()
        y = mxcore.matmul(a, b, "fp16")
        graph = s.end_capture()
    for _ in range(3):  # eager calls between replays reuse the pool's free blocks: the graph's must not be among them
        junk = mxcore.matmul(b, a, "fp16")
        junk.fill(float("nan"))
        graph.launch(s)
        s.synchronize()
        assert cp.array_equal(y.view(cp.uint32), expect.view(cp.uint32))
    del graph


def test_weight_changed_in_place_is_seen():
    x, w = _operands(8)
    w4 = mxcore.quantize_mx(w, "mxfp4", axis=0)
    mxcore.matmul(x, w4, out_dtype="bfloat16")
    mxcore.matmul(x, w4, out_dtype="bfloat16")
    _, w2 = _operands(80)
    other = mxcore.quantize_mx(w2, "mxfp4", axis=0)
    w4.codes.copy_(other.codes)
    w4.scales.copy_(other.scales)
    expect = mxcore.matmul(x, mxcore.quantize_mx(w2, "mxfp4", axis=0), out_dtype="bfloat16")
    y = mxcore.matmul(x, w4, out_dtype="bfloat16")
    torch.cuda.synchronize()
    assert _same(y, expect)


def test_no_cache_keeps_an_output_alive():
    """Every call's result (the layout's first call, which builds the kept entry, and the later ones) is freed as
    soon as the caller drops it: no plan, entry or converter holds it."""
    x, w = _operands(10)
    for label, fn in _cases(x, w):
        refs = []
        for _ in range(3):
            y = fn()
            refs.append(weakref.ref(y))
            del y
        gc.collect()
        assert [r() is None for r in refs] == [True] * 3, label
    # one layout, several weights (the layers of a model): the plan kept by the first weight's call holds none of
    # its results while other weights' calls run
    ws = [_operands(11 + i)[1] for i in range(3)]
    x8 = mxcore.quantize_mx(x, "mxfp8", axis=1)
    for label, quantize, call in (
            ("fp8 weights", lambda w: mxcore.quantize_tensor(w, "e4m3fn"), lambda q: mxcore.matmul(x, q, "fp8")),
            ("mxfp8 weights", lambda w: mxcore.quantize_mx(w, "mxfp8", axis=0), lambda q: mxcore.matmul(x, q, "mxfp8")),
            ("bf16 x mxfp4 weights", lambda w: mxcore.quantize_mx(w, "mxfp4", axis=0),
             lambda q: mxcore.matmul(x, q, out_dtype="bfloat16")),
            ("mxfp8 pairs", lambda w: mxcore.quantize_mx(w, "mxfp8", axis=0), lambda q: mxcore.matmul(x8, q, "mxfp8"))):
        mxcore.clear_cache()
        qs = [quantize(w) for w in ws]
        refs = []
        for q in qs:
            y = call(q)
            refs.append(weakref.ref(y))
            del y
        gc.collect()
        assert [r() is None for r in refs] == [True] * 3, label


def test_memory_back_to_baseline():
    torch.cuda.synchronize()
    gc.collect()
    mxcore.clear_cache()
    pool = cp.get_default_memory_pool()
    base, cbase = torch.cuda.memory_allocated(), pool.used_bytes()
    x, w = _operands(9)
    cases = _cases(x, w)
    graphs = []
    for _, fn in cases:
        graphs.append(_recipe(fn))
    for g, _ in graphs:
        g.replay()
    torch.cuda.synchronize()
    info = mxcore.cache_info()["cuda"]
    assert info["bytes"] <= info["limit"]
    del graphs, cases, x, w, g, fn
    for _ in range(50):  # the driver runs a destroyed graph's user-object callbacks on its own thread
        gc.collect()
        torch.cuda.synchronize()
        mxcore.clear_cache()
        gc.collect()
        if mxcore.cache_info()["cuda"]["graph_bytes"] == 0 and pool.used_bytes() <= cbase + (1 << 20):
            break
        time.sleep(0.02)
    assert abs(torch.cuda.memory_allocated() - base) <= 1 << 20, (torch.cuda.memory_allocated(), base)
    assert pool.used_bytes() <= cbase + (1 << 20), (pool.used_bytes(), cbase)
    assert mxcore.cache_info()["cuda"]["graph_bytes"] == 0


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
@pytest.mark.parametrize("kind", ["torch", "cupy"])
def test_transposed_operands_quantize_in_place(fmt, kind):
    """A transposed operand (B = W.t(), A = X.t(): the training step's) is quantized without a copy of its float data
    (codes and scales come back as transposed views); the product equals the one from contiguous copies bit for bit,
    on the first call and on later calls with fresh data (the per-call path's replay), outputs poisoned; and its
    quantization equals the contiguous one's codes and scales."""
    g = torch.Generator(device="cuda").manual_seed(7)
    fresh = [(torch.randn(256, 512, device="cuda", dtype=torch.bfloat16, generator=g),
              torch.randn(384, 512, device="cuda", dtype=torch.bfloat16, generator=g)) for _ in range(3)]
    conv = (lambda t: t) if kind == "torch" else (lambda t: cp.from_dlpack(t.float()))
    tr = (lambda a: a.t()) if kind == "torch" else (lambda a: a.T)
    cont = (lambda a: a.contiguous()) if kind == "torch" else (lambda a: a.copy())

    def same(p, q):
        return _same(torch.as_tensor(p, device="cuda"), torch.as_tensor(q, device="cuda"))

    for i, (x, w) in enumerate(fresh):  # y = x @ w.t() (the forward's form), x.t() @ x (the weight gradient's)
        xa, wa = conv(x), conv(w)
        _poison()
        got = mxcore.matmul(xa, tr(wa), fmt, out_dtype="float32")
        assert same(got, mxcore.matmul(xa, cont(tr(wa)), fmt, out_dtype="float32")), (fmt, kind, i)
        _poison()
        got = mxcore.matmul(tr(xa), xa, fmt, out_dtype="float32")
        assert same(got, mxcore.matmul(cont(tr(xa)), xa, fmt, out_dtype="float32")), (fmt, kind, i)
    if kind == "torch":  # below autograd (grad mode off) a parameter's transpose takes the same path, same bits
        x, w = fresh[0]
        wp = torch.nn.Parameter(w.clone())
        with torch.no_grad():
            for _ in range(2):
                _poison()
                assert same(mxcore.matmul(x, wp.t(), fmt, out_dtype="float32"),
                            mxcore.matmul(x, w.t().contiguous(), fmt, out_dtype="float32"))
    wa = conv(fresh[0][1])
    for axis in (0, 1):
        q, r = mxcore.quantize_mx(tr(wa), fmt, axis=axis), mxcore.quantize_mx(cont(tr(wa)), fmt, axis=axis)
        for name in ("codes", "scales"):
            a, b = torch.as_tensor(getattr(q, name), device="cuda"), torch.as_tensor(getattr(r, name), device="cuda")
            assert a.stride() != b.stride() and torch.equal(a.contiguous(), b), (name, axis)
        assert int(torch.as_tensor(q.scale_max)) == int(torch.as_tensor(r.scale_max))
