// mxcore NVIDIA mma.sync GEMM block: D tile = 2^e * (A[M,K] @ B[K,N]), fp32 accumulation on tensor
// cores.  The loop pieces and the block's main loop, shared by gemm.cu (the GEMM, mx_gemm) and gemm_diag.cu (loop diagnostics for
// the benchmark, mx_gemm_diag).  Specialised with -D defines by backends/cuda/variants.py (never edited by text
// substitution):
//   MX_ESIZE        bytes per element as stored: 2 (f16/bf16, m16n8k16), 4 (tf32 bits, m16n8k8), 1 (fp8, m16n8k32)
//   MX_MMA_OP       the mma.sync mnemonic (a string, taken from mxcore.layouts' record), e.g.
//                   "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
//   MX_A_KMAJOR     1: A stored [M][lda] with K contiguous; 0: A stored [K][lda] with M contiguous (2-byte only)
//   MX_B_KMAJOR     1: B stored [N][ldb] with K contiguous; 0: B stored [K][ldb] with N contiguous (2-byte only)
//   MX_BM MX_BN MX_BK MX_WARPS_M MX_WARPS_N MX_STAGES   block tile, warp grid, cp.async pipeline depth
//   MX_GROUP_M      rows of blocks per L2 group (grid swizzle)
//   MX_F8_CVT       1 (fp8, MX_ESIZE 1, for sm_90 where fp8 mma.sync is not native): the fp8 fragments that
//                   ldmatrix loads in the m16n8k32 layout are converted ONCE per mma step to f16 (cvt.rn.f16x2.
//                   e4m3x2 / e5m2x2, exact) and multiplied by two m16n8k16 f16 mma (MX_MMA_OP is then the f16
//                   mnemonic).  Each 32-bit fp8 register (4 consecutive K) gives its low and high byte pairs to the
//                   two K halves of one f16 mma; A and B are split the same way, so both see the same permutation
//                   of K inside the 32-wide step and the sum is the same products.  The operands' fp8 formats are
//                   the runtime argument f8_pair (bit 0: A is e5m2, bit 1: B is e5m2; e4m3 otherwise), so one build
//                   serves all four pairs: the main loop is instantiated per pair and chosen once per block, before
//                   the loop (no per-element or per-step select).  Other builds ignore f8_pair.
//   Fragment index formulas (generated from one Python table that tests/test_cuda_index.py checks against
//   mxcore.layouts; see backends/cuda/variants.py FRAGMENT_FORMULAS):
//   MX_LDSM_A_ROW(l) MX_LDSM_A_CHUNK(l) MX_LDSM_B_ROW(l) MX_LDSM_B_CHUNK(l): the tile row and 16-byte chunk whose
//       address lane l hands to ldmatrix.x4 (non-trans for K-major, .trans for M/N-major operands), so that the
//       four destination registers are the mma's A registers a0..a3, or B registers b0,b1 of two n8 blocks.
//   MX_LDSM_B_BLOCK(j) MX_LDSM_B_REG(j): B's ldmatrix.x4 register j -> (n8 block, mma B register).
//   MX_CVT_A_REG(h, j) MX_CVT_A_HI(h, j), MX_CVT_B_REG(h, j) MX_CVT_B_HI(h, j) (MX_F8_CVT): register j of f16 mma h
//       <- byte pair HI (0 low, 1 high) of fp8 fragment register REG.
//   MX_C_ROW(l, i) MX_C_COL(l, i): row/col in the 16x8 accumulator tile of lane l's accumulator register i.
//
// Shared memory: STAGES ring of (A tile, B tile); each tile is rows of 16-byte chunks, XOR-swizzled per row so
// that the 8 row addresses of one ldmatrix 8x8 matrix fall in 8 distinct 16-byte bank groups.
// Global loads: cp.async.cg 16 bytes with a source size (zero fill): rows/cols past M, N, K read nothing.
// Requires: A, B 16-byte aligned; lda, ldb multiples of 16 bytes (the backend copies other inputs first).

#include "mx_common.cuh"

#ifndef MX_F8_CVT
#define MX_F8_CVT 0
#endif
#if !defined(MX_ESIZE) || !defined(MX_MMA_OP) || !defined(MX_BM) || !defined(MX_LDSM_A_ROW)
#error "the GEMM kernels need their -D defines from mxcore's backends/cuda/variants.py"
#endif

constexpr int ESIZE = MX_ESIZE;
constexpr int EPC = 16 / ESIZE;          // elements per 16-byte chunk
constexpr int MMA_K = 32 / ESIZE;        // one mma step covers 32 bytes of K: two chunks
constexpr int BM = MX_BM, BN = MX_BN, BK = MX_BK;
constexpr int WARPS_M = MX_WARPS_M, WARPS_N = MX_WARPS_N;
constexpr int NT = 32 * WARPS_M * WARPS_N;
constexpr int STAGES = MX_STAGES;
constexpr bool A_K = MX_A_KMAJOR != 0;
constexpr bool B_K = MX_B_KMAJOR != 0;
constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
constexpr int MI = WTM / 16, NI = WTN / 8;
constexpr int A_ROWS = A_K ? BM : BK;
constexpr int A_CPR = (A_K ? BK : BM) / EPC;
constexpr int B_ROWS = B_K ? BN : BK;
constexpr int B_CPR = (B_K ? BK : BN) / EPC;
constexpr int A_BYTES = A_ROWS * A_CPR * 16;
constexpr int B_BYTES = B_ROWS * B_CPR * 16;
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;

static_assert(ESIZE == 1 || ESIZE == 2 || ESIZE == 4, "element size");
static_assert(A_K || ESIZE == 2, "M-major A needs 16-bit elements (ldmatrix.trans)");
static_assert(B_K || ESIZE == 2, "N-major B needs 16-bit elements (ldmatrix.trans)");
static_assert(!MX_F8_CVT || ESIZE == 1, "MX_F8_CVT converts fp8 fragments");
static_assert(BK % MMA_K == 0 && WTM % 16 == 0 && WTN % 16 == 0, "tile shape");
static_assert((A_ROWS * A_CPR) % NT == 0 && (B_ROWS * B_CPR) % NT == 0, "loader coverage");
static_assert(A_CPR >= 4 && B_CPR >= 4, "rows of at least 64 bytes (swizzle)");

// byte offset of (row, chunk) in a tile with CPR chunks per row, XOR-swizzled
template <int CPR>
__device__ __forceinline__ u32 swz(int row, int chunk) {
    const int x = CPR >= 8 ? (row & 7) : ((row >> 1) & 3);
    return (u32)((row * CPR + (chunk ^ x)) * 16);
}

#include "cp_async.cuh"

template <bool TRANS>
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(MX_MMA_OP " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// the operands' fp8 formats of the converted path as types (F8_PAIR: the kernel's f8_pair code), one main loop
// instantiation each
template <int F8_PAIR>
struct F8Pair {
    static constexpr bool A_E5 = (F8_PAIR & 1) != 0, B_E5 = (F8_PAIR & 2) != 0;
};

#if MX_F8_CVT
// two fp8 codes (E5: e5m2, else e4m3), byte pair HI of r -> f16x2, exact
template <bool E5, int HI>
__device__ __forceinline__ u32 f8x2_to_f16x2(u32 r) {
    const u16 pair = (u16)(HI ? r >> 16 : r);
    u32 d;
    if (E5)
        asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(d) : "h"(pair));
    else
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(pair));
    return d;
}
#endif

__device__ __forceinline__ int clamp16(i64 bytes) { return bytes <= 0 ? 0 : (bytes >= 16 ? 16 : (int)bytes); }

// Copy one operand's K tile into `sbuf`, fully predicated (zero fill past MN and K): KMAJ, tile rows are m or n
// (chunks along k); else tile rows are k (chunks along m or n).  mn0, k0: the tile's first row/column and K.
template <bool KMAJ, int ROWS, int CPR>
__device__ __forceinline__ void load_operand(u32 sbuf, const u8* __restrict__ P, i64 ld, int MN, int K, int mn0, int k0,
                                             int tid) {
#pragma unroll
    for (int i = 0; i < (ROWS * CPR) / NT; ++i) {
        const int q = tid + i * NT;
        const int row = q / CPR, c = q % CPR;
        int bytes;
        i64 off;
        if (KMAJ) {
            const int r = mn0 + row, k = k0 + c * EPC;
            bytes = r < MN ? clamp16((i64)(K - k) * ESIZE) : 0;
            off = ((i64)r * ld + k) * ESIZE;
        } else {
            const int k = k0 + row, x = mn0 + c * EPC;
            bytes = k < K ? clamp16((i64)(MN - x) * ESIZE) : 0;
            off = ((i64)k * ld + x) * ESIZE;
        }
        cp_async16(sbuf + swz<CPR>(row, c), bytes ? P + off : P, bytes);
    }
}

// Copy one K tile of A and B into stage buffer `sbuf`; k0 is the tile's first K index.
__device__ __forceinline__ void load_tile(u32 sbuf, const u8* __restrict__ A, const u8* __restrict__ B, i64 lda, i64 ldb,
                                          int M, int N, int K, int m0, int n0, int k0, int tid) {
    load_operand<A_K, A_ROWS, A_CPR>(sbuf, A, lda, M, K, m0, k0, tid);
    load_operand<B_K, B_ROWS, B_CPR>(sbuf + A_BYTES, B, ldb, N, K, n0, k0, tid);
}

// One operand's per-thread copy plan for FULL K tiles (k0 + BK <= K): few registers, ~3 instructions per
// cp.async.  Thread tid copies chunks q = tid + i * NT (i < ITERS): tile row row0 + i * RSTEP, chunk c (the
// same for every i since NT % CPR == 0), so the swizzled offsets differ by a constant.  The partial last tile
// goes through load_tile (fully predicated).  row_step * ITERS must stay below 2^32 (checked by the host).
template <bool KMAJ, int ROWS, int CPR>
struct FastLoader {
    static constexpr int ITERS = ROWS * CPR / NT;
    static constexpr int RSTEP = NT / CPR;
    static_assert(ITERS == 1 || RSTEP % 8 == 0, "slots must share the swizzle pattern");
    const u8* ptr;  // global address of slot 0 in the next tile to copy
    i64 k_step;     // bytes per K tile
    u32 row_step;   // bytes between slots (RSTEP tile rows)
    u32 smem0;      // swizzled shared offset of slot 0; slot i adds i * RSTEP * CPR * 16
    u32 vmask;      // K-major: bit i set when slot i's row (m or n) lies inside the matrix
    int bytes;      // M/N-major: source bytes of every slot's chunk (zero fill past M or N)

    __device__ __forceinline__ void init(const u8* base, i64 ld, int mn0, int MN, int tid) {
        const int row0 = tid / CPR, c = tid % CPR;
        row_step = (u32)(RSTEP * ld * ESIZE);
        smem0 = swz<CPR>(row0, c);
        vmask = 0;
        bytes = 0;
        if (KMAJ) {  // tile rows = m or n, chunks along k
            ptr = base + ((i64)(mn0 + row0) * ld + c * EPC) * ESIZE;
            k_step = (i64)BK * ESIZE;
#pragma unroll
            for (int i = 0; i < ITERS; ++i)
                if (mn0 + row0 + i * RSTEP < MN) vmask |= 1u << i;
        } else {     // tile rows = k, chunks along m or n
            ptr = base + ((i64)row0 * ld + mn0 + c * EPC) * ESIZE;
            k_step = (i64)BK * ld * ESIZE;
            bytes = clamp16((i64)(MN - mn0 - c * EPC) * ESIZE);
        }
    }
    // EDGE: the block's tile reaches past M (A) or N (B): per-slot source sizes (zero fill), and a valid
    // fallback address for slots that read nothing.  Interior blocks (EDGE false) copy all 16 bytes of every
    // slot with no predicate (~4.5 SASS instructions per cp.async instead of ~8.5).
    template <bool EDGE>
    __device__ __forceinline__ void copy(u32 sbuf, const u8* fallback) {
#pragma unroll
        for (int i = 0; i < ITERS; ++i) {
            const u32 dst = sbuf + smem0 + i * RSTEP * CPR * 16;
            if (EDGE) {
                const int b = KMAJ ? (int)((vmask >> i) & 1u) * 16 : bytes;
                cp_async16(dst, b ? ptr + i * row_step : fallback, b);
            } else {
                cp_async16_full(dst, ptr + i * row_step);
            }
        }
        ptr += k_step;
    }
};

// What the main loop keeps: the GEMM keeps everything; the benchmark's loop diagnostics (gemm_diag.cu) remove
// parts of it.  LOADS: refill stages from global memory in the loop; MATH: ldmatrix + mma; SYNC: the per-tile
// cp.async wait and barrier.
struct FullLoop {
    static constexpr bool LOADS = true, MATH = true, SYNC = true;
};

// The GEMM of one block: D tile = 2^e * (A @ B) (e: out_scale) over this block's batch element and K range (see
// gemm.cu for the arguments).  LOOP: which parts of the main loop run (FullLoop for the GEMM).  f8_pair: the fp8
// formats of MX_F8_CVT builds (see the top of this file), ignored by the others.
template <class LOOP>
__device__ __forceinline__ void gemm_block(const u8* __restrict__ A, const u8* __restrict__ B, void* __restrict__ C,
                                           int M, int N, int K, i64 lda, i64 ldb, i64 ldc, int exp0,
                                           const void* exp_a, const void* exp_b, int exp_u8, int out_kind, int k_split, i64 split_stride,
                                           i64 a_bstride, i64 b_bstride, i64 c_bstride, int f8_pair) {
    extern __shared__ __align__(128) u8 smem[];
    {  // this block's batch element (y) and K range (z)
        const int kbeg = blockIdx.z * k_split;
        K = min(K - kbeg, k_split);
        A += (A_K ? (i64)kbeg : (i64)kbeg * lda) * ESIZE + (i64)blockIdx.y * a_bstride * ESIZE;
        B += (B_K ? (i64)kbeg : (i64)kbeg * ldb) * ESIZE + (i64)blockIdx.y * b_bstride * ESIZE;
        C = (u8*)C + ((i64)blockIdx.z * split_stride + (i64)blockIdx.y * c_bstride) * (out_kind == 0 ? 4 : 2);
    }
    const u32 sbase = (u32)__cvta_generic_to_shared(smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;

    // grid swizzle: GROUP_M block rows walk the block columns together (L2 reuse of B)
    const int grid_m = (M + BM - 1) / BM, grid_n = (N + BN - 1) / BN;
    const int pid = blockIdx.x;
    const int per_group = MX_GROUP_M * grid_n;
    const int first_m = (pid / per_group) * MX_GROUP_M;
    const int gsize = min(grid_m - first_m, MX_GROUP_M);
    const int bm = first_m + (pid % per_group) % gsize;
    const int bn = (pid % per_group) / gsize;
    const int m0 = bm * BM, n0 = bn * BN;

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;

    const int KT = (K + BK - 1) / BK;
    const int KT_FULL = K / BK;  // tiles with every K index inside the matrix
    FastLoader<A_K, A_ROWS, A_CPR> ldA;
    FastLoader<B_K, B_ROWS, B_CPR> ldB;
    ldA.init(A, lda, m0, M, tid);
    ldB.init(B, ldb, n0, N, tid);
    // K order: a partial last tile (K % BK != 0) is multiplied FIRST, so that the steady-state loop below only
    // ever copies full tiles through the cheap FastLoader path.
    // interior block: every row (A: m, B: n) of its tiles lies inside the matrix (uniform per block)
    const bool interior = m0 + BM <= M && n0 + BN <= N;
    auto issue = [&](int stage) {
        const u32 sbuf = sbase + stage * STAGE_BYTES;
        if (interior) {
            ldA.template copy<false>(sbuf, A);
            ldB.template copy<false>(sbuf + A_BYTES, B);
        } else {
            ldA.template copy<true>(sbuf, A);
            ldB.template copy<true>(sbuf + A_BYTES, B);
        }
    };
    constexpr int PREF = STAGES - 1;
#pragma unroll
    for (int s = 0; s < PREF; ++s) {
        if (s < KT) {
            if (s == 0 && KT_FULL < KT)
                load_tile(sbase, A, B, lda, ldb, M, N, K, m0, n0, KT_FULL * BK, tid);
            else
                issue(s);
        }
        cp_async_commit();
    }

    // per-lane ldmatrix coordinates (generated formulas)
    const int a_row = MX_LDSM_A_ROW(lane), a_chunk = MX_LDSM_A_CHUNK(lane);
    const int b_row = MX_LDSM_B_ROW(lane), b_chunk = MX_LDSM_B_CHUNK(lane);

    // fragments of one mma step
    u32 af[MI][4], bf[NI][2];
    auto load_frags = [&](u32 sa, int kk) {
        const u32 sb = sa + A_BYTES;
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
            if (A_K)  // rows = m, chunks along k (2 chunks per mma step)
                ldsm_x4<false>(af[mi], sa + swz<A_CPR>(wm * WTM + mi * 16 + a_row, kk * 2 + a_chunk));
            else      // rows = k, chunks along m (8 elements per chunk)
                ldsm_x4<true>(af[mi], sa + swz<A_CPR>(kk * MMA_K + a_row, (wm * WTM + mi * 16) / EPC + a_chunk));
        }
#pragma unroll
        for (int p = 0; p < NI / 2; ++p) {
            u32 t[4];
            if (B_K)
                ldsm_x4<false>(t, sb + swz<B_CPR>(wn * WTN + p * 16 + b_row, kk * 2 + b_chunk));
            else
                ldsm_x4<true>(t, sb + swz<B_CPR>(kk * MMA_K + b_row, (wn * WTN + p * 16) / EPC + b_chunk));
            bf[2 * p + MX_LDSM_B_BLOCK(0)][MX_LDSM_B_REG(0)] = t[0];
            bf[2 * p + MX_LDSM_B_BLOCK(1)][MX_LDSM_B_REG(1)] = t[1];
            bf[2 * p + MX_LDSM_B_BLOCK(2)][MX_LDSM_B_REG(2)] = t[2];
            bf[2 * p + MX_LDSM_B_BLOCK(3)][MX_LDSM_B_REG(3)] = t[3];
        }
    };

    // the mma of one step; PAIR: F8Pair, the fp8 formats of the converted path (a type: no runtime select)
    auto mma_step = [&](auto pair) {
        using PAIR = decltype(pair);
#if MX_F8_CVT
        // f16 mma h (K half h of the fp8 step): registers from the generated MX_CVT_* formulas, which
        // tests/test_cuda_index.py checks against the layout tables
        u32 bh[NI][2][2];
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                bh[ni][h][0] = f8x2_to_f16x2<PAIR::B_E5, MX_CVT_B_HI(h, 0)>(bf[ni][MX_CVT_B_REG(h, 0)]);
                bh[ni][h][1] = f8x2_to_f16x2<PAIR::B_E5, MX_CVT_B_HI(h, 1)>(bf[ni][MX_CVT_B_REG(h, 1)]);
            }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const u32(&a)[4] = af[mi];
                const u32 ah[4] = {f8x2_to_f16x2<PAIR::A_E5, MX_CVT_A_HI(h, 0)>(a[MX_CVT_A_REG(h, 0)]),
                                   f8x2_to_f16x2<PAIR::A_E5, MX_CVT_A_HI(h, 1)>(a[MX_CVT_A_REG(h, 1)]),
                                   f8x2_to_f16x2<PAIR::A_E5, MX_CVT_A_HI(h, 2)>(a[MX_CVT_A_REG(h, 2)]),
                                   f8x2_to_f16x2<PAIR::A_E5, MX_CVT_A_HI(h, 3)>(a[MX_CVT_A_REG(h, 3)])};
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) mma(acc[mi][ni], ah, bh[ni][h][0], bh[ni][h][1]);
            }
#else
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) mma(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
#endif
    };

    constexpr int KK = BK / MMA_K;
    static_assert(STAGES >= 3, "the pipeline below needs at least 3 stages");
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    // the main loop for fp8 formats `pair` (an F8Pair)
    auto main_loop = [&](auto pair) {
        int read_stage = 0, write_stage = STAGES - 1;
        for (int kt = 0; kt < KT; ++kt) {
            const u32 sa = sbase + read_stage * STAGE_BYTES;
#pragma unroll
            for (int kk = 0; kk < KK; ++kk) {
                if (LOOP::MATH) load_frags(sa, kk);
                if (kk == 0) {  // refill the stage everyone finished reading before the last barrier
                    const int nk = kt + STAGES - 1;
                    if (LOOP::LOADS && nk < KT) issue(write_stage);
                    cp_async_commit();
                    write_stage = write_stage == STAGES - 1 ? 0 : write_stage + 1;
                }
                if (LOOP::MATH) mma_step(pair);
            }
            if (LOOP::LOADS) cp_async_wait<STAGES - 2>();
            if (LOOP::SYNC) __syncthreads();
            read_stage = read_stage == STAGES - 1 ? 0 : read_stage + 1;
        }
    };
#if MX_F8_CVT
    switch (f8_pair & 3) {  // uniform over the grid: one loop instantiation per pair, chosen once
        case 0: main_loop(F8Pair<0>{}); break;
        case 1: main_loop(F8Pair<1>{}); break;
        case 2: main_loop(F8Pair<2>{}); break;
        default: main_loop(F8Pair<3>{}); break;
    }
#else
    (void)f8_pair;
    main_loop(F8Pair<0>{});
#endif
    cp_async_wait<0>();

    const float alpha = out_scale(exp0, exp_a, exp_b, exp_u8);  // device exponents are read here
    // epilogue: scale, convert, predicated stores; the two columns of a register pair (c0,c1 / c2,c3) go out
    // as one 8-byte (fp32) or 4-byte (fp16/bf16) store when both are inside N and the address is aligned
    const int osize = out_kind == 0 ? 4 : 2;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int r = 0; r < 4; r += 2) {
                const int rb = m0 + wm * WTM + mi * 16, cb = n0 + wn * WTN + ni * 8;
                const int row0 = rb + MX_C_ROW(lane, r), col0 = cb + MX_C_COL(lane, r);
                const int row1 = rb + MX_C_ROW(lane, r + 1), col1 = cb + MX_C_COL(lane, r + 1);
                const bool in0 = row0 < M && col0 < N, in1 = row1 < M && col1 < N;
                const float v0 = f32_mul(acc[mi][ni][r], alpha), v1 = f32_mul(acc[mi][ni][r + 1], alpha);  // IEEE
                const i64 o0 = (i64)row0 * ldc + col0, o1 = (i64)row1 * ldc + col1;
                const bool vec = in0 && in1 && o1 == o0 + 1 &&
                                 ((unsigned long long)((u8*)C + o0 * osize) & (2 * osize - 1)) == 0;
                if (out_kind == 0) {
                    if (vec) {
                        *(float2*)((float*)C + o0) = make_float2(v0, v1);
                    } else {
                        if (in0) ((float*)C)[o0] = v0;
                        if (in1) ((float*)C)[o1] = v1;
                    }
                } else {
                    const u16 h0 = out_kind == 1 ? f32_to_f16(v0) : f32_to_bf16(v0);
                    const u16 h1 = out_kind == 1 ? f32_to_f16(v1) : f32_to_bf16(v1);
                    if (vec) {
                        *(u32*)((u16*)C + o0) = (u32)h0 | ((u32)h1 << 16);
                    } else {
                        if (in0) ((u16*)C)[o0] = h0;
                        if (in1) ((u16*)C)[o1] = h1;
                    }
                }
            }
}
