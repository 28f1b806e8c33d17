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
//   global -> registers (16-byte vector loads where the operand is contiguous, aligned and in range;
//   element loads with zero fill at the edges) -> LDS (K-contiguous rows, two buffers) -> fragments.
//   A is read with strides (sam, sak), B with (sbk, sbn): either major works (one of them must be 1).
//   Elements are stored as MX_EB-byte units (fp4/fp6 codes: one code per byte) and packed into the
//   instruction's registers at MX_*_BITS per slot, slot s at bits [s*BITS, (s+1)*BITS).
//   Block scales (MX formats): E8M0 bytes, A scales [M, KB] row-major, B scales [KB, N] row-major,
//   KB = ceil(K / 32); a missing block reads 127 (2^0) so zero-filled tails stay zero.
//   Batches: blockIdx.z (+ batch0) selects batch b; A, B, D and the scale arrays advance by their batch
//   strides (0 broadcasts one operand over the batch).  Grid Y covers M tiles from m_tile0 on: the host
//   splits tall problems into several launches when M / BM exceeds the device's grid-Y limit.

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
#define MX_THREADS (64 * MX_WAVES_M * MX_WAVES_N)
#define MX_A_REGS ((int)(sizeof(MX_AFRAG_T) / 4))  // registers of the builtin's operand types
#define MX_B_REGS ((int)(sizeof(MX_BFRAG_T) / 4))
#define MX_BM (MX_WAVES_M * MX_TM * MX_IM)
#define MX_BN (MX_WAVES_N * MX_TN * MX_IN)
#define MX_VEC (16 / MX_EB)                    // elements per 16-byte global load
#define MX_ROW_BYTES (MX_BK * MX_EB + MX_LDS_PAD)  // LDS row pitch (a multiple of 16)
#define MX_A_WORDS ((MX_A_SLOTS * MX_A_BITS + 31) / 32)
#define MX_B_WORDS ((MX_B_SLOTS * MX_B_BITS + 31) / 32)
#define MX_A_VECS (MX_BM * MX_BK / MX_VEC / MX_THREADS)  // 16-byte vectors per thread per stage
#define MX_B_VECS (MX_BN * MX_BK / MX_VEC / MX_THREADS)

static_assert(MX_ROW_BYTES % 16 == 0, "LDS row pitch must keep 16-byte alignment");
static_assert(MX_BK % MX_IK == 0, "BK must be a multiple of the instruction's K");
static_assert(MX_BM % MX_VEC == 0 && MX_BN % MX_VEC == 0 && MX_BK % MX_VEC == 0, "tile vs vector width");
static_assert(MX_A_VECS * MX_VEC * MX_THREADS == MX_BM * MX_BK, "A tile must split evenly over threads");
static_assert(MX_B_VECS * MX_VEC * MX_THREADS == MX_BN * MX_BK, "B tile must split evenly over threads");
static_assert(MX_A_WORDS <= MX_A_REGS && MX_B_WORDS <= MX_B_REGS, "fragment larger than the operand registers");
#if MX_SCALED
static_assert(MX_BK % 32 == 0, "MX tiles must hold whole 32-element scale blocks");
#endif

// ---- global -> staging registers -----------------------------------------------------------
// A stage holds MX_*_VECS 16-byte vectors per thread.  Vector v of the tile covers, in the
// K-contiguous case, row (v / (BK/VEC)) and k columns [(v % (BK/VEC)) * VEC, +VEC); in the
// MN-contiguous case, k row (v / (R/VEC)) and rows [(v % (R/VEC)) * VEC, +VEC).
template <int R, int NV>
__device__ __forceinline__ void mx_load_tile(mx_u32x4 (&stage)[NV], const mx_elem* __restrict__ p, long long s_r,
                                             long long s_k, int r0, int k0, int rows, int kdim, int vec_ok) {
    const int tid = threadIdx.x;
    const bool k_major = (s_k == 1);
#pragma unroll
    for (int i = 0; i < NV; ++i) {
        const int v = tid + i * MX_THREADS;
        int r, kk;
        if (k_major) {
            r = v / (MX_BK / MX_VEC);
            kk = (v % (MX_BK / MX_VEC)) * MX_VEC;
        } else {
            kk = v / (R / MX_VEC);
            r = (v % (R / MX_VEC)) * MX_VEC;
        }
        const int gr = r0 + r, gk = k0 + kk;
        const bool full = k_major ? (gr < rows && gk + MX_VEC <= kdim) : (gk < kdim && gr + MX_VEC <= rows);
        const mx_elem* src = p + gr * s_r + gk * s_k;
        if (vec_ok && full) {
            stage[i] = *reinterpret_cast<const mx_u32x4*>(src);
        } else {  // edge of the matrix or unaligned: element loads along the vector, zero fill
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

// staging registers -> LDS tile [R][BK] (K-contiguous rows of MX_ROW_BYTES)
template <int R, int NV>
__device__ __forceinline__ void mx_store_tile(mx_u8* lds, const mx_u32x4 (&stage)[NV], bool k_major) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
        const int v = tid + i * MX_THREADS;
        if (k_major) {
            const int r = v / (MX_BK / MX_VEC), kk = (v % (MX_BK / MX_VEC)) * MX_VEC;
            *reinterpret_cast<mx_u32x4*>(lds + r * MX_ROW_BYTES + kk * MX_EB) = stage[i];
        } else {
            const int kk = v / (R / MX_VEC), r = (v % (R / MX_VEC)) * MX_VEC;
            mx_elem e[MX_VEC];
            __builtin_memcpy(e, &stage[i], 16);
#pragma unroll
            for (int j = 0; j < MX_VEC; ++j)
                *reinterpret_cast<mx_elem*>(lds + (r + j) * MX_ROW_BYTES + kk * MX_EB) = e[j];
        }
    }
}

// ---- LDS -> instruction fragment -----------------------------------------------------------
// Lane l holds, for slot s: row (l % FR) of the tile and k = KLANE * (l / FR) + (s / CHUNK) * CSTRIDE
// + s % CHUNK.  Each chunk of CHUNK slots is contiguous in the LDS row and read in one piece.
template <int FR, int KLANE, int CHUNK, int CSTRIDE, int SLOTS, int BITS, int WORDS>
__device__ __forceinline__ void mx_load_frag(mx_u32 (&w)[WORDS], const mx_u8* lds, int row0, int kk0) {
    const int lane = threadIdx.x % 64;
    const mx_u8* base = lds + (row0 + lane % FR) * MX_ROW_BYTES + (kk0 + KLANE * (lane / FR)) * MX_EB;
    mx_elem e[SLOTS];
#pragma unroll
    for (int c = 0; c < SLOTS / CHUNK; ++c) {
        const mx_u8* src = base + c * CSTRIDE * MX_EB;
        constexpr int bytes = CHUNK * MX_EB;
        if constexpr (bytes % 16 == 0) {
#pragma unroll
            for (int q = 0; q < bytes / 16; ++q) {
                mx_u32x4 t = *reinterpret_cast<const mx_u32x4*>(src + 16 * q);
                __builtin_memcpy(&e[c * CHUNK + q * (16 / MX_EB)], &t, 16);
            }
        } else if constexpr (bytes == 8) {
            mx_u32x2 t = *reinterpret_cast<const mx_u32x2*>(src);
            __builtin_memcpy(&e[c * CHUNK], &t, 8);
        } else if constexpr (bytes == 4) {
            mx_u32 t = *reinterpret_cast<const mx_u32*>(src);
            __builtin_memcpy(&e[c * CHUNK], &t, 4);
        } else {
#pragma unroll
            for (int j = 0; j < CHUNK; ++j) e[c * CHUNK + j] = reinterpret_cast<const mx_elem*>(src)[j];
        }
    }
    if constexpr (BITS == 8 * MX_EB) {
        __builtin_memcpy(w, e, WORDS * 4);
    } else {  // sub-byte codes (fp4, fp6): pack slot s at bits [s*BITS, (s+1)*BITS)
#pragma unroll
        for (int i = 0; i < WORDS; ++i) w[i] = 0;
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
            const mx_u32 code = (mx_u32)e[s] & ((1u << BITS) - 1u);
            const int bit = s * BITS;
            w[bit / 32] |= code << (bit % 32);
            if ((bit % 32) + BITS > 32) w[bit / 32 + 1] |= code >> (32 - bit % 32);
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

// per-lane E8M0 scale for the instruction tile: lane l reads row (l % SFR), K block (l / SFR)
__device__ __forceinline__ int mx_scale_byte(const mx_u8* s, long long s_r, long long s_b, int r, int blk, int rows,
                                             int blocks) {
    return (s != nullptr && r < rows && blk < blocks) ? (int)s[r * s_r + blk * s_b] : 127;
}

// Flat kernel arguments (hip-python packs a tuple of ctypes values at their C alignment; the host side is
// backends/hip/launch.py kernel_args).  Strides are in elements (scales: in bytes).
//   A element (m, k) of batch z at a[z * sab + m * sam + k * sak]; B (k, n) at b[z * sbb + k * sbk + n * sbn];
//   D (m, n) at d[z * sdb + m * ldd + n]; block scales at sa + z * ssa, sb + z * ssb.
extern "C" __global__ __launch_bounds__(MX_THREADS) void MX_ENTRY(
    const mx_elem* a, const mx_elem* b, float* d, const mx_u8* sa, const mx_u8* sb, long long sam, long long sak,
    long long sbk, long long sbn, long long ldd, long long sab, long long sbb, long long sdb, long long ssa,
    long long ssb, int m, int n, int k, int a_vec_ok, int b_vec_ok, int m_tile0, int batch0, float out_scale) {
    struct {
        const mx_elem* a;
        const mx_elem* b;
        float* d;
        const mx_u8* sa;  // block scales (MX only; may be null otherwise)
        const mx_u8* sb;
        long long sam, sak, sbk, sbn, ldd;
        int m, n, k, a_vec_ok, b_vec_ok;
        float out_scale;
    } p;
    const long long z = (long long)blockIdx.z + batch0;
    p.a = a + z * sab;
    p.b = b + z * sbb;
    p.d = d + z * sdb;
    p.sa = sa ? sa + z * ssa : nullptr;
    p.sb = sb ? sb + z * ssb : nullptr;
    p.sam = sam, p.sak = sak, p.sbk = sbk, p.sbn = sbn, p.ldd = ldd;
    p.m = m, p.n = n, p.k = k, p.a_vec_ok = a_vec_ok, p.b_vec_ok = b_vec_ok, p.out_scale = out_scale;
    __shared__ __attribute__((aligned(16))) mx_u8 lds_a[2][MX_BM * MX_ROW_BYTES];
    __shared__ __attribute__((aligned(16))) mx_u8 lds_b[2][MX_BN * MX_ROW_BYTES];

    const int wave = threadIdx.x / 64;
    const int lane = threadIdx.x % 64;
    const int wm = (wave / MX_WAVES_N) * MX_TM * MX_IM;  // wave's row offset inside the block tile
    const int wn = (wave % MX_WAVES_N) * MX_TN * MX_IN;
    const int m0 = ((int)blockIdx.y + m_tile0) * MX_BM;
    const int n0 = blockIdx.x * MX_BN;
    const bool a_kmaj = (p.sak == 1);
    const bool b_kmaj = (p.sbk == 1);

    MX_CFRAG_T acc[MX_TM][MX_TN];
#pragma unroll
    for (int i = 0; i < MX_TM; ++i)
#pragma unroll
        for (int j = 0; j < MX_TN; ++j)
#pragma unroll
            for (int s = 0; s < MX_C_SLOTS; ++s) acc[i][j][s] = 0.0f;

    mx_u32x4 sta[MX_A_VECS], stb[MX_B_VECS];
    const int ktiles = (p.k + MX_BK - 1) / MX_BK;
#if MX_SCALED
    const int kblocks = (p.k + 31) / 32;
#endif

    mx_load_tile<MX_BM, MX_A_VECS>(sta, p.a, p.sam, p.sak, m0, 0, p.m, p.k, p.a_vec_ok);
    mx_load_tile<MX_BN, MX_B_VECS>(stb, p.b, p.sbn, p.sbk, n0, 0, p.n, p.k, p.b_vec_ok);
    mx_store_tile<MX_BM, MX_A_VECS>(lds_a[0], sta, a_kmaj);
    mx_store_tile<MX_BN, MX_B_VECS>(lds_b[0], stb, b_kmaj);
    __syncthreads();

    for (int kt = 0; kt < ktiles; ++kt) {
        const int cur = kt & 1;
        const bool more = kt + 1 < ktiles;
        if (more) {  // next tile's global loads are in flight while this tile computes
            mx_load_tile<MX_BM, MX_A_VECS>(sta, p.a, p.sam, p.sak, m0, (kt + 1) * MX_BK, p.m, p.k, p.a_vec_ok);
            mx_load_tile<MX_BN, MX_B_VECS>(stb, p.b, p.sbn, p.sbk, n0, (kt + 1) * MX_BK, p.n, p.k, p.b_vec_ok);
        }
#pragma unroll
        for (int ks = 0; ks < MX_BK; ks += MX_IK) {
            mx_u32 fa[MX_TM][MX_A_WORDS], fb[MX_TN][MX_B_WORDS];
#pragma unroll
            for (int i = 0; i < MX_TM; ++i)
                mx_load_frag<MX_IM, MX_A_KLANE, MX_A_CHUNK, MX_A_CSTRIDE, MX_A_SLOTS, MX_A_BITS, MX_A_WORDS>(
                    fa[i], lds_a[cur], wm + i * MX_IM, ks);
#pragma unroll
            for (int j = 0; j < MX_TN; ++j)
                mx_load_frag<MX_IN, MX_B_KLANE, MX_B_CHUNK, MX_B_CSTRIDE, MX_B_SLOTS, MX_B_BITS, MX_B_WORDS>(
                    fb[j], lds_b[cur], wn + j * MX_IN, ks);
#if MX_SCALED
            const int kb0 = (kt * MX_BK + ks) / 32;
            int sca[MX_TM], scb[MX_TN];
#pragma unroll
            for (int i = 0; i < MX_TM; ++i)
                sca[i] = mx_scale_byte(p.sa, kblocks, 1, m0 + wm + i * MX_IM + lane % MX_SA_FR, kb0 + lane / MX_SA_FR,
                                       p.m, kblocks);
#pragma unroll
            for (int j = 0; j < MX_TN; ++j)
                scb[j] = mx_scale_byte(p.sb, 1, p.n, n0 + wn + j * MX_IN + lane % MX_SB_FR, kb0 + lane / MX_SB_FR,
                                       p.n, kblocks);
#endif
#pragma unroll
            for (int i = 0; i < MX_TM; ++i)
#pragma unroll
                for (int j = 0; j < MX_TN; ++j) {
#if MX_SCALED
                    acc[i][j] = MX_BUILTIN(mx_as<MX_AFRAG_T>(fa[i]), mx_as<MX_BFRAG_T>(fb[j]), acc[i][j], MX_CBSZ,
                                           MX_BLGP, 0, sca[i], 0, scb[j]);
#else
                    acc[i][j] = MX_BUILTIN(mx_as<MX_AFRAG_T>(fa[i]), mx_as<MX_BFRAG_T>(fb[j]), acc[i][j], 0, 0, 0);
#endif
                }
        }
        if (more) {
            mx_store_tile<MX_BM, MX_A_VECS>(lds_a[cur ^ 1], sta, a_kmaj);
            mx_store_tile<MX_BN, MX_B_VECS>(lds_b[cur ^ 1], stb, b_kmaj);
        }
        __syncthreads();
    }

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
