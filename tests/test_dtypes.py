"""mxcore.dtypes, the one resolver: every dtype name on every arch, aliases, dtype objects, bit widths, codes.

The expected meanings are written here from the formats' definitions (OCP FP8/MX, AMD CDNA3/CDNA4 ISA:
CDNA3 reads fp8 bytes as FNUZ, CDNA4 and NVIDIA as OCP), never imported from mxcore.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mxcore import dtypes, formats, layouts
from mxcore.errors import InputTypeError, UnknownNameError, UnsupportedError

CDNA3 = ("gfx940", "gfx941", "gfx942")
ARCHS = CDNA3 + ("gfx950", "sm_80", "sm_89", "sm_90", "sm_120")

# name -> (canonical dtype, element format, scaling kind) where the arch does not matter
FIXED = {
    "fp32": ("fp32", "fp32", "float"), "float32": ("fp32", "fp32", "float"), "f32": ("fp32", "fp32", "float"),
    "single": ("fp32", "fp32", "float"), "float": ("fp32", "fp32", "float"), "binary32": ("fp32", "fp32", "float"),
    "tf32": ("tf32", "tf32", "float"), "tensorfloat32": ("tf32", "tf32", "float"),
    "tensorfloat-32": ("tf32", "tf32", "float"),
    "fp16": ("fp16", "fp16", "float"), "float16": ("fp16", "fp16", "float"), "half": ("fp16", "fp16", "float"),
    "f16": ("fp16", "fp16", "float"), "binary16": ("fp16", "fp16", "float"),
    "bf16": ("bf16", "bf16", "float"), "bfloat16": ("bf16", "bf16", "float"),
    "e4m3fn": ("e4m3fn", "e4m3fn", "fp8"), "e4m3": ("e4m3fn", "e4m3fn", "fp8"),
    "float8_e4m3fn": ("e4m3fn", "e4m3fn", "fp8"), "f8e4m3fn": ("e4m3fn", "e4m3fn", "fp8"),
    "e5m2": ("e5m2", "e5m2", "fp8"), "float8_e5m2": ("e5m2", "e5m2", "fp8"), "f8e5m2": ("e5m2", "e5m2", "fp8"),
    "e4m3fnuz": ("e4m3fnuz", "e4m3fnuz", "fp8"), "float8_e4m3fnuz": ("e4m3fnuz", "e4m3fnuz", "fp8"),
    "f8e4m3fnuz": ("e4m3fnuz", "e4m3fnuz", "fp8"), "fp8_fnuz": ("e4m3fnuz", "e4m3fnuz", "fp8"),
    "e5m2fnuz": ("e5m2fnuz", "e5m2fnuz", "fp8"), "float8_e5m2fnuz": ("e5m2fnuz", "e5m2fnuz", "fp8"),
    "f8e5m2fnuz": ("e5m2fnuz", "e5m2fnuz", "fp8"), "bf8_fnuz": ("e5m2fnuz", "e5m2fnuz", "fp8"),
    "mxfp8": ("mxfp8_e4m3", "e4m3fn", "mx"), "mxfp8_e4m3": ("mxfp8_e4m3", "e4m3fn", "mx"),
    "mxfp8_e5m2": ("mxfp8_e5m2", "e5m2", "mx"),
    "mxfp6": ("mxfp6_e2m3", "e2m3", "mx"), "mxfp6_e2m3": ("mxfp6_e2m3", "e2m3", "mx"),
    "mxfp6_e3m2": ("mxfp6_e3m2", "e3m2", "mx"),
    "mxfp4": ("mxfp4", "e2m1", "mx"), "mxfp4_e2m1": ("mxfp4", "e2m1", "mx"),
}
# names whose meaning follows the arch: (on CDNA3, elsewhere)
BY_ARCH = {"fp8": ("e4m3fnuz", "e4m3fn"), "bf8": ("e5m2fnuz", "e5m2")}


def expected(name: str, arch: str | None) -> tuple[str, str, str]:
    if name in BY_ARCH:
        fmt = BY_ARCH[name][0 if arch in CDNA3 else 1]
        return fmt, fmt, "fp8"
    return FIXED[name]


def test_every_name_is_covered():
    assert set(dtypes.known_names()) == set(FIXED) | set(BY_ARCH)


@pytest.mark.parametrize("arch", ARCHS + (None,))
@pytest.mark.parametrize("name", sorted(set(FIXED) | set(BY_ARCH)))
def test_every_name_on_every_arch(name, arch):
    canon, element, kind = expected(name, arch)
    for spelling in (name, name.upper(), f" {name} "):
        mdt = dtypes.resolve(spelling, arch)
        assert (mdt.a.name, mdt.a.element, mdt.a.kind) == (canon, element, kind)
        assert mdt.a == mdt.b and mdt.name == canon
        assert dtypes.canonical_operand(spelling, arch) == canon
        assert dtypes.resolve_name(spelling, arch) == canon
        assert dtypes.element_format(spelling, arch) == element


@pytest.mark.parametrize("arch", ARCHS)
def test_bench_names_follow_the_arch(arch):
    """What ``bench --dtype fp8,mxfp8,mxfp6`` runs: fp8 is FNUZ on CDNA3 (gfx942 included)."""
    fp8 = "e4m3fnuz" if arch in CDNA3 else "e4m3fn"
    assert [dtypes.resolve_name(n, arch) for n in ("fp8", "mxfp8", "mxfp6", "fp16")] == \
        [fp8, "mxfp8_e4m3", "mxfp6_e2m3", "fp16"]
    assert dtypes.resolve_name("mxfp8,mxfp4", arch) == "mxfp8_e4m3,mxfp4"
    assert dtypes.resolve_name("fp8,bf8", arch) == ("e4m3fnuz,e5m2fnuz" if arch in CDNA3 else "e4m3fn,e5m2")


@pytest.mark.parametrize("arch", ARCHS)
def test_what_the_instruction_reads(arch):
    """tf32 on gfx950 (no xf32 MFMA) runs as tf32-rounded values through the fp32 MFMA; elsewhere as itself."""
    tf32 = "fp32" if arch == "gfx950" else "tf32"
    assert layouts.instruction_element("tf32", arch) == tf32
    assert layouts.instruction_element("fp16", arch) == "fp16"
    fp8 = "e4m3fnuz" if arch in CDNA3 else "e4m3fn"
    assert layouts.instruction_element("fp8", arch) == (None if arch == "sm_80" else fp8)
    assert layouts.instruction_element("fp32", arch) == (None if arch.startswith("sm_") else "fp32")
    assert layouts.instruction_element("mxfp4", arch) == ("e2m1" if arch == "gfx950" else None)
    assert layouts.instruction_element("mxfp4", "sm_120a") == "e2m1"
    other = "e4m3fn" if arch in CDNA3 else "e4m3fnuz"
    assert layouts.instruction_element(other, arch) is None


def test_every_instruction_format_is_a_known_element():
    names = {d.element for d in dtypes.DTYPES.values()}
    for arch in ARCHS + ("sm_120a",):
        for scaled in (False, True):
            assert layouts.element_formats(arch, scaled=scaled) <= names


@pytest.mark.parametrize("obj,want", [
    (np.float32, "fp32"), (np.dtype(np.float16), "fp16"), (np.float16, "fp16"), (ml_dtypes.bfloat16, "bf16"),
    (ml_dtypes.float8_e4m3fn, "e4m3fn"), (np.dtype(ml_dtypes.float8_e5m2fnuz), "e5m2fnuz"),
])
def test_dtype_objects(obj, want):
    """dtype= takes the dtype objects out_dtype= takes (numpy, ml_dtypes; torch below)."""
    assert dtypes.resolve(obj).name == want
    assert dtypes.resolve((obj, obj)).name == want


def _torch_like(name: str):
    """An object that looks like ``torch.<name>`` (type module torch, str 'torch.<name>'), torch not needed."""
    cls = type("dtype", (), {"__module__": "torch", "__str__": lambda self: f"torch.{name}"})
    return cls()


@pytest.mark.parametrize("name,want,out", [("float16", "fp16", "float16"), ("bfloat16", "bf16", "bfloat16"),
                                           ("float32", "fp32", "float32"), ("float8_e4m3fn", "e4m3fn", None)])
def test_torch_dtypes(name, want, out):
    obj = _torch_like(name)
    assert dtypes.resolve(obj).name == want
    if out is None:
        with pytest.raises(UnknownNameError, match="out_dtype"):
            dtypes.canonical_out_dtype(obj)
    else:
        assert dtypes.canonical_out_dtype(obj) == out


@pytest.mark.parametrize("obj,want", [("float32", "float32"), ("fp16", "float16"), ("half", "float16"),
                                      ("bf16", "bfloat16"), (np.float16, "float16"), (ml_dtypes.bfloat16, "bfloat16"),
                                      ("f32", "float32")])
def test_out_dtypes(obj, want):
    assert dtypes.canonical_out_dtype(obj) == want


def test_out_dtype_float64_only_when_allowed():
    assert dtypes.canonical_out_dtype(np.float64, allow_float64=True) == "float64"
    with pytest.raises(UnknownNameError, match="float32, float16, bfloat16"):
        dtypes.canonical_out_dtype(np.float64)
    with pytest.raises(UnknownNameError):
        dtypes.canonical_out_dtype("tf32")


def test_bad_names_and_objects():
    with pytest.raises(UnknownNameError, match="known dtypes"):
        dtypes.resolve("fp9")
    with pytest.raises(UnknownNameError, match="use fp32"):
        dtypes.resolve(np.float64)
    with pytest.raises(InputTypeError, match="dtype must be"):
        dtypes.resolve(3.5)
    with pytest.raises(UnknownNameError, match="two names"):
        dtypes.resolve(("fp16",))
    with pytest.raises(UnsupportedError, match="FNUZ and OCP"):
        dtypes.resolve(("e4m3fnuz", "e5m2"))
    with pytest.raises(UnsupportedError, match="scaling kinds"):
        dtypes.resolve(("mxfp8", "fp8"))
    with pytest.raises(UnsupportedError, match="mixed float"):
        dtypes.resolve(("fp16", "bf16"))


def test_pairs():
    assert dtypes.resolve(("mxfp8", "mxfp4")).name == "mxfp8_e4m3,mxfp4"
    assert dtypes.resolve(("fp8", "bf8"), "gfx942").name == "e4m3fnuz,e5m2fnuz"
    assert dtypes.resolve(("fp8", "bf8"), "gfx950").name == "e4m3fn,e5m2"


def test_matmul_dtype_derived_attributes():
    """kind and name are set once at construction (the per-call paths read them): equal to what a and b say, kept by
    pickling, copying and dataclasses.replace, and outside equality and hashing (a resolved pair is one key)."""
    import copy
    import dataclasses
    import pickle

    for request, kind, name in ((("bf16", "mxfp4"), dtypes.WONLY_KIND, "bf16,mxfp4"), ("mxfp8", "mx", "mxfp8_e4m3"),
                                (("mxfp8", "mxfp4"), "mx", "mxfp8_e4m3,mxfp4"), ("fp8", "fp8", "e4m3fn"),
                                ("bf16", "float", "bf16")):
        m = dtypes.resolve(request, "sm_90")
        assert (m.kind, m.name, str(m)) == (kind, name, name)
        for other in (pickle.loads(pickle.dumps(m)), copy.copy(m), dataclasses.replace(m),
                      dtypes.MatmulDType(m.a, m.b)):
            assert other == m and hash(other) == hash(m) and (other.kind, other.name) == (kind, name)
        assert repr(m) == f"MatmulDType(a={m.a!r}, b={m.b!r})"


# element format -> (code bits, storage bits, register holds codes), from the formats' definitions
WIDTHS = {"fp32": (32, 32, False), "tf32": (19, 32, False), "fp16": (16, 16, False), "bf16": (16, 16, False),
          "e4m3fn": (8, 8, True), "e5m2": (8, 8, True), "e4m3fnuz": (8, 8, True), "e5m2fnuz": (8, 8, True),
          "e2m3": (6, 6, True), "e3m2": (6, 6, True), "e2m1": (4, 4, True), "e8m0": (8, 8, True)}


@pytest.mark.parametrize("fmt", sorted(WIDTHS))
def test_bit_widths(fmt):
    assert (dtypes.bits(fmt), dtypes.storage_bits(fmt), dtypes.holds_codes(fmt)) == WIDTHS[fmt]


def test_bit_widths_by_alias():
    assert dtypes.bits("fp4") == 4 and dtypes.bits("bf6") == 6 and dtypes.storage_bits("xf32") == 32
    assert dtypes.bits("mxfp6") == 6 and dtypes.bits("fp8") == 8


def test_f8f6f4_codes_match_the_records():
    """CDNA4 ISA 7.1.5: CBSZ/BLGP 0 E4M3, 1 E5M2, 2 E2M3, 3 E3M2, 4 E2M1; every f8f6f4 record carries them."""
    assert dtypes.F8F6F4_CODES == {"e4m3fn": 0, "e5m2": 1, "e2m3": 2, "e3m2": 3, "e2m1": 4}
    recs = [r for r in layouts.records("amd", "gfx950") if r.cbsz is not None]
    assert len(recs) == 4 * 25
    for r in recs:
        assert (r.cbsz, r.blgp) == (dtypes.F8F6F4_CODES[r.a_format], dtypes.F8F6F4_CODES[r.b_format])


def test_table_elements_are_formats():
    for d in dtypes.DTYPES.values():
        assert formats.get(d.element).name == d.element
        assert d.kind in ("float", "fp8", "mx")
    assert dtypes.MX_ELEMENT == {"mxfp8_e4m3": "e4m3fn", "mxfp8_e5m2": "e5m2", "mxfp6_e2m3": "e2m3",
                                 "mxfp6_e3m2": "e3m2", "mxfp4": "e2m1"}


def test_weight_only_pairs():
    """fp16/bf16 activations x an MX weight: kind "wonly"; the mirrored order and other float dtypes are refused
    with what to do instead."""
    for act in ("bf16", "fp16", "bfloat16", "half"):
        for w in ("mxfp4", "mxfp6", "mxfp6_e3m2", "mxfp8", "mxfp8_e5m2"):
            mdt = dtypes.resolve((act, w))
            assert mdt.kind == dtypes.WONLY_KIND and mdt.a.kind == "float" and mdt.b.kind == "mx"
            assert mdt.name == f"{mdt.a.name},{mdt.b.name}"
    with pytest.raises(UnsupportedError, match=r"must be B .*b\.T @ a\.T"):
        dtypes.resolve(("mxfp4", "bf16"))
    with pytest.raises(UnsupportedError, match="fp16 or bf16 activations"):
        dtypes.resolve(("fp32", "mxfp4"))
    with pytest.raises(UnsupportedError, match="scaling kinds"):
        dtypes.resolve(("bf16", "fp8"))
    from mxcore.backends.hip.backend import supports_on

    assert "cuda or reference" in supports_on(dtypes.resolve(("bf16", "mxfp4")), "gfx950")
