"""Layout pictures: SVG (no dependency), text, optional PNG, and the ``mxcore layout`` command."""

from __future__ import annotations

import importlib.util
import re
import xml.etree.ElementTree as ET

import pytest

from mxcore import layouts
from mxcore.errors import BackendUnavailableError, LayoutError

SVG = "{http://www.w3.org/2000/svg}"


def test_svg_grid_labels_every_cell():
    svg = layouts.render("v_mfma_f32_16x16x16_f16", "A", fmt="svg")
    root = ET.fromstring(svg)
    rects = root.findall(f"{SVG}rect")
    assert len(rects) == 1 + 16 * 16  # background + one cell per element
    texts = [t.text for t in root.findall(f"{SVG}text")]
    # A[1][4] of 16x16x16 f16 sits in lane 17, register v0 low half (CDNA3 ISA; seed figure 6)
    assert texts.count("T17") == 4 and "v0.0" in texts
    fills = {r.get("fill") for r in rects[1:]}
    assert len(fills) == 64  # coloured by lane: one colour per lane


def test_svg_for_scaled_fp4_and_scale_operand():
    svg = layouts.render("v_mfma_scale_f32_32x32x64_f8f6f4", "scale_a", fmt="svg", a_format="fp4", scale_opsel=(1, 0))
    root = ET.fromstring(svg)
    assert len(root.findall(f"{SVG}rect")) == 1 + 32 * 2
    assert "T63" in svg and "v0.1" in svg  # scale byte 1 of the lane's register


def test_text_form():
    text = layouts.render("m16n8k16.f16", "C", fmt="text")
    lines = text.splitlines()
    assert len(lines) == 2 + 16
    # C row 9 col 3 of the 16x8 fragment: lane 4*1 + 1 = 5, c3 (register 3)
    assert re.split(r"\s+", lines[2 + 9].strip())[1 + 3] == "T5:v3"


def test_ldmatrix_picture():
    text = layouts.render("ldmatrix.x2.trans", fmt="text")
    assert "T0:r0.0" in text and "T4:r1.0" in text


def test_png_optional():
    if importlib.util.find_spec("PIL") is None:
        with pytest.raises(BackendUnavailableError, match=r'Pillow: pip install "mxcore\[png\]"'):
            layouts.render("m16n8k8.tf32", "B", fmt="png")
    else:
        data = layouts.render("m16n8k8.tf32", "B", fmt="png")
        assert data[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_requests():
    with pytest.raises(LayoutError, match="svg, png or text"):
        layouts.render("m16n8k8.tf32", "A", fmt="jpg")
    with pytest.raises(LayoutError, match="scale_a"):
        layouts.render("v_mfma_scale_f32_16x16x128_f8f6f4", "scale_c")
    with pytest.raises(LayoutError, match="operands: a, b, c, d$"):
        layouts.render("m16n8k8.tf32", "scale_a")


def test_cli(tmp_path, capsys):
    assert layouts._cli(["--list", "--vendor", "amd", "--arch", "gfx950"]) == 0
    listed = capsys.readouterr().out.split()
    assert "v_mfma_scale_f32_16x16x128_f8f6f4" in listed and "v_mfma_f32_32x32x4_xf32" not in listed
    assert layouts._cli(["m16n8k32.e4m3.e5m2", "--operand", "B"]) == 0
    out = capsys.readouterr().out
    assert "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32" in out and "T31" in out
    target = tmp_path / "fp4.svg"
    assert layouts._cli(["v_mfma_scale_f32_32x32x64_f8f6f4", "--a-format", "fp4", "--out", str(target)]) == 0
    ET.fromstring(target.read_text())
    assert layouts._cli(["no_such_instruction"]) == 2
    assert "unknown instruction" in capsys.readouterr().err


def test_cli_bad_scale_opsel_is_a_usage_error(capsys):
    for bad in ("x", "1", "0,5", "0,1,2"):
        with pytest.raises(SystemExit) as info:
            layouts._cli(["v_mfma_scale_f32_32x32x64_f8f6f4", "--scale-opsel", bad])
        assert info.value.code == 2
        captured = capsys.readouterr()
        assert "expected A,B" in captured.err and "e.g. 0,1" in captured.err and captured.out == ""
    assert layouts._cli(["v_mfma_scale_f32_32x32x64_f8f6f4", "--scale-opsel", "1,3", "--operand", "scale_b"]) == 0
    assert "op_sel bytes (1, 3)" in capsys.readouterr().out


def test_cli_bad_operand_prints_nothing_first(capsys):
    assert layouts._cli(["v_mfma_f32_32x32x8_f16", "--operand", "Z"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no operand 'Z'; operands: a, b, c, d" in captured.err
    assert layouts._cli(["v_mfma_scale_f32_16x16x128_f8f6f4", "--operand", "scale_c"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "scale_a, scale_b" in captured.err


def test_cli_out_suffix(tmp_path, capsys):
    bmp = tmp_path / "x.bmp"
    with pytest.raises(SystemExit) as info:
        layouts._cli(["m16n8k16.f16", "--out", str(bmp)])
    assert info.value.code == 2 and not bmp.exists()
    assert ".svg, .png or .txt" in capsys.readouterr().err
    txt = tmp_path / "c.TXT"
    assert layouts._cli(["m16n8k16.f16", "--operand", "C", "--out", str(txt)]) == 0
    assert txt.read_text() == layouts.render("m16n8k16.f16", "C", fmt="text")
    png = tmp_path / "x.png"
    if importlib.util.find_spec("PIL") is None:
        capsys.readouterr()
        assert layouts._cli(["m16n8k16.f16", "--out", str(png)]) == 2
        assert 'pip install "mxcore[png]"' in capsys.readouterr().err and not png.exists()
    else:
        assert layouts._cli(["m16n8k16.f16", "--out", str(png)]) == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_list_rejects_unknown_arch(capsys):
    assert layouts._cli(["--list", "--arch", "gfx900"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "known archs" in captured.err
