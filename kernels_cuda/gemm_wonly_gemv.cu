// mxcore weight-only GEMM for the smallest M (decode; backends/cuda/wonly/ runs it for M <= GEMV_MAX_M, any M
// runs: grid.y covers M in steps of 8 * WO_MT): C[M,N] = X[M,K] @ W[K,N] with X fp16/bf16 activations and W an MX
// weight, the packed fragment records of wonly_common.cuh read straight into registers.
//
// Same records, decode, block factors and split K as gemm_wonly.cu (the weight is the mma's A operand, X^T the B
// operand, every 32-K block's two mma run into a zeroed accumulator scaled into acc in fp32), but no shared memory
// and no barrier in the loop: each warp owns WG_R n16 tiles of one record group and walks the block's K chunks on
// its own, loading every lane's 16 code bytes and scale word with 16-byte / 4-byte non-coherent loads (L1 not
// allocated) WG_PF chunks ahead of the chunk it decodes, and its activation fragments (lane (g, t): row g, the 8
// consecutive K that WO_KPHYS gives it) with 16-byte loads that stay in L1 (every warp of the block reads them).
// The decode costs 13 operations per 4 registers of bf16 (wo4_place and one multiply); the block factors take a
// slower path only in chunks where some scale byte is 0x00 or 0xFF (a warp vote per chunk).
//
// Under WO_PDL the records of the first WG_PF chunks are requested before the dependent part (wonly_common.cuh:
// wo_dependent_part), the activations after it.
//
// -D: those of wonly_common.cuh, and WG_R (n16 tiles per warp: 1, 2, 4 or 8) WG_WARPS (warps per block; WG_R *
// WG_WARPS a multiple of 8) WG_PF (chunks in flight per warp).

#include "mx_common.cuh"
#include "wonly_common.cuh"

#define WG_THREADS (32 * WG_WARPS)
#define WG_NT (WG_WARPS * WG_R)  // n16 tiles per block

__device__ __forceinline__ uint4 wg_ld_w(const u8* p) {  // streamed once: no L1 allocation
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ u32 wg_ld_s(const u8* p) {
    u32 v;
#if WO_BPC == 2
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
#else
    u16 h;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(h) : "l"(p));
    v = h;
#endif
    return v;
}
struct WgChunk {  // what a warp loads of one K chunk
    uint4 q[WG_R];
    u32 sc[WG_R];
    uint4 x[WO_BPC][WO_MT];
};

// Decode and multiply the chunk in `ch`, loading chunk `next` into it as its parts are used (record r as soon as
// it is decoded, the activations at the end): WG_PF chunks stay in flight with WG_PF chunk buffers of registers.
template <bool SPECIAL, int KIND, typename Load>
__device__ __forceinline__ void wg_chunk(WgChunk& ch, float (&acc)[WG_R][WO_MT][4], int lane, bool more,
                                         const Load& load) {
#pragma unroll
    for (int r = 0; r < WG_R; ++r) {
        const uint4 q = ch.q[r];
        const u32 sc = wo_scale_word(ch.sc[r]);
        if (more) load.record(ch, r);
#pragma unroll
        for (int blk = 0; blk < WO_BPC; ++blk) wo_block<WO_MT, KIND>(acc[r], q, ch.x[blk], sc, blk, SPECIAL, lane);
    }
    if (more) load.acts(ch);
}

struct WgLoad {  // the loads of one chunk of a warp (chunk index set before use)
    const u8* wq;     // the lane's code bytes of the warp's first tile, chunk 0
    const u8* wsc;    // its scale word
    const u16* xr[WO_MT];
    bool xlive[WO_MT];
    int xk, K, chunk;
    __device__ __forceinline__ void record(WgChunk& ch, int r) const {
        constexpr i64 CSTRIDE = (i64)WO_GROUP * WO_REC;  // bytes from one chunk's record of a tile to the next
        ch.q[r] = wg_ld_w(wq + chunk * CSTRIDE + r * WO_REC);
        ch.sc[r] = wg_ld_s(wsc + chunk * CSTRIDE + r * WO_REC);
    }
    __device__ __forceinline__ void acts(WgChunk& ch) const {
#pragma unroll
        for (int blk = 0; blk < WO_BPC; ++blk)
#pragma unroll
            for (int mt = 0; mt < WO_MT; ++mt)
                ch.x[blk][mt] = xlive[mt] ? wo_ld_x(xr[mt], chunk * WO_KC + 32 * blk + xk, K) : make_uint4(0u, 0u, 0u, 0u);
    }
};

// The warp's chunks from c_begin to c_end (the first WG_PF already requested into ring), each decoded as format
// KIND (wonly_common.cuh) while the chunk WG_PF ahead loads into its buffer.
template <int KIND>
__device__ __forceinline__ void wg_loop(WgChunk (&ring)[WG_PF], float (&acc)[WG_R][WO_MT][4], WgLoad& ld, int c_begin,
                                        int c_end, int lane) {
    for (int c = c_begin; c < c_end; c += WG_PF) {
#pragma unroll
        for (int p = 0; p < WG_PF; ++p) {
            if (c + p >= c_end) break;
            ld.chunk = c + p + WG_PF;
            const bool more = ld.chunk < c_end;
            u32 any = 0;
#pragma unroll
            for (int r = 0; r < WG_R; ++r) any |= wo_special(wo_scale_word(ring[p].sc[r]));
            if (__any_sync(0xffffffffu, any != 0))
                wg_chunk<true, KIND>(ring[p], acc, lane, more, ld);
            else
                wg_chunk<false, KIND>(ring[p], acc, lane, more, ld);
        }
    }
}

extern "C" __global__ void __launch_bounds__(WG_THREADS)
mx_wonly_gemv(const u8* __restrict__ W, const u8* __restrict__ X, void* __restrict__ C, float* __restrict__ ws,
              u32* __restrict__ counters, int M, int N, int K, i64 lda, i64 ldc, int out_kind, int nchunks, int per,
              u32 kind) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    const int nt0 = blockIdx.x * WG_NT, wt0 = nt0 + warp * WG_R;  // first n16 tile of the block, of the warp
    const int m0 = blockIdx.y * (WO_MT * 8);
    const int c_begin = blockIdx.z * per, c_end = min(nchunks, c_begin + per);
    const int groups = (N + 16 * WO_GROUP - 1) / (16 * WO_GROUP);
    const bool live = wt0 < groups * WO_GROUP;  // warp-uniform: the warp's tiles have records

    // this lane's records of chunk 0: tile group wt0 / 8, tile wt0 % 8 (the warp's WG_R tiles are consecutive);
    // its activation rows (rows past M read nothing: zeros) and K offset in a block (WO_KPHYS)
    WgLoad ld;
    const i64 rec0 = ((i64)(wt0 / WO_GROUP) * nchunks * WO_GROUP + wt0 % WO_GROUP) * WO_REC;
    ld.wq = W + rec0 + lane * 16;
    ld.wsc = W + rec0 + 512 + g * 2 * WO_BPC;
#pragma unroll
    for (int mt = 0; mt < WO_MT; ++mt) {
        const int m = m0 + mt * 8 + WO_B_N(lane);
        ld.xlive[mt] = m < M;
        ld.xr[mt] = reinterpret_cast<const u16*>(X) + (i64)min(m, M - 1) * lda;
    }
    ld.xk = WO_KPHYS(0, 0, WO_B_K(lane, 0, 0));
    ld.K = K;

    float acc[WG_R][WO_MT][4] = {};
    WgChunk ring[WG_PF];
    if (live) {  // the first WG_PF chunks' records: weights only, before the dependent part
#pragma unroll
        for (int p = 0; p < WG_PF; ++p)
            if (c_begin + p < c_end) {
                ld.chunk = c_begin + p;
#pragma unroll
                for (int r = 0; r < WG_R; ++r) ld.record(ring[p], r);
            }
    }
    wo_dependent_part();
    if (live) {
#pragma unroll
        for (int p = 0; p < WG_PF; ++p)
            if (c_begin + p < c_end) {
                ld.chunk = c_begin + p;
                ld.acts(ring[p]);
            }
#define WG_LOOP(K) wg_loop<K>(ring, acc, ld, c_begin, c_end, lane)
        WO_BY_KIND(kind, WG_LOOP)
#undef WG_LOOP
    }

    wo_epilogue<WG_R>(acc, C, ws, counters, M, N, ldc, out_kind, m0, wt0, WG_NT, lane);
}
