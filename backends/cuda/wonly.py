"""Weight-only MX products on NVIDIA: fp16/bf16 activations A (M x K) times an MX weight B (K x N, E8M0 scales per
32 K), the ``"wonly"`` kind of :mod:`mxcore.dtypes`.  Two paths, chosen by :func:`wonly_path`:

``registers`` (every pair, any M; the default for fp16, for M <= 32, and on sm_90 where the wgmma kernel runs)
    The weight is packed once into fragment records (``kernels_cuda/wonly_pack.cu``, ``wonly_records.py``: 4-bit
    codes two per byte, placed so that a register of two bf16 values comes out of its word with 2.25 integer
    operations on average (``WO4_POS``), fp6/fp8 codes one per byte, the block scales beside them; records of 8 n16 tiles per K chunk
    contiguous, K permuted inside each 32-K block (``WO_KPHYS``) so that a lane's activations of a block are 16
    consecutive bytes) and cached on the MXTensor like any staged operand (``stage.py``, path ``"wonly"``): 0.53
    bytes per element for mxfp4 (codes + scales), read once per launch.  Four kernels read the records
    (``wonly_common.cuh`` holds what they share), chosen by M (``small_kernel``, ``sm90_small``):
    ``gemm_wonly_gemv.cu`` (small M) loads them straight into registers, each warp on its own two tiles a few
    chunks ahead, no shared memory and no barrier; ``gemm_wonly_tma.cu`` (sm_90, small M, where SM90_SMALL names
    it; the default rule takes the wgmma kernel where it ran) has a producer warp stream a block's contiguous
    records with bulk copies into a shared-memory ring (mbarriers) while four consumer warps decode;
    ``gemm_wonly.cu`` (larger M) streams the records and the activation rows through a cp.async ring (blocks of 4
    warps x 2 n16 tiles); ``gemm_wonly_wg.cu`` (sm_90a, M <= 64 on weights wider than a quarter record group per SM,
    but for f16 x 4-bit codes at M <= 4 on weights of fewer record groups than SMs: ``wg_rule``)
    multiplies on wgmma with the decoded weight as the register-A operand, the activations gathered into
    swizzled shared-memory rows (or loaded there by tensor copy from a copy of A in the records' K order, written
    right before by ``mx_wonly_xperm``: ``wg_tma``), and folds the block scales into the decode where
    ``fold_range`` says that is exact (else an fp32 block-scale path per chunk; M above 32 on a weight whose every
    scale code folds runs the fold-only build at m64: ``wg_fold_only``).  On sm_90 the
    small-M kernels can be launched with programmatic dependent launch (``RawLaunch(pdl=True)``; SM90_PDL and
    SM90_SMALL, the default there): a launch may start
    while the previous kernel in the stream finishes and requests its first records before it waits for it
    (``wonly_common.cuh`` says why that is safe; ``records_written``).  All decode codes to the activation's
    16-bit type in registers (exact: bit
    placement and one multiply by a power of two), multiply with ``mma.sync`` m16n8k16 with the weight as the A
    operand (M is the mma's N: ceil(M/8) mma per 16 x 16 weight fragment) and apply each 32-K block's scale in
    fp32 (t = the block's two mma from zero; acc = fma(t, 2^(scale - 127), acc), explicit PTX so that CuPy's
    -ftz=true cannot flush the subnormal 2^-127).  Split K fills the GPU when the tiles cannot; the last block of
    a tile sums the fp32 partials in split order (deterministic, one launch).
``staged`` (bf16 only; the default for bf16 with M > 32)
    The existing MX decode staging: B decoded once to bf16 with its block scale folded in (``stage.py``, cached on
    the MXTensor: 2 bytes per element, 4x the packed mxfp4 weight, besides the MXTensor's own one-byte codes), then
    the bf16 GEMM (wgmma on sm_90 for large problems, else mma.sync).  fp16 activations are refused there: a weight
    decoded to f16 with its scales folded in is not exact (f16's range is 2^-24..2^16).

Numerics (both paths): A is rounded once to its 16-bit format; products are exact; fp32 accumulation.  Bound on
random inputs: |C - ref| <= (K + 2) * 2^-23 * (|A| @ |B|) (+ the output rounding; + ceil(K/32) * 2^-149 where a
block partial times a scale below 2^-126 lands among fp32 subnormals on the registers path).  On exactly
representable inputs (partial sums exact in fp32) the result is the reference's bit for bit.  A block with scale
0xFF makes every output that reads it NaN.  The staged path's range limit is the MX decode's (stage.py): exact
while the weight's block scales span at most ~117 binades.

This module holds the paths' rules: which path and kernel run (``wonly_path``, ``small_kernel``, ``sm90_small``,
``wg_rule``), each kernel's compiled forms (:class:`WonlyVariant`) and how a launch is sized (``_splits``,
``ring_split_cap``, ``_even_smem``); ``wonly_plan.py`` the registers path's plan and both paths' staging;
``wonly_records.py`` the packed records.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

import numpy as np

from mxcore.errors import UnsupportedError

from .variants import sm_of
from .wonly_records import GROUP, chunk_k, formula_options, record_bytes, record_groups

__all__ = ["GEMV_FILE", "REGISTERS_MAX_M", "TMA_FILE", "WG_FILE", "WONLY_FILE", "WONLY_PATHS", "WonlyVariant",
           "all_wonly_variants", "fold_range", "mx_weight_folds", "ring_split_cap", "wg_fold_only", "wg_rule",
           "wonly_path"]

WONLY_FILE, GEMV_FILE, TMA_FILE = "gemm_wonly.cu", "gemm_wonly_gemv.cu", "gemm_wonly_tma.cu"
WG_FILE = "gemm_wonly_wg.cu"
KERNELS = {"ring": (WONLY_FILE, "mx_wonly_gemm"), "gemv": (GEMV_FILE, "mx_wonly_gemv"),
           "tma": (TMA_FILE, "mx_wonly_tma"), "wg": (WG_FILE, "mx_wonly_wg")}
WONLY_PATHS = ("registers", "staged")
#: bf16 activations with M up to this run on the registers path by default, larger M on the staged path (H200,
#: bf16 x mxfp4, N = K = 8192, kernel time against cuBLAS bf16: registers 1.07 / 0.74 / 0.40 at M = 16 / 32 / 64,
#: staged 0.75 / 0.73 / 0.68)
REGISTERS_MAX_M = 32
MT_CHOICES = (1, 2, 4, 8)  # m8 tiles per block (WO_MT)
# warps per block, cp.async ring depth, blocks per SM that split K aims for: the best of a sweep on the H200
# (warps 2/4/8, stages 4/6/8, 2/4/8 blocks per SM at M = 1, 16, 64 with N = K = 8192 and 1 x 28672 x 8192)
WARPS, STAGES, CTAS_PER_SM = 4, 4, 4
#: the ring's split-K partials (8 M N bytes a split: written, then read by the finishing block) stay under 1 /
#: RING_WS_SHARE of the packed weight's bytes (ring_split_cap).  H100, bf16 x mxfp4 16 x 4096 x 4096: 16 splits (the
#: partials as large as the weight) 29.3 us, 8 splits 23.1, 4 splits 19.8, 2 splits 22.9.  A cap that binds
#: a little measured slower (16 x 8192 x 8192 at 8 splits, not 9: 37.9 against 33.8 us; 32 x 8192 x 8192 likewise),
#: so it only stops splits whose partials would outweigh the weight (fp16 activations at M >= 32 on narrow weights)
RING_WS_SHARE = 1
R = GROUP // WARPS  # n16 tiles per warp
#: M up to this runs the direct-load kernel (gemm_wonly_gemv.cu), larger M the cp.async ring (gemm_wonly.cu).  H200,
#: bf16 x mxfp4, N = K = 8192, kernel time: direct loads 19.4 / 20.5 / 22.4 / 25.8 us at M = 1 / 2 / 4 / 8, the ring
#: 20.5 / 21.1 / 22.0 / 24.5 us; 1 x 28672 x 8192: 56.0 against 61.0 us
GEMV_MAX_M = 2
GEMV_MT = (1,)  # m8 tiles per block of the direct-load kernel (any M runs: grid.y covers it)
# its n16 tiles per warp, warps per block, chunks in flight per warp, and the most blocks per SM that split K aims
# for (fewer when the registers allow fewer: one wave).  The best of a sweep on the H200 (tiles per warp 2 / 4 / 8,
# warps 1 / 2 / 4 / 8, 1 to 4 chunks in flight, with and without L2 prefetches of the records 4 / 8 chunks ahead)
GEMV_R, GEMV_WARPS, GEMV_PF, GEMV_CTAS_PER_SM = 2, 4, 2, 32
#: sm_90: the small-M kernel ("gemv"; "tma": gemm_wonly_tma.cu, bulk copies into a shared-memory ring, a producer warp
#: and TMA_WARPS consumer warps; "auto": the wgmma kernel where wg_rule says, else gemv; until session 19 tma for bf16
#: activations when the weight has at least one record group of 128 columns per SM), the M up to which it runs (larger
#: M: the ring), and PDL: launched with programmatic dependent launch (wonly_common.cuh).  H200, bf16 x mxfp4, kernel
#: time of back-to-back launches (README): gemv with PDL 18.2 / 19.2 / 21.4 / 24.7 us at M = 1 / 2 / 4 / 8 (N = K =
#: 8192) against 19.7 / 20.9 / 23.0 / 26.5 without and the ring's 20.7 / 21.3 / 22.5 / 24.3; tma with PDL 19.0 at M = 1,
#: 52.4 at 1 x 28672 x 8192 against gemv with PDL's 55.6 (fp16 there: 73.4 against 67.7)
#: The default since session 9 (the merged tree through the GPU suite on an H100; bench there, before -> after:
#: bf16 x mxfp4 1 x 8192 x 8192 1710 -> 1857 GB/s, 4 x 8192 x 8192 1555 -> 1601, 1 x 28672 x 8192 2129 -> 2196)
#: Since session 19 "auto" runs the wgmma kernel at M <= 4 on every weight wider than a quarter record group per SM
#: (wg_rule), so it picks tma nowhere; tma stays a kernel SM90_SMALL can name (and the GPU tests run)
SM90_SMALL, SM90_PDL = "auto", True
#: sm_90: the M up to which the small-M kernel runs, by activation type and how narrow the weight is: (record
#: groups of 128 columns per SM at most, M up to); larger M, or wider weights, run the ring.  A narrow weight gives
#: the ring too few blocks without many K splits, each of a few chunks and an fp32 partial to write and sum.  H100,
#: mxfp4 weights, kernel time in us, the ring / gemv with PDL (sweeps of session 9; bf16 activations unless noted):
#: 16 x 4096 x 4096 19.8 with 4 splits, 29.3 with the 16 the ring chose / 17.9; 32 x 4096 x 4096 52.5 / 20.6;
#: 16 x 4096 x 14336 37.3 / 32.7; 8 x 8192 x 8192 27.3 / 26.5; 16 x 8192 x 8192 33.8 / 33.8 (fp16: 34.9 / 40.2);
#: the ring ahead for wider weights: 32 x 8192 x 8192 48.0 / 54.0, 32 x 14336 x 4096 40.1 / 60.0, 16 x 14336 x 4096
#: 33.4 / 32.8, 16 x 28672 x 8192 86.8 / 124.7
SM90_SMALL_M = {"bf16": ((0.25, 32), (0.75, 16), (float("inf"), 4)), "f16": ((0.25, 32), (float("inf"), 4))}
# the tma kernel's ring stages, K chunks per stage and most blocks per SM (fewer when registers or shared memory
# allow fewer: one wave), and its consumer warps per block (GROUP / TMA_WARPS n16 tiles each).  A sweep of 2 / 3 / 4 /
# 6 / 8 stages of 1 / 2 / 4 chunks at 1 x 28672 x 8192: 4 x 2 within 2-3 % of the best (2 x 4, which has not been
# through the GPU test suite); 8 consumer warps, or registers capped for 6 blocks per SM: slower
TMA_STAGES, TMA_CPS, TMA_CTAS_PER_SM, TMA_WARPS = 4, 2, 8, 4
TMA_MT = (1, 2)  # its m8 tiles per block (the fewest that cover M; any M runs)
#: sm_90a: the wgmma kernel (gemm_wonly_wg.cu: the weight as wgmma's register A, the activations gathered into
#: shared memory, the block scales folded into the decode) runs M in (WG_M[0], WG_M[1]] on weights wider than a
#: quarter record group per SM (narrower ones give it too few blocks).  Its ring stages, K chunks per stage for m8
#: tiles up to 2 and above, most blocks per SM, and m8 tiles per block (wgmma N = 8 WG_MT; M above 32 runs as row
#: blocks of 32: m64 needs ~170 registers, one block per SM, and measured slower).  H100, bf16 x mxfp4, kernel time
#: in us, the previous rule's kernel -> wg (session 10 sweeps; stages / chunks 4 / 2, 6 / 2, 8 / 2, 4 / 4 within 5 %
#: of each other except 16 x 28672 x 8192: 4 / 4 65.2, 4 / 2 72.8): 16 x 8192 x 8192 33.5 -> 26.8; 32 x 8192 x 8192
#: 49.0 -> 34.3; 64 x 8192 x 8192 61 (staged) -> 50.2; 32 x 14336 x 4096 48.3 -> 29.1; 16 x 28672 x 8192 85.6 ->
#: 65.2; but 16 / 32 x 4096 x 4096 17.7 / 20.6 (direct loads) -> 18.8 / 33.3.  M up to WG_M[0] runs it too where N
#: has fewer record groups than SMs, except f16 x 4-bit codes, and on wider weights for every pair.  Session 19, H100,
#: us, the bulk-copy kernel (bf16) or direct loads (f16) -> wg at M = 1 / 2 / 4 x 28672 x 8192: bf16 x mxfp4 55.6 /
#: 57.8 / 63.0 -> 46.7 / 47.1 / 47.2, mxfp6 96.6 / 104.2 / 114.8 -> 87.0 / 87.1 / 87.3, mxfp8 128.7 / 129.6 / 132.9 ->
#: 124.2 / 124.5 / 125.8, f16 x mxfp4 68.3 / 68.5 / 69.0 -> 56.6 / 56.1 / 56.5, f16 x mxfp8 127.9 / 128.3 / 128.9 ->
#: 121.1 / 121.5 / 120.6; 1 x 57344 x 8192 bf16 x mxfp4 101.6 -> 92.6 (f16 146.5 -> 108.3); 1 / 4 x 32768 x 4096 bf16 x
#: mxfp4 33.7 / 39.1 -> 26.9 / 27.4 (mxfp6, mxfp8, f16 likewise).  Session 17, H100, direct loads -> wg, us: 1 / 4 x
#: 8192 x 8192 bf16 x mxfp8 42.0 / 42.7 -> 38.0 / 38.0, mxfp6 31.0 / 31.8 -> 28.1 / 29.1, mxfp4 18.4 / 19.1 -> 18.2 /
#: 18.5, f16 x mxfp8 42.1 / 42.9 -> 36.5 / 37.3; 1 x 14336 x 4096 bf16 x mxfp4 / mxfp6 / mxfp8 16.8 / 27.5 / 36.1 ->
#: 16.2 / 25.5 / 35.3; but f16 x mxfp4 there 20.2 -> 21.7 (1 x 8192 x 8192: 22.0 -> 20.1)
WG_M, WG_BYTE_MAX_M = (4, 64), 32
WG_STAGES, WG_CTAS_PER_SM = 4, 2
WG_MT = (1, 2, 3, 4)


#: M above 8 WG_MT[-1] on a weight whose every scale code folds (wg_fold_only) runs row blocks of 8 WG_FOLD_MT on
#: the fold-only variant (WW_FOLD_ONLY: no fp32 block-scale path, so m64's accumulators fit two blocks per SM): the
#: weight is decoded once for 64 rows instead of once per row block of 32, and two producer warps gather the
#: activations (WG_GATHER_WARPS).  Session 18, H100, us, row blocks of 32 -> fold-only m64 with 1 / 2 gather warps:
#: bf16 x mxfp4 40 x 8192 x 8192 46.0 -> 37.2 / 35.9, 64 x 8192 x 8192 45.4 -> 43.2 / 43.6, 64 x 14336 x 4096 44.4 ->
#: 41.4 / 40.6, 64 x 28672 x 8192 150.0 -> 134.5 / 127.7; bf16 x mxfp6 64 x 8192 x 8192 58.6 -> 47.8 / 46.4, 64 x
#: 28672 x 8192 216.6 -> 157.4 / 147.1; f16 x mxfp4 64 x 8192 x 8192 48.9 -> 43.8 / 44.1, 64 x 28672 x 8192 166.8 ->
#: 123.4 / 127.9.  At M <= 32 the fold-only build measured within 3 % of the other (not used there).  The wgmma N
#: fits M to 8 rows (n40 / n48 / n56 / n64; likewise n24 in WG_MT): dead rows cost tensor time.  Session 18, H100,
#: us, n64 for every M above 32 -> n48 (33 to 48): bf16 x mxfp4 33 / 40 / 48 x 8192 x 8192 34.4 / 35.7 / 38.0 -> 30.3 /
#: 31.5 / 34.2, 48 x 28672 x 8192 118.7 -> 100.0 (bf16 x mxfp8 1.02-1.06x, f16 x mxfp4 1.09-1.15x); then n48 / n32 ->
#: n40 / n56 / n24: bf16 x mxfp4 36 / 40 / 52 / 56 x 8192 x 8192 30.9 / 31.7 / 39.0 / 39.8 -> 29.7 / 30.9 / 37.5 / 38.5,
#: 20 / 24 x 8192 x 8192 24.1 / 25.3 -> 23.2 / 24.0, 24 / 40 x 28672 x 8192 74.0 / 94.5 -> 67.6 / 88.7 (bf16 x mxfp8
#: within 2 % either way)
WG_FOLD_MT = (5, 6, 7, 8)
#: the wgmma kernel's producer warps that gather activations per row group, by m8 tiles (1 where not listed; 4 at
#: m64 spill; the token-row gather takes WG_ROWS_WARPS).
#: Session 18, H100, bf16 x mxfp4, us, 1 -> 2 at m32: 24 / 32 x 8192 x 8192 26.8 / 28.4 -> 25.3 / 27.3, 32 x 28672 x
#: 8192 80.2 -> 76.9 (bf16 x mxfp8 within 1-2 %); at m16 level (16 x 8192 x 8192 22.2 -> 22.3, 16 x 28672 x 8192
#: 56.3 -> 55.9: not taken)
WG_GATHER_WARPS = {mt: 2 for mt in range(4, 9)}
#: the wgmma kernel's activation gather, by m8 tiles: from WG_ROWS_MT up on 4-bit codes one 4-byte cp.async per
#: token and 64 K (128 contiguous bytes: 4 sectors), else per row group of 8 tokens (16 sectors per instruction).
#: Session 20, H100, us, row groups -> token rows, bf16 x mxfp4: 32 / 64 x 8192 x 8192 27.2 / 43.1 -> 25.7 / 37.8,
#: 32 / 64 x 28672 x 8192 76.7 / 126.3 -> 73.0 / 102.0; f16 x mxfp4 64 x 8192 x 8192 43.8 -> 40.2, 64 x 28672 x 8192
#: 126.8 -> 111.7; but byte codes slower (bf16 x mxfp8 64 x 28672 x 8192 169.6 -> 197.7, mxfp6 147.4 -> 156.5) and
#: M <= 16 level or slower (bf16 x mxfp4 4 / 16 x 28672 x 8192 47.3 / 56.7 -> 48.0 / 57.0) with one producer warp.
#: With two (WG_ROWS_WARPS) m16 and m24 gain: session 21, H100, us, same run, row groups with one warp -> token rows
#: with one / two warps, bf16 x mxfp4: 16 x 28672 x 8192 56.0 -> 56.9 / 53.7, 24 x 28672 x 8192 68.0 -> 80.0 / 64.0,
#: 16 x 8192 x 8192 22.2 -> 22.1 / 21.3; m8 not (8 x 28672 x 8192 47.7 -> 48.6 / 48.8)
WG_ROWS_MT, WG_ROWS_WARPS = 2, 2
#: 6-bit codes take the token-row gather from WG_ROWS6_MT m8 tiles up (None: nowhere), in clusters where wg_pair
#: says.  Session 22, H100, us, same run, row groups -> token rows in pairs / without: bf16 x mxfp6 64 x 28672 x 8192
#: 146.7 / 147.5 -> 122.9 / 132.2, 64 x 8192 x 8192 46.1 / 46.5 -> 43.8 / 45.6; f16 x mxfp6 148.0 / 148.5 -> 123.2 /
#: 135.0, 46.3 / 47.1 -> 44.0 / 45.5; but from m40 in pairs 40 / 48 x 28672 x 8192 111.8 / 117.7 -> 117.8 / 126.9,
#: at m32 rows 96.8 -> 102.6, and bf16 x mxfp8 slower with rows at every M (64 x 28672 x 8192 170.8 -> 180.3)
WG_ROWS6_MT = 8
#: from WG_WHOLE_MT m8 tiles up a token-row build gathers a block whose tokens all lie inside M with each token's
#: source and destination offsets computed once per kernel (WW_WHOLE: an address add and two copies per token and
#: stage, no test between tokens; the producer issued ~11 instructions per copy before).  Session 22, H100, us, same
#: run, before -> after: bf16 x mxfp4 64 x 28672 x 8192 92.3 -> 85.6 / 86.6, 64 x 8192 x 8192 34.8 -> 34.0 / 33.8;
#: f16 x mxfp4 102.3 -> 98.0 / 98.6, 37.5 -> 35.5 / 35.7; mixed below m64 (bf16 x mxfp4 40 / 32 x 28672 x 8192 78.4
#: / 72.3 -> 74.4 / 73.7, f16 x mxfp4 85.1 / 84.9 -> 87.4 / 83.3, 24 x 28672 x 8192 73.2 -> 76.4)
WG_WHOLE_MT = 8
#: clusters of WG_PAIR blocks on adjacent record groups that each gather a WG_PAIR-th of the activations and copy it
#: to the others (WW_PAIR: the activations cross L2 once per cluster), from WG_PAIR_MT m8 tiles up on the token-row
#: builds (4-bit codes; 6-bit at m64) where the record groups divide into clusters.  Session 21, H100, us, same run,
#: one block -> pairs: bf16 x mxfp4 40 / 64 x 28672 x 8192 82.9 / 103.4 -> 78.7 / 91.6, 64 x 8192 x 8192 37.9 -> 34.9;
#: f16 x mxfp4 90.3 / 111.2 -> 86.0 / 101.2, 41.0 -> 37.0; but bf16 x mxfp8 slower (160.5 / 167.0 -> 168.5 / 180.1,
#: 52.9 -> 56.3), m32 level or slower (bf16 x mxfp4 32 x 28672 x 8192 72.9 -> 75.7) and clusters of 4 slower
#: everywhere (64 x 28672 x 8192 92.5)
WG_PAIR_MT, WG_PAIR = 5, 2
#: the wgmma kernel loads its activations by tensor copy (TMA, WW_TMA) from a copy of X with the records' K permutation
#: applied (mx_wonly_xperm, launched by the plan right before the product) instead of gathering them with 4-byte
#: cp.async (one producer warp, whose lane 0 issues a box per 64-K row; no clusters: sharing the tiles by multicast in
#: clusters of two measured no better, 64 / 48 x 28672 x 8192 75.7 / 70.1 us against 75.3 / 69.4 without, and is not
#: built): from WG_TMA_MT m8 tiles up (None: nowhere) where the launch has a block per SM without splitting K, and where
#: it splits K from WG_TMA_ANY_MT[bits] up for codes of that many bits (none listed: never).  The copy's pass costs ~3
#: us that a short block does not win back.  Session 24, H100, us, gather -> TMA, same run: bf16 x mxfp4 16 / 24 / 32 /
#: 40 / 48 / 56 / 64 x 28672 x 8192 53.8 / 64.6 / 71.7 / 77.3 / 80.5 / 84.8 / 85.0 -> 53.9 / 60.2 / 66.2 / 64.3 / 69.4 /
#: 70.0 / 75.3 (m16: the other run), 16 / 24 / 32 x 8192^2 (split 4) 21.2 / 23.2 / 25.6 -> 24.2 / 28.0 / 29.7, 40 / 48 /
#: 56 / 64 x 8192^2 28.7 / 30.8 / 31.9 / 33.6 -> 27.7 / 29.0 / 33.3 / 31.9; fp16 x mxfp4 40 / 64 x 8192^2 30.8 / 35.7 ->
#: 29.9 / 34.1; but bf16 x mxfp8 48.1 / 53.1 -> 64.0 / 70.3 and bf16 x mxfp6 39.4 / 44.3 -> 43.1 / 49.4 there; on 28672
#: x 8192 every pair gains at 32 / 64 (bf16 x mxfp8 144.9 / 167.4 -> 142.4 / 154.3).
WG_TMA_MT, WG_TMA_ANY_MT = 3, {4: 5}


def wg_tma(v: "WonlyVariant", blocks: int, sms: int) -> bool:
    """Whether wgmma variant ``v`` (without clusters) loads its activations by tensor copy from the permuted copy of
    X in a launch of ``blocks`` blocks before any K split on ``sms`` multiprocessors (WG_TMA_MT, WG_TMA_ANY_MT)."""
    if v.kernel != "wg" or WG_TMA_MT is None or v.mt < WG_TMA_MT:
        return False
    return blocks >= sms or v.mt >= WG_TMA_ANY_MT.get(v.spec.bits, 99)


def wg_pair(v: "WonlyVariant", groups: int) -> int:
    """The blocks per cluster of wgmma variant ``v`` on ``groups`` record groups (WG_PAIR_MT; 0: no clusters)."""
    ok = v.gather_rows and not v.tma_x and v.mt >= WG_PAIR_MT and groups % WG_PAIR == 0
    return WG_PAIR if ok and 8 * v.mt % (WG_PAIR * v.gather_warps) == 0 else 0  # (each warp an equal share)


def span_folds(span: tuple, element: str, act: str) -> bool:
    """Whether scale codes from span[0] to span[1] all lie in the fold range of ``element`` codes and ``act``."""
    lo, hi, _ = fold_range(element, act)
    return lo <= span[0] and span[1] <= hi


def wg_fold_only(w, act: str) -> bool:
    """Whether every scale code of the packed weight ``w`` (a DevOperand of pack_weight, which read their span)
    lies in ``act``'s fold range for its element format."""
    return w.span is not None and span_folds(w.span, w.elem, act)


def mx_weight_folds(b, act: str, element: str) -> bool:
    """Whether every scale code of weight ``b`` (``element`` codes) lies in ``act``'s fold range: an MXTensor's
    scales (their least and greatest code, a synchronization for device scales, once per tensor; the backend's
    choice of path asks, as wonly_path's ``folds``); False for a weight quantized per call."""
    from mxcore.arrays import array_kind

    if array_kind(b) != "mx":
        return False
    span = _MX_SPANS.get(b)
    if span is None:
        s = b.scales
        span = (int(s.min()), int(s.max())) if int(np.prod(s.shape)) else (127, 127)
        try:
            _MX_SPANS[b] = span
        except TypeError:  # not weak-referenceable: asked again next time
            pass
    return span_folds(span, element, act)


_MX_SPANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def wg_cps(mt: int) -> int:
    """K chunks per ring stage of the wgmma kernel with ``mt`` m8 tiles."""
    return 4 if mt <= 2 else 2

_RECORD = {"f16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
           "bf16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"}
_SPECIAL = {"none": 0, "fn": 1, "ieee": 2}


@dataclass(frozen=True)
class WonlyVariant:
    """One compiled form of a weight-only kernel: the weight's element format, the activation type ("f16" |
    "bf16"), the m8 tiles per block and the kernel ("ring": gemm_wonly.cu, "gemv": gemm_wonly_gemv.cu, with its
    tiles per warp, warps per block and chunks in flight)."""

    element: str
    act: str
    mt: int
    kernel: str = "ring"
    r: int = 0
    warps: int = 0
    pf: int = 0  # gemv: chunks in flight per warp; tma: ring stages
    cps: int = 0  # tma: K chunks per ring stage
    pdl: bool = False  # sm_90: launched with programmatic dependent launch (WO_PDL)
    fold_only: bool = False  # wg: every chunk folds (WW_FOLD_ONLY: no fp32 block-scale path; WG_FOLD_MT)
    pair: int = 0  # wg: clusters of this many blocks share the activation gather (WW_PAIR; wg_pair)
    tma_x: bool = False  # wg: the activations by tensor copy from the permuted copy of X (WW_TMA; wg_tma)

    @classmethod
    def gemv(cls, element: str, act: str, mt: int, pdl: bool = False) -> "WonlyVariant":
        return cls(element, act, mt, "gemv", GEMV_R, GEMV_WARPS, GEMV_PF, pdl=pdl)

    @classmethod
    def tma(cls, element: str, act: str, mt: int, pdl: bool = False) -> "WonlyVariant":
        return cls(element, act, mt, "tma", GROUP // TMA_WARPS, TMA_WARPS, TMA_STAGES, TMA_CPS, pdl)

    @classmethod
    def wg(cls, element: str, act: str, mt: int, pdl: bool = False, fold_only: bool = False) -> "WonlyVariant":
        return cls(element, act, mt, "wg", 1, 8, WG_STAGES, wg_cps(mt), pdl, fold_only)

    @classmethod
    def small(cls, element: str, act: str, mt: int, arch: str, kernel: str = "gemv") -> "WonlyVariant":
        """The small-M kernel of ``arch``: ``kernel`` ("gemv" | "tma", sm_90 only) on sm_90 with PDL as SM90_PDL
        says, else gemv."""
        if sm_of(arch) == 90:
            return getattr(cls, kernel)(element, act, mt, SM90_PDL)
        return cls.gemv(element, act, mt)

    @property
    def file(self) -> str:
        return KERNELS[self.kernel][0]

    @property
    def entry(self) -> str:
        return KERNELS[self.kernel][1]

    @property
    def threads(self) -> int:
        return 32 * {"gemv": self.warps, "tma": self.warps + 1, "wg": 8 + self.gather_warps}.get(self.kernel, WARPS)

    @property
    def gather_warps(self) -> int:
        """wg: the producer warps that gather the activations (WG_ROWS_WARPS per token row, else WG_GATHER_WARPS)."""
        if self.kernel != "wg":
            return 0
        if self.tma_x:
            return 1  # the one producer warp: records, fold bits and the activations' tensor copies
        return WG_ROWS_WARPS if self.gather_rows else WG_GATHER_WARPS.get(self.mt, 1)

    @property
    def gather_rows(self) -> bool:
        """wg: the activations gathered per token row (WG_ROWS_MT for 4-bit codes, WG_ROWS6_MT for 6-bit codes),
        else per row group."""
        if self.kernel != "wg":
            return False
        if self.pack4:
            return self.mt >= WG_ROWS_MT
        return self.spec.bits == 6 and WG_ROWS6_MT is not None and self.mt >= WG_ROWS6_MT

    @property
    def whole_rows(self) -> bool:
        """wg: the token-row gather of a block inside M with offsets computed once (WG_WHOLE_MT)."""
        return self.gather_rows and self.mt >= WG_WHOLE_MT

    @property
    def tiles(self) -> int:
        """n16 tiles per block."""
        return self.r * self.warps if self.kernel == "gemv" else GROUP

    @property
    def sm90(self) -> bool:
        """Whether the variant needs sm_90 (bulk copies, griddepcontrol; wgmma: sm_90a)."""
        return self.kernel in ("tma", "wg") or self.pdl

    @property
    def arch(self) -> str | None:
        """The architecture the variant must be compiled for when not the device's own (wgmma: sm_90a)."""
        return "sm_90a" if self.kernel == "wg" else None

    @property
    def spec(self):
        from mxcore import formats

        return formats.get(self.element)

    @property
    def pack4(self) -> bool:
        return self.spec.bits == 4

    @property
    def kc(self) -> int:
        return chunk_k(self.element)

    @property
    def record_bytes(self) -> int:
        return record_bytes(self.element)

    @property
    def stages(self) -> int:
        """Depth of the cp.async ring (chunks in flight per block)."""
        return STAGES

    @property
    def smem_bytes(self) -> int:
        if self.kernel == "gemv":
            return 0
        if self.kernel == "tma":
            return self.pf * self.cps * GROUP * self.record_bytes
        if self.kernel == "wg":  # per stage: the activation rows (64 K x 2 bytes per token), the records; 1 KB aligned
            rows = self.cps * (self.kc // 32) // 2 * self.mt * 8 * 128
            return self.pf * (-(-(rows + self.cps * GROUP * self.record_bytes) // 1024) * 1024) + 1024
        return self.stages * (GROUP * self.record_bytes + self.mt * 8 * (192 if self.kc == 64 else 64))

    @property
    def name(self) -> str:
        tail = "_pdl" if self.pdl else ""
        if self.kernel == "tma":  # its configuration (the constants above may change between variants)
            tail = f"_w{self.warps}s{self.pf}c{self.cps}" + tail
        if self.kernel == "wg":
            tail = (f"_s{self.pf}c{self.cps}" + ("_fold" if self.fold_only else "")
                    + ("_x" if self.tma_x else "") + (f"_p{self.pair}" if self.pair else "") + tail)
        if self.kernel in ("gemv", "tma", "wg"):
            return f"wonly_{self.kernel}_{self.act}_{self.element}_m{self.mt * 8}{tail}"
        return f"wonly_{self.act}_{self.element}_m{self.mt * 8}{tail}"

    def options(self) -> tuple:
        from mxcore import layouts

        sp = self.spec
        tbias, tmant = (127, 7) if self.act == "bf16" else (15, 10)
        mul = 2.0 ** (tbias - sp.bias)  # the exact multiply that turns placed bits into the value
        bits = int(np.float32(mul).view(np.uint32) >> 16) if self.act == "bf16" else int(np.float16(mul).view(np.uint16))
        if sp.ebits + sp.mbits + 1 != sp.bits or sp.mbits > tmant:
            raise UnsupportedError(f"internal: {self.element} is not a sign-magnitude minifloat the decode places")
        return ("-std=c++17", f"-DWO_EBITS={sp.ebits}", f"-DWO_MBITS={sp.mbits}",
                f"-DWO_SPECIAL={_SPECIAL.get(sp.specials, 0) if sp.bits == 8 else 0}", f"-DWO_PACK4={int(self.pack4)}",
                f"-DWO_BF16={int(self.act == 'bf16')}", f"-DWO_MUL={bits * 0x10001:#x}u", f"-DWO_MT={self.mt}",
                *{"gemv": (f"-DWG_R={self.r}", f"-DWG_WARPS={self.warps}", f"-DWG_PF={self.pf}"),
                  "tma": (f"-DWT_R={self.r}", f"-DWT_WARPS={self.warps}", f"-DWT_STAGES={self.pf}",
                          f"-DWT_CPS={self.cps}"),
                  "wg": ("--gpu-architecture=sm_90a", f"-DWW_STAGES={self.pf}", f"-DWW_CPS={self.cps}",
                         *(f"-DWW_{k}={v}" for k, v in zip(("SLO", "SHI", "EOFF"), fold_range(self.element, self.act))),
                         f'-DWW_MMA_ASM="{_wgmma_asm(self.mt, self.act)}"', f"-DWW_FOLD_ONLY={int(self.fold_only)}",
                         f"-DWW_GATHER_WARPS={self.gather_warps}",
                         f"-DWW_GATHER_ROWS={int(self.gather_rows)}",
                         f"-DWW_WHOLE={int(self.whole_rows)}",
                         f"-DWW_PAIR={self.pair}", f"-DWW_TMA={int(self.tma_x)}"),
                  "ring": (f"-DWO_R={R}", f"-DWO_WARPS={WARPS}", f"-DWO_STAGES={self.stages}")}[self.kernel],
                f"-DWO_PDL={int(self.pdl)}",
                f'-DWO_MMA="{layouts.get(_RECORD[self.act]).ptx}"', *formula_options())


def _wgmma_asm(mt: int, act: str) -> str:
    """The wg kernel's ``wgmma.mma_async m64n(8 mt)k16`` with A from registers, as one line of inline PTX whose
    operands are numbered as ww_mma passes them: the 4 mt accumulators, the 4 A registers, B's descriptor, and
    whether to accumulate (the scale-d predicate)."""
    from mxcore.layouts import hopper

    fmt = {"f16": "fp16", "bf16": "bf16"}[act]
    nd = 4 * mt
    d = ", ".join(f"%{i}" for i in range(nd))
    a = ", ".join(f"%{nd + i}" for i in range(4))
    return (f"{{ .reg .pred p; setp.ne.b32 p, %{nd + 5}, 0; {hopper.wgmma_ptx(8 * mt, fmt, fmt)} {{{d}}}, {{{a}}}, "
            f"%{nd + 4}, p, 1, 1, 0; }}")


def fold_range(element: str, act: str) -> tuple[int, int, int]:
    """(lo, hi, offset): the E8M0 scale codes s in [lo, hi] for which the wgmma kernel decodes a code of ``element``
    straight to its scaled value in ``act`` ("f16" | "bf16") with one multiply of the placed bits by the 16-bit
    power of two 2^(target bias - element bias) * 2^(s - 127), exactly: that factor is a normal number of the
    target, and every finite value of the format times 2^(s - 127) is representable (its lowest bit, the format's
    smallest subnormal, stays above the target's, its largest finite value below the target's largest exponent).
    ``offset``: the factor's exponent field is s + offset.  Codes outside (e.g. 0xFF, the NaN scale, always) take
    the fp32 block-scale path.  bf16 x e2m1: [0, 128]; f16 x e2m1: [102, 128]."""
    from mxcore import formats

    sp = formats.get(element)
    tbias, tmant = (127, 7) if act == "bf16" else (15, 10)
    temin, temax = 1 - tbias, tbias
    shift = tbias - sp.bias                      # log2 of the placement's multiplier
    lsb = sp.emin - sp.mbits                     # exponent of the format's smallest subnormal
    top = int(np.floor(np.log2(sp.max_normal)))  # exponent of its largest finite value
    lo = max(0, temin - shift + 127, temin - tmant - lsb + 127)
    hi = min(254, temax - shift + 127, temax - top + 127)
    return (lo, hi, tbias + shift - 127) if lo <= hi else (255, 0, 0)


def all_wonly_variants(arch: str = "sm_80") -> list[WonlyVariant]:
    """Every weight-only kernel a plan on ``arch`` can launch: the ring at every M tile, the direct-load kernel, and
    on sm_90 the small-M kernels gemv and tma, each with and without PDL (whatever SM90_SMALL / SM90_PDL choose), and
    wg (fold-only too, in clusters where wg_pair may choose them, and with the tensor-copy activations where wg_tma
    may choose them)."""
    from mxcore import dtypes as _dt

    elements = list(dict.fromkeys(_dt.MX_ELEMENT.values()))
    out = ([WonlyVariant(e, act, mt) for e in elements for act in ("f16", "bf16") for mt in MT_CHOICES]
           + [WonlyVariant.gemv(e, act, mt) for e in elements for act in ("f16", "bf16") for mt in GEMV_MT])
    if sm_of(arch) == 90:
        extra = [getattr(WonlyVariant, k)(e, act, mt, pdl) for k, mts in (("gemv", GEMV_MT), ("tma", TMA_MT),
                                                                          ("wg", WG_MT))
                 for pdl in ((False, True) if k != "wg" else (SM90_PDL,))
                 for e in elements for act in ("f16", "bf16") for mt in mts]
        extra += [WonlyVariant.wg(e, act, mt, SM90_PDL, fold_only=True)
                  for e in elements for act in ("f16", "bf16") for mt in WG_FOLD_MT]
        # clusters where they may run: asked of a weight whose record groups pair up (WG_PAIR of them)
        extra += [replace(v, pair=p) for v in extra if (p := wg_pair(v, groups=WG_PAIR))]
        extra += [replace(v, tma_x=True) for v in extra if wg_tma(v, blocks=1 << 20, sms=1) and not v.pair]
        out += [v for v in dict.fromkeys(extra) if v not in out]
    return out


def _one_group_per_sm(n: int, sms: int) -> bool:
    """N has at least one record group (128 columns) per SM: at M up to WG_M[0] the wgmma kernel takes such weights
    for f16 x 4-bit codes too."""
    return record_groups(n) >= sms


def wg_rule(arch: str, m: int, n: int, sms: int, act: str = "bf16", element: str = "e2m1", folds=None) -> bool:
    """Whether M = ``m`` of ``act`` activations with N = ``n`` and an ``element`` weight runs the wgmma kernel on
    ``arch`` (``sms`` multiprocessors): weights wider than a quarter record group per SM, M in (WG_M[0], WG_M[1]]
    (bf16 x byte codes, fp8 weights with twice the bytes of fp4, up to WG_BYTE_MAX_M: H100, bf16 x mxfp8 64 x 8192 x
    8192 staged 66.7 us, wg 89.2; at 32 the ring 70.3, wg 54.8; above it only where every scale code of the weight
    folds: the fold-only build, session 18, staged -> wg, us: 33 / 64 x 8192 x 8192 58.3 / 66.7 -> 49.7 / 53.1, 64 x
    14336 x 4096 53.6 -> 50.8, 64 x 28672 x 8192 171.3 -> 168.3), and M up to WG_M[0] too, but for f16 x 4-bit
    codes on weights of fewer record groups than SMs.  ``folds``: None (not known: no) or ``folds(act, element)``,
    whether the weight's scale codes all fold, asked only in that case."""
    from mxcore import formats

    groups = record_groups(n)
    if not arch or sm_of(arch) != 90 or groups <= 0.25 * sms:
        return False
    if m <= WG_M[0]:  # every width but f16 x 4-bit codes on weights of fewer record groups than SMs
        return _one_group_per_sm(n, sms) or act == "bf16" or formats.get(element).bits > 4
    if m > WG_M[1]:
        return False
    return (m <= WG_BYTE_MAX_M or act != "bf16" or formats.get(element).bits != 8
            or (folds is not None and folds(act, element)))


def sm90_small(act: str, n: int, sms: int, m: int = 1, element: str = "e2m1", folds=None) -> str:
    """sm_90's small-M kernel for M = ``m`` of ``act`` activations ("f16" | "bf16"), N = ``n`` and an ``element``
    weight, where small_kernel runs one (SM90_SMALL; "auto": the wgmma kernel where wg_rule says, else direct
    loads; ``folds``: as wg_rule takes it)."""
    if SM90_SMALL != "auto":
        return SM90_SMALL
    return "wg" if wg_rule("sm_90", m, n, sms, act, element, folds) else "gemv"


def small_kernel(arch: str, act: str, m: int, n: int, sms: int, element: str = "e2m1", folds=None) -> bool:
    """Whether M = ``m`` of ``act`` activations ("f16" | "bf16") with N = ``n`` runs the small-M kernel
    (WonlyVariant.small) on ``arch`` (``sms`` multiprocessors), else the cp.async ring (``folds``: as wg_rule)."""
    if sm_of(arch) != 90:
        return m <= GEMV_MAX_M
    if wg_rule(arch, m, n, sms, act, element, folds):
        return True
    groups = record_groups(n)
    return any(m <= most and groups <= share * sms for share, most in SM90_SMALL_M[act])


def wonly_path(mdt, m: int, option: str | None = None, arch: str = "", n: int = 0, sms: int = 0, folds=None) -> str:
    """"registers" or "staged" for ``mdt`` (a weight-only pair) with M = ``m`` (and N = ``n`` on ``arch`` with
    ``sms`` multiprocessors: the wgmma kernel's M; ``folds``: as wg_rule takes it); ``option`` forces one."""
    if option is not None:
        if option not in WONLY_PATHS:
            raise UnsupportedError(f"wonly_path={option!r}; choose one of {', '.join(WONLY_PATHS)} (or None: the rule)")
        if option == "staged" and mdt.a.name != "bf16":
            raise UnsupportedError(f"wonly_path='staged' decodes the weight to bf16 and multiplies bf16; "
                                   f"{mdt.a.name} activations run on wonly_path='registers'")
        return option
    from mxcore import dtypes

    wg = wg_rule(arch, m, n, sms, "bf16", dtypes.MX_ELEMENT.get(mdt.b.name, "e2m1"), folds)
    return "registers" if (mdt.a.name != "bf16" or m <= REGISTERS_MAX_M or wg) else "staged"


# ------------------------------------------------------------------------------------------------------------
# how a launch is sized (the plan, wonly_plan.py, applies them)
# ------------------------------------------------------------------------------------------------------------
def _splits(sms: int, base: int, nchunks: int, force: int = 0, per_sm: int = CTAS_PER_SM,
            one_wave: bool = False, cap: int = 64) -> tuple[int, int]:
    """(splits, chunks per split): enough blocks for ``per_sm`` per SM when the tiles alone cannot give them
    (``one_wave``: at most ``per_sm`` per SM), at most ``cap`` splits unless ``force``d."""
    fill = (per_sm * sms // max(base, 1)) if one_wave else -(-per_sm * sms // max(base, 1))
    want = force or (1 if base >= 2 * sms else max(1, min(fill, cap, 64, max(1, nchunks // 4))))
    per = -(-nchunks // max(1, want))
    return -(-nchunks // per), per


def ring_split_cap(m: int, n_padded: int, weight_bytes: int) -> int:
    """The most K splits of the cp.async ring: each split writes an fp32 partial of M x N that the finishing block
    reads back (8 M N bytes of traffic), kept to 1 / RING_WS_SHARE of the packed weight's bytes."""
    return max(1, weight_bytes // (RING_WS_SHARE * 8 * max(m, 1) * max(n_padded, 1)))


def _even_smem(props: dict, blocks: int, sms: int, resident: int, smem: int, static: int) -> int:
    """Dynamic shared memory for a one-wave grid of ``blocks`` launched with PDL: enough that an SM holds at most
    ceil(blocks / sms) of them.  A PDL launch's blocks start on the SMs its predecessor frees first, which would
    otherwise take up to ``resident`` blocks each and leave the last ones idle (H200, 16 x 28672 x 8192 on the
    direct-load kernel: 145 us with PDL against 119 without, before this)."""
    cap = -(-blocks // max(sms, 1))
    if cap >= resident:
        return smem
    per_sm = props.get("sharedMemPerMultiprocessor", 233472) // cap - props.get("reservedSharedMemPerBlock", 1024)
    want = min(per_sm - static, props.get("sharedMemPerBlockOptin", 232448) - static) // 128 * 128
    return max(smem, want)
