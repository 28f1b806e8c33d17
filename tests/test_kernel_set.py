"""The CUDA kernel set is what the rules choose: ``kernels --emit`` compiles exactly the builds the default choice
uses (``default_builds.emit_jobs``), one job per build, at most 80 on sm_90, and the weight-only kernels take the
element format at run time (one build per kernel form serves every byte-code format).  No GPU, no compiler needed."""

from __future__ import annotations

import collections

import pytest

from mxcore.backends.cuda import default_builds as db
from mxcore.backends.cuda import emit, wonly

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90"])
def test_emit_is_the_chosen_set(arch):
    jobs = db.emit_jobs(arch)
    built = collections.Counter((j["file"], emit.plain_options(j["options"])) for j in jobs)
    assert max(built.values()) == 1  # one job per build
    chosen = {(b.file, emit.plain_options(b.options)) for b in db.default_builds(db.target_for(arch))
              if b.file != "codec.cu"}
    assert set(built) == chosen  # every build chosen, every chosen build compiled (the codec has its own checks)
    every = {(j["file"], emit.plain_options(j["options"])) for j in emit.compile_jobs(arch)}
    assert set(built) <= every  # what options can select includes the default


def test_sm90_build_count():
    assert len(db.emit_jobs("sm_90")) <= 80


def test_byte_formats_share_a_build():
    """Every byte-code format of one kernel form compiles the same source with the same options; the format is the
    kernel argument ``kind``, its index in the build's format table."""
    for act in ("f16", "bf16"):
        opts = {e: wonly.WonlyVariant.wg(e, act, 2).options() for e in wonly.byte_formats()}
        assert len(set(opts.values())) == 1, act
        kinds = [int(wonly.WonlyVariant.wg(e, act, 2).format_args()[0]) for e in wonly.byte_formats()]
        assert kinds == list(range(len(wonly.byte_formats())))
    assert wonly.WonlyVariant.wg("e2m1", "bf16", 2).options() != opts["e4m3fn"]


def test_kind_loop_follows_the_table():
    """The wgmma kernel compiles its consumer loop once per format (WW_KIND_LOOP=1) exactly where the tuning table's
    wg_kind_loop says: byte codes, the listed activations, M tiles up to max_mt, not fold-only; 4-bit builds (one
    format) never."""
    t = wonly.TUNING["wg_kind_loop"]
    for act in ("f16", "bf16"):
        for mt in range(1, 9):
            for fold_only in (False, True):
                for e in ("e4m3fn", "e2m1"):
                    v = wonly.WonlyVariant.wg(e, act, mt, fold_only=fold_only)
                    want = e != "e2m1" and act in t["acts"] and mt <= t["max_mt"] and not fold_only
                    assert v.kind_loop == want and f"-DWW_KIND_LOOP={int(want)}" in v.options(), (act, mt, e)
    assert wonly.WonlyVariant.gemv("e4m3fn", "bf16", 1).kind_loop is False
