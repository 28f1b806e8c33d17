"""The decode-step benchmark's eager timer (mxcore.tools.bench_decode._time_pair) on stand-in CUDA events: the two
steps take turns round by round, the order alternating, and the ratio is read from neighbouring rounds."""

import types

from mxcore.tools import bench_decode as bd


class _Clock:
    """A stand-in for torch's CUDA events: each call of a step advances a fake clock by that step's cost."""

    def __init__(self):
        self.now = 0.0
        self.log = []

    def step(self, name, costs):
        it = iter(costs)

        def run():
            self.log.append(name)
            self.now += next(it)

        return run

    def torch(self):
        clock = self

        class Event:
            def __init__(self, enable_timing=True):
                self.t = None

            def record(self):
                self.t = clock.now

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return (other.t - self.t) * 1e3  # ms

        return types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event, synchronize=lambda: None))


def test_rounds_alternate_and_ratios_pair_neighbours():
    clock = _Clock()
    # base costs 2 s per call throughout; fn costs 1 s per call, then 4 s per call from its third round on (a host
    # slowing down between rounds): each round has reps // 5 = 4 calls after 2 warm-up calls of each
    fn_costs = [1.0] * 2 + [1.0] * 8 + [4.0] * 24
    base, fn = clock.step("base", [2.0] * 100), clock.step("fn", fn_costs)
    tb, tf, ratios = bd._time_pair(clock.torch(), base, fn, reps=20, rounds=8)
    timed = clock.log[4:]  # after the warm-up calls: base, fn, base, fn
    assert clock.log[:4] == ["base", "fn", "base", "fn"]
    order = [timed[i] for i in range(0, len(timed), 4)]  # the step of each round of 4 calls
    assert order == ["base", "fn", "fn", "base"] * 4  # base first in even rounds, fn first in odd ones
    assert len(ratios) == 8
    assert ratios[:2] == [2.0, 2.0] and ratios[2:] == [0.5] * 6  # each pair of neighbouring rounds, base / fn
    assert (tb, tf) == (2.0, 1.0)  # each side's fastest round, seconds per call


def test_fused_shape_streams_the_same_weights_in_fewer_launches():
    plain, fused = bd._linears(bd.MODELS["llama3-8b"]), bd._linears(bd.MODELS["llama3-8b-fused"])
    assert [n for n, _, _ in fused] == ["qkv", "o", "gate_up", "down"] and len(plain) == 7
    for fmt in bd.WEIGHTS:  # the same bytes per layer: one launch per input the projections share
        assert sum(bd._weight_bytes(fmt, k, n) for _, k, n in fused) == sum(
            bd._weight_bytes(fmt, k, n) for _, k, n in plain)
    p, f = {n: (k, w) for n, k, w in plain}, {n: (k, w) for n, k, w in fused}
    assert f["qkv"] == (4096, p["q"][1] + p["k"][1] + p["v"][1]) and f["gate_up"] == (4096, 2 * p["gate"][1])
    assert f["o"] == p["o"] and f["down"] == p["down"]
