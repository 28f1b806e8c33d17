"""``torch.ops.mxcore`` and ``mxcore.nn`` on an NVIDIA GPU (marker nvidia_gpu; skipped without one): torch.compile
(fullgraph=True, inductor) per dtype, ``mode="reduce-overhead"`` capturing the ops in CUDA graphs, and forward and
backward bit for bit equal to the reference backend on exactly representable data."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mxcore  # noqa: E402
from mxcore.nn import Linear, MXConfig  # noqa: E402

pytestmark = pytest.mark.nvidia_gpu

DTYPES = ["bf16", "fp16", "fp8", "e5m2", "mxfp8", "mxfp8_e5m2", "mxfp6", "mxfp4", "mxfp8,mxfp4"]
WONLY = ["bf16,mxfp4", "fp16,mxfp4", "bf16,mxfp8"]
CONFIGS = ["fp8", "mxfp8", "mxfp6", "mxfp4", "bf16:mxfp4", "mxfp8,mxfp4"]


def _exact(rng, shape, dtype=torch.bfloat16):
    """Small integers times powers of two, |x| <= 4: exact in every format; every product and partial sum exact in
    fp32 for K <= 1024, so the GPU's fp32 accumulation and the reference's float64 sum agree bit for bit."""
    v = rng.integers(-3, 4, size=shape) * np.exp2(rng.integers(-1, 1, size=shape))
    return torch.from_numpy(v).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES + WONLY)
def test_compile_fullgraph_on_cuda_is_bit_exact(rng, dtype):
    torch._dynamo.reset()
    wonly = "," in dtype and dtype.split(",")[0] in ("bf16", "fp16")
    act = torch.float16 if dtype.startswith("fp16") else torch.bfloat16
    a = _exact(rng, (64, 256), act).cuda().requires_grad_()
    b = _exact(rng, (256, 128), act).cuda().requires_grad_(not wonly)
    g = _exact(rng, (64, 128), act).cuda()

    def f(a, b, backend="auto"):
        return mxcore.torch.matmul(a, b, dtype, backend=backend)

    y = torch.compile(f, fullgraph=True)(a, b)
    y.backward(g)
    ah, bh = a.detach().cpu().requires_grad_(), b.detach().cpu().requires_grad_(not wonly)
    yh = f(ah, bh, backend="reference")
    yh.backward(g.cpu())
    assert torch.equal(y.cpu(), yh)
    assert torch.equal(a.grad.cpu(), ah.grad)
    if not wonly:
        assert torch.equal(b.grad.cpu(), bh.grad)


# torch.cuda.graph's exit warns that a graph is empty also when the captured code raised: as an error that warning
# would replace the exception that says what went wrong (an empty graph still fails below: each call has new data,
# and a replay that computes nothing returns the recorded call's output)
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")
@pytest.mark.parametrize("config", CONFIGS)
def test_linear_compiled_and_reduce_overhead_match_eager_and_reference(rng, config):
    """A stack of Linear layers: eager, torch.compile(fullgraph=True) and mode="reduce-overhead" (no cudagraph skip:
    the ops are captured) give the same bits, equal to the reference backend's on the host."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = torch.nn.Sequential(*[Linear(256, 256, bias=False, config=config, weight=_exact(rng, (256, 256)).cuda(),
                                         device="cuda", dtype=torch.bfloat16) for _ in range(3)]).eval()
    xs = [_exact(rng, (16, 256)).cuda() for _ in range(4)]  # new data each call: a replay must compute
    x = xs[0]
    with torch.no_grad():
        eager = [model(xi) for xi in xs]
        full = torch.compile(model, fullgraph=True)(x)
        graphed = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        outs = [graphed(xi).clone() for xi in xs]  # warm-up, record, then replays
        first = model[0](x)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert torch.equal(full, eager[0]) and all(torch.equal(o, e) for o, e in zip(outs, eager))
    # the first layer (exact data: every product and sum exact) equals the reference backend on the host
    m = model[0]
    w = mxcore.torch.ops.weight_operand(m.weight_codes.cpu(), m._scales().cpu(), m.config.weight)
    ref = mxcore.matmul(x.cpu(), w, (m.config.act or m.config.weight, m.config.weight), out_dtype="bfloat16",
                        backend="reference")
    assert torch.equal(first.cpu(), ref)


def test_mxfp8_training_step_matches_reference(rng):
    """One forward + backward of an MXFP8 training-recipe MLP on the GPU equals the reference backend bit for bit
    (activations, input gradient and both weight gradients)."""
    torch.manual_seed(1)
    cfg = MXConfig("mxfp8", train=True)
    up = Linear(256, 512, bias=False, config=cfg, device="cuda", dtype=torch.bfloat16)
    down = Linear(512, 256, bias=False, config=cfg, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        up.weight.copy_(_exact(rng, (512, 256)))
        down.weight.copy_(_exact(rng, (256, 512)))
    x = _exact(rng, (64, 256)).cuda().requires_grad_()
    g = _exact(rng, (64, 256)).cuda()
    y = down(up(x))
    y.backward(g)
    up_h = Linear(256, 512, bias=False, config=MXConfig("mxfp8", train=True, backend="reference"), dtype=torch.bfloat16)
    down_h = Linear(512, 256, bias=False, config=MXConfig("mxfp8", train=True, backend="reference"),
                    dtype=torch.bfloat16)
    with torch.no_grad():
        up_h.weight.copy_(up.weight.cpu())
        down_h.weight.copy_(down.weight.cpu())
    xh = x.detach().cpu().requires_grad_()
    yh = down_h(up_h(xh))
    yh.backward(g.cpu())
    assert torch.equal(y.cpu(), yh) and torch.equal(x.grad.cpu(), xh.grad)
    assert torch.equal(up.weight.grad.cpu(), up_h.weight.grad)
    assert torch.equal(down.weight.grad.cpu(), down_h.weight.grad)


def test_from_blocks_on_the_device(rng):
    w = rng.standard_normal((32, 128))
    t = mxcore.quantize_mx(w, "mxfp4", axis=-1)
    codes = t.codes.reshape(32, 4, 32)
    blocks = torch.from_numpy((codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)).cuda()
    got = mxcore.MXTensor.from_blocks(blocks, torch.from_numpy(t.scales).cuda())
    assert got.device == "torch" and got.codes.is_cuda
    np.testing.assert_array_equal(got.codes.cpu().numpy(), t.codes)
    lin = Linear.from_quantized(got, act="bf16")
    x = _exact(rng, (4, 128)).cuda()
    ref = mxcore.matmul(x.cpu(), mxcore.MXTensor(t.codes.T, t.scales.T, "mxfp4", 0), ("bf16", "mxfp4"),
                        out_dtype="bfloat16", backend="reference")
    assert torch.equal(lin(x).cpu(), ref)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("fuse", [False, True])
def test_transformers_generate_with_reduce_overhead_matches_compile(fuse):
    """A tiny transformers Llama after quantize_(model, "bf16:mxfp4") (and with q/k/v and gate/up fused),
    generating through transformers' own compile path (static cache, CompileConfig): with mode="reduce-overhead" the
    decode steps are CUDA graphs (no cudagraph skip) and give the same tokens and the same logits, bit for bit, as
    the same compiled forward without graphs."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "CompileConfig"):
        pytest.skip("this transformers has no CompileConfig")
    from torch._dynamo.utils import counters

    from mxcore.nn import quantize_
    from mxcore.torch import bench

    torch.manual_seed(7)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    report = quantize_(model, "bf16:mxfp4", fuse=fuse)
    assert len(report.swapped) == 2 * 7 + 1 and len(report.fused) == (4 if fuse else 0)
    ids = torch.randint(0, 512, (1, 8), device="cuda")

    def generate(mode):
        torch._dynamo.reset()
        bench._forget_compiled_call(model)  # (compiled again with this compile_config)
        counters.clear()
        kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0, output_logits=True,
                  return_dict_in_generate=True, cache_implementation="static",
                  compile_config=transformers.CompileConfig(fullgraph=True, dynamic=False, mode=mode))
        with torch.no_grad():
            runs = [model.generate(ids, **kw) for _ in range(3)]  # warm-up, recording, then replays
        return runs, dict(counters["inductor"])

    plain, _ = generate("default")
    graphed, inductor = generate("reduce-overhead")
    assert inductor.get("cudagraph_skips", 0) == 0, inductor
    for run in plain[1:] + graphed:
        assert torch.equal(run.sequences, plain[0].sequences)
        assert all(torch.equal(a, b) for a, b in zip(run.logits, plain[0].logits))
    assert plain[0].sequences.shape == (1, 20)


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")
@pytest.mark.parametrize("config", ["bf16:mxfp4", "mxfp8"])
def test_fused_projections_match_layer_by_layer(rng, config):
    """quantize_(fuse=True) on the GPU: q/k/v and gate/up fused give, on exactly representable data, the same bits
    as the layers swapped one by one: eager, torch.compile(fullgraph=True) and mode="reduce-overhead" (no
    cudagraph skip), each call on new data."""
    import copy

    from torch._dynamo.utils import counters

    from mxcore.nn import FusedLinear, quantize_

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
            self.q_proj, self.k_proj, self.v_proj = lin(256, 256), lin(256, 128), lin(256, 128)
            self.gate_proj, self.up_proj = lin(256, 512), lin(256, 512)

        def forward(self, h):  # every product of exact data (each GEMM exact in fp32, whatever its split of K)
            return torch.cat([self.q_proj(h), self.k_proj(h) - self.v_proj(h), self.gate_proj(h) * self.up_proj(h)], -1)

    plain = Block().cuda().to(torch.bfloat16)
    with torch.no_grad():
        for m in plain.children():
            m.weight.copy_(_exact(rng, tuple(m.weight.shape)) / 16)
    fused = copy.deepcopy(plain)
    quantize_(plain, config)
    assert len(quantize_(fused, config, fuse=True).fused) == 2 and isinstance(fused.qkv_proj, FusedLinear)
    xs = [_exact(rng, (16, 256)).cuda() / 4 for _ in range(4)]
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        want = [plain(x) for x in xs]
        assert all(torch.equal(fused(x), w) for x, w in zip(xs, want))
        full = torch.compile(fused, fullgraph=True)
        assert all(torch.equal(full(x), w) for x, w in zip(xs, want))
        graphed = torch.compile(fused, mode="reduce-overhead", fullgraph=True)
        outs = [graphed(x).clone() for x in xs]
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert all(torch.equal(o, w) for o, w in zip(outs, want))
