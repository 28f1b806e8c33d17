"""The CUDA backend's host-side rules, without a GPU: which device a call runs on (operands on two devices are a
typed error naming both), the kernel family rule and its option, the split-K rule and the tile rule for batches."""

from __future__ import annotations

import pytest

from mxcore import dtypes as _dt
from mxcore.backends import Backend, Plan, cuda
from mxcore.backends.cuda import device, families, plan
from mxcore.errors import UnsupportedError


class _Dev:
    def __init__(self, kind, index):
        self.type, self.index, self.id = kind, index, index


def _cupy_like(ordinal):
    cls = type("ndarray", (), {"__module__": "cupy._core.core"})
    x = cls()
    x.device = _Dev("cuda", ordinal)
    return x


def _torch_like(kind, index):
    cls = type("Tensor", (), {"__module__": "torch"})
    x = cls()
    x.device = _Dev(kind, index)
    return x


class _FakeCupy:
    class cuda:
        class runtime:
            @staticmethod
            def getDevice():
                return 3


def test_operand_device_resolution():
    import numpy as np

    cp = _FakeCupy()
    assert device.resolve_ordinal(cp, _cupy_like(1), _cupy_like(1)) == 1
    assert device.resolve_ordinal(cp, _torch_like("cuda", 2), np.ones(2)) == 2  # host data follows the device
    assert device.resolve_ordinal(cp, np.ones(2), np.ones(2)) == 3  # all host: CuPy's current device
    assert device.resolve_ordinal(cp, _torch_like("cpu", None), _cupy_like(0)) == 0
    with pytest.raises(UnsupportedError, match="device 1 and operand b on CUDA device 0"):
        device.resolve_ordinal(cp, _cupy_like(1), _torch_like("cuda", 0))


def test_family_rule_and_option():
    mdt = _dt.resolve("fp16", "sm_90")
    assert families.family_for("sm_80", mdt, (1, 4096, 4096, 4096)) == "mma_sync"  # no wgmma before Hopper
    assert families.family_for("sm_90", mdt, (1, 4096, 4096, 4096), "mma_sync") == "mma_sync"
    assert families.family_for("sm_90", mdt, (1, 4096, 4096, 4096)) in families.FAMILIES
    with pytest.raises(UnsupportedError, match="family='tensor'"):
        families.family_for("sm_90", mdt, None, "tensor")
    if "wgmma" not in families.FAMILIES:
        with pytest.raises(UnsupportedError, match="not available"):
            families.family_for("sm_90", mdt, None, "wgmma")


def test_split_k_rule():
    assert plan.split_k(132, 132, 8192, 32) == (1, 8192)  # the tiles fill the GPU
    assert plan.split_k(132, 4, 64, 32) == (1, 64)  # K too short
    splits, per = plan.split_k(132, 4, 8192, 32)
    assert splits > 1 and per % 32 == 0 and splits * per >= 8192 > (splits - 1) * per
    assert plan.split_k(132, 132, 650, 32, force=3)[0] == 3


def test_tile_rule_counts_the_batch():
    assert cuda.choose_tile(512, 512, 132, "f16") == "64x64"  # 16 blocks of 128x128
    assert cuda.choose_tile(512, 512, 132, "f16", batch=16) == "128x128"  # 256 blocks with the batch


def test_backend_and_plan_follow_the_contract():
    assert issubclass(cuda.CudaBackend, Backend) and issubclass(cuda.CudaPlan, Plan)
    be = cuda.CudaBackend()
    assert set(be.tiles("fp16")) == set(cuda.TILES) and "tile" in be.options
    assert be.supported_dtypes("sm_80")[:4] == ["fp32", "tf32", "fp16", "bf16"]
    assert "e4m3fn" in be.supported_dtypes("sm_89") and be.supported_dtypes("sm_75") == []


def test_unknown_option_is_a_typed_error():
    with pytest.raises(UnsupportedError, match="no option.*tile_size.*its options are: tile"):
        cuda.CudaBackend().matmul(None, None, None, tile_size=3)


def test_replay_needs_every_quantized_buffer_recorded():
    """fast_matmul keeps a replay only when every device buffer of the quantized operands lies in an array of a
    recorded codec step (codec.Recording.spans, the one rule it also applies to the staging): a buffer made by a
    copy outside the codec's launches would be left stale by a replay (what happened with column-major fp8 B codes
    of shapes without 64 x 64 tiles).  Host arrays are not device buffers; a tainted recording never replays."""
    from types import SimpleNamespace

    import numpy as np

    from mxcore.backends import codec
    from mxcore.backends.cuda import fastpath, quantized

    def arr(ptr, nbytes=16):
        x = type("ndarray", (), {"__module__": "cupy._core.core"})()
        x.data, x.nbytes = SimpleNamespace(ptr=ptr), nbytes
        return x

    def tensor(ptr, device="cuda"):
        x = type("Tensor", (), {"__module__": "torch"})()
        x.device = _Dev(device, 0)
        x.data_ptr = lambda: ptr
        return x

    rec = codec.Recording()
    rec.steps += [("zero", arr(8, 4)), ("launch", None, (1,), (arr(100), arr(200, 64), 7, arr(8, 4), arr(300),
                                                             arr(400)))]
    assert sorted(rec.spans()) == [(8, 12), (8, 12), (100, 116), (200, 264), (300, 316), (400, 416)]
    written = SimpleNamespace(codes=tensor(200), scale=tensor(300), scale_exp=tensor(400))
    copied = SimpleNamespace(codes=tensor(900), scale=tensor(300), scale_exp=tensor(400))  # codes from a copy
    mx_like = SimpleNamespace(codes=arr(200), scales=arr(300), scale_max=arr(8))
    view = SimpleNamespace(codes=tensor(232), scale=tensor(300))  # codes: a view inside the recorded 200..264
    on_host = SimpleNamespace(codes=tensor(200), scale=tensor(5000, "cpu"), scale_exp=np.zeros(1))
    got = quantized.quantized_buffers(written, mx_like, on_host)
    assert [int(x.data_ptr()) if hasattr(x, "data_ptr") else x.data.ptr for x in got] == [200, 300, 400, 200, 300,
                                                                                          8, 200]
    assert fastpath._replayable(quantized.quantized_buffers(written, mx_like, view, on_host), rec)
    assert not fastpath._replayable(quantized.quantized_buffers(written, copied), rec)
    assert not fastpath._replayable(quantized.quantized_buffers(SimpleNamespace(codes=tensor(264))), rec)  # one past
    rec.tainted = "a copy"
    assert not fastpath._replayable(quantized.quantized_buffers(written), rec)


def test_staging_replays_only_when_it_covers_every_buffer():
    """The per-call path replays the plan's staging (instead of staging again in Python) only when the staging made
    no copy of its own (codec.taint, e.g. a non-contiguous operand's ascontiguousarray) and every buffer the GEMM
    reads (codes, MX factors and flags, device scale exponents) lies in an array of a recorded step."""
    from types import SimpleNamespace

    from mxcore.backends import codec
    from mxcore.backends.cuda import fastpath

    def arr(ptr, nbytes=64):
        return SimpleNamespace(data=SimpleNamespace(ptr=ptr), nbytes=nbytes)

    quant, rec = codec.Recording(), codec.Recording()
    quant.steps += [("launch", None, (1,), (arr(100),), (256,), 0)]  # the codes (the quantization's recording)
    aux = arr(1000, 64)  # info at +0, NaN flags at +16, window flags at +40: views into one zeroed allocation
    rec.steps += [("zero", aux), ("launch", None, (1,), (arr(200), 7), (256,), 0)]
    mx = SimpleNamespace(factors=arr(200), info=arr(1000), nan=arr(1016), folded=arr(1040), lo_cnt=None, lo_ent=None,
                         lo_elt=None)
    staged = SimpleNamespace(da=SimpleNamespace(buf=arr(100), exp_at=None, mx=mx),
                             db=SimpleNamespace(buf=arr(100), exp_at=None, mx=None))
    assert fastpath._replayable(fastpath._plan_buffers(staged), quant, rec)
    assert not fastpath._replayable(fastpath._plan_buffers(staged), rec)  # the codes: in the other recording
    staged.db.buf = arr(5000)  # a buffer no recorded step touched
    assert not fastpath._replayable(fastpath._plan_buffers(staged), quant, rec)
    staged.db.buf = arr(100)
    from mxcore.backends import codec_runtime

    with codec.recording() as r:
        codec_runtime.taint("a staging copy")
        codec_runtime.taint("another")
    assert r.tainted == "a staging copy"
    codec_runtime.taint("outside a recording: nothing")
    assert not fastpath._replayable(fastpath._plan_buffers(staged), quant, rec, r)  # a staging copy: no replay


def test_fold_split_fewest_window_times():
    """mx_sm90_fold's grid y: the fewest (waves of blocks) x (windows per block + the tables' cost), the smaller on
    ties; it covers every window (a block folds windows y, y + grid y, ...)."""
    from mxcore.backends.cuda.stage import FOLD_TABLE_WINDOWS, fold_split

    def cost(gx, windows, slots, gy):
        return -(-gx * gy // slots) * (-(-windows // gy) + FOLD_TABLE_WINDOWS)

    for gx, windows, slots in ((256, 64, 396), (128, 32, 396), (3, 3, 396), (512, 128, 528), (1, 1, 132), (64, 7, 132)):
        gy = fold_split(gx, windows, slots)
        assert 1 <= gy <= windows
        costs = [cost(gx, windows, slots, y) for y in range(1, windows + 1)]
        assert costs[gy - 1] == min(costs) and costs.index(min(costs)) == gy - 1
    assert fold_split(256, 64, 396) == 3  # 8192 rows, 8192 K on an H100 (3 blocks per SM): 2 waves of 22 windows


@pytest.mark.parametrize("role", ["a", "b"])
def test_mx_factor_launches_match_the_kernels_parameters(monkeypatch, role):
    """``Stager.mx_factors`` / ``mx_fold`` (numpy standing in for CuPy, launches captured): each launch passes as
    many arguments as its kernel in ``gemm_sm90_mx.cu`` declares, and the grids cover every row and window."""
    import re

    import numpy as np

    from mxcore.backends.cuda import sm90, stage
    from mxcore.kernels import kernel_source

    src = kernel_source("nvidia", sm90.SM90_MX_FILE)
    params = {name: len(re.search(rf"{name}\(([^)]*)\)", src).group(1).split(","))
              for name in sm90.SM90_MX_KERNELS}
    calls = []
    monkeypatch.setattr(stage, "launch", lambda fn, grid, block, args, shared_mem=0: calls.append((fn, grid, args)))
    st = stage.Stager(np, 0, None, 132)
    monkeypatch.setattr(st, "_factor_kernel", lambda name: name)
    monkeypatch.setattr(st, "_slots", lambda kernel, name: 3 * 132)  # resident blocks (an H100's fold: 3 per SM)
    m, k = 70, 300  # 10 blocks of 32: 3 windows of 128
    codes = np.zeros((m, k) if role == "a" else (k, m), np.uint8)
    scales = np.full((m, 10) if role == "a" else (10, m), 127, np.uint8)
    st.mx_factors(codes, scales, role, k)
    elems, ldk, fac = st.mx_fold(codes, scales, role, k, "e2m1")
    assert [c[0] for c in calls] == ["mx_sm90_block_factors", "mx_sm90_fold_rows", "mx_sm90_fold"]
    for name, grid, args in calls:
        assert len(args) == params[name], (name, len(args), params[name])
    rows_pad = m if role == "a" else 80
    assert calls[2][1] == (-(-rows_pad // 32), 3) and fac.blocks_pad == 12 and fac.folded.shape == (3,)
    assert elems.shape == (m, ldk) and ldk == 304
    assert fac.lo_cnt is None and fac.lo_ent is None and fac.lo_elt is None
    assert calls[2][2][-2] is stage._NULLP and calls[2][2][-1] == 0  # no transposed elements
    calls.clear()  # beside an MXFP8 partner: the fold writes its elements transposed for mx_lo_fix too
    elems, ldk, fac = st.mx_fold(codes, scales, role, k, "e2m1", transposed=True)
    blocks32 = -(-(m if role == "a" else 80) // 32)
    assert fac.lo_cnt is None and fac.lo_elt.shape == (128 * 3, 32 * blocks32)
    assert calls[-1][0] == "mx_sm90_fold" and calls[-1][2][-2] is fac.lo_elt and calls[-1][2][-1] == 32 * blocks32
    calls.clear()  # MXFP8: the lossy fold, its lists sorted, then the lossless fold gated on the overflow flag
    elems, ldk, fac = st.mx_fold(codes, scales, role, k, "e4m3fn")
    assert [c[0] for c in calls] == ["mx_sm90_fold_rows", "mx_sm90_fold", "mx_sm90_lo_sort", "mx_sm90_fold_rows",
                                     "mx_sm90_fold"]
    for name, grid, args in calls:
        assert len(args) == params[name], (name, len(args), params[name])
    assert fac.lo_cnt.shape == (m,) and fac.lo_ent.shape == (m, stage.LO_CAP, 2) and fac.info.shape == (8,)
    only_if = [c[2][-3] for c in calls if "_lo_" not in c[0]]  # fold_rows: (.., only_if, info, lo_cnt); fold:
    windows, blocks32 = 3, -(-(m if role == "a" else 80) // 32)  # (.., only_if, el_t, ldt)
    assert fac.lo_elt.shape == (128 * windows, 32 * blocks32)  # mx_lo_fix's transposed elements
    assert all(c[2][-2] is fac.lo_elt and c[2][-1] == 32 * blocks32 for c in calls if c[0] == "mx_sm90_fold")
    assert [o is not stage._NULLP for o in only_if] == [False, False, True, True]  # the second pass is gated


def test_mx_lo_fix_launch_matches_the_kernels_parameters():
    """``Sm90Plan._fix_launch`` (numpy standing in for CuPy): as many arguments as ``mx_lo_fix`` declares, a block per
    32 x 256 tile of C, and a folded partner without lists (MXFP4 weights beside lossy MXFP8 activations) given its
    elements transposed once, as the lossy fold writes its own ([k][row], rows rounded up to 32, zeros beyond)."""
    import re
    from types import SimpleNamespace

    import numpy as np

    from mxcore.backends.cuda import sm90, stage
    from mxcore.kernels import kernel_source

    src = kernel_source("nvidia", sm90.SM90_MX_FILE)
    n_params = len(re.search(r"mx_lo_fix\(([^)]*)\)", src).group(1).split(","))
    for name in ("FIX_ROWS", "FIX_COLS"):  # the grid's tile is the kernel's
        assert int(re.search(rf"#define {name} (\d+)", src).group(1)) == getattr(sm90, name)
    m, n, k, blocks_pad = 70, 50, 300, 12

    def factors(rows, lossy):
        fac = stage.MXFactors(np.zeros((rows, blocks_pad), np.int32), blocks_pad, blocks_pad, np.zeros(8, np.int32),
                              np.zeros(rows, np.uint8), folded=np.ones(3, np.uint8))
        if lossy:
            fac.lo_cnt, fac.lo_ent = np.zeros(rows, np.int32), np.zeros((rows, stage.LO_CAP, 2), np.int32)
            fac.lo_elt = np.zeros((32 * blocks_pad, 32 * -(-rows // 32)), np.uint8)
        return fac

    rng = np.random.default_rng(0)
    elems_b = rng.integers(0, 256, size=(n, 304), dtype=np.uint8)
    p = sm90.Sm90Plan.__new__(sm90.Sm90Plan)
    p.cp, p.dev, p._fix, p.m, p.n, p.out_dtype = np, SimpleNamespace(ordinal=0), True, m, n, "bfloat16"
    p.out = np.zeros((m, n), np.uint16)
    p._gemm_out = lambda: np.zeros((m, n), np.float32)  # the plan's fp32 buffer for a 16-bit output
    p.backend = SimpleNamespace(kernels=SimpleNamespace(get=lambda *args: args[-2]))
    p.da = stage.DevOperand(np.zeros((m, 304), np.uint8), 304, True, "e4m3", 0, k, mx=factors(m, True))
    p.db = stage.DevOperand(elems_b, 304, True, "e4m3", 0, k, mx=factors(n, False))
    kernel, grid, args = p._fix_launch()
    assert kernel == "mx_lo_fix" and len(args) == n_params, (len(args), n_params)
    assert grid == (1, 3)
    elt = p.db.mx.lo_elt
    assert elt.shape == (32 * blocks_pad, 64)
    np.testing.assert_array_equal(elt[:304, :n], elems_b.T)
    assert not elt[304:].any() and not elt[:, n:].any()
    at = next(i for i, x in enumerate(args) if x is elt)  # B's transposed elements, then their row pitch
    assert args[at + 1] == 64


def test_kernel_cache_keys_on_what_compiles():
    """A compiled kernel is found again only under the same key, file, entry and options: a variant whose build
    options change (a module constant its options read) gets a fresh kernel, never a stale one."""
    from types import SimpleNamespace

    from mxcore.backends.cuda.compile import GEMM_FILE, KernelCache

    built = []
    fake_cp = SimpleNamespace(RawKernel=lambda src, name, options: built.append((name, options)) or object())
    cache = KernelCache()
    a = cache.get(fake_cp, 0, ("gemm", "v"), GEMM_FILE, "mx_gemm", ["-DX=1"])
    assert cache.get(fake_cp, 0, ("gemm", "v"), GEMM_FILE, "mx_gemm", ("-DX=1",)) is a and len(built) == 1
    for other in ((1, ("gemm", "v"), ["-DX=1"]), (0, ("gemm", "w"), ["-DX=1"]), (0, ("gemm", "v"), ["-DX=2"])):
        ordinal, key, opts = other
        assert cache.get(fake_cp, ordinal, key, GEMM_FILE, "mx_gemm", opts) is not a
    assert built[-1] == ("mx_gemm", ("-default-device", "-DX=2")) and len(built) == 4
