"""CI compile checks of the HIP kernels: every variant, gfx942 and gfx950, clang-22, no GPU.

Each variant is compiled from the source string and -D options that go to hiprtc at run time
(``hip.compile_inputs``).  The disassembly must contain exactly the intended MFMA (mnemonic and
cbsz/blgp modifiers taken from the layout record), the expected number of them per K tile, no
scratch, and the LDS size the tile implies.  VGPR/AGPR/LDS are printed (``pytest -s``).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest
from conftest import require_tool
from mxcore.backends import hip, hip_tools

from mxcore import dtypes as _dt
from mxcore import kernel_source
from mxcore.errors import FormatError, KernelCompileError, LayoutError, UnsupportedError

ALL = [s for arch in hip.ARCHS for s in hip.kernel_specs(arch)]
WORKERS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _need_clang():
    require_tool("clang-22", hip_tools.have_clang())


@pytest.fixture(scope="session")
def compiled():
    """(arch, entry) -> HipBinary for every variant: one batch over all cores (clang-22 runs as a subprocess per
    variant), through the disk cache (a second run is fast; tests of the cache itself use their own folder)."""
    if hip_tools.have_clang() is not None:
        return None
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        bins = list(pool.map(hip.offline_compile, ALL))
    return {(s.arch, s.entry): b for s, b in zip(ALL, bins)}


def test_toolchain_present():
    _need_clang()
    assert hip_tools.clang_version().startswith(("Debian clang version 22", "clang version 22", "Ubuntu clang version 22"))


def _expected_mfma(spec) -> str:
    rec = spec.layout()
    return f"{rec.mnemonic} {rec.modifiers}".strip()


@pytest.mark.parametrize("spec", ALL, ids=lambda s: f"{s.arch}-{s.entry}")
def test_variant_machine_code(spec, compiled):
    _need_clang()
    binary = compiled[(spec.arch, spec.entry)]
    assert hip_tools.code_object_arch(binary.code_object) == spec.arch
    found = hip_tools.mfma_instructions(binary.disasm)
    assert set(found) == {_expected_mfma(spec)}, f"{spec.entry}: expected only {_expected_mfma(spec)}, got {set(found)}"
    per_tile = spec.tm * spec.tn * (spec.bk // spec.shape[2])
    assert len(found) >= per_tile and len(found) % per_tile == 0, f"{len(found)} MFMAs, {per_tile} per K tile"
    res = binary.resources[spec.entry]
    ops = set(hip_tools.mnemonics(binary.disasm))
    assert res["scratch_bytes"] == 0 and res["vgpr_spill"] == 0 and not any(o.startswith("scratch_") for o in ops)
    assert not res["dynamic_stack"]
    bm, bn, bk = spec.tile
    assert res["lds_bytes"] == spec.lds_bytes  # two buffers of A and B rows (fp4 / fp6 packed along K)
    assert "global_load_dwordx4" in ops, "the 16-byte global load path is missing"
    assert any(o.startswith("ds_read") for o in ops) and any(o.startswith("ds_write") for o in ops)
    print(f"{spec.arch} {spec.entry}: vgpr {res['vgpr']} agpr {res['agpr']} sgpr {res['sgpr']} "
          f"lds {res['lds_bytes']} B, {len(found)} x {found[0]}")


def test_cdna4_half_precision_is_full_rate(compiled):
    """gfx950 fp16/bf16 must use the CDNA4 16x16x32 / 32x32x16 instructions, never the half-rate CDNA3 shapes."""
    _need_clang()
    for spec in hip.kernel_specs("gfx950"):
        if spec.dtype in ("fp16", "bf16"):
            text = " ".join(hip_tools.mfma_instructions(compiled[("gfx950", spec.entry)].disasm))
            assert "32x32x8" not in text and "16x16x16" not in text
            assert ("32x32x16" if spec.shape[0] == 32 else "16x16x32") in text, (spec.entry, text)


def test_named_instructions(compiled):
    """The issue's examples, spelled out."""
    _need_clang()
    by = {(s.arch, s.dtype, s.shape[0]): compiled[(s.arch, s.entry)] for s in ALL}
    assert hip_tools.mfma_instructions(by[("gfx950", "mxfp4", 32)].disasm)[0] == \
        "v_mfma_scale_f32_32x32x64_f8f6f4 cbsz:4 blgp:4"
    assert hip_tools.mfma_instructions(by[("gfx942", "e4m3fnuz", 32)].disasm)[0] == "v_mfma_f32_32x32x16_fp8_fp8"
    assert hip_tools.mfma_instructions(by[("gfx950", "fp16", 32)].disasm)[0] == "v_mfma_f32_32x32x16_f16"
    assert hip_tools.mfma_instructions(by[("gfx942", "bf16", 16)].disasm)[0] == "v_mfma_f32_16x16x16_bf16"


def test_every_dtype_has_both_shapes():
    for arch in hip.ARCHS:
        shapes = {}
        for s in hip.kernel_specs(arch):
            for d in s.dtypes:
                shapes.setdefault(d, set()).add(s.shape[0])
        assert all(v == {16, 32} for v in shapes.values())
    assert len({s.entry for s in hip.kernel_specs("gfx950")}) == len(hip.kernel_specs("gfx950"))
    assert {"fp32", "tf32", "fp16", "bf16", "e4m3fnuz", "e5m2fnuz"} == set(hip.supported_dtype_names("gfx942"))
    assert {"mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2", "e4m3fn", "e5m2", "fp16"} <= set(
        hip.supported_dtype_names("gfx950"))


def test_select_spec_picks_shape_by_problem_size():
    mdt = _dt.resolve("fp16", "gfx950")
    assert hip.select_spec("gfx950", mdt, 4096, 4096).shape[0] == 32
    assert hip.select_spec("gfx950", mdt, 4096, 40).shape[0] == 16
    with pytest.raises(UnsupportedError, match="gfx942 runs"):
        hip.select_spec("gfx942", _dt.resolve("mxfp4"), 64, 64)
    assert hip.supports_on(_dt.resolve("e4m3fn"), "gfx942").startswith("gfx942 reads FNUZ")
    assert "OCP" in hip.supports_on(_dt.resolve("e4m3fnuz"), "gfx950")


def test_same_source_and_options_as_hiprtc(monkeypatch):
    """clang-22 gets exactly the kernel file's text and the -D options that the runtime passes to hiprtc."""
    spec = hip.kernel_specs("gfx950")[0]
    seen = {}

    def fake(source, *, name, arch, options=()):
        seen.update(source=source, name=name, arch=arch, options=tuple(options))
        raise KernelCompileError("stop")

    monkeypatch.setattr(hip_tools, "compile_hip", fake)
    with pytest.raises(KernelCompileError):
        hip.offline_compile(spec, use_cache=False)
    source, options = hip.compile_inputs(spec)
    assert seen == {"source": kernel_source("amd", "gemm_mfma.hip"), "name": spec.entry, "arch": "gfx950",
                    "options": tuple(options)}
    assert source == seen["source"] and hip_tools.DEFAULT_OPTIONS == hip.COMMON_OPTIONS


@pytest.mark.parametrize("arch,dtype", [("gfx942", "fp16"), ("gfx942", "e5m2fnuz"), ("gfx950", "bf16"),
                                        ("gfx950", "mxfp6_e3m2"), ("gfx950", "fp32")])
def test_ceiling_kernel(arch, dtype):
    _need_clang()
    spec = hip.select_spec(arch, _dt.resolve(dtype, arch), 1 << 20, 1 << 20)
    binary = hip_tools.compile_hip(kernel_source("amd", "gemm_ceiling.hip"), name="mx_mfma_ceiling", arch=arch,
                                   options=hip.ceiling_defines(spec, 4))
    found = hip_tools.mfma_instructions(binary.disasm)
    assert set(found) == {_expected_mfma(spec)} and len(found) >= 4
    assert binary.resources["mx_mfma_ceiling"]["scratch_bytes"] == 0
    ops = hip_tools.mnemonics(binary.disasm)
    assert not any(o.startswith(("global_load", "ds_read")) for o in ops), "the ceiling loop must not touch memory"


# ----------------------------------------------------------------------------- validation on the Python side
def _mx(arch="gfx950", a="e2m1", b="e2m1", mn=32):
    return hip.scaled_spec(arch, mn, a, b)


def test_invalid_format_code_is_refused():
    with pytest.raises(FormatError, match="does not name e2m1"):
        hip.validate_spec(replace(_mx(), cbsz=3))
    with pytest.raises(FormatError, match="does not name"):
        hip.validate_spec(replace(_mx(), blgp=7))
    with pytest.raises(FormatError, match="not an f8f6f4 format"):
        hip.validate_spec(replace(_mx(), a_format="fp16"))
    with pytest.raises(UnsupportedError, match="gfx950"):
        hip.validate_spec(replace(_mx(), arch="gfx942"))
    classic = hip.kernel_specs("gfx942")[0]
    with pytest.raises(FormatError, match="broadcast"):
        hip.validate_spec(replace(classic, cbsz=1))
    with pytest.raises(FormatError, match="broadcast"):
        replace(classic, blgp=2).defines()


def test_layout_mismatch_is_refused():
    spec = hip.kernel_specs("gfx950")[-1]  # 16x16x128 mxfp4
    from mxcore import layouts

    other = layouts.get("v_mfma_scale_f32_32x32x64_f8f6f4", a_format="e2m1", b_format="e2m1")
    with pytest.raises(LayoutError):
        spec.defines(other)
    wrong_codes = layouts.get(spec.instruction, a_format="e4m3fn", b_format="e2m1")
    with pytest.raises((FormatError, LayoutError)):
        spec.defines(wrong_codes)


def test_operand_storage_rejects_bad_codes():
    spec = next(s for s in hip.kernel_specs("gfx950") if s.dtype == "mxfp4")

    class Op:
        codes = np.array([[0, 17]], np.uint8)
        dtype = _dt.resolve("mxfp4").a

    with pytest.raises(FormatError, match="4-bit"):
        hip.operand_storage(Op(), spec, "a")


# ----------------------------------------------------------------------------- code object cache
def test_cache_roundtrip_and_corruption(tmp_path, monkeypatch):
    monkeypatch.setenv("MXCORE_CACHE_DIR", str(tmp_path))
    key = hip.cache_key("src", "gfx950", ("-DA=1",), "clang:x")
    assert key != hip.cache_key("src", "gfx942", ("-DA=1",), "clang:x")
    assert key != hip.cache_key("src", "gfx950", ("-DA=2",), "clang:x")
    assert key != hip.cache_key("src", "gfx950", ("-DA=1",), "hiprtc:7.0")
    assert key == hip.cache_key("src", "gfx950", ["-DA=1"], "clang:x")
    assert hip.cache_read(key) is None
    hip.cache_write(key, b"\x7fELF code object")
    assert hip.cache_read(key) == b"\x7fELF code object"
    path = tmp_path / "hip" / f"{key}.co"
    raw = path.read_bytes()
    path.write_bytes(raw[:-1] + b"X")  # flip the last byte: the hash no longer matches
    assert hip.cache_read(key) is None and not path.exists()
    hip.cache_write(key, b"again")
    path.write_bytes(b"garbage")
    assert hip.cache_read(key) is None
    assert not [p for p in (tmp_path / "hip").iterdir() if p.name.startswith(".tmp_")]


def test_offline_compile_rebuilds_a_corrupt_entry(tmp_path, monkeypatch):
    _need_clang()
    monkeypatch.setenv("MXCORE_CACHE_DIR", str(tmp_path))
    spec = [s for s in hip.kernel_specs("gfx942") if s.dtype == "fp16"][-1]
    first = hip.offline_compile(spec)
    (entry,) = (tmp_path / "hip").iterdir()
    entry.write_bytes(entry.read_bytes()[:100])
    again = hip.offline_compile(spec)
    assert again.code_object == first.code_object
    assert hip.offline_compile(spec).code_object == first.code_object  # served from the rebuilt entry


def test_emit_kernels_with_clang(compiled, tmp_path):
    """``emit_kernels`` without a ROCm runtime: clang-22 code objects (the batch's, through the disk cache),
    disassembly and a manifest."""
    _need_clang()
    backend = hip.HipBackend()
    assert backend.is_available() is not None  # no AMD GPU here: the clang path
    records = backend.emit_kernels("gfx942", tmp_path / "out")
    assert len(records) == len(hip.kernel_specs("gfx942"))
    for r in records:
        assert (tmp_path / "out" / r.file).read_bytes() == compiled[("gfx942", r.variant)].code_object
        assert r.registers > 0 and r.shared_bytes > 0 and r.local_bytes == 0
        assert r.extra["mfma"] and r.extra["compiler"].startswith("clang:")
    assert (tmp_path / "out" / "manifest.json").exists()
