"""Smoke tests of ``python -m mxcore`` (each command runs in a subprocess, as a user would run it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run(*args, ok=True):
    res = subprocess.run([sys.executable, "-m", "mxcore", *args], capture_output=True, text=True, timeout=600)
    if ok:
        assert res.returncode == 0, f"mxcore {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}"
    return res


def test_help_lists_commands():
    out = run().stdout
    for cmd in ("info", "demo", "formats", "layout", "kernels", "bench"):
        assert cmd in out


def test_info():
    out = run("info").stdout
    assert "reference: usable" in out and "cuda" in out and "hip" in out


def test_demo_on_reference():
    out = run("demo", "--backend", "reference", "--size", "64").stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line.strip()}
    for dtype in ("fp32", "tf32", "fp16", "bf16", "fp8", "mxfp8", "mxfp6", "mxfp4", "mxfp8,mxfp4"):
        assert dtype in rows, out
        err = float(rows[dtype][1])
        assert 0 <= err < 0.4, (dtype, err)
    assert float(rows["fp32"][1]) < 1e-6


def test_formats_table():
    out = run("formats", "e2m1", "--table").stdout
    assert "6" in out and "0.5" in out
    assert len([line for line in out.splitlines() if line.strip()]) >= 16


def test_layout_text():
    out = run("layout", "m16n8k16.f16", "--operand", "A").stdout
    assert "T0" in out or "0" in out


def test_unknown_command_and_bad_names():
    res = run("frobnicate", ok=False)
    assert res.returncode == 2 and "unknown command" in res.stderr
    res = run("formats", "e9m9", ok=False)
    assert res.returncode != 0


def test_kernels_emit_nvidia(tmp_path):
    from conftest import require_tool
    from mxcore.backends import nvrtc_tools

    require_tool("NVRTC", nvrtc_tools.have_nvrtc())
    out = run("kernels", "--vendor", "nvidia", "--arch", "sm_80", "--emit", str(tmp_path)).stdout
    rows = json.loads((tmp_path / "manifest.json").read_text())
    assert rows and all((tmp_path / r["file"]).is_file() for r in rows), out


def test_kernels_emit_amd(tmp_path):
    from conftest import require_tool
    from mxcore.backends import hip_tools

    require_tool("clang-22", hip_tools.have_clang())
    out = run("kernels", "--vendor", "amd", "--arch", "gfx950", "--emit", str(tmp_path)).stdout
    rows = json.loads((tmp_path / "manifest.json").read_text())
    assert rows and all((tmp_path / r["file"]).is_file() for r in rows), out
