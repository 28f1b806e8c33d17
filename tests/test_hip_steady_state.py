"""Steady-state K loop of the HIP GEMM kernels, read from the clang-22 disassembly (no GPU).

Each family is compiled with ``-DMX_FAST_ONLY=1``: the same source and -D options that go to hiprtc, with
only the fast path built -- the loop a block runs when it lies inside the matrix, both operands are
K-contiguous and 16-byte aligned and K is a multiple of the tile's K (the launch picks it per block at run
time).  The K loop is the backward branch whose body holds the MFMAs.  Asserted on that loop:

* no ``s_waitcnt vmcnt`` between the loop head and the first MFMA of the tile: the MFMAs of tile kt read
  only LDS and registers loaded during tile kt-1 (operand tiles and E8M0 scales are prefetched together);
* vector-ALU instructions (every ``v_`` but the MFMAs) per MFMA at most :data:`VALU_PER_MFMA`;
* no byte-wise LDS stores (``ds_write_b8``) and no scratch anywhere in the fast build;
* fragments read with LDS loads of at least 64 bits (fp4 / fp6 are stored packed along K, so no
  per-element packing happens in the loop).

The counts are printed (``pytest -s``); kernels_hip/gemm_mfma.hip's header turns them into design
estimates of the fraction of peak.  Nothing here is a measurement on AMD hardware.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import require_tool
from mxcore.backends import hip, hip_tools

from mxcore import dtypes as _dt

# (arch, dtype) of each operand class, both instruction shapes of each
FAMILIES = [("gfx942", "fp32"), ("gfx942", "tf32"), ("gfx942", "fp16"), ("gfx942", "bf16"), ("gfx942", "e4m3fnuz"),
            ("gfx950", "fp32"), ("gfx950", "fp16"), ("gfx950", "bf16"), ("gfx950", "e4m3fn"),
            ("gfx950", "mxfp8_e4m3"), ("gfx950", "mxfp6_e2m3"), ("gfx950", "mxfp4"),
            ("gfx950", "mxfp8_e4m3,mxfp4")]
VALU_PER_MFMA = 12  # bound on vector-ALU instructions per MFMA in the steady-state loop

_ADDR = re.compile(r"//\s*([0-9A-Fa-f]+):")
_TARGET = re.compile(r"<([^>+]+)\+0x([0-9a-f]+)>")
_FUNC = re.compile(r"^([0-9a-f]+) <([^>]+)>:")


def _specs():
    out = []
    for arch, dtype in FAMILIES:
        pair = dtype.split(",")
        name = _dt.resolve(tuple(pair) if len(pair) == 2 else dtype, arch).name
        for s in hip.kernel_specs(arch):
            if name in s.dtypes and s not in out:  # OCP fp8 runs the MX fp8 kernel: one build
                out.append(s)
    return out


SPECS = _specs()


def instructions(disasm: str, entry: str) -> list[tuple[int, str, int | None]]:
    """(address, text, branch target or None) of every instruction of ``entry``."""
    out, base, inside = [], None, False
    for line in disasm.splitlines():
        f = _FUNC.match(line)
        if f:
            inside = f.group(2) == entry
            base = int(f.group(1), 16)
            continue
        a = _ADDR.search(line)
        if not inside or not a or not line.startswith("\t"):
            continue
        text = line.split("//")[0].strip()
        t = _TARGET.search(line)
        target = base + int(t.group(2), 16) if t and t.group(1) == entry and text.startswith("s_") else None
        out.append((int(a.group(1), 16), text, target))
    return out


def steady_loop(disasm: str, entry: str) -> list[str]:
    """The instructions of the K loop: the innermost loop (head to its last back edge; the compiler may close
    a loop with several back edges) that holds MFMAs, global loads and a workgroup barrier."""
    ins = instructions(disasm, entry)
    heads: dict = {}
    for i, (addr, _text, target) in enumerate(ins):
        if target is not None and target <= addr:
            body = [t for a, t, _ in ins[: i + 1] if a >= target]
            if len(body) > len(heads.get(target, [])):
                heads[target] = body

    def is_k_loop(body):
        ops = [t.split()[0] for t in body]
        return (any(o.startswith("v_mfma") for o in ops) and "s_barrier" in ops
                and any(o.startswith(("global_load", "buffer_load")) for o in ops))

    loops = [b for b in heads.values() if is_k_loop(b)]
    assert loops, f"{entry}: no loop with MFMAs, global loads and a barrier"
    return min(loops, key=len)


def loop_figures(body: list[str]) -> dict:
    ops = [t.split()[0] for t in body]
    mfma = sum(o.startswith("v_mfma") for o in ops)
    first = next(i for i, o in enumerate(ops) if o.startswith("v_mfma"))
    loads = [i for i, o in enumerate(ops[:first]) if o.startswith(("global_load", "buffer_load"))]
    # the waits between issuing the next tile's loads and the first MFMA of this tile (a vmcnt wait there
    # stalls the MFMAs on global memory)
    after = body[(loads[-1] + 1 if loads else 0):first]
    return {
        "mfma": mfma,
        "valu": sum(o.startswith("v_") and not o.startswith("v_mfma") for o in ops),
        "salu": sum(o.startswith("s_") and not o.startswith(("s_waitcnt", "s_nop", "s_barrier")) for o in ops),
        "global_load": sum(o.startswith(("global_load", "buffer_load")) for o in ops),
        "prefetch_before_mfma": len(loads),
        "global_load_kinds": sorted({o for o in ops if o.startswith(("global_load", "buffer_load"))}),
        "ds_read": sum(o.startswith("ds_read") for o in ops),
        "ds_write": sum(o.startswith("ds_write") for o in ops),
        "ds_read_widths": sorted({o for o in ops if o.startswith("ds_read")}),
        "vmcnt_before_first_mfma": [t for t in after if t.startswith("s_waitcnt") and "vmcnt" in t],
        "length": len(ops),
    }


@pytest.fixture(scope="module")
def fast_builds():
    if hip_tools.have_clang() is not None:
        return None

    def one(spec):
        source, options = hip.compile_inputs(spec)
        return hip_tools.compile_hip(source, name=spec.entry, arch=spec.arch, options=(*options, "-DMX_FAST_ONLY=1"))

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip([(s.arch, s.entry) for s in SPECS], pool.map(one, SPECS)))


def test_every_family_has_a_fast_build():
    assert {(s.arch, s.shape[0], s.big) for s in SPECS} == {(a, m, b) for a in hip.ARCHS for m, b in
                                                            ((16, False), (32, False), (32, True))}
    names = {(s.arch, d) for s in SPECS for d in s.dtypes}
    assert all((a, _dt.resolve(tuple(d.split(",")) if "," in d else d, a).name) in names for a, d in FAMILIES)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.arch}-{s.entry}")
def test_steady_state_loop(spec, fast_builds):
    require_tool("clang-22", hip_tools.have_clang())
    binary = fast_builds[(spec.arch, spec.entry)]
    text = binary.disasm
    fig = loop_figures(steady_loop(text, spec.entry))
    per_tile = spec.tm * spec.tn * (spec.bk // spec.shape[2])
    print(f"{spec.arch} {spec.entry} tile {hip.tile_name(spec)}x{spec.bk}: {fig['mfma']} MFMA, {fig['valu']} VALU "
          f"({fig['valu'] / fig['mfma']:.2f}/MFMA), {fig['salu']} SALU, {fig['global_load']} global loads, "
          f"{fig['ds_read']} ds_read {fig['ds_read_widths']}, {fig['ds_write']} ds_write, {fig['length']} instructions")
    assert fig["mfma"] == per_tile, f"{fig['mfma']} MFMAs in the loop, {per_tile} per K tile"
    assert fig["prefetch_before_mfma"] >= 1, "the next tile's loads must be issued before this tile's MFMAs"
    assert not fig["vmcnt_before_first_mfma"], f"the first MFMA waits on global loads: {fig['vmcnt_before_first_mfma']}"
    assert fig["valu"] <= VALU_PER_MFMA * fig["mfma"], f"{fig['valu']} VALU for {fig['mfma']} MFMAs"
    wide = re.compile(r"ds_read2?(st64)?_b(64|96|128)$")  # fp32 fragments are one register: b32 pairs
    assert all(wide.match(w) or spec.stored_bits("a") == 32 for w in fig["ds_read_widths"]), \
        f"narrow fragment reads: {fig['ds_read_widths']}"
    ops = hip_tools.mnemonics(text)
    assert "ds_write_b8" not in ops and "ds_write_b16" not in ops, "element-wise LDS stores on the fast path"
    assert not any(o.startswith("scratch_") for o in ops) and binary.resources[spec.entry]["scratch_bytes"] == 0
    loads = set(fig["global_load_kinds"])  # 16-byte operand vectors; E8M0 scale bytes
    assert loads == {"global_load_dwordx4"} | ({"global_load_ubyte"} if spec.scaled else set()), loads


def test_loop_finder_rejects_a_loopless_kernel():
    """The finder must fail loudly, not pass, on code without the loop (e.g. the ceiling kernel's form)."""
    text = ("0000000000001000 <k>:\n\tv_mfma_f32_16x16x16_f16 v[0:3], v[4:5], v[6:7], v[0:3] // 000000001000: 0\n"
            "\ts_endpgm // 000000001008: 0\n")
    with pytest.raises(AssertionError, match="no loop"):
        steady_loop(text, "k")
