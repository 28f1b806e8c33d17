"""``mxcore.nn`` on the CPU (reference backend): Linear per format against mxcore.matmul, the training recipe,
``state_dict`` round trips, ``repr``, ``quantize_`` (swapping, skipping and reporting), checkpoints read with
``MXTensor.from_blocks`` (bit-exact through safetensors), and a transformers Llama built from a config that
``generate()``s after ``quantize_``."""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mxcore  # noqa: E402
from mxcore.errors import InputTypeError, ShapeError, UnknownNameError, UnsupportedError  # noqa: E402
from mxcore.nn import Linear, MXConfig, quantize_  # noqa: E402

CONFIGS = ["fp8", "e5m2", "mxfp8", "mxfp8_e5m2", "mxfp6", "mxfp4", "bf16:mxfp4", "fp16,mxfp8", "mxfp8,mxfp4"]


@pytest.fixture(autouse=True)
def _reference_backend(monkeypatch):
    monkeypatch.setenv("MXCORE_BACKEND", "reference")


@pytest.mark.parametrize("config", CONFIGS)
def test_linear_matches_mxcore_matmul(config):
    torch.manual_seed(0)
    float_lin = torch.nn.Linear(96, 40)
    lin = Linear.from_float(float_lin, config)
    cfg = MXConfig.parse(config)
    assert isinstance(lin, Linear) and lin.weight_codes.dtype == torch.uint8
    assert lin.weight_codes.shape == (40, 96)
    x = torch.randn(2, 3, 96)
    y = lin(x)
    assert y.shape == (2, 3, 40) and y.dtype == x.dtype
    # the same product through mxcore.matmul on host arrays: the weight quantized along in_features (K)
    w = float_lin.weight.detach().numpy()
    if cfg.is_mx:
        wq = mxcore.quantize_mx(w.T, cfg.weight, axis=0)
    else:
        wq = mxcore.quantize_tensor(w.T, cfg.weight)
    ref = mxcore.matmul(x.reshape(-1, 96).numpy(), wq, (cfg.act or cfg.weight, cfg.weight), backend="reference")
    ref = torch.from_numpy(ref).reshape(2, 3, 40) + float_lin.bias.detach()
    assert torch.equal(y, ref)
    # the dequantized weight is the one that was multiplied
    np.testing.assert_array_equal(lin.dequantize(torch.float64).numpy().T, mxcore.dequantize(wq, np.float64))


@pytest.mark.parametrize("config", ["fp8", "mxfp8", "bf16:mxfp4"])
def test_bfloat16_model(config):
    """A bf16 model on the CPU: the weights quantize from bf16 (read through ml_dtypes), the output stays bf16."""
    torch.manual_seed(6)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.SiLU(), torch.nn.Linear(64, 32)).to(torch.bfloat16)
    w = model[0].weight.detach().float().numpy()
    assert quantize_(model, config).swapped == ["0", "2"]
    y = model(torch.randn(3, 64, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and y.shape == (3, 32) and torch.isfinite(y).all()
    cfg = MXConfig.parse(config)
    want = (mxcore.dequantize(mxcore.quantize_mx(w, cfg.weight, axis=-1), np.float64) if cfg.is_mx
            else mxcore.dequantize(mxcore.quantize_tensor(w, cfg.weight), np.float64))
    np.testing.assert_array_equal(model[0].dequantize(torch.float64).numpy(), want)


@pytest.mark.parametrize("config", ["fp8", "mxfp4", "bf16:mxfp4"])
def test_repr_shows_the_format(config):
    text = repr(Linear(64, 16, config=config))
    assert text.startswith("Linear(in_features=64, out_features=16, bias=True, format=")
    assert {"fp8": "format=e4m3fn)", "mxfp4": "format=mxfp4)", "bf16:mxfp4": "format=bf16 x mxfp4 (weight-only)"}[
        config] in text
    assert "training recipe" in repr(Linear(64, 16, config=MXConfig("mxfp8", train=True)))


@pytest.mark.parametrize("config", ["fp8", "mxfp6", "mxfp4", "bf16:mxfp4"])
def test_state_dict_round_trip(config):
    torch.manual_seed(1)
    lin = Linear(64, 32, config=config)
    buf = io.BytesIO()
    torch.save(lin.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    other = Linear(64, 32, config=config)  # another random weight, then loaded
    x = torch.randn(5, 64)
    assert not torch.equal(other(x), lin(x))
    other.load_state_dict(state)
    assert torch.equal(other(x), lin(x))
    assert set(state) == ({"weight_codes", "weight_scales", "bias"} if MXConfig.parse(config).is_mx
                          else {"weight_codes", "weight_scale_exp", "bias"})
    import copy

    twin = copy.deepcopy(lin)
    assert torch.equal(twin(x), lin(x)) and twin._operand is not lin._operand


def test_training_recipe_linear():
    """train=True keeps a float Parameter; the gradients are the recipe's GEMMs (mxcore.matmul along N and M)."""
    torch.manual_seed(2)
    lin = Linear(64, 32, config=MXConfig("mxfp8", train=True, scale_rounding="rceil"))
    assert isinstance(lin.weight, torch.nn.Parameter)
    x = torch.randn(8, 64, requires_grad=True)
    g = torch.randn(8, 32)
    lin(x).backward(g)
    w = lin.weight.detach().clone()
    kw = dict(dtype="mxfp8", backend="reference", scale_rounding="rceil")
    assert torch.equal(x.grad, mxcore.matmul(g, w, **kw))
    assert torch.equal(lin.weight.grad, mxcore.matmul(x.detach().t(), g, **kw).t())
    assert torch.equal(lin.bias.grad, g.sum(0))
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    opt.step()
    assert not torch.equal(lin.weight.detach(), w)


def test_frozen_quantized_linear_passes_activation_gradient():
    torch.manual_seed(3)
    lin = Linear(64, 32, config="mxfp4")
    x = torch.randn(4, 64, requires_grad=True)
    g = torch.randn(4, 32)
    lin(x).backward(g)
    assert torch.equal(x.grad, mxcore.matmul(g, lin.dequantize(), "fp32", backend="reference"))
    assert lin.weight_codes.grad is None and not lin.weight_codes.requires_grad


def test_config_errors():
    with pytest.raises(UnsupportedError, match="weight-only"):
        MXConfig("mxfp4", act="bf16", train=True)
    with pytest.raises(UnsupportedError, match="not quantized"):
        MXConfig("bf16")
    with pytest.raises(UnknownNameError):
        MXConfig("mxfp5")
    with pytest.raises(UnsupportedError):
        MXConfig.parse(4)
    with pytest.raises(ShapeError, match="multiple of 32"):
        Linear(48, 16, config="mxfp4")
    assert MXConfig.parse("bf16:mxfp4") == MXConfig("mxfp4", act="bf16") == MXConfig.parse("bf16,mxfp4")


def test_quantize_swaps_skips_and_reports():
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 64),
                                torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 30),
                                                    torch.nn.Linear(30, 64)))
    x = torch.randn(3, 64)
    before = model(x)
    report = quantize_(model, "mxfp8", filter_fn=lambda m, fqn: fqn != "2")
    assert report.swapped == ["0", "3.0"]
    assert report.skipped == {"2": "filter_fn declined it", "3.1": "out_features=30 is not a multiple of 8",
                              "3.2": "in_features=30 is not a multiple of 32 (MX blocks run along it)"}
    assert "2 layer(s) swapped, 3 skipped" in str(report)
    assert isinstance(model[0], Linear) and type(model[2]) is torch.nn.Linear and type(model[3][2]) is torch.nn.Linear
    after = model(x)
    assert after.shape == before.shape and not torch.equal(after, before)
    assert (after - before).abs().max() < 0.1 * before.abs().max()  # mxfp8 keeps the model close
    lone = torch.nn.Linear(64, 64)
    assert "from_float" in quantize_(lone, "mxfp4").skipped[""]


def test_from_blocks_round_trip_through_safetensors(tmp_path, rng):
    """A tensor written in the published MXFP4 layout (gpt-oss: blocks [..., n_blocks, 16] with the earlier element
    in the low nibble, scales [..., n_blocks]) reads back bit for bit, from numpy and from torch."""
    safetensors = pytest.importorskip("safetensors.torch")
    w = rng.standard_normal((4, 48, 128)) * np.exp2(rng.integers(-6, 6, size=(4, 48, 1)))
    t = mxcore.quantize_mx(w, "mxfp4", axis=-1)
    codes = t.codes.reshape(4, 48, 4, 32)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)  # written here, independent of mxcore
    path = tmp_path / "experts.safetensors"
    safetensors.save_file({"mlp.experts.down_proj_blocks": torch.from_numpy(blocks),
                           "mlp.experts.down_proj_scales": torch.from_numpy(t.scales)}, str(path))
    loaded = safetensors.load_file(str(path))
    for b, s in ((loaded["mlp.experts.down_proj_blocks"], loaded["mlp.experts.down_proj_scales"]),
                 (loaded["mlp.experts.down_proj_blocks"].numpy(), loaded["mlp.experts.down_proj_scales"].numpy())):
        got = mxcore.MXTensor.from_blocks(b, s, "mxfp4")
        assert got.fmt == "mxfp4" and got.shape == (4, 48, 128) and got.axis == 2
        np.testing.assert_array_equal(got.codes, t.codes)
        np.testing.assert_array_equal(got.scales, t.scales)
        np.testing.assert_array_equal(np.asarray(got.packed()).reshape(blocks.shape), blocks)
    # one expert as a Linear, weight-only, nothing requantized
    expert = mxcore.MXTensor.from_blocks(loaded["mlp.experts.down_proj_blocks"][1],
                                         loaded["mlp.experts.down_proj_scales"][1])
    lin = Linear.from_quantized(expert, act="bf16")
    np.testing.assert_array_equal(lin.weight_codes.numpy(), t.codes[1])
    x = torch.randn(2, 128)
    ref = mxcore.matmul(x.numpy(), mxcore.MXTensor(t.codes[1].T, t.scales[1].T, "mxfp4", 0), ("bf16", "mxfp4"),
                        backend="reference")
    assert torch.equal(lin(x), torch.from_numpy(ref))


def test_from_blocks_other_formats_and_errors(rng):
    w = rng.standard_normal((3, 96))
    for fmt, pack in (("mxfp8", lambda c: c), ("mxfp6", mxcore.formats.pack_fp6)):
        t = mxcore.quantize_mx(w, fmt, axis=-1)
        blocks = pack(t.codes.reshape(3, 3, 32))
        got = mxcore.MXTensor.from_blocks(blocks, t.scales, fmt)
        np.testing.assert_array_equal(got.codes, t.codes)
    with pytest.raises(ShapeError, match=r"blocks \[\.\.\., n_blocks, 16\]"):
        mxcore.MXTensor.from_blocks(np.zeros((3, 4, 32), np.uint8), np.zeros((3, 4), np.uint8))
    with pytest.raises(ShapeError):
        mxcore.MXTensor.from_blocks(np.zeros((3, 4, 16), np.uint8), np.zeros((3, 5), np.uint8))
    with pytest.raises(InputTypeError):
        mxcore.MXTensor.from_blocks(np.zeros((3, 4, 16), np.int32), np.zeros((3, 4), np.uint8))
    with pytest.raises(UnknownNameError):
        mxcore.MXTensor.from_blocks(np.zeros((3, 4, 16), np.uint8), np.zeros((3, 4), np.uint8), "fp8")


@pytest.mark.slow
@pytest.mark.parametrize("config", ["mxfp8", "bf16:mxfp4"])
def test_quantize_transformers_llama_generates(config):
    """A tiny LlamaForCausalLM from a config (random weights, no download): quantize_ swaps every projection and
    the LM head, and generate() runs greedy decoding through them."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(5)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).eval()
    report = quantize_(model, config)
    assert len(report.swapped) == 2 * 7 + 1 and not report.skipped, report
    assert all(isinstance(m, Linear) for n, m in model.named_modules() if n.endswith(("q_proj", "down_proj")))
    ids = torch.tensor([[1, 5, 9, 13]])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 10) and torch.equal(out[:, :4], ids)
    assert int(out.max()) < 256


def test_bench_block_quantizes_and_runs():
    """The decode benchmark's block (q, k, v, o, gate, up, down) at small shapes: quantize_ swaps all seven."""
    from mxcore.torch import bench

    block = bench._Block(64, 32, 128).to(torch.bfloat16)
    assert len(quantize_(block, "bf16:mxfp4").swapped) == 7
    assert block(torch.randn(2, 64, dtype=torch.bfloat16)).shape == (2, 64)


def test_bench_step_timer_rounds(monkeypatch):
    """The decode benchmark's step timer with rounds, on stand-in CUDA events: warm-up calls, then the fastest of
    the rounds of iters / rounds calls back to back, in ms per call, each call a new cudagraph step when graphed."""
    import types

    from mxcore.torch import bench

    clock = {"now": 0.0, "marks": 0}

    class Event:
        def __init__(self, enable_timing=True):
            self.t = None

        def record(self):
            self.t = clock["now"]

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return (other.t - self.t) * 1e3

    def mark():
        clock["marks"] += 1

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event, synchronize=lambda: None),
                                 compiler=types.SimpleNamespace(cudagraph_mark_step_begin=mark))
    monkeypatch.setattr(bench, "torch", fake)
    costs = iter([9.0] * 3 + [3.0] * 4 + [2.0] * 4 + [5.0] * 4)  # warm-up, then three rounds of four calls

    def step():
        clock["now"] += next(costs)

    assert bench._time_ms(step, warmup=3, iters=12, graphed=True, rounds=3) == 2000.0  # 2 s per call, in ms
    assert clock["marks"] == 15


@pytest.mark.parametrize("config", ["fp8", "mxfp8", "bf16:mxfp4"])
def test_compiled_inference_calls_the_inference_op(config):
    """Under torch.compile with no gradient to carry, Linear calls the op without an autograd layer
    (linear_*_infer): the same bits as eager; with a gradient wanted, the differentiable op (and x gets its grad)."""
    torch.manual_seed(3)
    lin = Linear.from_float(torch.nn.Linear(64, 24), config)
    x = torch.randn(5, 64)
    seen = []

    def backend(gm, inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(lin, backend=backend, fullgraph=True)
    with torch.no_grad():
        want = lin(x)
        got = compiled(x)
    assert torch.equal(got, want)
    infer = "linear_mx_infer" if MXConfig.parse(config).is_mx else "linear_fp8_infer"
    assert any(infer in t for t in seen), seen
    seen.clear()
    xg = x.clone().requires_grad_()
    compiled(xg).sum().backward()
    assert not any(infer in t for t in seen) and any("mxcore.linear" in t for t in seen), seen
    assert xg.grad is not None and xg.grad.shape == x.shape


def test_inference_ops_refuse_a_gradient_and_pass_opcheck():
    lin = Linear(64, 32, config="mxfp8")
    fp8 = Linear(64, 32, config="fp8")
    x = torch.randn(3, 64)
    for op, args in ((torch.ops.mxcore.linear_mx_infer.default,
                      (x, lin.weight_codes, lin.weight_scales, "mxfp8", "", "floor", "reference")),
                     (torch.ops.mxcore.linear_fp8_infer.default,
                      (x, fp8.weight_codes, fp8.weight_scale_exp, "e4m3fn", "", "reference"))):
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)
        with pytest.raises(UnsupportedError, match="takes no gradient"):
            op(x.clone().requires_grad_(), *args[1:])
