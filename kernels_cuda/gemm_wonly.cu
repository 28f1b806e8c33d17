// mxcore weight-only GEMM (mma.sync family): C[M,N] = X[M,K] @ W[K,N] with X fp16/bf16 activations and W an MX
// weight (E8M0 scale per 32 K), streamed from packed fragment records through a cp.async ring and decoded in
// registers.  Small M is the design point (the smallest M runs gemm_wonly_gemv.cu); any M runs (grid.y covers M
// in steps of 8 * WO_MT).
//
// The weight is the mma's A operand (swapped: W^T is M-like, N rows), X^T the B operand, so the decode work is
// per weight element whatever M is, and M costs ceil(M / 8) mma per 16x16 weight fragment.
//
// The packed weight, the decode and the block factors: wonly_common.cuh.
//
// Split K: block z takes chunks [z * per, min(nchunks, (z + 1) * per)); with gridDim.z > 1 every block writes its
// fp32 partial tile to ws[z], and the last block of a tile to arrive (a counter per tile, reset afterwards) sums
// the partials in z order (deterministic) and writes C.  out_kind: 0 fp32, 1 f16, 2 bf16; ldc in elements.
//
// -D: those of wonly_common.cuh, and WO_R (n16 tiles per warp; WO_R * WO_WARPS = 8, the packed tile group) WO_WARPS
// WO_STAGES.

#include "mx_common.cuh"
#include "cp_async.cuh"
#define WO_FIN 0  // the split-K finish a column and a partial at a time (wonly_common.cuh): this kernel is short of
                  // registers (sm_80, f16 x e2m1, m16: the batched finish spills)
#include "wonly_common.cuh"

#define WO_XS (WO_KC == 64 ? 192 : 64)  // activation row pitch in shared memory (bytes): 16-byte reads conflict-free
#define WO_THREADS (32 * WO_WARPS)
#define WO_NT (WO_WARPS * WO_R)       // n16 tiles per block
#define WO_STAGE_BYTES (WO_NT * WO_REC + WO_MT * 8 * WO_XS)

// The warp's tiles times one chunk of activations in shared memory (xs), block by block: lane (g, t) holds X^T k =
// 32 blk + 8 t .. + 8 of row g (the packed K order, WO_KPHYS, makes them contiguous): word 2 s2 + j is register j of
// k16 step s2.  KIND: the weight's format (wonly_common.cuh).
template <int KIND>
__device__ __forceinline__ void wo_ring_chunk(float (&acc)[WO_R][WO_MT][4], const uint4 (&q)[WO_R],
                                              const u32 (&sc)[WO_R], const u8* xs, bool special, int lane) {
#pragma unroll
    for (int blk = 0; blk < WO_BPC; ++blk) {
        uint4 xv[WO_MT];
#pragma unroll
        for (int mt = 0; mt < WO_MT; ++mt)
            xv[mt] = *reinterpret_cast<const uint4*>(xs + (mt * 8 + WO_B_N(lane)) * WO_XS +
                                                     WO_KPHYS(blk, 0, WO_B_K(lane, 0, 0)) * 2);
#pragma unroll
        for (int r = 0; r < WO_R; ++r) wo_block<WO_MT, KIND>(acc[r], q[r], xv, sc[r], blk, special, lane);
    }
}

extern "C" __global__ void __launch_bounds__(WO_THREADS)
mx_wonly_gemm(const u8* __restrict__ W, const u8* __restrict__ X, void* __restrict__ C, float* __restrict__ ws,
              u32* __restrict__ counters, int M, int N, int K, i64 lda, i64 ldc, int out_kind, int nchunks, int per,
              u32 kind) {
    extern __shared__ __align__(16) u8 smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int nt0 = blockIdx.x * WO_NT;  // first n16 tile of the block
    const int m0 = blockIdx.y * (WO_MT * 8);
    const int c_begin = blockIdx.z * per, c_end = min(nchunks, c_begin + per);
    const u32 sbase = (u32)__cvta_generic_to_shared(smem);

    // this thread's activation copies (row, 16-byte unit): fixed for the whole loop; rows past M are zeroed once
    constexpr int XU = WO_KC / 8, XUNITS = WO_MT * 8 * XU, XPER = (XUNITS + WO_THREADS - 1) / WO_THREADS;
    const u8* xsrc[XPER];
    u32 xdst[XPER];
    int xk[XPER];
#pragma unroll
    for (int i = 0; i < XPER; ++i) {
        const int q = tid + i * WO_THREADS, row = q / XU, u = q % XU;
        const bool live = q < XUNITS && m0 + row < M;
        xsrc[i] = live ? X + ((i64)(m0 + row) * lda + u * 8) * 2 : nullptr;
        xdst[i] = WO_NT * WO_REC + row * WO_XS + u * 16;
        xk[i] = u * 8;
        if (q < XUNITS && !live)
            for (int st = 0; st < WO_STAGES; ++st)
                *reinterpret_cast<uint4*>(smem + st * WO_STAGE_BYTES + xdst[i]) = make_uint4(0u, 0u, 0u, 0u);
    }
    const u8* wsrc = W + (i64)blockIdx.x * nchunks * (WO_NT * WO_REC);  // this block's tile group
    constexpr int WUNITS = WO_NT * WO_REC / 16, WPER = (WUNITS + WO_THREADS - 1) / WO_THREADS;

    auto load = [&](int slot, int chunk) {
        const u32 st = sbase + slot * WO_STAGE_BYTES;
        const u8* src = wsrc + (i64)chunk * (WO_NT * WO_REC);
#pragma unroll
        for (int i = 0; i < WPER; ++i) {
            const int u = tid + i * WO_THREADS;
            if (WUNITS % WO_THREADS == 0 || u < WUNITS) cp_async16_full(st + u * 16, src + u * 16);
        }
#pragma unroll
        for (int i = 0; i < XPER; ++i) {
            if (!xsrc[i]) continue;
            const int k = chunk * WO_KC + xk[i];
            const int bytes = min(16, max(0, (K - k) * 2));
            cp_async16(st + xdst[i], bytes ? xsrc[i] + (i64)chunk * (WO_KC * 2) : X, bytes);
        }
    };

    float acc[WO_R][WO_MT][4] = {};

#pragma unroll
    for (int s = 0; s < WO_STAGES - 1; ++s) {
        if (c_begin + s < c_end) load(s, c_begin + s);
        cp_async_commit();
    }
    const int g = lane >> 2;
    for (int c = c_begin; c < c_end; ++c) {
        cp_async_wait<WO_STAGES - 2>();
        __syncthreads();
        const int nxt = c + WO_STAGES - 1;
        if (nxt < c_end) load((nxt - c_begin) % WO_STAGES, nxt);
        cp_async_commit();

        const u8* st = smem + ((c - c_begin) % WO_STAGES) * WO_STAGE_BYTES;
        const u8* xs = st + WO_NT * WO_REC;
        uint4 q[WO_R];
        u32 sc[WO_R];
#pragma unroll
        for (int r = 0; r < WO_R; ++r) {
            const u8* rec = st + (warp * WO_R + r) * WO_REC;
            q[r] = *reinterpret_cast<const uint4*>(rec + lane * 16);
            sc[r] = WO_BPC == 2 ? *reinterpret_cast<const u32*>(rec + 512 + g * 4)
                                : *reinterpret_cast<const u16*>(rec + 512 + g * 2);
        }
        u32 any = 0;
#pragma unroll
        for (int r = 0; r < WO_R; ++r) any |= wo_special(wo_scale_word(sc[r]));
        const bool special = __any_sync(0xffffffffu, any != 0);
#define WO_CHUNK(K) wo_ring_chunk<K>(acc, q, sc, xs, special, lane)
        WO_BY_KIND(kind, WO_CHUNK)
#undef WO_CHUNK
    }
    cp_async_wait<0>();

    wo_epilogue<WO_R>(acc, C, ws, counters, M, N, ldc, out_kind, m0, nt0 + warp * WO_R, WO_NT, lane);
}
