"""``quantize_(..., fuse=...)`` on the CPU (reference backend): sibling projections fused into one
``FusedLinear`` give the same results bit for bit as the same layers swapped one by one (MX weights are quantized
row by row), the fused product runs once per input, a part called alone still answers, torch.compile traces it
whole, groups that cannot fuse are swapped one by one and say why, and the state_dict round trips."""

from __future__ import annotations

import copy
import io

import pytest

torch = pytest.importorskip("torch")

from mxcore.errors import InputTypeError  # noqa: E402
from mxcore.nn import FusedLinear, FusedPart, Linear, quantize_  # noqa: E402
from mxcore.nn.fused import fused_name, fusion_groups  # noqa: E402


@pytest.fixture(autouse=True)
def _reference_backend(monkeypatch):
    monkeypatch.setenv("MXCORE_BACKEND", "reference")


class _Block(torch.nn.Module):
    """An attention's projections and an MLP, with transformers' child names."""

    def __init__(self, hidden=64, kv=32, inter=96, bias=False):
        super().__init__()
        self.q_proj = torch.nn.Linear(hidden, hidden, bias=bias)
        self.k_proj = torch.nn.Linear(hidden, kv, bias=bias)
        self.v_proj = torch.nn.Linear(hidden, kv, bias=bias)
        self.o_proj = torch.nn.Linear(hidden, hidden, bias=bias)
        self.gate_proj = torch.nn.Linear(hidden, inter, bias=bias)
        self.up_proj = torch.nn.Linear(hidden, inter, bias=bias)
        self.down_proj = torch.nn.Linear(inter, hidden, bias=bias)

    def forward(self, h):
        q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        h = h + self.o_proj(q) * (k.mean(-1, keepdim=True) - v.mean(-1, keepdim=True))
        return h + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


def _pair(config="bf16:mxfp4", bias=False, seed=0, **fuse_kw):
    torch.manual_seed(seed)
    plain = torch.nn.Sequential(_Block(bias=bias), _Block(bias=bias)).to(torch.bfloat16)
    fused = copy.deepcopy(plain)
    return plain, quantize_(plain, config), fused, quantize_(fused, config, **{"fuse": True, **fuse_kw})


@pytest.mark.parametrize("config", ["bf16:mxfp4", "mxfp8", "mxfp4", "bf16,mxfp8"])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_matches_layer_by_layer_bit_for_bit(config, bias):
    plain, rp, fused, rf = _pair(config, bias)
    assert sorted(rf.swapped) == sorted(rp.swapped) and not rf.skipped and not rf.unfused
    assert rf.fused == {f"{i}.{n}": tuple(f"{i}.{m}" for m in members)
                        for i in ("0", "1") for n, members in (("qkv_proj", ("q_proj", "k_proj", "v_proj")),
                                                               ("gate_up_proj", ("gate_proj", "up_proj")))}
    block = fused[0]
    assert isinstance(block.qkv_proj, FusedLinear) and block.qkv_proj.out_features == 64 + 32 + 32
    assert isinstance(block.k_proj, FusedPart) and block.k_proj.out_features == 32
    assert type(block.o_proj) is Linear and type(block.down_proj) is Linear
    # the fused weight's codes and scales are the members' own (MX blocks run along in_features)
    assert torch.equal(block.qkv_proj.weight_codes,
                       torch.cat([plain[0].q_proj.weight_codes, plain[0].k_proj.weight_codes,
                                  plain[0].v_proj.weight_codes]))
    for shape in [(3, 64), (2, 5, 64), (1, 1, 64)]:
        x = torch.randn(*shape, dtype=torch.bfloat16)
        with torch.no_grad():
            assert torch.equal(fused(x), plain(x))


def test_fused_product_runs_once_per_input_and_keeps_nothing():
    _, _, fused, _ = _pair()
    block = fused[0]
    calls = []
    block.qkv_proj.register_forward_hook(lambda m, i, o: calls.append(i[0]))
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        q, k, v = block.q_proj(x), block.k_proj(x), block.v_proj(x)
    assert len(calls) == 1 and calls[0] is x
    assert getattr(x, block.qkv_proj._snapshot) is None  # the last part let go of the product
    whole = block.qkv_proj(x)
    assert torch.equal(torch.cat([q, k, v], -1), whole)
    # a part alone, or with another input, computes its own answer (the fused product of that input)
    y = torch.randn(4, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        k_alone = block.k_proj(y)
        q_y = block.q_proj(y)  # q was not left anything for y: the product again
    assert torch.equal(k_alone, block.qkv_proj(y)[:, 64:96]) and torch.equal(q_y, block.qkv_proj(y)[:, :64])
    # the input changed in place between two parts' calls: the later part computes the product of what it reads
    z = torch.randn(4, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        block.q_proj(z)
        z.mul_(2)
        assert torch.equal(block.k_proj(z), block.qkv_proj(z)[:, 64:96])


def test_fused_parts_under_inference_mode():
    plain, _, fused, _ = _pair(seed=6)
    with torch.inference_mode():
        x = torch.randn(3, 64, dtype=torch.bfloat16)
        assert torch.equal(fused(x), plain(x))


def test_fused_parts_from_several_threads():
    """Threads running the same fused model on their own inputs get their own results: a part reads an input and
    that input's outputs from one snapshot."""
    from concurrent.futures import ThreadPoolExecutor

    plain, _, fused, _ = _pair(seed=4)
    xs = [torch.randn(2, 64, dtype=torch.bfloat16) for _ in range(8)]
    with torch.no_grad():
        want = [plain(x) for x in xs]

    def work(i):
        with torch.no_grad():
            return all(torch.equal(fused(xs[i]), want[i]) for _ in range(15))

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(work, range(8)))


@pytest.mark.slow
def test_fused_model_compiles_whole():
    _, _, fused, _ = _pair()
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = torch.compile(fused, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
            assert torch.equal(compiled(x), fused(x))
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("config, why", [
    ("fp8", "per-tensor factor"),
    (None, "training recipe"),
])
def test_groups_that_cannot_fuse_are_swapped_one_by_one(config, why):
    from mxcore.nn import MXConfig

    cfg = MXConfig("mxfp8", train=True) if config is None else config
    torch.manual_seed(1)
    model = torch.nn.Sequential(_Block())
    report = quantize_(model, cfg, fuse=True)
    assert not report.fused and set(report.unfused) == {"0.qkv_proj", "0.gate_up_proj"}
    assert all(why in r for r in report.unfused.values())
    assert len(report.swapped) == 7 and all(type(m) is Linear for m in model[0].children())
    assert "not fused 0.qkv_proj" in str(report)


def test_mismatched_groups_and_filter():
    torch.manual_seed(2)
    block = _Block()
    block.v_proj = torch.nn.Linear(64, 32, bias=True)  # a bias where q and k have none
    report = quantize_(torch.nn.Sequential(block), "mxfp4", fuse=True)
    assert "bias" in report.unfused["0.qkv_proj"] and "0.gate_up_proj" in report.fused
    block = _Block()
    report = quantize_(torch.nn.Sequential(block), "mxfp4", fuse=True,
                       filter_fn=lambda m, fqn: not fqn.endswith("up_proj"))
    assert report.skipped == {"0.up_proj": "filter_fn declined it"} and "0.qkv_proj" in report.fused
    assert type(block.gate_proj) is Linear and type(block.up_proj) is torch.nn.Linear
    # groups by name, for other naming schemes
    from mxcore.torch.bench import _Block as BenchBlock

    bench = BenchBlock(64, 32, 96)
    report = quantize_(bench, "bf16:mxfp4", fuse=[("q", "k", "v"), ("gate", "up")])
    assert report.fused == {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}


def test_fuse_argument_and_names():
    assert fusion_groups(False) == () and fusion_groups(None) == ()
    assert fusion_groups(True) == (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
    assert fusion_groups([["w1", "w3"]]) == (("w1", "w3"),)
    for bad in ("q_proj", [("q",)], [("q", "q")], 3, [("q", 1)]):
        with pytest.raises(InputTypeError, match="fuse="):
            fusion_groups(bad)
    assert fused_name(("q_proj", "k_proj", "v_proj")) == "qkv_proj"
    assert fused_name(("gate_proj", "up_proj")) == "gate_up_proj"
    assert fused_name(("q", "k", "v")) == "qkv" and fused_name(("w1", "w3")) == "w1_w3"


def test_fused_state_dict_round_trip_and_copies():
    plain, _, fused, _ = _pair(seed=3)
    buf = io.BytesIO()
    torch.save(fused.state_dict(), buf)
    assert "0.qkv_proj.weight_codes" in fused.state_dict() and "0.q_proj.weight_codes" not in fused.state_dict()
    torch.manual_seed(9)
    other = torch.nn.Sequential(_Block(), _Block()).to(torch.bfloat16)
    quantize_(other, "bf16:mxfp4", fuse=True)
    buf.seek(0)
    other.load_state_dict(torch.load(buf, weights_only=True))
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(other(x), fused(x))
        twin = copy.deepcopy(fused)
        assert twin[0].k_proj.fused is twin[0].qkv_proj and twin[0].qkv_proj is not fused[0].qkv_proj
        assert torch.equal(twin(x), fused(x))


@pytest.mark.slow
def test_fused_transformers_llama_generates_the_same():
    """A tiny transformers Llama: fused q/k/v and gate/up generate the same tokens and logits, bit for bit, as the
    same model swapped layer by layer."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(5)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    plain = transformers.LlamaForCausalLM(cfg).eval()
    fused = copy.deepcopy(plain)
    quantize_(plain, "bf16:mxfp4")
    report = quantize_(fused, "bf16:mxfp4", fuse=True)
    assert len(report.fused) == 4 and len(report.swapped) == 2 * 7 + 1
    ids = torch.tensor([[1, 5, 9, 13]])
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True,
              return_dict_in_generate=True)
    with torch.no_grad():
        a, b = plain.generate(ids, **kw), fused.generate(ids, **kw)
    assert torch.equal(a.sequences, b.sequences)
    assert all(torch.equal(x, y) for x, y in zip(a.logits, b.logits))


class _QK(torch.nn.Module):
    """Calls only two of the three fused parts."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(64, n, bias=False) for n in (64, 32, 32))

    def forward(self, h):
        return self.q_proj(h).sum(-1) + self.k_proj(h).sum(-1)


@pytest.mark.slow
def test_compiled_parts_never_take_another_inputs_product():
    """The product is left on the input tensor itself, so a compiled region that starts between two parts (a graph
    break, regional compilation) reads it only from its own input; a model calling only some parts compiles once."""
    from torch._dynamo.utils import counters

    plain, _, fused, _ = _pair(seed=7)
    p, f = plain[0], fused[0]
    torch._dynamo.reset()
    kv = torch.compile(lambda t: (f.k_proj(t), f.v_proj(t)), fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(3, 64, dtype=torch.bfloat16)
            f.q_proj(x)  # eager: leaves the product on x
            k, v = kv(x)
            assert torch.equal(k, p.k_proj(x)) and torch.equal(v, p.v_proj(x))
        y, z = (torch.randn(3, 64, dtype=torch.bfloat16) for _ in range(2))
        f.q_proj(y)
        k, v = kv(z)
        assert torch.equal(k, p.k_proj(z)) and torch.equal(v, p.v_proj(z))
    torch.manual_seed(8)
    qk = _QK().to(torch.bfloat16)
    qk_plain = copy.deepcopy(qk)
    quantize_(qk, "bf16:mxfp4", fuse=True)
    quantize_(qk_plain, "bf16:mxfp4")
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(qk, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert all(torch.equal(compiled(x), qk_plain(x)) for x in
                   [torch.randn(2, 64, dtype=torch.bfloat16) for _ in range(4)])
    assert counters["stats"]["unique_graphs"] == 1


def test_parts_under_autograd_and_grad_modes():
    """Frozen quantized weights, an input that needs grad: a part's output can be changed in place (a narrow view,
    not a multi-output split), biases stay frozen, and a part computed under no_grad is not reused with grad on."""
    plain, _, fused, _ = _pair(bias=True, seed=9)
    for m in (plain, fused):
        for t in m.parameters():
            t.requires_grad_(False)
    assert not [n for n, t in fused.named_parameters() if t.requires_grad]
    f, p = fused[0], plain[0]
    x = torch.randn(2, 64, dtype=torch.bfloat16, requires_grad=True)
    q = f.q_proj(x)
    q.mul_(0.5)  # as a model may scale q in place
    assert torch.equal(q, p.q_proj(x) * 0.5)
    (q.float().sum() + f.k_proj(x).float().sum() + f.v_proj(x).float().sum()).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    x2 = torch.randn(2, 64, dtype=torch.bfloat16, requires_grad=True)
    with torch.no_grad():
        f.q_proj(x2)
    k = f.k_proj(x2)  # grad on now: the product again, with a graph back to x2
    assert k.requires_grad and torch.equal(k, p.k_proj(x2))


def test_cross_attention_and_containers_are_not_fused():
    class CrossAttention(_QK):
        pass

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder_attn = _QK()
            self.cross = CrossAttention()
            self.projs = torch.nn.ModuleDict({n: torch.nn.Linear(64, 64) for n in ("q_proj", "k_proj", "v_proj")})
            self.self_attn = _QK()

    report = quantize_(Decoder(), "mxfp4", fuse=True)
    assert set(report.fused) == {"self_attn.qkv_proj"}
    assert "cross-attention" in report.unfused["encoder_attn.qkv_proj"]
    assert "cross-attention" in report.unfused["cross.qkv_proj"]
    assert "container" in report.unfused["projs.qkv_proj"]
    assert len(report.swapped) == 12


def test_whole_quantized_models_save_and_load():
    """torch.save of a whole quantized model (not only its state_dict): the operand a codes tensor keeps is saved
    as nothing, and the loaded model binds its own."""
    plain, _, fused, _ = _pair(seed=10)
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    for model in (plain, fused):
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        with torch.no_grad():
            assert torch.equal(loaded(x), model(x))
