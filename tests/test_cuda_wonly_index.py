"""The weight-only kernel's index arithmetic and decode, checked on the CPU (no GPU needed).

``backends/cuda/wonly/records.py::WONLY_FORMULAS`` (emitted as -D macros into gemm_wonly.cu and wonly_pack.cu) must give the
m16n8k16 layout records' A, B and C coordinates; the kernel's bit-placement decode (mirrored here in numpy, with
the same shifts, masks and multiply) must give every code's value of every MX element format, for both
activation types, bit for bit; and the packed record geometry must be what the kernel streams.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from mxcore import dtypes, formats, layouts
from mxcore.backends.cuda import variants, wonly
from mxcore.backends.cuda.wonly import records as wonly_records

T = wonly.TUNING  # the tuning table's values the rules below are stated against
WG_MT, WG_FOLD_MT = tuple(T["wg"]["mt"]), tuple(T["wg_fold"]["mt"])
WG_ROWS_MT, WG_ROWS6_MT = T["wg_gather"]["rows_mt"], T["wg_gather"]["rows6_mt"]
WG_WHOLE_MT, WG_ROWS_WARPS = T["wg_gather"]["whole_mt"], T["wg_gather"]["rows_warps"]
WG_PAIR_MT, WG_PAIR = T["wg_pair"]["mt"], T["wg_pair"]["size"]
WG_TMA_MT, WG_TMA_ANY_MT = T["wg_tma"]["mt"], {int(b): mt for b, mt in T["wg_tma"]["any_mt"].items()}
RING_WS_SHARE = T["ring"]["ws_share"]

RECORDS = {act: layouts.get(name) for act, name in wonly._RECORD.items()}


def _f(key, **kw):
    params, expr = wonly_records.WONLY_FORMULAS[key]
    return variants.eval_formula(expr, **kw)


def test_packed_k_order():
    """WO_KPHYS permutes K inside each 32-K block (so the E8M0 block scales still apply to their own 32 K), is a
    bijection on the chunk, pairs every A element with the B element of the same K (the mma sums k of one step,
    so A and B must agree), and gives lane t of a block the 8 consecutive K at 32 b + 8 t in the order the kernel
    reads them (word 2 s + j = register j of step s, low half = the even element)."""
    seen = set()
    for b in range(2):
        for s in range(2):
            for k in range(16):
                p = wonly_records.eval_wonly("WO_KPHYS", b=b, s=s, k=k)
                assert p // 32 == b and p not in seen
                seen.add(p)
    assert seen == set(range(64))
    for lane in range(32):
        t = lane & 3
        for b in range(2):
            for s in range(2):
                for j in range(2):
                    for h in range(2):
                        kk = _f("WO_B_K", lane=lane, j=j, h=h)
                        assert wonly_records.eval_wonly("WO_KPHYS", b=b, s=s, k=kk) == 32 * b + 8 * t + 2 * (2 * s + j) + h


@pytest.mark.parametrize("act", sorted(RECORDS))
def test_formulas_match_layout_records(act):
    rec = RECORDS[act]
    for lane in range(32):
        for j in range(4):
            for h in range(2):
                assert tuple(rec.a.coords[lane, 2 * j + h]) == (_f("WO_A_ROW", lane=lane, j=j),
                                                                _f("WO_A_K", lane=lane, j=j, h=h))
        for j in range(2):
            for h in range(2):
                assert tuple(rec.b.coords[lane, 2 * j + h]) == (_f("WO_B_K", lane=lane, j=j, h=h),
                                                                _f("WO_B_N", lane=lane))
        for i in range(4):
            assert tuple(rec.c.coords[lane, i]) == (_f("WO_C_ROW", lane=lane, i=i), _f("WO_C_COL", lane=lane, i=i))


def _mul16(bits: np.ndarray, mul_bits: int, act: str) -> np.ndarray:
    """16-bit values times the 16-bit constant, exactly (the kernel's HMUL2 / HFMA2 of an exact product)."""
    import ml_dtypes

    dt = np.float16 if act == "f16" else ml_dtypes.bfloat16
    x = bits.astype(np.uint16).view(dt).astype(np.float64)
    m = np.array([mul_bits], np.uint16).view(dt).astype(np.float64)[0]
    return (x * m).astype(np.float32).astype(dt).view(np.uint16)


def _format_args(element: str, act: str) -> tuple[int, int, int, int]:
    """(ebits, mbits, special, 16-bit multiplier): ``element``'s entry of the build's format table (-DWO_FORMATS,
    wonly_common.cuh's WoFormat) at the index the kernel argument gives."""
    v = wonly.WonlyVariant(element, act, 1)
    opts = dict(o[2:].split("=", 1) for o in v.options() if o.startswith("-DWO_FORMATS="))
    entries = re.findall(r"\{(\d+), (\d+), (\d+), (0x[0-9a-f]+)u\}", opts["WO_FORMATS"])
    eb, mb, special, mul = entries[int(v.format_args()[0])]
    return int(eb), int(mb), int(special), int(mul, 16) & 0xFFFF


def _decode_mul(element: str, act: str) -> int:
    """The 16-bit multiplier of the decode (the argument mul's low half)."""
    return _format_args(element, act)[3]


def _decode_like_kernel(codes: np.ndarray, element: str, act: str) -> np.ndarray:
    """The kernel's wo_decode2<KIND> / wo_reg<J, KIND> on one code per element (numpy mirror of the bit placement,
    from the kernel arguments)."""
    eb, mb, special, mul = _format_args(element, act)
    tm = 7 if act == "bf16" else 10
    c = codes.astype(np.uint32)
    nb = eb + mb
    mag = c & ((1 << nb) - 1)
    r = (mag << (tm - mb)) | ((c >> nb) & 1) << 15
    if not (special == 2 and act == "f16"):  # f16 x e5m2 is the placement itself (wo_scale2)
        r = _mul16(r, mul, act).astype(np.uint32)
    if special == 1:
        r = np.where(mag == 0x7F, r | (0x7FC0 if act == "bf16" else 0x7E00), r)
    elif special == 2 and act == "bf16":
        r = np.where(mag >= 0x7C, (r & 0x8000) | 0x7F80 | np.where(mag > 0x7C, 0x40, 0), r)
    return r.astype(np.uint16)


def _pos4(j: int, p: int, b: int) -> int:
    return wonly_records.eval_wonly("WO4_POS", j=j, t=wonly_records.eval_wonly("WO4_T", p=p, b=b), b=b)


def _pack4_word(codes: np.ndarray) -> np.ndarray:
    """codes [..., 4 registers, 2 halves] (4-bit) -> the packed u32 words (wonly_pack.cu's placement)."""
    w = np.zeros(codes.shape[:-2], np.uint64)
    for j in range(4):
        for p in range(2):
            for b in range(4):
                w |= ((codes[..., j, p].astype(np.uint64) >> b) & 1) << _pos4(j, p, b)
    return w.astype(np.uint32)


def _wo4_reg_like_kernel(w: np.ndarray, j: int, act: str) -> np.ndarray:
    """numpy mirror of wonly_common.cuh's wo4_reg<J> before the multiply (same shifts, rotates and masks)."""
    w = w.astype(np.uint64)
    m32 = np.uint64(0xFFFFFFFF)
    shl = lambda x, n: (x << np.uint64(n)) & m32  # noqa: E731
    shr = lambda x, n: x >> np.uint64(n)  # noqa: E731
    rotl = lambda x, n: shl(x, n) | shr(x, 32 - n)  # noqa: E731
    if act == "bf16":
        k = 0x81C081C0
        r = [shl(w, 6) & k, rotl(w, 12) & k, shl(w, 2) & k, (shr(w, 8) & 0x00400040) | (w & 0x81808180)][j]
    else:
        mag, sgn = 0x0E000E00, 0x80008000
        r = [(shl(w, 9) & mag) | (shl(w, 6) & sgn), (rotl(w, 15) & mag) | (rotl(w, 12) & sgn),
             (shl(w, 5) & mag) | (shl(w, 2) & sgn),
             (shr(w, 5) & 0x02000200) | (shl(w, 3) & 0x0C000C00) | (w & sgn)][j]
    return r.astype(np.uint32)


def test_pack4_placement_and_decode(rng):
    """The 4-bit placement fills the word exactly once, and the kernel's register decode (wo4_reg, mirrored) puts
    every code of every register and half in the place wo_decode2 would (magnitude under the target exponent, sign
    at bit 15 of its half), whatever the other seven codes of the word are."""
    assert sorted(_pos4(j, p, b) for j in range(4) for p in range(2) for b in range(4)) == list(range(32))
    for act in ("bf16", "f16"):
        tm = 7 if act == "bf16" else 10
        for j in range(4):
            for p in range(2):
                codes = rng.integers(0, 16, (4096, 4, 2))
                codes[:16, j, p] = np.arange(16)
                half = (_wo4_reg_like_kernel(_pack4_word(codes), j, act) >> (16 * p)) & 0xFFFF
                c = codes[:, j, p]
                want = ((c & 7) << (tm - 1)) | ((c >> 3) << 15)
                assert np.array_equal(half, want), (act, j, p)


@pytest.mark.parametrize("act", ["f16", "bf16"])
@pytest.mark.parametrize("element", sorted(set(dtypes.MX_ELEMENT.values())))
def test_decode_every_code(element, act):
    import ml_dtypes

    spec = formats.get(element)
    codes = np.arange(1 << spec.bits, dtype=np.uint8)
    got = _decode_like_kernel(codes, element, act).view(np.float16 if act == "f16" else ml_dtypes.bfloat16)
    want = formats.decode(codes, element).astype(np.float64)
    np.testing.assert_array_equal(got.astype(np.float64), want)  # NaN == NaN here; signed zeros by value
    assert np.array_equal(np.signbit(got.astype(np.float64)), np.signbit(want))
    if spec.bits == 4:  # the packed 4-bit path: placement, wo4_reg and the multiply, every register and half
        for j in range(4):
            for p in range(2):
                cw = np.zeros((len(codes), 4, 2), np.int64)
                cw[:, j, p] = codes
                bits = (_wo4_reg_like_kernel(_pack4_word(cw), j, act) >> (16 * p)) & 0xFFFF
                mul = _decode_mul(element, act)
                got4 = (bits if mul in (0x3C00, 0x3F80) else _mul16(bits, mul, act)).astype(np.uint16)
                got4 = got4.view(np.float16 if act == "f16" else ml_dtypes.bfloat16).astype(np.float64)
                np.testing.assert_array_equal(got4, want)
                assert np.array_equal(np.signbit(got4), np.signbit(want))


@pytest.mark.parametrize("element", sorted(set(dtypes.MX_ELEMENT.values())))
def test_special_mask_marks_exactly_the_special_codes(element):
    """mx_wonly_pack flags a weight holding a code c with (c & special_mask) == special_mask; exactly the codes that
    decode to NaN or inf are such codes (none for a format without special values: mask 0), so that the wgmma
    kernel's plain decode, without their fix, runs only on weights it decodes exactly."""
    spec = formats.get(element)
    mask = wonly_records.special_mask(element)
    codes = np.arange(1 << spec.bits, dtype=np.uint32)
    flagged = (mask != 0) & ((codes & mask) == mask)
    special = ~np.isfinite(formats.decode(codes.astype(np.uint8), element).astype(np.float64))
    np.testing.assert_array_equal(flagged, special)
    assert (mask == 0) == (not special.any())


def test_packed_geometry():
    # 4-bit codes: 64 K per 544-byte record (512 fragment bytes + 32 scale bytes); byte codes: 32 K per 528 bytes
    assert wonly_records.packed_bytes("e2m1", 8192, 8192) == 8192 // 16 * 8192 // 64 * 544
    assert wonly_records.packed_bytes("e4m3fn", 64, 128) == 8 * 2 * 528
    assert wonly_records.packed_bytes("e2m1", 65, 1) == 8 * 2 * 544  # N padded to a tile group of 128, K to chunks
    v = wonly.WonlyVariant.ring("e2m1", "bf16", 8)
    assert v.kc == 64 and v.record_bytes == 544 and 0 < v.smem_bytes <= 227 * 1024 and v.stages >= 2


def _pick(m, n, act="bf16", element="e2m1", arch="sm_90", sms=132, folds=None, path=None, config=None, ask=None):
    return wonly.choose(wonly.WonlyProblem(m, n, 4096, act, element, arch, sms, folds), path, config, ask)


def test_path_rule():
    from mxcore.errors import UnsupportedError

    most = T["registers_max_m"]["value"]
    assert _pick(most, 8192, arch="sm_80", sms=108).path == "registers"
    assert _pick(most + 1, 8192, arch="sm_80", sms=108).path == "staged"
    assert _pick(8192, 8192, act="f16").path == "registers"
    assert _pick(4096, 8192, path="registers").path == "registers"
    assert _pick(8, 8192, path="staged") == wonly.WonlyChoice("staged")
    with pytest.raises(UnsupportedError, match="registers"):
        _pick(8, 8192, act="f16", path="staged")
    with pytest.raises(UnsupportedError, match="wonly_path"):
        _pick(8, 8192, path="shared")


def _kernels(act, n, arch="sm_90", sms=132, element="e2m1"):
    """{M: kernel} over M = 1..128 where the registers path runs."""
    out = {}
    for m in range(1, 129):
        c = _pick(m, n, act, element, arch, sms, folds=False)
        if c.path == "registers":
            out[m] = c.variant.kernel
    return out


def test_kernel_rule_by_m_and_width():
    """sm_90: the wgmma kernel for every M up to 32 on weights of any width, every activation type and code width,
    and up to M = 64 for f16 and, for bf16, on weights wider than an eighth (4-bit codes) or a quarter (byte codes) of
    a record group per SM; the ring above (bf16 above registers_max_m takes the staged path unless the wgmma kernel
    runs).  Other archs: direct loads up to
    gemv_max_m, the ring above."""
    sms = 132
    most = T["wg"]["any_width_m"]
    assert most == 32
    for element in ("e2m1", "e2m3", "e3m2", "e4m3fn", "e5m2"):
        for act in ("bf16", "f16"):
            for n in (1024, 2048):  # 8 and 16 record groups: an eighth per SM or fewer
                got = _kernels(act, n, element=element)
                wg_to = 64 if act == "f16" else most
                assert {m for m, kern in got.items() if kern == "wg"} == set(range(1, wg_to + 1)), (act, n, element)
                assert set(got.values()) <= {"wg", "ring"}, (act, n, element)
                if act == "f16":  # no staged path: the wgmma kernel up to M = 64 on every width, the ring above
                    assert {m for m, kern in got.items() if kern == "ring"} == set(range(65, 129))
    # bf16 above M = 32: the wgmma kernel on 4-bit weights wider than an eighth of a record group per SM, byte codes
    # wider than a quarter; the staged path on narrower ones
    assert _pick(64, 4096).variant.kernel == "wg" and _pick(64, 1024).path == "staged"
    assert _pick(64, 2048).path == "staged" and _pick(64, 2304).variant.kernel == "wg"  # 16 / 18 record groups
    assert _pick(64, 4096, element="e4m3fn", folds=True).path == "staged"
    assert _pick(64, 4352, element="e4m3fn", folds=True).variant.kernel == "wg"  # 34 record groups
    for act in ("bf16", "f16"):
        for n in (8192, 14336, 28672):
            got = _kernels(act, n)
            assert {m for m, kern in got.items() if kern == "wg"} == set(range(1, 65)), (act, n)
            assert "gemv" not in got.values()
        for n in (16, 4096, 28672):
            got = _kernels(act, n, "sm_80", 108)
            assert {m for m, kern in got.items() if kern == "gemv"} == set(range(1, T["gemv_max_m"]["value"] + 1))
            assert "wg" not in got.values()
    paths = [_pick(m, 8192).path for m in (32, 33, 64, 65)]
    assert paths == ["registers", "registers", "registers", "staged"]
    assert [_pick(m, 1024).path for m in (32, 33)] == ["registers", "staged"]
    assert _pick(64, 8192, arch="sm_80", sms=108).path == "staged"
    fp8 = {"element": "e4m3fn"}  # byte codes: bf16 above byte_max_m runs staged ...
    assert [_pick(m, 8192, **fp8).path for m in (32, 33)] == ["registers", "staged"]
    asked = []  # ... unless every scale code folds (the fold-only build); asked only there
    assert [_pick(m, 8192, **fp8, ask=lambda m=m: asked.append(m) or True).path for m in (32, 33, 64, 65)] == \
        ["registers", "registers", "registers", "staged"] and asked == [33, 64]
    problem = wonly.WonlyProblem(64, 8192, 4096, "bf16", "e2m1", "sm_90", sms)  # the path alone: not asked
    assert wonly.wonly_path(problem, ask_folds=lambda: pytest.fail("asked")) == "registers"
    assert _pick(48, 8192, **fp8, folds=True).variant.kernel == "wg"
    assert _pick(48, 8192, **fp8, folds=True).variant.fold_only
    assert _pick(1, 8192, "f16", "e4m3fn").variant.kernel == "wg" and _pick(4, 8192, "f16", "e3m2").variant.kernel == "wg"
    assert _pick(4, 8192, "f16").variant.kernel == "wg" and _pick(4, 28672, "f16").variant.kernel == "wg"
    for c in (_pick(m, n, act) for m in (1, 16, 64) for n in (1024, 8192) for act in ("bf16", "f16")):
        assert c.variant is None or c.variant.pdl == (c.variant.kernel != "ring")  # sm_90: PDL on the small-M kernels


def test_decode_shapes_take_the_wgmma_kernel():
    """The tuning table's measured entry: a Llama-3-8B decode step's weights (N = 1024, 4096, 14336 at K = 4096 or
    14336), bf16 / f16 x mxfp4 / mxfp6 / mxfp8 at M = 1, 16 and 32 on an H200 (132 SMs), run the wgmma kernel with
    PDL, one block row for all of M."""
    for m in (1, 16, 32):
        for n in (1024, 4096, 14336):
            for act in ("bf16", "f16"):
                for element in ("e2m1", "e2m3", "e4m3fn", "e5m2"):
                    v = _pick(m, n, act, element, folds=False).variant
                    assert v.kernel == "wg" and v.pdl and v.mt == -(-m // 8), (m, n, act, element, v)


def test_forced_config():
    """``config=`` forces a build: a kernel form fits the M tile (and the fold-only build, clusters) as the rule
    does; a name from the candidates or a WonlyVariant is taken as it is; anything else is a typed error naming
    what is accepted."""
    from mxcore.errors import UnsupportedError

    assert _pick(1, 8192, config="ring").variant == wonly.WonlyVariant.ring("e2m1", "bf16", 1)
    assert _pick(40, 8192, config="gemv").variant == wonly.WonlyVariant.gemv("e2m1", "bf16", 1)
    assert _pick(1, 8192, config="gemv-pdl").variant.pdl
    wgx = _pick(1, 8192, config="wg-tma").variant
    assert wgx.kernel == "wg" and wgx.tma_x and wgx.mt == 1
    assert not _pick(64, 8192, config="wg").variant.tma_x
    assert _pick(40, 8192, folds=True, config="wg").variant.fold_only
    v = _pick(16, 8192, config="wg").variant
    assert _pick(16, 8192, config=v.name).variant == v and _pick(16, 8192, config=v).variant == v
    assert _pick(16, 8192, path="registers", config="ring").path == "registers"
    with pytest.raises(UnsupportedError, match="kernel form"):
        _pick(16, 8192, config="wonly_nothing")
    with pytest.raises(UnsupportedError, match="sm_90"):
        _pick(1, 8192, arch="sm_80", sms=108, config="wg")
    with pytest.raises(UnsupportedError, match="multiplies"):
        _pick(1, 8192, act="f16", config=v)
    with pytest.raises(UnsupportedError, match="fold-only"):
        _pick(40, 8192, folds=False, config=wonly.WonlyVariant.wg("e2m1", "bf16", 5, True, fold_only=True))
    with pytest.raises(UnsupportedError, match="staged"):
        _pick(40, 8192, path="staged", config="wg")
    with pytest.raises(UnsupportedError, match="WonlyVariant"):
        _pick(40, 8192, config=3)


def test_built_variants_are_the_chosen_ones():
    """What is compiled offline (all_wonly_variants) is exactly what choose() returns over the grid, and every
    choice over a wider grid is among them; sm_80 builds need no sm_90 feature."""
    import itertools

    for arch, sms in (("sm_80", 108), ("sm_90", 132)):
        built = set(wonly.all_wonly_variants(arch))
        assert built and not any(v.sm90 for v in built) if arch == "sm_80" else any(v.kernel == "wg" for v in built)
        for m, n, act, el, folds in itertools.product((3, 7, 20, 50, 300), (640, 5120, 20000), ("bf16", "f16"),
                                                      ("e2m1", "e3m2", "e4m3fn"), (False, True)):
            c = _pick(m, n, act, el, arch, sms, folds=folds)
            assert c.variant is None or c.variant in built, (arch, m, n, act, el, folds, c)


def test_fold_range():
    """The wgmma kernel's folded decode: for every scale code in fold_range, every finite value of the format times
    2^(code - 127) is a number of the activation type, and the factor 2^(target bias - element bias) 2^(code - 127)
    is a normal one (exponent field code + offset); the codes just outside break one of the two (the bf16 x e2m1
    range starts at code 0: its subnormal 2^-128 is a bf16 subnormal)."""
    import ml_dtypes

    for act, np_t, emin, emax in (("bf16", ml_dtypes.bfloat16, -126, 127), ("f16", np.float16, -14, 15)):
        for el in ("e2m1", "e2m3", "e3m2", "e4m3fn", "e5m2"):
            spec = formats.get(el)
            lo, hi, off = wonly.fold_range(el, act)
            vals = formats.decode(np.arange(1 << spec.bits, dtype=np.uint8), el).astype(np.float64)
            vals = vals[np.isfinite(vals)]

            def exact(code):
                v = vals * 2.0 ** (code - 127)
                if np.abs(v).max() > float(ml_dtypes.finfo(np_t).max):
                    return False
                factor_exp = code - 127 + ((127 if act == "bf16" else 15) - spec.bias)
                field = code + off
                return (emin <= factor_exp <= emax and field == factor_exp + (127 if act == "bf16" else 15)
                        and np.array_equal(v.astype(np_t).astype(np.float64), v))

            assert all(exact(c) for c in range(lo, hi + 1)), (act, el)
            assert (lo == 0 or not exact(lo - 1)) and not exact(hi + 1), (act, el, lo, hi)
    assert wonly.fold_range("e2m1", "bf16")[:2] == (0, 128) and wonly.fold_range("e2m1", "f16")[:2] == (104, 128)


def test_wg_fold_only_rule_and_build():
    """M above 32 on a weight whose every scale code (the span pack_weight keeps on the operand) lies in the
    fold range runs the fold-only build (N 40..64): no fp32 block-scale path, two producer warps gathering activations,
    compiled for sm_90 (and listed there only)."""
    from mxcore.backends.cuda.stage import DevOperand

    def weight(elem, span):
        return DevOperand(None, 8192, True, elem, 0, 8192, span=span)

    for act in ("bf16", "f16"):
        for el in ("e2m1", "e2m3", "e3m2", "e4m3fn", "e5m2"):
            lo, hi, _ = wonly.fold_range(el, act)
            assert wonly.wg_fold_only(weight(el, (lo, hi)), act), (act, el)
            assert not wonly.wg_fold_only(weight(el, (lo, hi + 1)), act)
            assert lo == 0 or not wonly.wg_fold_only(weight(el, (lo - 1, hi)), act)
            assert not wonly.wg_fold_only(weight(el, (lo, 0xFF)), act)  # a NaN block
    v = wonly.WonlyVariant.wg("e2m1", "bf16", WG_FOLD_MT[-1], True, fold_only=True)
    assert v.name == "wonly_wg_bf16_e2m1_m64_s4c2_fold_pdl" and v.gather_warps == 2 and v.threads == 320
    opts = v.options()
    assert "-DWW_FOLD_ONLY=1" in opts and "-DWW_GATHER_WARPS=2" in opts and "-DWO_MT=8" in opts
    other = wonly.WonlyVariant.wg("e4m3fn", "bf16", 2, True)  # byte codes at m16: one warp gathers row groups
    assert other.threads == 288 and "-DWW_FOLD_ONLY=0" in other.options() and "-DWW_GATHER_WARPS=1" in other.options()
    rows = wonly.WonlyVariant.wg("e2m1", "bf16", 2, True)  # 4-bit codes: WG_ROWS_WARPS gather token rows
    assert rows.gather_rows and rows.gather_warps == WG_ROWS_WARPS == 2 and rows.threads == 320
    assert wonly.WonlyVariant.wg("e2m1", "bf16", 4, True).threads == 320
    folds = [x for x in wonly.all_wonly_variants("sm_90") if x.fold_only]
    assert folds and {x.mt for x in folds} == set(WG_FOLD_MT)
    assert not any(x.fold_only for x in wonly.all_wonly_variants("sm_80"))


def test_mx_weight_folds():
    """The path rule's question for bf16 x fp8 codes above 32 rows: whether every scale code of an MXTensor weight
    lies in the fold range (a weight quantized per call: no)."""
    from mxcore.mx import MXTensor

    lo, hi, _ = wonly.fold_range("e4m3fn", "bf16")
    codes = np.zeros((64, 8), np.uint8)
    for scales, want in (([lo, hi], True), ([lo - 1, hi], False), ([lo, hi + 1], False), ([0x7F, 0xFF], False)):
        sc = np.resize(np.asarray(scales, np.uint8), (2, 8))
        assert wonly.mx_weight_folds(MXTensor(codes, sc, "mxfp8_e4m3", 0), "bf16", "e4m3fn") == want, scales
    assert not wonly.mx_weight_folds(np.zeros((64, 8), np.float32), "bf16", "e4m3fn")


def test_ring_split_cap_bounds_the_partials():
    """The ring's K splits write at most 1 / RING_WS_SHARE of the packed weight's bytes as fp32 partials; a split
    always remains, and the cap limits what _splits would otherwise choose (never a forced count)."""
    for m, n, k in [(16, 4096, 4096), (32, 8192, 8192), (64, 8192, 1024), (9, 28672, 8192), (64, 128, 64)]:
        w = wonly_records.packed_bytes("e2m1", k, n)
        cap = wonly.ring_split_cap(m, n, w)
        assert cap >= 1 and (cap == 1 or cap * 8 * m * n * RING_WS_SHARE <= w), (m, n, k, cap)
    assert wonly.ring_split_cap(16, 4096, wonly_records.packed_bytes("e2m1", 4096, 4096)) == 17
    assert wonly.ring_split_cap(64, 4096, wonly_records.packed_bytes("e2m1", 4096, 4096)) == 4
    nchunks = 4096 // 64
    assert wonly._splits(132, 32, nchunks)[0] == 16  # uncapped: 4 blocks per SM
    assert wonly._splits(132, 32, nchunks, cap=8) == (8, 8)
    assert wonly._splits(132, 32, nchunks, force=16, cap=8)[0] == 16


def _first_rows_mt(element: str) -> int:
    """The m8 tiles from which the wgmma kernel gathers token rows for ``element`` codes, as the rule states it
    (99: never)."""
    return {"e2m1": WG_ROWS_MT, "e2m3": WG_ROWS6_MT, "e3m2": WG_ROWS6_MT}.get(element, 99)


def test_wg_gather_rule():
    """The wgmma kernel gathers activations per token row (WW_GATHER_ROWS=1) for 4-bit codes from WG_ROWS_MT m8
    tiles up and for 6-bit codes from WG_ROWS6_MT, per row group of 8 tokens otherwise (fp8 codes and small M
    measured slower per row); from WG_WHOLE_MT up a token-row build gathers whole blocks from offsets computed once
    (WW_WHOLE=1)."""
    for act in ("bf16", "f16"):
        for el in ("e2m1", "e2m3", "e3m2", "e4m3fn", "e5m2"):
            for mt in (*WG_MT, *WG_FOLD_MT):
                v = wonly.WonlyVariant.wg(el, act, mt, True, fold_only=mt in WG_FOLD_MT)
                rows = mt >= _first_rows_mt(el)
                whole = rows and mt >= WG_WHOLE_MT
                assert v.gather_rows == rows and f"-DWW_GATHER_ROWS={int(rows)}" in v.options(), (act, el, mt)
                assert v.whole_rows == whole and f"-DWW_WHOLE={int(whole)}" in v.options(), (act, el, mt)
    assert not wonly.WonlyVariant.gemv("e2m1", "bf16", 1).gather_rows
    assert WG_ROWS_MT <= WG_MT[-1]  # the m32 build too
    assert WG_ROWS6_MT in WG_FOLD_MT and WG_WHOLE_MT in WG_FOLD_MT


def test_wg_pair_rule():
    """The wgmma kernel runs in clusters of WG_PAIR blocks sharing the activation gather (WW_PAIR) for the token-row
    builds (4-bit codes, 6-bit at m64) from WG_PAIR_MT m8 tiles up where the record groups divide into clusters; its
    name and options say so."""
    from dataclasses import replace
    for act in ("bf16", "f16"):
        for el in ("e2m1", "e2m3", "e4m3fn"):
            for mt in (*WG_MT, *WG_FOLD_MT):
                v = wonly.WonlyVariant.wg(el, act, mt, True, fold_only=mt in WG_FOLD_MT)
                rows = mt >= _first_rows_mt(el)
                for groups in (64, 224, 7):
                    want = rows and mt >= WG_PAIR_MT and groups % WG_PAIR == 0
                    assert wonly.wg_pair(v, groups) == (WG_PAIR if want else 0), (act, el, mt, groups)
    assert wonly.wg_pair(wonly.WonlyVariant.gemv("e2m1", "bf16", 1), 64) == 0
    v = wonly.WonlyVariant.wg("e2m1", "bf16", 8, True, fold_only=True)
    p = replace(v, pair=WG_PAIR)
    assert "-DWW_PAIR=0" in v.options() and f"-DWW_PAIR={WG_PAIR}" in p.options() and p.name != v.name


def test_wg_tma_rule():
    """The wgmma kernel loads its activations by tensor copy from their permuted copy (WW_TMA) from WG_TMA_MT m8
    tiles up where the launch has a block per SM before any K split, and where it splits K from WG_TMA_ANY_MT[bits]
    up (4-bit codes only, as measured); such a build has one producer warp, no clusters, its own name, and is
    listed for sm_90 beside the gather build."""
    from dataclasses import replace

    assert WG_TMA_MT is not None and set(WG_TMA_ANY_MT) == {4}
    for act in ("bf16", "f16"):
        for el in ("e2m1", "e2m3", "e4m3fn"):
            for mt in (*WG_MT, *WG_FOLD_MT):
                v = wonly.WonlyVariant.wg(el, act, mt, True, fold_only=mt in WG_FOLD_MT)
                for blocks in (64, 131, 132, 224):
                    split = el == "e2m1" and mt >= WG_TMA_ANY_MT[4]
                    want = mt >= WG_TMA_MT and (blocks >= 132 or split)
                    assert wonly.wg_tma(v, blocks, 132) == want, (act, el, mt, blocks)
                x = replace(v, tma_x=True)
                assert x.gather_warps == 1 and x.threads == 288 and wonly.wg_pair(x, 224) == 0
                assert "-DWW_TMA=1" in x.options() and "-DWW_TMA=0" in v.options() and x.name == v.name.replace(
                    "_pdl", "_x_pdl")
    assert not wonly.wg_tma(wonly.WonlyVariant.gemv("e2m1", "bf16", 8), 1 << 20, 1)
    listed = {x for x in wonly.all_wonly_variants("sm_90") if x.kernel == "wg"}
    assert any(x.tma_x for x in listed) and all(x.mt >= WG_TMA_MT and not x.pair for x in listed if x.tma_x)
    assert not any(x.tma_x for x in wonly.all_wonly_variants("sm_80"))
