// mxcore weight-only GEMM for small M on sm_90, warp-specialized (backends/cuda/wonly.py): C[M,N] = X[M,K] @ W[K,N]
// with X fp16/bf16 activations and W an MX weight, the packed fragment records of wonly_common.cuh.  Any M runs
// (grid.y covers M in steps of 8 * WO_MT).
//
// Same records, decode, block factors, split K and epilogue as gemm_wonly_gemv.cu, but the memory stream is
// decoupled from the decode: a block owns one record group (8 n16 tiles) and a range of K chunks, whose records
// are contiguous in memory.  Its last warp is the producer: one thread streams WT_CPS chunks at a time (WT_CPS * 8
// records) with one bulk copy (cp.async.bulk ... mbarrier::complete_tx::bytes) into a WT_STAGES-deep shared-memory
// ring, each stage with a "full" mbarrier (the producer's arrive.expect_tx, completed by the copy's byte count) and
// an "empty" one (one arrive per consumer warp once it has read the stage into registers).  The WT_WARPS consumer
// warps own WT_R tiles each: a lane reads its 16 code bytes and scale word per tile and chunk from the stage (one
// 16-byte and one 4-byte shared load; the record layout makes them conflict-free), its activation fragments from
// global memory (16-byte loads kept in L1, one chunk ahead), and decodes and multiplies with all of its issue
// slots; the copy engine keeps WT_STAGES * WT_CPS chunks per block in flight whatever the consumers do.
//
// Under WO_PDL the producer fills the whole ring before the dependent part
// (wonly_common.cuh: wo_dependent_part); the consumers read activations only after it.
//
// -D: those of wonly_common.cuh, and WT_R (n16 tiles per consumer warp) WT_WARPS (consumer warps; WT_R * WT_WARPS =
// 8, the record group) WT_STAGES (ring stages) WT_CPS (K chunks per stage).

#include "mx_common.cuh"
#include "async_sm90.cuh"
#include "wonly_common.cuh"

#define WT_THREADS (32 * (WT_WARPS + 1))
#define WT_GROUP_BYTES (WO_GROUP * WO_REC)     // one chunk of a record group
#define WT_STAGE_BYTES (WT_CPS * WT_GROUP_BYTES)
static_assert(WT_R * WT_WARPS == WO_GROUP, "a block owns one record group");

// a lane's activation fragments of chunk c (xk: the lane's offset in a block); chunks inside K skip the tail test
__device__ __forceinline__ void wt_acts(uint4 (&x)[WO_BPC][WO_MT], const u16* const (&xr)[WO_MT],
                                        const bool (&xlive)[WO_MT], int c, int xk, int K) {
    const int k = c * WO_KC + xk;
    const bool inside = (c + 1) * WO_KC <= K;
#pragma unroll
    for (int blk = 0; blk < WO_BPC; ++blk)
#pragma unroll
        for (int mt = 0; mt < WO_MT; ++mt)
            x[blk][mt] = !xlive[mt] ? make_uint4(0u, 0u, 0u, 0u)
                         : inside   ? wo_ld_x(xr[mt], k + 32 * blk, 1 << 30)
                                    : wo_ld_x(xr[mt], k + 32 * blk, K);
}

// a consumer warp's chunk: its WT_R tiles' blocks (SPECIAL, warp-uniform: some scale byte is 0x00 or 0xFF)
template <bool SPECIAL>
__device__ __forceinline__ void wt_chunk(float (&acc)[WT_R][WO_MT][4], const uint4 (&q)[WT_R],
                                         const uint4 (&x)[WO_BPC][WO_MT], const u32 (&sc)[WT_R], int lane) {
#pragma unroll
    for (int r = 0; r < WT_R; ++r)
#pragma unroll
        for (int blk = 0; blk < WO_BPC; ++blk) wo_block<WO_MT>(acc[r], q[r], x[blk], sc[r], blk, SPECIAL, lane);
}

extern "C" __global__ void __launch_bounds__(WT_THREADS, 1)
mx_wonly_tma(const u8* __restrict__ W, const u8* __restrict__ X, void* __restrict__ C, float* __restrict__ ws,
             u32* __restrict__ counters, int M, int N, int K, i64 lda, i64 ldc, int out_kind, int nchunks, int per) {
    extern __shared__ __align__(128) u8 smem[];
    __shared__ __align__(8) u64 bars[2 * WT_STAGES];  // full[s], then empty[s]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int m0 = blockIdx.y * (WO_MT * 8);
    const int c_begin = blockIdx.z * per, c_end = min(nchunks, c_begin + per);
    const int stages = (c_end - c_begin + WT_CPS - 1) / WT_CPS;  // ring stages this block streams
    const u32 ring = smem_u32(smem), full0 = smem_u32(bars), empty0 = full0 + 8 * WT_STAGES;
    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < WT_STAGES; ++s) {
            mbarrier_init(full0 + 8 * s, 1);
            mbarrier_init(empty0 + 8 * s, WT_WARPS);
        }
        fence_mbarrier_init();
    }
    __syncthreads();

    float acc[WT_R][WO_MT][4] = {};
    const int tile0 = blockIdx.x * WO_GROUP + warp * WT_R;  // the consumer warp's first n16 tile
    if (warp == WT_WARPS) {  // producer
        if (lane == 0) {
            const u8* src = W + ((i64)blockIdx.x * nchunks + c_begin) * WT_GROUP_BYTES;
            const u32 total = (u32)(c_end - c_begin) * WT_GROUP_BYTES;
            for (int st = 0; st < stages; ++st) {
                const int s = st % WT_STAGES;
                if (st >= WT_STAGES) mbarrier_wait(empty0 + 8 * s, ((st / WT_STAGES) - 1) & 1);
                const u32 off = (u32)st * WT_STAGE_BYTES, bytes = min((u32)WT_STAGE_BYTES, total - off);
                mbarrier_arrive_expect_tx(full0 + 8 * s, bytes);
                cp_async_bulk_g2s(ring + s * WT_STAGE_BYTES, src + off, bytes, full0 + 8 * s);
            }
        }
        __syncwarp();
        wo_dependent_part();
    } else {  // consumers
        wo_dependent_part();
        const u16* xr[WO_MT];
        bool xlive[WO_MT];
#pragma unroll
        for (int mt = 0; mt < WO_MT; ++mt) {
            const int m = m0 + mt * 8 + WO_B_N(lane);
            xlive[mt] = m < M;
            xr[mt] = reinterpret_cast<const u16*>(X) + (i64)min(m, M - 1) * lda;
        }
        const int xk = WO_KPHYS(0, 0, WO_B_K(lane, 0, 0));
        uint4 x[WO_BPC][WO_MT];
        if (c_begin < c_end) wt_acts(x, xr, xlive, c_begin, xk, K);
        const int g = lane >> 2;
        for (int st = 0; st < stages; ++st) {
            const int s = st % WT_STAGES;
            mbarrier_wait(full0 + 8 * s, (st / WT_STAGES) & 1);
            const u8* stage = smem + s * WT_STAGE_BYTES;
#pragma unroll
            for (int cc = 0; cc < WT_CPS; ++cc) {
                const int c = c_begin + st * WT_CPS + cc;
                if (c >= c_end) break;
                uint4 q[WT_R];
                u32 sc[WT_R], any = 0;
#pragma unroll
                for (int r = 0; r < WT_R; ++r) {
                    const u8* rec = stage + (cc * WO_GROUP + warp * WT_R + r) * WO_REC;
                    q[r] = *reinterpret_cast<const uint4*>(rec + lane * 16);
#if WO_BPC == 2
                    sc[r] = *reinterpret_cast<const u32*>(rec + 512 + g * 4);
#else
                    sc[r] = wo_scale_word(*reinterpret_cast<const u16*>(rec + 512 + g * 2));
#endif
                    any |= wo_special(sc[r]);
                }
                uint4 xn[WO_BPC][WO_MT];  // the next chunk's activations, in flight during this one's decode
                if (c + 1 < c_end) wt_acts(xn, xr, xlive, c + 1, xk, K);
                if (__any_sync(0xffffffffu, any != 0))
                    wt_chunk<true>(acc, q, x, sc, lane);
                else
                    wt_chunk<false>(acc, q, x, sc, lane);
#pragma unroll
                for (int blk = 0; blk < WO_BPC; ++blk)
#pragma unroll
                    for (int mt = 0; mt < WO_MT; ++mt) x[blk][mt] = xn[blk][mt];
            }
            __syncwarp();
            if (lane == 0) mbarrier_arrive(empty0 + 8 * s);
        }
    }

    wo_epilogue<WT_R>(acc, C, ws, counters, M, N, ldc, out_kind, m0, tile0, WO_GROUP, lane, warp < WT_WARPS);
}
