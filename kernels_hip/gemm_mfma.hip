// gemm_mfma.hip: D[M,N] (fp32) = out_scale * A[M,K] x B[K,N] on AMD CDNA3/CDNA4 matrix cores.
//
// One source for every variant.  backends/hip/variants.py (KernelSpec.defines) generates the -D defines
// from the instruction's record in mxcore.layouts: the builtin, the fragment types (mx_types.h), the
// lane -> element constants (MX_A_*, MX_B_*, MX_C_*, MX_S*_*) and the tile sizes.  tests/test_hip_index.py runs the
// same constants through a Python mirror of this file's index arithmetic and mxcore.emulate.
//
// Structure
//   block  = MX_WAVES_M x MX_WAVES_N waves (64 lanes each), tile BM x BN, K step BK
//   wave   = MX_TM x MX_TN instruction tiles of MX_IM x MX_IN, accumulators in registers (fp32)
//   global -> registers (16-byte vector loads) -> LDS (K-contiguous rows, two buffers) -> fragments.
//   A is read with strides (sam, sak), B with (sbk, sbn): either major works for 8/16/32-bit elements (one
//   of them must be 1); an MN-contiguous operand is transposed element by element on its way into LDS.
//   Elements are stored exactly as the instruction's registers hold them (slot s at bits [s*BITS,
//   (s+1)*BITS)): fp4 / fp6 codes packed along K by the staging pass (backends/hip/staging.py pack_k, rows
//   padded with zero codes to MX_KPAD, always K-contiguous), so a fragment is a copy of LDS bytes.
//   Block scales (MX formats): E8M0 bytes, A scales [M, KB] row-major, B scales [KB, N] row-major,
//   KB = ceil(K / 32); a missing block reads 127 (2^0) so zero-filled tails stay zero.  The scales of a
//   K tile are loaded together with its operand tiles, one tile ahead of the MFMAs that use them.
//   Batches: blockIdx.z (+ batch0) selects batch b; A, B, D and the scale arrays advance by their batch
//   strides (0 broadcasts one operand over the batch).  Grid Y covers M tiles from m_tile0 on: the host
//   splits tall problems into several launches when M / BM exceeds the device's grid-Y limit.  Block
//   (x, y) computes tile mx_xcd_order(y * tiles_x + x) (chiplet-aware order, see there).
//
// Two paths, chosen per block at run time (uniform branch):
//   fast    the block lies inside D and both operands are K-contiguous and 16-byte aligned (a/b_vec_ok):
//           one 16-byte load per vector, 16-byte LDS stores, no edge tests in the K loop; a K tail
//           (K % BK != 0) is fetched once, after the loop, by the general loads.
//   general everything else: vectors inside the matrix but unaligned are gathered with independent element
//           loads (all in flight); vectors that cross an edge element by element with zero fill; an
//           MN-contiguous operand (8/16/32-bit elements read in place) is transposed into LDS per element.
//   -DMX_FAST_ONLY=1 builds only the fast path (tests/test_hip_steady_state.py reads its K loop).
//
// Tiles: per instruction shape a 2x2-wave tile (64x64 for 16x16 instructions, 128x128 for 32x32), and for
// the 32x32 instructions a large 8-wave tile (256x256 on gfx950, 256x128 on gfx942; two waves per SIMD;
// backends/hip/variants.py BIG_TILE, chosen for problems of at least BIG_TILES such tiles).
//
// DESIGN ESTIMATE of the fraction of MFMA peak -- NOT A MEASUREMENT (no AMD GPU has run this code).
// Counted on the steady-state K loop of the fast path in clang-22's disassembly (test_hip_steady_state.py
// prints them), per K tile of one wave:
//   family (block tile x BK)                  MFMA  VALU  SALU  global  ds_read  ds_write
//   gfx950 mxfp4 32x32x64 (256x256x64)          8    34    21     8        6        2
//   gfx950 mxfp4 32x32x64 (128x128x64)          4    24    16     6        4        2
//   gfx950 mxfp6 16x16x128 (64x64x256)          8    65    28    14       16        6
//   gfx950 mxfp8 / OCP fp8 32x32x64 (256x256)   8    45    21    10       12        4
//   gfx950 fp16/bf16 32x32x16 (256x256x32)     16    17     7     4       12        4
//   gfx942 fp16/bf16/fp8 32x32 (256x128)       16    11     9     3        8        3
//   gfx942 fp16/bf16 32x32x8 (128x128x32)      16    20     7     4        8        4
//   gfx942/gfx950 fp32 32x32x2 (128x128x16)    32    20     8     4       16        4
// Before this design (one code per byte, packing in the loop, scales loaded after the prefetch, edge tests
// in every loop) the same K loop held 250-580 VALU per 4 f8f6f4 MFMAs (fp8 / fp4 / fp6), 170 per 16 fp16
// MFMAs on gfx942 (static counts of the loop body, edge code included), and the scaled kernels waited
// vmcnt(0) before the first MFMA of every tile.
// Reasoning: VALU/SALU issue alongside the MFMAs of the other waves of a SIMD, so the MFMA pipe is the limit
// once the MFMA cycles per tile exceed the issue cycles of everything else.  Taking 16 passes of 4 cycles
// for a 32x32x64 f8f6f4 MFMA with fp8 operands and half that with fp4 (CDNA4's doubled fp4 rate), the
// 8 MFMAs of a 256x256 tile are 256-512 cycles against ~60-80 other instructions: issue is not the limit.
// The remaining limits: (a) one barrier per K tile and a two-stage pipeline (the LDS stores of tile kt+1
// wait for its global loads right after the MFMAs of tile kt; with BK of one or two MFMA K steps the global
// latency, hundreds of ns, is hidden only by the other blocks / waves of the CU: a deeper pipeline is NOT
// built); (b) arithmetic intensity: 256x256 tiles give 256 FLOP per byte of global traffic at fp8 (512 at
// fp4, 128 at fp16), 128x128 half that, against ridges of roughly 600 FLOP/B for fp8 and 1200 for fp4
// (MI355X's published peaks over 8 TB/s), so large problems lean on L2 reuse (chiplet-aware block order,
// mx_xcd_order).  Expected by design on large
// problems: 40-60 % of peak for fp16/bf16 and fp8, 25-40 % for MXFP4 / MXFP6 (bandwidth- and
// latency-bound), less on small problems.  Measure with `python -m mxcore bench` on the hardware before
// quoting any number.

#ifndef MX_ENTRY
#error "compile through backends/hip (KernelSpec.defines): it passes the -D defines of a variant"
#endif

#include "mx_types.h"

typedef unsigned char mx_u8;
typedef unsigned short mx_u16;
typedef unsigned int mx_u32;
typedef unsigned int mx_u32x4 __attribute__((ext_vector_type(4)));
typedef unsigned int mx_u32x2 __attribute__((ext_vector_type(2)));

// ---- element storage unit ------------------------------------------------------------------
#if MX_EB == 1
typedef mx_u8 mx_elem;
#elif MX_EB == 2
typedef mx_u16 mx_elem;
#elif MX_EB == 4
typedef mx_u32 mx_elem;
#else
#error "MX_EB must be 1, 2 or 4"
#endif

#ifndef MX_EDGE_UNROLL
#define MX_EDGE_UNROLL 4  // element loads in flight per edge vector
#endif
#ifndef MX_FAST_ONLY
#define MX_FAST_ONLY 0  // 1: only the steady-state fast path (CI disassembly checks); never launched
#endif
#define MX_THREADS (64 * MX_WAVES_M * MX_WAVES_N)
#define MX_A_REGS ((int)(sizeof(MX_AFRAG_T) / 4))  // registers of the builtin's operand types
#define MX_B_REGS ((int)(sizeof(MX_BFRAG_T) / 4))
#define MX_BM (MX_WAVES_M * MX_TM * MX_IM)
#define MX_BN (MX_WAVES_N * MX_TN * MX_IN)
#define MX_VEC (16 / MX_EB)                           // storage units per 16-byte global load
#define MX_A_BKU (MX_BK * MX_A_SBITS / (8 * MX_EB))   // storage units of one tile row (packed: bytes)
#define MX_B_BKU (MX_BK * MX_B_SBITS / (8 * MX_EB))
#define MX_A_ROW (MX_A_BKU * MX_EB + MX_LDS_PAD)      // LDS row pitch in bytes (a multiple of 16)
#define MX_B_ROW (MX_B_BKU * MX_EB + MX_LDS_PAD)
#define MX_A_PACKED (MX_A_SBITS < 8 * MX_EB)
#define MX_B_PACKED (MX_B_SBITS < 8 * MX_EB)
#define MX_A_WORDS ((MX_A_SLOTS * MX_A_BITS + 31) / 32)
#define MX_B_WORDS ((MX_B_SLOTS * MX_B_BITS + 31) / 32)
#define MX_A_VECS (MX_BM * MX_A_BKU / MX_VEC / MX_THREADS)  // 16-byte vectors per thread per stage
#define MX_B_VECS (MX_BN * MX_B_BKU / MX_VEC / MX_THREADS)
#define MX_KSTEPS (MX_BK / MX_IK)

static_assert(MX_A_ROW % 16 == 0 && MX_B_ROW % 16 == 0, "LDS row pitch must keep 16-byte alignment");
static_assert(MX_BK % MX_IK == 0, "BK must be a multiple of the instruction's K");
static_assert(MX_BM % MX_VEC == 0 && MX_BN % MX_VEC == 0, "tile vs vector width");
static_assert(MX_A_BKU % MX_VEC == 0 && MX_B_BKU % MX_VEC == 0, "tile rows must be whole 16-byte vectors");
static_assert(MX_A_VECS * MX_VEC * MX_THREADS == MX_BM * MX_A_BKU, "A tile must split evenly over threads");
static_assert(MX_B_VECS * MX_VEC * MX_THREADS == MX_BN * MX_B_BKU, "B tile must split evenly over threads");
static_assert(MX_A_WORDS <= MX_A_REGS && MX_B_WORDS <= MX_B_REGS, "fragment larger than the operand registers");
static_assert(MX_A_SBITS == MX_A_BITS && MX_B_SBITS == MX_B_BITS, "stored bits must be the register format's");
static_assert((MX_KPAD * MX_A_SBITS) % (128 * MX_EB) == 0 && (MX_KPAD * MX_B_SBITS) % (128 * MX_EB) == 0,
              "packed rows must end on a 16-byte vector");
#if MX_SCALED
static_assert(MX_BK % 32 == 0, "MX tiles must hold whole 32-element scale blocks");
#endif

// K extent of an operand row in storage units: K, or for packed codes K rounded up to MX_KPAD (zero codes)
__device__ __forceinline__ int mx_kunits(int k, int sbits) {
    return sbits < 8 * MX_EB ? (k + MX_KPAD - 1) / MX_KPAD * (MX_KPAD * sbits / (8 * MX_EB)) : k;
}

// ---- global -> staging registers -----------------------------------------------------------
// A stage holds NV 16-byte vectors per thread.  Vector v of the tile covers, in the K-contiguous case,
// row (v / (BKU/VEC)) and k units [(v % (BKU/VEC)) * VEC, +VEC); in the MN-contiguous case (unpacked
// operands only), k row (v / (R/VEC)) and rows [(v % (R/VEC)) * VEC, +VEC).  FAST: K-contiguous, aligned
// and wholly inside the matrix (the caller checked it for the whole block), so one vector load each.
template <int R, int NV, int BKU, bool FAST, bool KMAJ>
__device__ __forceinline__ void mx_load_tile(mx_u32x4 (&stage)[NV], const mx_elem* __restrict__ p, long long s_r,
                                             long long s_k, int r0, int k0, int rows, int kdim, int vec_ok) {
    const int tid = threadIdx.x;
    const bool k_major = FAST || KMAJ || (s_k == 1);
#pragma unroll
    for (int i = 0; i < NV; ++i) {
        const int v = tid + i * MX_THREADS;
        int r, kk;
        if (k_major) {
            r = v / (BKU / MX_VEC);
            kk = (v % (BKU / MX_VEC)) * MX_VEC;
        } else {
            kk = v / (R / MX_VEC);
            r = (v % (R / MX_VEC)) * MX_VEC;
        }
        const int gr = r0 + r, gk = k0 + kk;
        if constexpr (FAST) {
            stage[i] = *reinterpret_cast<const mx_u32x4*>(p + gr * s_r + gk);
            continue;
        }
        const bool full = k_major ? (gr < rows && gk + MX_VEC <= kdim) : (gk < kdim && gr + MX_VEC <= rows);
        const mx_elem* src = p + gr * s_r + gk * s_k;
        if (vec_ok && full) {
            stage[i] = *reinterpret_cast<const mx_u32x4*>(src);
        } else if (full) {  // inside the matrix, unaligned pitch or base: independent element loads, all in flight
            const long long step = k_major ? s_k : s_r;
            mx_elem e[MX_VEC];
#pragma unroll
            for (int j = 0; j < MX_VEC; ++j) e[j] = src[j * step];
            __builtin_memcpy(&stage[i], e, 16);
        } else {  // edge of the matrix: element loads along the vector, zero fill
            const long long step = k_major ? s_k : s_r;
            const int avail = !(k_major ? gr < rows : gk < kdim) ? 0 : (k_major ? kdim - gk : rows - gr);
            // shift each element in from the top of a 128-bit value: no dynamic register indexing, and a
            // short unroll keeps the number of loads in flight (and their address registers) small
            unsigned __int128 v = 0;
#pragma unroll MX_EDGE_UNROLL
            for (int j = 0; j < MX_VEC; ++j) {
                const unsigned __int128 e = (j < avail) ? (unsigned __int128)src[j * step] : 0u;
                v = (v >> (8 * MX_EB)) | (e << (128 - 8 * MX_EB));
            }
            __builtin_memcpy(&stage[i], &v, 16);
        }
    }
}

// staging registers -> LDS tile [R][BKU] (K-contiguous rows of ROW bytes); KMAJ: the operand is K-contiguous
template <int R, int NV, int BKU, int ROW, bool KMAJ>
__device__ __forceinline__ void mx_store_tile(mx_u8* lds, const mx_u32x4 (&stage)[NV], bool k_major) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
        const int v = tid + i * MX_THREADS;
        if (KMAJ || k_major) {
            const int r = v / (BKU / MX_VEC), kk = (v % (BKU / MX_VEC)) * MX_VEC;
            *reinterpret_cast<mx_u32x4*>(lds + r * ROW + kk * MX_EB) = stage[i];
        } else {
            const int kk = v / (R / MX_VEC), r = (v % (R / MX_VEC)) * MX_VEC;
            mx_elem e[MX_VEC];
            __builtin_memcpy(e, &stage[i], 16);
#pragma unroll
            for (int j = 0; j < MX_VEC; ++j) *reinterpret_cast<mx_elem*>(lds + (r + j) * ROW + kk * MX_EB) = e[j];
        }
    }
}

// ---- LDS -> instruction fragment -----------------------------------------------------------
// Lane l holds, for slot s: row (l % FR) of the tile and k = KLANE * (l / FR) + (s / CHUNK) * CSTRIDE
// + s % CHUNK.  Stored elements are exactly the register format (slot s at bits [s*BITS, (s+1)*BITS),
// fp4 / fp6 packed along K by the staging pass), so each chunk of CHUNK slots is CHUNK*BITS/8 contiguous
// LDS bytes copied straight into the registers: no per-element work.
template <int N>
struct mx_piece;
template <>
struct mx_piece<16> { typedef mx_u32x4 type; };
template <>
struct mx_piece<8> { typedef mx_u32x2 type; };
template <>
struct mx_piece<4> { typedef mx_u32 type; };

constexpr int mx_low_bit(int x) { return x & -x; }

template <int FR, int KLANE, int CHUNK, int CSTRIDE, int SLOTS, int BITS, int WORDS, int ROW>
__device__ __forceinline__ void mx_load_frag(mx_u32 (&w)[WORDS], const mx_u8* lds, int row0, int kk0) {
    constexpr int CB = CHUNK * BITS / 8;  // bytes per chunk
    constexpr int NCH = SLOTS / CHUNK;
    // alignment every address of a chunk shares: row pitch, lane step, chunk stride, K step, chunk size
    constexpr int AL = mx_low_bit(16 | (KLANE * BITS / 8) | (NCH > 1 ? CSTRIDE * BITS / 8 : 16) |
                                  (MX_IK * BITS / 8) | CB);
    static_assert(NCH * CB == WORDS * 4 && AL >= 4, "fragment chunks must be whole, aligned words");
    const int lane = threadIdx.x % 64;
    const mx_u8* base = lds + (row0 + lane % FR) * ROW + (kk0 + KLANE * (lane / FR)) * BITS / 8;
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
#pragma unroll
        for (int q = 0; q < CB / AL; ++q) {
            const typename mx_piece<AL>::type t =
                *reinterpret_cast<const typename mx_piece<AL>::type*>(base + c * CSTRIDE * BITS / 8 + q * AL);
            __builtin_memcpy(reinterpret_cast<mx_u8*>(w) + c * CB + q * AL, &t, AL);
        }
    }
}

template <typename T, int WORDS>
__device__ __forceinline__ T mx_as(const mx_u32 (&w)[WORDS]) {
    T t;
    if constexpr (sizeof(T) > WORDS * 4) __builtin_memset(&t, 0, sizeof(T));
    __builtin_memcpy(&t, w, (sizeof(T) < WORDS * 4) ? sizeof(T) : WORDS * 4);
    return t;
}

// Flat kernel arguments (hip-python packs a tuple of ctypes values at their C alignment; the host side is
// backends/hip/launch.py kernel_args).  Strides are in storage units (elements; packed fp4 / fp6: bytes;
// scales: bytes).
//   A element (m, k) of batch z at a[z * sab + m * sam + k * sak]; B (k, n) at b[z * sbb + k * sbk + n * sbn];
//   D (m, n) at d[z * sdb + m * ldd + n]; block scales at sa + z * ssa, sb + z * ssb.
struct mx_params {
    const mx_elem* a;
    const mx_elem* b;
    float* d;
    const mx_u8* sa;  // block scales (MX only; may be null otherwise: every scale reads 127)
    const mx_u8* sb;
    long long sam, sak, sbk, sbn, ldd;
    int m, n, k, a_vec_ok, b_vec_ok;
    float out_scale;
};

#if MX_SCALED
// The E8M0 scales of one K tile, per lane: for K step ks and instruction tile i, row (l % SFR) of the tile
// and 32-K block (l / SFR).  Loaded with the operand tiles of the same K tile (one tile ahead of the MFMAs),
// so the MFMAs of a tile never wait on a scale load.  A missing block or row reads 127 (2^0).
template <bool FAST>
__device__ __forceinline__ void mx_load_scales(int (&sca)[MX_KSTEPS][MX_TM], int (&scb)[MX_KSTEPS][MX_TN],
                                               const mx_params& p, int kt, int m0, int n0, int wm, int wn) {
    const int lane = threadIdx.x % 64;
    const int kblocks = (p.k + 31) / 32;
#pragma unroll
    for (int ks = 0; ks < MX_KSTEPS; ++ks) {
        const int kb0 = (kt * MX_BK + ks * MX_IK) / 32;
#pragma unroll
        for (int i = 0; i < MX_TM; ++i) {
            const int r = m0 + wm + i * MX_IM + lane % MX_SA_FR, blk = kb0 + lane / MX_SA_FR;
            sca[ks][i] = (p.sa != nullptr && (FAST || (r < p.m && blk < kblocks))) ? (int)p.sa[r * kblocks + blk] : 127;
        }
#pragma unroll
        for (int j = 0; j < MX_TN; ++j) {
            const int c = n0 + wn + j * MX_IN + lane % MX_SB_FR, blk = kb0 + lane / MX_SB_FR;
            scb[ks][j] = (p.sb != nullptr && (FAST || (c < p.n && blk < kblocks))) ? (int)p.sb[blk * p.n + c] : 127;
        }
    }
}
#endif

#if MX_SCALED
#define MX_SCALE_ARGS , const int (&sca)[MX_KSTEPS][MX_TM], const int (&scb)[MX_KSTEPS][MX_TN]
#else
#define MX_SCALE_ARGS
#endif

// The MFMAs of one K tile from one LDS buffer: fragments of every K step, TM x TN instructions each.
__device__ __forceinline__ void mx_compute(MX_CFRAG_T (&acc)[MX_TM][MX_TN], const mx_u8* la, const mx_u8* lb, int wm,
                                           int wn MX_SCALE_ARGS) {
#pragma unroll
    for (int ks = 0; ks < MX_KSTEPS; ++ks) {
        mx_u32 fa[MX_TM][MX_A_WORDS], fb[MX_TN][MX_B_WORDS];
#pragma unroll
        for (int i = 0; i < MX_TM; ++i)
            mx_load_frag<MX_IM, MX_A_KLANE, MX_A_CHUNK, MX_A_CSTRIDE, MX_A_SLOTS, MX_A_BITS, MX_A_WORDS, MX_A_ROW>(
                fa[i], la, wm + i * MX_IM, ks * MX_IK);
#pragma unroll
        for (int j = 0; j < MX_TN; ++j)
            mx_load_frag<MX_IN, MX_B_KLANE, MX_B_CHUNK, MX_B_CSTRIDE, MX_B_SLOTS, MX_B_BITS, MX_B_WORDS, MX_B_ROW>(
                fb[j], lb, wn + j * MX_IN, ks * MX_IK);
#pragma unroll
        for (int i = 0; i < MX_TM; ++i)
#pragma unroll
            for (int j = 0; j < MX_TN; ++j) {
#if MX_SCALED
                acc[i][j] = MX_BUILTIN(mx_as<MX_AFRAG_T>(fa[i]), mx_as<MX_BFRAG_T>(fb[j]), acc[i][j], MX_CBSZ, MX_BLGP,
                                       0, sca[ks][i], 0, scb[ks][j]);
#else
                acc[i][j] = MX_BUILTIN(mx_as<MX_AFRAG_T>(fa[i]), mx_as<MX_BFRAG_T>(fb[j]), acc[i][j], 0, 0, 0);
#endif
            }
    }
}

// The software pipeline's registers: the next tile's staged vectors and the scales of the current and the
// next tile.
struct mx_pipe {
    mx_u32x4 sta[MX_A_VECS], stb[MX_B_VECS];
#if MX_SCALED
    int sca[MX_KSTEPS][MX_TM], scb[MX_KSTEPS][MX_TN], nsa[MX_KSTEPS][MX_TM], nsb[MX_KSTEPS][MX_TN];
#endif
};

// Global loads of K tile kt (operands into the staging registers, scales into nsa/nsb).  FAST: no edge tests
// (the caller knows the tile lies inside the matrix and both operands are K-contiguous and aligned); KMAJ:
// both operands are K-contiguous (edge tests stay).
template <bool FAST, bool KMAJ>
__device__ __forceinline__ void mx_fetch(mx_pipe& q, const mx_params& p, int kt, int m0, int n0, int wm, int wn,
                                         int ka, int kb) {
#if MX_SCALED
    mx_load_scales<FAST>(q.nsa, q.nsb, p, kt, m0, n0, wm, wn);  // scales first: they are waited for first
#endif
    mx_load_tile<MX_BM, MX_A_VECS, MX_A_BKU, FAST, KMAJ>(q.sta, p.a, p.sam, p.sak, m0, kt * MX_A_BKU, p.m, ka,
                                                         p.a_vec_ok);
    mx_load_tile<MX_BN, MX_B_VECS, MX_B_BKU, FAST, KMAJ>(q.stb, p.b, p.sbn, p.sbk, n0, kt * MX_B_BKU, p.n, kb,
                                                         p.b_vec_ok);
}

// Staging registers -> LDS buffer, and the fetched scales become the current ones.  KMAJ: both operands are
// K-contiguous (16-byte stores only).
template <bool KMAJ>
__device__ __forceinline__ void mx_commit(mx_pipe& q, const mx_params& p, mx_u8* la, mx_u8* lb) {
    mx_store_tile<MX_BM, MX_A_VECS, MX_A_BKU, MX_A_ROW, KMAJ>(la, q.sta, p.sak == 1);
    mx_store_tile<MX_BN, MX_B_VECS, MX_B_BKU, MX_B_ROW, KMAJ>(lb, q.stb, p.sbk == 1);
#if MX_SCALED
#pragma unroll
    for (int ks = 0; ks < MX_KSTEPS; ++ks) {
#pragma unroll
        for (int i = 0; i < MX_TM; ++i) q.sca[ks][i] = q.nsa[ks][i];
#pragma unroll
        for (int j = 0; j < MX_TN; ++j) q.scb[ks][j] = q.nsb[ks][j];
    }
#endif
}

#if MX_SCALED
#define MX_SCALE_Q , q.sca, q.scb
#else
#define MX_SCALE_Q
#endif

// One step of the K loop: loads of tile kt+1 in flight while tile kt computes, then tile kt+1 into the other
// LDS buffer.  One basic block; scheduling barriers keep its order (loads, MFMAs, LDS stores, barrier) so the
// global latency of tile kt+1 overlaps the MFMAs of tile kt.  FAST / KMAJ as for mx_fetch.
template <bool FAST, bool KMAJ>
__device__ __forceinline__ void mx_step(mx_pipe& q, const mx_params& p, mx_u8 (*lds_a)[MX_BM * MX_A_ROW],
                                        mx_u8 (*lds_b)[MX_BN * MX_B_ROW], MX_CFRAG_T (&acc)[MX_TM][MX_TN], int kt,
                                        int m0, int n0, int wm, int wn, int ka, int kb) {
    const int cur = kt & 1;
    mx_fetch<FAST, KMAJ>(q, p, kt + 1, m0, n0, wm, wn, ka, kb);
    __builtin_amdgcn_sched_barrier(0);
    mx_compute(acc, lds_a[cur], lds_b[cur], wm, wn MX_SCALE_Q);
    __builtin_amdgcn_sched_barrier(0);
    mx_commit<KMAJ>(q, p, lds_a[cur ^ 1], lds_b[cur ^ 1]);
    __syncthreads();
}

// The K loop of one block, two LDS buffers.  FAST (the block lies inside D, both operands K-contiguous and
// vector-aligned): every whole K tile is fetched without edge tests; only a K tail (K % BK != 0) takes the
// general loads, once, after the loop.
template <bool FAST>
__device__ __forceinline__ void mx_block(const mx_params& p, mx_u8 (*lds_a)[MX_BM * MX_A_ROW],
                                         mx_u8 (*lds_b)[MX_BN * MX_B_ROW], MX_CFRAG_T (&acc)[MX_TM][MX_TN], int m0,
                                         int n0, int wm, int wn) {
    const int ka = mx_kunits(p.k, MX_A_SBITS), kb = mx_kunits(p.k, MX_B_SBITS);
    const int ktiles = (p.k + MX_BK - 1) / MX_BK;
    const int nfull = FAST ? p.k / MX_BK : 0;  // tiles fetched on the fast path
    mx_pipe q;
    if (FAST && nfull > 0)
        mx_fetch<FAST, FAST>(q, p, 0, m0, n0, wm, wn, ka, kb);
    else
        mx_fetch<false, FAST>(q, p, 0, m0, n0, wm, wn, ka, kb);
    mx_commit<FAST>(q, p, lds_a[0], lds_b[0]);
    __syncthreads();
    int kt = 0;
    if constexpr (FAST) {
        for (; kt + 1 < nfull; ++kt) mx_step<true, true>(q, p, lds_a, lds_b, acc, kt, m0, n0, wm, wn, ka, kb);
        if (kt + 1 < ktiles) {  // the K tail
            mx_step<false, true>(q, p, lds_a, lds_b, acc, kt, m0, n0, wm, wn, ka, kb);
            ++kt;
        }
    } else {
        for (; kt + 1 < ktiles; ++kt) mx_step<false, false>(q, p, lds_a, lds_b, acc, kt, m0, n0, wm, wn, ka, kb);
    }
    mx_compute(acc, lds_a[kt & 1], lds_b[kt & 1], wm, wn MX_SCALE_Q);  // the last tile
}

// Chiplet-aware block order.  The dispatcher hands workgroups to the MX_XCDS chiplets (XCDs, each with its
// own L2) round-robin: linear block L runs on XCD L % MX_XCDS.  Renumber so that each XCD gets a contiguous
// run of tiles (row-major over N tiles): neighbours that share A rows / B columns then share one L2.  A
// bijection of [0, G) for any G (the first G % MX_XCDS chiplets take one tile more).
__device__ __forceinline__ int mx_xcd_order(int L, int G) {
    const int per = (G + MX_XCDS - 1) / MX_XCDS;
    const int tall = G % MX_XCDS == 0 ? MX_XCDS : G % MX_XCDS;  // chiplets that take `per` tiles
    const int xcd = L % MX_XCDS, local = L / MX_XCDS;
    return xcd < tall ? xcd * per + local : tall * per + (xcd - tall) * (per - 1) + local;
}

extern "C" __global__ __launch_bounds__(MX_THREADS) void MX_ENTRY(
    const mx_elem* a, const mx_elem* b, float* d, const mx_u8* sa, const mx_u8* sb, long long sam, long long sak,
    long long sbk, long long sbn, long long ldd, long long sab, long long sbb, long long sdb, long long ssa,
    long long ssb, int m, int n, int k, int a_vec_ok, int b_vec_ok, int m_tile0, int batch0, float out_scale,
    int tiles_y) {
    mx_params p;
    const long long z = (long long)blockIdx.z + batch0;
    p.a = a + z * sab;
    p.b = b + z * sbb;
    p.d = d + z * sdb;
    p.sa = sa ? sa + z * ssa : nullptr;
    p.sb = sb ? sb + z * ssb : nullptr;
    p.sam = sam, p.sak = sak, p.sbk = sbk, p.sbn = sbn, p.ldd = ldd;
    p.m = m, p.n = n, p.k = k, p.a_vec_ok = a_vec_ok, p.b_vec_ok = b_vec_ok, p.out_scale = out_scale;
    __shared__ __attribute__((aligned(16))) mx_u8 lds_a[2][MX_BM * MX_A_ROW];
    __shared__ __attribute__((aligned(16))) mx_u8 lds_b[2][MX_BN * MX_B_ROW];

    const int wave = threadIdx.x / 64;
    const int lane = threadIdx.x % 64;
    const int wm = (wave / MX_WAVES_N) * MX_TM * MX_IM;  // wave's row offset inside the block tile
    const int wn = (wave % MX_WAVES_N) * MX_TN * MX_IN;
    const int tiles_x = (n + MX_BN - 1) / MX_BN;  // grid X (tiles_y: grid Y of this launch piece)
    const int tile = mx_xcd_order((int)blockIdx.y * tiles_x + (int)blockIdx.x, tiles_x * tiles_y);
    const int m0 = (tile / tiles_x + m_tile0) * MX_BM;
    const int n0 = (tile % tiles_x) * MX_BN;

    MX_CFRAG_T acc[MX_TM][MX_TN];
#pragma unroll
    for (int i = 0; i < MX_TM; ++i)
#pragma unroll
        for (int j = 0; j < MX_TN; ++j)
#pragma unroll
            for (int s = 0; s < MX_C_SLOTS; ++s) acc[i][j][s] = 0.0f;

#if MX_FAST_ONLY
    mx_block<true>(p, lds_a, lds_b, acc, m0, n0, wm, wn);
#else
    const bool fast = p.a_vec_ok && p.b_vec_ok && p.sak == 1 && p.sbk == 1 && m0 + MX_BM <= p.m &&
                      n0 + MX_BN <= p.n;
    if (fast)
        mx_block<true>(p, lds_a, lds_b, acc, m0, n0, wm, wn);
    else
        mx_block<false>(p, lds_a, lds_b, acc, m0, n0, wm, wn);
#endif

    // D: lane l, slot s -> row MX_C_RLANE * (l / IN) + (s / MX_C_GROUP) * MX_C_GSTRIDE + s % MX_C_GROUP, col l % IN
#pragma unroll
    for (int i = 0; i < MX_TM; ++i)
#pragma unroll
        for (int j = 0; j < MX_TN; ++j)
#pragma unroll
            for (int s = 0; s < MX_C_SLOTS; ++s) {
                const int r = m0 + wm + i * MX_IM + MX_C_RLANE * (lane / MX_IN) + (s / MX_C_GROUP) * MX_C_GSTRIDE +
                              s % MX_C_GROUP;
                const int c = n0 + wn + j * MX_IN + lane % MX_IN;
                if (r < p.m && c < p.n) p.d[(long long)r * p.ldd + c] = acc[i][j][s] * p.out_scale;
            }
}
