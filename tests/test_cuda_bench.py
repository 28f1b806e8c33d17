"""mxcore.bench's loop on a fake backend (no GPU): timing through backend.timer(), plans closed after every
case, one ceiling measurement per backend ceiling_key, the vendor baseline and the printed table."""

from __future__ import annotations

import numpy as np
import pytest

from mxcore import bench


class _Variant:
    def __init__(self, name):
        self.name = name


class _Plan:
    def __init__(self, be, a, b):
        self.be, self.shape = be, (a.shape[0], b.shape[1], a.shape[1])
        self.variant = _Variant(f"fake_{be.force_tile or 'auto'}")
        self.closed = False
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
        return type(self)(self.be, np.empty((self.shape[0], self.shape[2])), np.empty((self.shape[2], self.shape[1])))


class FakeBackend:
    name = "fake"
    vendor = "fake"

    def __init__(self, clonable: bool):
        self.plan_cls = _ClonablePlan if clonable else _Plan
        self.force_tile = None
        self.plans, self.clock, self.launches = [], 0.0, 0
        self.ceiling_calls: list = []

    def target(self):
        from mxcore.backends import Target

        return Target("nvidia", "sm_90", 32)

    def plan(self, a, b, mdt):
        assert a.dtype == np.float32 and a.shape[1] == b.shape[0]
        return self.plan_cls(self, a, b)

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
    assert be.force_tile is None
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
    assert be.force_tile is None


def test_bench_needs_a_timer():
    obj = type("NoTimer", (), {"name": "nt", "plan": lambda self, *a: None, "force_tile": None})()
    with pytest.raises(SystemExit, match="timer"):
        bench.run("nt", ["fp16"], [(16, 16, 16)], backend=obj, progress=lambda *a, **k: None)


def test_hip_timer_brackets_the_call_with_hip_events(monkeypatch):
    """HipBackend.timer() (bench's AMD timer): create two events, record around fn, wait, read, destroy."""
    from mxcore.backends import hip as hipmod

    calls = []

    class _Hip:
        def hipEventCreate(self):
            calls.append("create")
            return (0, len(calls))

        def hipEventRecord(self, ev, stream):
            calls.append(("record", stream))
            return (0,)

        def hipEventSynchronize(self, ev):
            calls.append("sync")
            return (0,)

        def hipEventElapsedTime(self, start, stop):
            calls.append("elapsed")
            return (0, 2.5)  # milliseconds

        def hipEventDestroy(self, ev):
            calls.append("destroy")
            return (0,)

    class _Rt:
        hip = _Hip()

        @staticmethod
        def check(result, what):
            return result[1] if len(result) > 1 else None

    be = hipmod.HipBackend()
    monkeypatch.setattr(be, "_runtime", lambda: _Rt())
    measure = be.timer()
    assert measure(lambda: calls.append("fn")) == pytest.approx(2.5e-3)
    assert calls == ["create", "create", ("record", None), "fn", ("record", None), "sync", "elapsed", "destroy",
                     "destroy"]


class _DiagPlan(_ClonablePlan):
    DIAGNOSTICS = {"smem": 1, "mma": 2, "feed": 3}
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
