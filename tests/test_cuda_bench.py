"""mxcore.tools.bench's loop on a fake backend that implements the backend contract (no GPU): timing through
backend.timer(), tiles through plan(tile=...), plans closed after every case, one ceiling measurement per
backend ceiling_key, the vendor baseline, loop diagnostics through Plan.diagnostics and the printed table."""

from __future__ import annotations

import numpy as np
import pytest

from mxcore.tools import bench
from mxcore.backends import Backend, Plan, Target


class _Plan(Plan):
    def __init__(self, be, a, b, tile):
        self.be, self.shape = be, (a.shape[0], b.shape[1], a.shape[1])
        self.variant = f"fake_{tile or 'auto'}"
        self.tile, self.closed = tile, False
        be.plans.append(self)

    def gemm(self):
        assert not self.closed, "gemm() on a closed plan"
        self.be.clock += 2e-3  # 2 ms of "device time" per launch
        self.be.launches += 1

    def prep(self):
        assert not self.closed
        self.be.clock += 1e-3

    def close(self):
        self.closed = True


class _ClonablePlan(_Plan):
    def clone(self):
        return type(self)(self.be, np.empty((self.shape[0], self.shape[2])), np.empty((self.shape[2], self.shape[1])),
                          self.tile)


class FakeBackend(Backend):
    name = "fake"
    vendor = "fake"

    def __init__(self, clonable: bool):
        self.plan_cls = _ClonablePlan if clonable else _Plan
        self.plans, self.clock, self.launches = [], 0.0, 0
        self.ceiling_calls: list = []

    def target(self):
        return Target("nvidia", "sm_90", 32)

    def tiles(self, dtype):
        return ("t1", "t2")

    def plan(self, a, b, mdt, *, tile=None, **options):
        assert a.dtype == np.float32 and a.shape[1] == b.shape[0] and not options
        return self.plan_cls(self, a, b, tile)

    def timer(self):
        def measure(fn):
            t0 = self.clock
            fn()
            return self.clock - t0

        return measure

    def vendor_baseline(self, dtype, m, n, k):
        def run():
            self.clock += 1e-3

        return f"fake BLAS {dtype}", run

    def ceiling_key(self, dtype):
        return "f16" if dtype == "fp16" else "bf16"

    def instruction_ceiling(self, dtype):
        self.ceiling_calls.append(dtype)
        return f"mma.{self.ceiling_key(dtype)}", 100.0


@pytest.mark.parametrize("clonable", [True, False])
def test_bench_loop_on_fake_backend(clonable):
    be = FakeBackend(clonable)
    lines = []
    rows = bench.run("fake", ["fp16", "bf16", "mxfp4"], [(64, 32, 128)], repeats=5, sets=3, tiles=(None, "t1"),
                     backend=be, progress=lambda *a, **k: lines.append(a[0]))
    assert len(rows) == 6 and len(be.plans) == 18  # 3 dtypes x 2 tiles x 3 input sets
    assert all(p.closed for p in be.plans)
    assert be.ceiling_calls == ["fp16", "bf16"]  # mxfp4 shares bf16's instruction: measured once
    flops = 2.0 * 64 * 32 * 128
    for r in rows:
        assert r["mxcore_ms"] == pytest.approx(2.0) and r["prep_ms"] == pytest.approx(1.0)
        assert r["mxcore_tflops"] == pytest.approx(flops / 2e-3 / 1e12)
        assert r["mxcore_with_prep_tflops"] == pytest.approx(flops / 3e-3 / 1e12)
        assert r["ratio"] == pytest.approx(0.5) and r["baseline"] == f"fake BLAS {r['dtype']}"
        assert r["fraction_of_ceiling"] == pytest.approx(r["mxcore_tflops"] / 100.0)
    assert [r["tile"] for r in rows[:2]] == ["fake_auto", "fake_t1"]
    assert be.launches == 6 * (3 + 5)  # warm-up + repeats of gemm per case
    table = bench._table(rows)
    assert "mxfp4" in table and "fake_t1" in table
    assert sum("..." in ln for ln in lines) == 6


def test_bench_plans_closed_when_a_case_fails():
    be = FakeBackend(True)

    def broken_timer():
        def measure(fn):
            raise RuntimeError("device lost")

        return measure

    be.timer = broken_timer
    with pytest.raises(RuntimeError, match="device lost"):
        bench.run("fake", ["fp16"], [(16, 16, 16)], repeats=2, sets=2, backend=be, progress=lambda *a, **k: None)
    assert be.plans and all(p.closed for p in be.plans)


def test_bench_needs_a_contract_backend():
    obj = type("NotABackend", (), {"name": "nt", "plan": lambda self, *a: None})()
    with pytest.raises(SystemExit, match="not an mxcore backend"):
        bench.run("nt", ["fp16"], [(16, 16, 16)], backend=obj, progress=lambda *a, **k: None)


def test_bench_every_tile_and_the_contract_defaults():
    """``tiles=("all",)`` runs every tile of backend.tiles(dtype); a backend without the optional hooks (no
    baseline, no ceiling, plans without clone()) still benchmarks through the contract's defaults."""
    be = FakeBackend(False)
    rows = bench.run("fake", ["fp16"], [(32, 32, 32)], repeats=2, sets=2, tiles=("all",), backend=be,
                     progress=lambda *a, **k: None)
    assert [r["tile"] for r in rows] == ["fake_t1", "fake_t2"] and {p.tile for p in be.plans} == {"t1", "t2"}

    class Bare(Backend):
        name = "bare"

        def target(self):
            return Target("cpu", None, 1)

        def plan(self, a, b, mdt, **options):
            return _Plan(be, a, b, None)

    rows = bench.run("bare", ["fp16"], [(8, 8, 8)], repeats=2, sets=2, backend=Bare(), progress=lambda *a, **k: None)
    assert "baseline" not in rows[0] and "ceiling_tflops" not in rows[0] and rows[0]["mxcore_ms"] > 0


class _DiagPlan(_ClonablePlan):
    diagnostics = ("smem", "mma", "feed")
    COST = {"smem": 1.6e-3, "mma": 1.5e-3, "feed": 1.8e-3}

    def gemm_diagnostic(self, name):
        from mxcore.errors import UnsupportedError

        assert not self.closed
        if self.shape[0] < 32:
            raise UnsupportedError("split K")
        self.be.clock += self.COST[name]
        self.be.diag_calls.append(name)


def test_bench_loop_ceilings_on_fake_backend():
    be = FakeBackend(True)
    be.plan_cls, be.diag_calls = _DiagPlan, []
    rows = bench.run("fake", ["fp16"], [(64, 32, 128), (16, 32, 128)], repeats=4, sets=2, backend=be,
                     progress=lambda *a, **k: None, loop_ceilings=True)
    flops = 2.0 * 64 * 32 * 128
    for name, cost in _DiagPlan.COST.items():
        assert rows[0][f"loop_{name}_tflops"] == pytest.approx(flops / cost / 1e12)
        assert be.diag_calls.count(name) == 3 + 4  # warm-up + repeats, first case only
    assert not any(k.startswith("loop_") for k in rows[1])  # split-K case: no diagnostics, no error
    table = bench._table(rows)
    assert " smem    mma   feed" in table.splitlines()[0] and "loop smem" in bench._fmt(rows[0])
    rows = bench.run("fake", ["fp16"], [(64, 32, 128)], repeats=2, sets=2, backend=be, progress=lambda *a, **k: None)
    assert "loop_smem_tflops" not in rows[0] and "smem" not in bench._table(rows)
