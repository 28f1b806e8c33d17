"""Benchmarks of mxcore inside PyTorch on one CUDA GPU (random weights, nothing downloaded).

``python -m mxcore.torch.bench decode``: the decode step of a Llama-3-8B-shaped stack of linear layers (32 layers x
q, k, v, o, gate, up, down; hidden 4096, kv 1024, intermediate 14336) at M = 1 and 16, through
``mxcore.nn.quantize_`` (default ``bf16:mxfp4``) eager, ``torch.compile`` and ``mode="reduce-overhead"``, against the
same torch bf16 model the same three ways.

``python -m mxcore.torch.bench train``: one training step (forward + backward) of an ``mxcore.nn.Linear`` in the
MXFP8 recipe and of an MLP block (up, GELU, down) at 8192 x 8192 x 8192, against torch bf16 and, where importable,
torchao's MX linear.

``python -m mxcore.torch.bench generate``: an 8B-shaped transformers ``LlamaForCausalLM`` (random weights) generating
greedy tokens, bf16 against ``quantize_(model, "bf16:mxfp4")``, eager, with a compiled forward (static cache) and
with a reduce-overhead compiled forward (CUDA graphs).
Without transformers it says so and runs nothing.

``all`` runs the three; ``--json PATH`` writes the figures.  Each figure comes from CUDA events after warm-up: a
decode step's, the fastest of five rounds of four steps back to back (as ``python -m mxcore bench --decode``); a
training step's, the median of steps timed alone.  Functions of the same names take the same arguments for use
from Python.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time

import torch

__all__ = ["decode", "generate", "main", "train"]

LLAMA3_8B = {"hidden": 4096, "kv": 1024, "intermediate": 14336, "layers": 32}


def _time_ms(fn, *, warmup: int = 3, iters: int = 20, graphed: bool = False, rounds: int = 0) -> float:
    """Milliseconds of ``fn()`` by CUDA events (``graphed``: mark a new cudagraph step per call): the median of
    ``iters`` calls each timed alone, or with ``rounds``, the fastest of ``rounds`` rounds of ``iters / rounds`` calls
    back to back (as ``python -m mxcore bench --decode`` times a step: a decode loop's steps follow each other, and a
    call timed alone also counts the host time before its first launch)."""
    for _ in range(warmup):
        if graphed:
            torch.compiler.cudagraph_mark_step_begin()
        fn()
    torch.cuda.synchronize()
    if rounds:
        per, best = max(1, iters // rounds), float("inf")
        for _ in range(rounds):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(per):
                if graphed:
                    torch.compiler.cudagraph_mark_step_begin()
                fn()
            stop.record()
            stop.synchronize()
            best = min(best, start.elapsed_time(stop) / per)
        return best
    times = []
    for _ in range(iters):
        if graphed:
            torch.compiler.cudagraph_mark_step_begin()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


class _Block(torch.nn.Module):
    """One decoder layer's linear layers (attention itself left out: the weights are what a decode step streams)."""

    def __init__(self, hidden: int, kv: int, inter: int):
        super().__init__()
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.q, self.k, self.v, self.o = lin(hidden, hidden), lin(hidden, kv), lin(hidden, kv), lin(hidden, hidden)
        self.gate, self.up, self.down = lin(hidden, inter), lin(hidden, inter), lin(inter, hidden)

    def forward(self, h):
        q, k, v = self.q(h), self.k(h), self.v(h)
        # k and v reach the output (a product with 0 would let torch.compile drop their layers as dead code)
        h = h + self.o(q) + (k.mean(-1, keepdim=True) + v.mean(-1, keepdim=True))
        return h + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


def _stack(layers: int, shape: dict):
    with torch.device("cuda"):
        model = torch.nn.Sequential(*[_Block(shape["hidden"], shape["kv"], shape["intermediate"])
                                      for _ in range(layers)])
    return model.to(torch.bfloat16).eval()


MODES = ("eager", "compile", "reduce-overhead")


def _pdl(mode: str):
    """A mode's inductor settings: ``+pdl`` (``"reduce-overhead+pdl"``) turns on inductor's programmatic dependent
    launch (``torch._inductor.config.triton.enable_pdl``, ``TORCHINDUCTOR_ENABLE_PDL=1``): its kernels let the next
    launch start early, as mxcore's weight-only kernels do, so a weight's stream can begin while the elementwise
    kernels between two linear layers run."""
    import contextlib

    if not mode.endswith("+pdl"):
        return contextlib.nullcontext()
    import torch._inductor.config as inductor_config

    return inductor_config.patch({"triton.enable_pdl": True})


def _three_ways(model, x, label: str, rows: list, modes=MODES) -> None:
    torch._dynamo.reset()
    for way in modes:
        base = way.removesuffix("+pdl")
        if base not in MODES:
            raise ValueError(f"mode {way!r}: one of {MODES}, optionally with +pdl")
        fn = model if base == "eager" else torch.compile(model, fullgraph=True,
                                                         mode="reduce-overhead" if base == "reduce-overhead" else None)
        try:
            with torch.no_grad(), _pdl(way):
                ms = _time_ms(lambda fn=fn: fn(x), graphed=base == "reduce-overhead", rounds=5)
            rows.append({"model": label, "mode": way, "M": x.shape[0], "ms": round(ms, 4)})
        except Exception as exc:  # noqa: BLE001 (a mode that fails is reported, the others still run)
            rows.append({"model": label, "mode": way, "M": x.shape[0], "error": f"{type(exc).__name__}: {exc}"[:300]})
        print(_fmt(rows[-1]), flush=True)


def _fmt(row: dict) -> str:
    head = "  ".join(f"{k}={v}" for k, v in row.items() if k not in ("ms", "error"))
    if "error" in row:
        return f"{head}  FAILED {row['error']}"
    return head + (f"  {row['ms']:.3f} ms" if "ms" in row else "")


def decode(ms=(1, 16), layers: int = 32, config: str = "bf16:mxfp4", fuse: bool = False, modes=MODES) -> list:
    """Decode-step milliseconds of the Llama-3-8B-shaped linear stack: torch bf16 and ``quantize_(config)``, each
    way of ``modes`` (eager, compile, reduce-overhead; ``+pdl``: with inductor's programmatic dependent launch), at
    each M of ``ms``; ``fuse``: then also a twin with q, k, v and gate, up fused (``quantize_(..., fuse=...)``), in
    the same run."""
    rows: list = []
    torch.manual_seed(0)
    model = _stack(layers, LLAMA3_8B)
    for m in ms:
        _three_ways(model, torch.randn(m, LLAMA3_8B["hidden"], device="cuda", dtype=torch.bfloat16), "torch bf16",
                    rows, modes)
    for model, label in _quantized(model, config, [("q", "k", "v"), ("gate", "up")] if fuse else False):
        for m in ms:
            _three_ways(model, torch.randn(m, LLAMA3_8B["hidden"], device="cuda", dtype=torch.bfloat16), label, rows,
                        modes)
    return rows


def _quantized(model, config: str, fuse):
    """Yield (model, label): ``model`` after ``quantize_(model, config)``, then, where ``fuse`` names groups (or is
    True), a copy of the float model made before it, quantized with those groups fused (both in the same run)."""
    from .. import nn

    twin = copy.deepcopy(model) if fuse else None
    print(nn.quantize_(model, config), flush=True)
    yield model, f"mxcore {config}"
    if twin is not None:
        del model  # (the unfused model goes once the caller lets go of it too)
        torch.cuda.empty_cache()
        print(nn.quantize_(twin, config, fuse=fuse), flush=True)
        yield twin, f"mxcore {config} fused"


def train(n: int = 8192, config: str = "mxfp8") -> list:
    """Forward + backward milliseconds at ``n`` x ``n`` x ``n``: one Linear and an MLP block (up, GELU, down), torch
    bf16 against ``mxcore.nn.Linear`` with ``MXConfig(config, train=True)`` and torchao's MX linear if importable."""
    from .. import nn

    rows: list = []
    torch.manual_seed(0)
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)

    def make(kind: str):
        layers = [torch.nn.Linear(n, n, bias=False, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        if kind == "mxcore":
            layers = [nn.Linear.from_float(lin, nn.MXConfig(config, train=True)) for lin in layers]
        elif kind == "torchao":
            from torchao.prototype.mx_formats import MXLinearConfig
            from torchao.quantization import quantize_ as ao_quantize

            seq = torch.nn.Sequential(*layers)
            ao_quantize(seq, MXLinearConfig())
            layers = list(seq)
        return layers

    for kind in ("torch bf16", "mxcore", "torchao"):
        try:
            up, down = make(kind.split()[0])
        except Exception as exc:  # noqa: BLE001 (torchao absent or another API: said, not fatal)
            rows.append({"model": kind, "error": f"not run: {type(exc).__name__}: {exc}"[:300]})
            print(_fmt(rows[-1]), flush=True)
            continue
        for name, fwd in (("linear", lambda up=up: up(x)),
                          ("mlp", lambda up=up, down=down: down(torch.nn.functional.gelu(up(x))))):
            def step(fwd=fwd):
                x.grad = None
                fwd().backward(g)
            try:
                ms = _time_ms(step, warmup=2, iters=10)
                flops = 6 * n ** 3 * (1 if name == "linear" else 2)
                rows.append({"model": kind, "block": name, "n": n, "ms": round(ms, 4),
                             "tflops": round(flops / ms / 1e9, 1)})
            except Exception as exc:  # noqa: BLE001
                rows.append({"model": kind, "block": name, "n": n, "error": f"{type(exc).__name__}: {exc}"[:300]})
            print(_fmt(rows[-1]), flush=True)
        del up, down
        torch.cuda.empty_cache()
    return rows


def _forget_compiled_call(model) -> None:
    """Drop the compiled forward transformers' generate keeps on a model (made again at its next compiled run)."""
    for attr in ("_compiled_call", "_last_compile_config"):
        if hasattr(model, attr):
            delattr(model, attr)


def generate(new_tokens: int = 128, prompt: int = 32, config: str = "bf16:mxfp4", layers: int = 32,
             modes=MODES, fuse: bool = False) -> list:
    """Greedy tokens/s of an 8B-shaped transformers Llama (random weights), bf16 against ``quantize_(config)``;
    ``modes``: ``eager``, ``compile`` and ``reduce-overhead`` (transformers' own compile path: a static cache and a
    ``CompileConfig`` with that torch.compile mode, ``fullgraph=True``; reduce-overhead replays the decode steps as
    CUDA graphs; a mode with ``+pdl``: inductor's programmatic dependent launch on, see :func:`_pdl`); ``fuse``: then
    also a twin with q/k/v and gate/up fused (``quantize_(..., fuse=True)``), in the same run; [] (and a message)
    without transformers."""
    try:
        import transformers
    except ImportError:
        print("generate: transformers is not installed (pip install transformers); not run", flush=True)
        return []
    cfg = transformers.LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=8,
                                   max_position_embeddings=prompt + new_tokens + 8)
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = transformers.LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(prev)
    ids = torch.randint(0, cfg.vocab_size, (1, prompt), device="cuda")
    rows: list = []

    def run(model, label: str, mode: str):
        base = mode.removesuffix("+pdl")
        compiled = base != "eager"
        kw = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False, "pad_token_id": 0}
        if compiled:
            # transformers' own compile path: over a static cache, generate compiles the forward of the decode steps
            # with the compile_config given (the prompt runs eager, where the cache's tensors are made and marked as
            # static addresses, which CUDA graphs need)
            kw["cache_implementation"] = "static"
            kw["compile_config"] = transformers.CompileConfig(
                fullgraph=True, dynamic=False, mode="reduce-overhead" if base == "reduce-overhead" else "default")
        try:
            if compiled:
                torch._dynamo.reset()
                _forget_compiled_call(model)  # compiled again for this model's modules
                torch.cuda.empty_cache()
            with torch.no_grad(), _pdl(mode):
                t0 = time.perf_counter()
                # warm-up at the timed run's own length: compiled, a static cache is sized by it (another length is
                # another cache shape, compiled again); eager, a shorter warm-up made the first model's timed run 4x
                # slower than the same run warmed up at its length (the attention, cuDNN through SDPA, most likely
                # builds a plan per new sequence length, which the second model's run then found cached)
                model.generate(ids, **kw)
                torch.cuda.synchronize()
                print(f"{label}: warm-up{' and compile' if compiled else ''} {time.perf_counter() - t0:.1f} s",
                      flush=True)
                times = []
                for _ in range(2):  # the faster of two timed runs
                    t0 = time.perf_counter()
                    out = model.generate(ids, **kw)
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - t0)
            tokens = int(out.shape[1] - prompt)
            rows.append({"model": label, "mode": mode, "tokens": tokens,
                         "tok_per_s": round(tokens / min(times), 2), "runs_s": [round(t, 3) for t in times]})
        except Exception as exc:  # noqa: BLE001
            rows.append({"model": label, "mode": mode,
                         "error": f"{type(exc).__name__}: {exc}"[:300]})
        print(_fmt(rows[-1]).replace("  tok_per_s=", "  tokens/s="), flush=True)

    for mode in modes:
        run(model, "torch bf16", mode)
    _forget_compiled_call(model)  # (not copied to a fused twin)
    for model, label in _quantized(model, config, fuse):
        for mode in modes:
            run(model, label, mode)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mxcore.torch.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["decode", "train", "generate", "all"])
    p.add_argument("--m", type=int, nargs="+", default=[1, 16], help="decode: batch rows M")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--config", default=None, help="decode/generate: quantize_ config (bf16:mxfp4); train: mxfp8")
    p.add_argument("--n", type=int, default=8192, help="train: M = N = K")
    p.add_argument("--tokens", type=int, default=128, help="generate: new tokens")
    p.add_argument("--modes", default="eager,compile,reduce-overhead",
                   help="decode/generate: eager, compile, reduce-overhead, each optionally +pdl (comma list)")
    p.add_argument("--fuse", action="store_true", help="decode/generate: also q/k/v and gate/up fused (quantize_ fuse=), same run")
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("mxcore.torch.bench needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if args.what in ("decode", "all"):
        out["decode"] = decode(tuple(args.m), args.layers, args.config or "bf16:mxfp4", fuse=args.fuse, modes=modes)
    if args.what in ("train", "all"):
        out["train"] = train(args.n, args.config if args.what == "train" and args.config else "mxfp8")
    if args.what in ("generate", "all"):
        out["generate"] = generate(args.tokens, config=args.config if args.what == "generate" and args.config
                                   else "bf16:mxfp4", layers=args.layers,
                                   modes=modes, fuse=args.fuse)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
