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


def test_info_returns_and_does_not_print(capsys):
    import mxcore
    from mxcore.tools import info

    report = info()
    assert capsys.readouterr().out == ""  # the library returns; the CLI prints
    from mxcore.backends import names

    assert [s.name for s in report.backends] == names()  # every registered backend, in selection order
    assert report.packages["numpy"] != "not installed"
    assert str(report).startswith(f"mxcore {mxcore.__version__} on Python") and "reference: usable" in str(report)


def test_demo_on_reference():
    out = run("demo", "--backend", "reference", "--size", "64").stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line.strip()}
    for dtype in ("fp32", "tf32", "fp16", "bf16", "fp8", "mxfp8", "mxfp6", "mxfp4", "mxfp8,mxfp4"):
        assert dtype in rows, out
        err = float(rows[dtype][1])
        assert 0 <= err < 0.4, (dtype, err)
    assert float(rows["fp32"][1]) < 1e-6


def test_formats_table():
    """Every e2m1 code with its value (OCP MX v1.0: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives)."""
    out = run("formats", "e2m1", "--table").stdout
    rows = {int(p[0], 16): float(p[5]) for p in (line.split() for line in out.splitlines())
            if len(p) >= 6 and p[0].startswith("0x")}
    mags = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert rows == {c: (mags[c & 7] if c < 8 else -mags[c & 7]) for c in range(16)}


def test_layout_text():
    """The A picture of m16n8k16.f16: row 0 holds lanes 0-3 (a0, a1) then again lanes 0-3 (a4, a5), PTX ISA."""
    out = run("layout", "m16n8k16.f16", "--operand", "A").stdout
    row0 = next(line.split() for line in out.splitlines() if line.split()[:1] == ["0"] and "T0:v0.0" in line)
    assert row0[1:] == [f"T{t}:v{r}.{h}" for r in (0, 2) for t in range(4) for h in (0, 1)]


def error_line(*args):
    """Run a failing command: exit status 2 and exactly one line on stderr (no traceback)."""
    res = run(*args, ok=False)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def test_layout_out_into_missing_folder(tmp_path):
    line = error_line("layout", "m16n8k16.f16", "--out", str(tmp_path / "missing" / "a.svg"))
    assert "does not exist" in line and "missing" in line


def test_kernels_emit_onto_a_file(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    assert "not a folder" in error_line("kernels", "--vendor", "nvidia", "--arch", "sm_80", "--emit", str(f))


@pytest.mark.parametrize("vendor,arch,says", [("nvidia", "sm_75", "needs sm_80 or newer"),
                                              ("nvidia", "gfx942", "amd arch, not nvidia"),
                                              ("amd", "gfx900", "unknown arch 'gfx900'"),
                                              ("amd", "gfx940", "no kernels for gfx940")])
def test_kernels_checks_the_arch_first(tmp_path, vendor, arch, says):
    assert says in error_line("kernels", "--vendor", vendor, "--arch", arch, "--emit", str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # nothing compiled or written


def test_errors_use_command_line_spelling():
    import os

    env = {k: v for k, v in os.environ.items() if k != "MXCORE_BACKEND"}
    res = subprocess.run([sys.executable, "-m", "mxcore", "demo", "--backend", "hip", "--size", "8"],
                         capture_output=True, text=True, timeout=600, env=env)
    if res.returncode == 0:
        pytest.skip("the hip backend is usable here")
    line = res.stderr.strip()
    assert res.returncode == 2 and len(line.splitlines()) == 1, res.stderr
    assert "--backend auto" in line and "backend='" not in line


def test_command_line_spelling():
    from mxcore.tools.cli import command_line_spelling

    assert command_line_spelling("pass backend='auto' or dtype=\"fp16\"") == "pass --backend auto or --dtype fp16"
    assert command_line_spelling("out_dtype='float16'") == "--out-dtype float16"


def test_unknown_command_and_bad_names():
    res = run("frobnicate", ok=False)
    assert res.returncode == 2 and "unknown command" in res.stderr
    res = run("formats", "e9m9", ok=False)
    assert res.returncode == 2 and "e9m9" in res.stderr and "Traceback" not in res.stderr


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


def test_version():
    import mxcore

    for args in (["--version"], ["-V"]):
        out = run(*args).stdout.strip()
        assert out.startswith("mxcore ") and out.split()[1][:1].isdigit(), out
    from mxcore.tools.cli import main

    assert main(["--version"]) == 0
    assert mxcore.__version__ in run("--version").stdout or "dev" not in mxcore.__version__


# Every subcommand with bad options: exit status 2, one line on stderr, no traceback (in-process: main(argv)).
BAD_OPTIONS = [
    ["info", "--bogus"],
    ["demo", "--size", "abc"],
    ["demo", "--size", "0"],
    ["demo", "--size", "-3"],
    ["demo", "--backend", "reference", "--size", "100000"],
    ["demo", "--backend", "nope"],
    ["formats", "e9m9"],
    ["formats", "--bogus"],
    ["layout", "no.such.instruction"],
    ["layout", "m16n8k16.f16", "--operand", "Z"],
    ["kernels", "--vendor", "nvidia"],
    ["kernels", "--vendor", "intel", "--arch", "sm_80", "--emit", "x"],
    ["bench", "--sizes", "abc"],
    ["bench", "--sizes", "1x2"],
    ["bench", "--sizes", "0"],
    ["bench", "--shapes", "abc"],
    ["bench", "--shapes", "1x2"],
    ["bench", "--shapes", "axbxc"],
    ["bench", "--shapes", "1x2x0"],
    ["bench", "--repeats", "-1"],
    ["bench", "--repeats", "x"],
    ["bench", "--sets", "0"],
    ["bench", "--backend", "reference", "--sizes", ""],
    ["bench", "--backend", "nope"],
    ["bench", "--dtype", ","],
    ["bench", "--end-to-end", "--shapes", "1x2"],
    ["bench", "--end-to-end", "--sizes", "abc"],
    ["bench", "--end-to-end", "--repeats", "-1"],
    ["selftest", "--shapes", "abc"],
    ["selftest", "--shapes", "1x2"],
    ["selftest", "--shapes", "axbxc"],
    ["selftest", "--seed", "x"],
    ["frobnicate"],
]


@pytest.mark.parametrize("argv", BAD_OPTIONS, ids=lambda a: " ".join(a) or "''")
def test_bad_options_give_one_line_and_status_2(argv, capsys):
    from mxcore.tools.cli import main

    assert main(argv) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in cap.err and "error" in lines[0], cap.err
    # the line names the offending value or an option, so the user knows what to change
    said = lines[0].split("error:", 1)[1]
    assert "--" in said or any(a in said for a in argv if a), lines[0]


@pytest.mark.parametrize("argv", [["demo", "--size", "abc"], ["bench", "--shapes", "axbxc"],
                                  ["selftest", "--shapes", "1x2"], ["frobnicate"]])
def test_bad_options_in_a_subprocess(argv):
    line = error_line(*argv)
    assert argv[-1] in line


@pytest.mark.parametrize("cmd,opt", [("selftest", "--out"), ("layout", "--out"), ("bench", "--json")])
def test_unwritable_outputs_are_refused_before_running(tmp_path, cmd, opt):
    from mxcore.tools.cli import main

    pre = ["m16n8k16.f16"] if cmd == "layout" else (["--backend", "reference", "--sizes", "8"] if cmd == "bench"
                                                     else [])
    for target, says in ((tmp_path / "missing" / "r.json", "does not exist"), (tmp_path, "is a folder")):
        line = error_line(cmd, *pre, opt, str(target))
        assert opt in line and says in line, line
    assert main([cmd, *pre, opt, str(tmp_path / "missing" / "r.json")]) == 2
    assert not (tmp_path / "missing").exists()


def test_missing_optional_modules(tmp_path):
    """torch and CuPy made unimportable: the bench commands say what to install, in one line."""
    import os

    for name in ("torch", "cupy"):
        (tmp_path / f"{name}.py").write_text(f"raise ModuleNotFoundError(\"No module named '{name}'\", name='{name}')\n")
    env = {k: v for k, v in os.environ.items() if k != "MXCORE_BACKEND"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path)] + [p for p in sys.path if p])
    for argv, says in ((["bench", "--end-to-end"], "needs torch"), (["bench", "--backend", "cuda"], "cupy"),
                       (["bench", "--backend", "cuda", "--end-to-end"], "needs torch")):
        res = subprocess.run([sys.executable, "-m", "mxcore", *argv], capture_output=True, text=True, timeout=600,
                             env=env)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
        assert says in lines[0].lower(), lines[0]


def test_unexpected_failures_are_one_line_with_status_1(monkeypatch, capsys):
    from mxcore.tools import cli

    def broken(argv):
        raise ZeroDivisionError("a bug")

    monkeypatch.delenv("MXCORE_DEBUG", raising=False)
    monkeypatch.setitem(cli._LOCAL, "info", (broken, "broken"))
    assert cli.main(["info"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ZeroDivisionError: a bug" in err and "MXCORE_DEBUG=1" in err
    monkeypatch.setenv("MXCORE_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        cli.main(["info"])


def test_bench_on_the_cpu_picks_small_sizes_and_prints_its_table(tmp_path):
    out = tmp_path / "rows.json"
    res = run("bench", "--backend", "reference", "--dtype", "fp16,mxfp4", "--json", str(out))
    rows = json.loads(out.read_text())
    assert {(r["dtype"], r["m"]) for r in rows} == {(d, s) for d in ("fp16", "mxfp4") for s in (256, 512)}
    assert all(r["mxcore_tflops"] > 0 for r in rows)
    assert "[1/4]" in res.stdout and "[4/4]" in res.stdout  # progress, case by case
    assert "numpy on the CPU" in res.stdout and "rows written to" in res.stdout
    table = [ln for ln in res.stdout.splitlines() if ln.startswith(("fp16 ", "mxfp4 "))]
    assert len(table) == 4 and all(float(ln.split()[2]) > 0 for ln in table), res.stdout  # not "0.0"


def test_bench_warns_when_a_cpu_size_takes_minutes(monkeypatch, capsys):
    from mxcore.tools import bench

    seen = {}
    monkeypatch.setattr(bench, "run", lambda name, dtypes, shapes, **kw: seen.update(shapes=shapes, **kw) or [])
    assert bench._cli(["--backend", "reference", "--sizes", "4096", "--dtype", "fp16"]) == 0
    assert "take minutes per case" in capsys.readouterr().out
    assert seen["shapes"] == [(4096, 4096, 4096)] and seen["repeats"] == bench.DEFAULT_REPEATS["cpu"]


def test_parse_helpers():
    from mxcore.tools.cli import CLIError, parse_shapes, parse_sizes

    assert parse_sizes("256, 512,") == [256, 512]
    assert parse_shapes("16x32x64,llm", words=("llm",)) == [(16, 32, 64), "llm"]
    assert parse_shapes("2x16x32x64", dims=(3, 4)) == [(2, 16, 32, 64)]
    for bad in ("abc", "1x2", "axbxc", "1x2x-3", "1.5x2x3"):
        with pytest.raises(CLIError, match="--shapes"):
            parse_shapes(bad)
    with pytest.raises(CLIError, match="--sizes"):
        parse_sizes("-1")
