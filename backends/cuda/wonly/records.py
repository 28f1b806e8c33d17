"""The packed fragment records of a weight-only MX weight (``kernels_cuda/wonly_pack.cu`` writes them once per
weight; ``wonly_common.cuh`` describes the layout; every weight-only kernel of :mod:`.wonly` reads them): the
per-lane fragment formulas emitted as -D macros, the record geometry, the packing launch and the fence that makes
records safe for launches with programmatic dependent launch."""

from __future__ import annotations

import functools
import operator

import numpy as np

from ..operand import DevOperand
from ..stage import register_path

__all__ = ["GROUP", "PACK_FILE", "WONLY_FORMULAS", "chunk_k", "eval_wonly", "formula_options", "pack_weight",
           "packed_bytes", "record_bytes", "record_groups", "records_written", "special_mask"]

PACK_FILE = "wonly_pack.cu"
GROUP = 8  # n16 tiles per block and per packed record group (WO_WARPS * WO_R)

# The kernel's per-lane fragment indices (m16n8k16, weight as A), emitted as -D macros; the CPU test
# tests/test_cuda_wonly_index.py checks them against mxcore.layouts.  j: register, h: element in it, i: accumulator.
WONLY_FORMULAS = {
    "WO_A_ROW": ("lane,j", "(lane >> 2) + ((j & 1) << 3)"),
    "WO_A_K": ("lane,j,h", "((lane & 3) << 1) + ((j >> 1) << 3) + h"),
    "WO_B_K": ("lane,j,h", "((lane & 3) << 1) + (j << 3) + h"),
    "WO_B_N": ("lane", "lane >> 2"),
    "WO_C_ROW": ("lane,i", "(lane >> 2) + ((i >> 1) << 3)"),
    "WO_C_COL": ("lane,i", "((lane & 3) << 1) + (i & 1)"),
    # the packed K order: k (0..15) of k16 step s of 32-K block b -> K offset in the chunk.  Lane t's B registers
    # (k = 2t, 2t+1, 2t+8, 2t+9 of both steps of a block) become the 8 consecutive K at 32b + 8t: one 16-byte
    # load of the activations per block (a permutation inside each 32-K block: the block scales are unchanged)
    "WO_KPHYS": ("b,s,k", "(b << 5) + (((k & 7) >> 1) << 3) + (s << 2) + ((k >> 3) << 1) + (k & 1)"),
    # the 4-bit code placement in a k16 step's word (wonly_common.cuh): bit b (0 m, 1 e0, 2 e1, 3 sign) of the code
    # in half p of register j sits at WO4_POS(j, WO4_T(p, b), b), where WO4_T is the bit the decode moves it to
    # (bf16 placement: magnitude at 6..8, sign at 15, per half); j = 0 is shifted left 6, j = 1 rotated left 12,
    # j = 2 shifted left 2, j = 3 keeps e0 e1 and the sign in place and shifts m right 8
    "WO4_T": ("p,b", "(p << 4) + 6 + b + 6 * (b == 3)"),
    "WO4_POS": ("j,t,b", "t - 6 * (j == 0) + (20 - 32 * (t >= 12)) * (j == 1) - 2 * (j == 2) + 8 * (j == 3) * (b == 0)"),
}


def eval_wonly(key: str, **names):
    """Evaluate one of WONLY_FORMULAS in Python (ints or numpy arrays), as the C preprocessor expands it."""
    import re

    params, expr = WONLY_FORMULAS[key]
    if set(names) != set(params.split(",")) or not re.fullmatch(r"[\sa-z0-9&>|<+()*=-]*", expr):
        raise ValueError(f"{key}({params}) evaluated with {sorted(names)}")
    return eval(expr, {"__builtins__": {}}, names)


def formula_options() -> list[str]:
    """The formulas as -D function-like macros (every parameter parenthesised)."""
    import re

    out = []
    for name, (params, expr) in WONLY_FORMULAS.items():
        body = re.sub(r"\b(" + "|".join(params.split(",")) + r")\b", r"(\1)", expr)
        out.append(f"-D{name}({params})=({body})")
    return out


def record_groups(n: int) -> int:
    """Packed record groups (GROUP n16 tiles, 128 columns each) of a weight with N = ``n``."""
    return -(-n // (16 * GROUP))


# ------------------------------------------------------------------------------------------------------------
# packing (staged once per weight: stage.py caches the DevOperand on the MXTensor)
# ------------------------------------------------------------------------------------------------------------
def chunk_k(element: str) -> int:
    """K per record chunk: 64 for 4-bit codes (16 bytes of a lane's codes), 32 for byte codes."""
    from mxcore import formats

    return 64 if formats.get(element).bits == 4 else 32


def record_bytes(element: str) -> int:
    """Bytes of one record: the 32 lanes' 16 code bytes, then 16 scale bytes per 32-K block of the chunk."""
    return 512 + 16 * (chunk_k(element) // 32)


def _record_geometry(element: str, k: int, n: int) -> tuple[int, int, int]:
    """(K chunks, tile groups, bytes per record) of the packed records of a (K, N) weight."""
    return -(-k // chunk_k(element)), record_groups(n), record_bytes(element)


def pack_weight(stager, codes, scales, element: str, k: int, n: int) -> DevOperand:
    """The packed fragment records of a (K, N) MX weight (codes and scales: CuPy arrays, any strides) as a
    :class:`DevOperand` (``buf``: uint8 records, ``elem``: the element format, ``k``: K, ``ld``: N).  After the
    records (``packed_bytes``), the range of each record group's chunk's scale codes, [group][chunk] of two bytes
    (the least and the greatest of its records' scale bytes, pad rows' 127 included): the wgmma kernel
    (gemm_wonly_wg.cu) tests it against its fold range instead of reading every scale byte per chunk and warp.
    The operand's ``span`` is the least and greatest of them (pad rows count as 127), and its ``specials``
    whether some byte code is special (e4m3fn's NaN, e5m2's inf / NaN: :func:`special_mask`), both read back once
    here (a synchronization: packing runs while a plan is built, never under a CUDA graph capture), so that a
    later plan or a weight swapped into a kept layout asks the fold-only wgmma build's condition
    (wonly.wg_fold_only) and whether the decode may skip the special codes' fix without one."""
    from mxcore import formats

    cp = stager.cp
    nchunks, groups, rec = _record_geometry(element, k, n)
    body = groups * GROUP * nchunks * rec
    out = cp.empty(max(1, body + 2 * groups * nchunks), dtype=cp.uint8)
    total = groups * GROUP * nchunks * 32
    if total:
        span_d = cp.zeros(3, dtype=cp.uint32)  # {255 - least, greatest} of every chunk's range (mx_wonly_ranges),
        #                                         then whether a code is special (mx_wonly_pack)
        kern = stager.kernels.get(cp, stager.ordinal, ("wonly", "pack"), PACK_FILE, "mx_wonly_pack",
                                  ("-std=c++17", *formula_options()))
        c0, c1 = (s // codes.itemsize for s in codes.strides)
        s0, s1 = (s // scales.itemsize for s in scales.strides)
        grid = (max(1, min(-(-total // 256), 16 * stager.sms)),)
        kern(grid, (256,), (codes, np.int64(c0), np.int64(c1), scales, np.int64(s0), np.int64(s1), np.int32(k),
                            np.int32(n), np.int32(int(formats.get(element).bits == 4)), np.int32(nchunks),
                            np.int32(GROUP), np.int64(total), out, np.uint32(special_mask(element)), span_d[2:]))
        items = groups * nchunks
        ranges = stager.kernels.get(cp, stager.ordinal, ("wonly", "ranges"), PACK_FILE, "mx_wonly_ranges",
                                    ("-std=c++17", *formula_options()))
        ranges((max(1, min(-(-items // 256), 16 * stager.sms)),), (256,), (
            out, np.int32(groups), np.int32(nchunks), np.int32(GROUP), np.int32(rec), out[body:], span_d))
        records_written(stager.kernels, cp, stager.ordinal)
        least, hi, specials = span_d.get()  # one synchronization
        span = (255 - int(least), int(hi))
    else:
        span, specials = (127, 127), 0
    return DevOperand(out, n, True, element, 0, k, span=span, specials=bool(specials))


def special_mask(element: str) -> int:
    """The bits that are all set in exactly the special codes of a byte-code ``element`` format: the common bits of
    its NaN and inf codes (e4m3fn: the NaN magnitude 0x7f; e5m2: exponent 31); 0 for formats without them."""
    from mxcore import formats

    sp = formats.get(element)
    codes = (*sp.nan_codes, *sp.inf_codes)
    return functools.reduce(operator.and_, codes) if sp.bits == 8 and codes else 0


def records_written(kernels, cp, ordinal: int) -> None:
    """Launch an empty kernel normally on the current stream after packed records were written (the pack kernel, a
    device copy): a kernel launched with programmatic dependent launch reads its records before waiting for its
    predecessor (wonly_common.cuh), which is safe only when that predecessor started after the records were
    complete; a normal launch starts only after everything before it completed, so whatever follows it may start
    early.  Costs one empty launch per packed weight."""
    kernels.get(cp, ordinal, ("wonly", "fence"), PACK_FILE, "mx_wonly_fence", ("-std=c++17", *formula_options()))(
        (1,), (1,), ())


def packed_bytes(element: str, k: int, n: int) -> int:
    """Bytes of the packed records of a (K, N) weight: what one launch reads of the weight (codes + scales, N
    padded to whole tile groups of 128; the wgmma kernel also reads the scale ranges after them, 2 bytes per
    record group and chunk, 1/2176 of the records at 4-bit codes, not counted)."""
    nchunks, groups, rec = _record_geometry(element, k, n)
    return groups * GROUP * nchunks * rec


register_path("wonly", pack_weight)  # stage.py's path "wonly": the packed records
