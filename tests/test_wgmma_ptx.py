"""Every matrix instruction the kernels run has a layout record: the PTX of every kernel ``kernels --emit`` writes
(``backends/cuda/emit.compile_jobs``: mma.sync GEMMs, weight-only kernels, ceilings, and on sm_90 the sm_90a wgmma
family), compiled by NVRTC from the pip wheels as ``emit_kernels`` compiles it (the disk cache that
tests/test_cuda_compile.py fills), is scanned for matrix instructions; each must be a name of
``mxcore.layouts.names(kind="all")`` whose record's register footprint is the operand list the PTX passes.

The scan recognises an instruction wherever PTX starts one (line start, or after ``;`` / ``{`` inside inline-asm
blocks) and treats as a matrix instruction every opcode of the mma / wgmma / ldmatrix / stmatrix / movmatrix /
tcgen05 families except wgmma's fence / commit_group / wait_group (ordering, no data), so a kernel that starts
using an instruction the database lacks fails here.  Without NVRTC the tests skip, except under CI=true.
"""

from __future__ import annotations

import collections
import functools
import os
import re

import pytest
from conftest import require_tool

from mxcore import layouts
from mxcore.backends import cuda, nvrtc_tools

ARCHS = ["sm_80", "sm_89", "sm_90"]
_FAMILIES = ("mma", "wgmma", "ldmatrix", "stmatrix", "movmatrix", "tcgen05")
_ORDERING = ("wgmma.fence", "wgmma.commit_group", "wgmma.wait_group")
# an instruction: at a line start or after ';' / '{' (inline-asm blocks), optional guard predicate, opcode, operands
_INSTRUCTION = re.compile(r"(?:^|[;{])[ \t]*(?:@!?%?\w+[ \t]+)?((?:" + "|".join(_FAMILIES) + r")\.[\w.:]+)"
                          r"[ \t]+([^;]*);", re.M)
WORKERS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def matrix_instructions(ptx: str) -> list[tuple[str, str]]:
    """(opcode, operand text) of every matrix instruction in ``ptx``."""
    return [(op, args.strip()) for op, args in _INSTRUCTION.findall(ptx) if not op.startswith(_ORDERING)]


def operand_groups(args: str) -> list[str]:
    """The comma-separated operands of an instruction, a ``{...}`` vector kept as one operand."""
    out, depth, cur = [], 0, ""
    for ch in args:
        depth += (ch == "{") - (ch == "}")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()] if cur.strip() else out


def _count(vector: str) -> int:
    assert vector.startswith("{") and vector.endswith("}"), vector
    return len([x for x in vector[1:-1].split(",") if x.strip()])


def check_operands(rec, args: str) -> None:
    """The PTX operand list against the record: register vectors of the sizes the record's operands occupy."""
    ops = operand_groups(args)
    if isinstance(rec, layouts.LdMatrixLayout):  # d, [addr]
        assert _count(ops[0]) == rec.registers, (rec.name, args)
        return
    if isinstance(rec, layouts.WgmmaLayout):  # d, a-desc | {a}, b-desc, scale-d, imm-scale-a, imm-scale-b[, trans]
        assert _count(ops[0]) == rec.c.registers, (rec.name, "accumulator registers", args)
        a_regs = ops[1].startswith("{")
        if a_regs:
            assert _count(ops[1]) == rec.a.registers, (rec.name, "A registers", args)
        trans = (1 if a_regs else 2) if rec.transpose else 0
        assert len(ops) == 6 + trans, (rec.name, "operands", args)
        return
    d, a, b, c = ops[:4]  # mma.sync: d, a, b, c
    assert (_count(d), _count(a), _count(b), _count(c)) == (rec.c.registers, rec.a.registers, rec.b.registers,
                                                          rec.c.registers), (rec.name, args)


@functools.cache
def emitted(arch: str) -> dict:
    """{opcode: [(kernel stem, operand text), ...]} over every kernel ``kernels --emit`` writes for ``arch``."""
    require_tool("NVRTC (cuda-bindings + nvidia-cuda-nvrtc)", nvrtc_tools.have_nvrtc())
    out = collections.defaultdict(list)
    for job, binary in cuda.compile_all(cuda.compile_jobs(arch), arch=arch, workers=WORKERS):
        for op, args in matrix_instructions(binary.ptx):
            out[op].append((job["stem"], args))
    return dict(out)


def test_scanner_finds_instructions_in_asm_blocks_and_skips_ordering():
    ptx = ("\twgmma.fence.sync.aligned;\n"
           "\t{ .reg .pred p; setp.ne.b32 p, %r9, 0; wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
           "{%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, %rd7, p, 1, 1, 0; }\n"
           "\t@%p3 mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, "
           "{%r5,%r6}, {%f5,%f6,%f7,%f8};\n"
           "\tldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%r1, %r2, %r3, %r4}, [%r8];\n"
           "\twgmma.commit_group.sync.aligned;\n\tstmatrix.sync.aligned.m8n8.x2.shared.b16 [%r1], {%r2, %r3};\n")
    found = matrix_instructions(ptx)
    assert [op for op, _ in found] == ["wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16",
                                       "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                                       "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
                                       "stmatrix.sync.aligned.m8n8.x2.shared.b16"]
    check_operands(layouts.get(found[0][0]), found[0][1])
    check_operands(layouts.get(found[1][0]), found[1][1])
    check_operands(layouts.get(found[2][0]), found[2][1])
    with pytest.raises(AssertionError):  # a wrong accumulator count is caught
        check_operands(layouts.get("m64n16k16.bf16"), found[0][1])


@pytest.mark.parametrize("arch", ARCHS)
def test_every_emitted_matrix_instruction_has_a_record(arch):
    found = emitted(arch)
    known = set(layouts.names(kind="all"))
    missing = {op: [stem for stem, _ in uses][:3] for op, uses in found.items() if op not in known}
    assert not missing, f"{arch}: matrix instructions in emitted PTX without a layout record: {missing}"
    for op, uses in found.items():
        rec = layouts.get(op)
        assert rec.name == op
        for stem, args in uses:
            check_operands(rec, args)
    assert any(op.startswith("mma.sync") for op in found)
    if arch == "sm_90":  # the sm_90a family and the weight-only wgmma kernel
        wg = {op for op in found if op.startswith("wgmma.mma_async")}
        # the emitted set is the default choice's builds (emit.compile_jobs): the weight-only kernel's N = 8 M-tiles of
        # the grid's M, the wgmma family's block tiles
        ns = {layouts.get(op).n for op in wg}
        assert {8, 16, 32, 64, 192, 256} <= ns <= {8 * t for t in range(1, 9)} | {192, 256}
        assert all(op in layouts.names("nvidia", "sm_90a") for op in wg)
        print(f"{arch}: {len(found)} matrix instructions, {len(wg)} wgmma: {sorted(wg)}")


def test_database_n_covers_the_kernels_tiles():
    """The N list of the wgmma records follows the kernels' tile tables (sm90.SM90_TILES, wonly WG_MT and
    WG_FOLD_MT), so a tile added there needs its records (the PTX test above catches an emitted one)."""
    from mxcore.backends.cuda import sm90, wonly
    from mxcore.layouts import hopper

    want = {bn for bn, _, _ in sm90.SM90_TILES.values()} | {8 * mt for mt in wonly.TUNING["wg"]["mt"] + wonly.TUNING["wg_fold"]["mt"]}
    assert set(hopper.KERNEL_N) == want
