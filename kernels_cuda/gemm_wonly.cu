// mxcore weight-only GEMM (mma.sync family): C[M,N] = X[M,K] @ W[K,N] with X fp16/bf16 activations and W an MX
// weight (E8M0 scale per 32 K), streamed from packed fragment records and decoded in registers.  Small M (decode)
// is the design point; any M runs (grid.y covers M in steps of 8 * WO_MT).
//
// The weight is the mma's A operand (swapped: W^T is M-like, N rows), X^T the B operand, so the decode work is
// per weight element whatever M is, and M costs ceil(M / 8) mma per 16x16 weight fragment.
//
// Packed weight (wonly_pack.cu writes it once per weight; backends/cuda/wonly.py caches it on the MXTensor):
// records [n16 tile group of WO_NT][K chunk][tile in the group], REC bytes each (a block's stage is one contiguous
// run of WO_NT records), chunk = WO_KC K (64 for 4-bit codes, 32 for byte codes).
//   bytes [0, 512): lane L's 16 bytes at 16 L, its A-fragment codes for the chunk's k16 steps:
//     4-bit: u32 word s = step s; register j's two codes (k even, k odd) at bits 4j..4j+3 and 16+4j..16+4j+3
//     bytes: u32 words 2s, 2s+1 = step s; register j: word 2s + (j >> 1), byte (j & 1) (k even) and 2 + (j & 1)
//   bytes [512, REC): E8M0 scales, 2 * WO_BPC per fragment row g: byte g*2*BPC + 2*blk + h = scale of W^T row
//     g + 8h, K block blk of the chunk (pad rows / blocks: 127)
//   (row, k) of lane L's register j, half p: WO_A_ROW(L, j), WO_A_K(L, j, p) (backends/cuda/wonly.py emits the
//   formulas; tests/test_cuda_wonly_index.py checks them against mxcore.layouts)
// Decode: a code pair in "spread" form (even k in bits 0..7, odd k in 16..23) goes to two 16-bit values of the
// activation type by bit placement (magnitude under the target exponent, sign to bit 15) and one exact multiply by
// 2^(target bias - element bias); exact for every e2m1 / e2m3 / e3m2 / e4m3 / e5m2 value (all lie in f16's and
// bf16's range); e4m3's NaN code and e5m2's inf/NaN codes are set explicitly.  Block scales are applied in fp32:
// every 32-K block's two mma run into a zeroed accumulator t, then acc = fma(t, 2^(scale - 127), acc) (exact
// factor: code 0 is the subnormal 2^-127, 0xFF NaN).  CuPy compiles with -ftz=true, so every fp32 operation that
// may meet a subnormal is explicit PTX without .ftz (wo_fma, wo_add): subnormals are kept, as the reference keeps them.
//
// Split K: block z takes chunks [z * per, min(nchunks, (z + 1) * per)); with gridDim.z > 1 every block writes its
// fp32 partial tile to ws[z], and the last block of a tile to arrive (a counter per tile, reset afterwards) sums
// the partials in z order (deterministic) and writes C.  out_kind: 0 fp32, 1 f16, 2 bf16; ldc in elements.
//
// -D: WO_EBITS WO_MBITS WO_SPECIAL (0 none, 1 e4m3fn NaN, 2 e5m2 inf/NaN) WO_PACK4 (4-bit codes) WO_BF16 (activation
// type bf16, else f16) WO_MUL (the 16-bit x2 bits of 2^(target bias - element bias)) WO_MT (m8 tiles per block)
// WO_R (n16 tiles per warp; WO_R * WO_WARPS = 8, the packed tile group) WO_WARPS WO_STAGES WO_MMA (the mma mnemonic, from the layout record) and the
// fragment formulas WO_A_ROW WO_A_K WO_B_K WO_B_N WO_C_ROW WO_C_COL.

#include "mx_common.cuh"
#include "cp_async.cuh"

#define WO_KC (WO_PACK4 ? 64 : 32)    // K per chunk (16 bytes of codes per lane)
#define WO_STEPS (WO_KC / 16)         // mma k16 steps per chunk
#define WO_BPC (WO_KC / 32)           // MX blocks per chunk
#define WO_REC (512 + 16 * WO_BPC)    // record bytes: fragments + scales
#define WO_UNITS (WO_REC / 16)        // 16-byte copies per record
#define WO_XS (WO_KC == 64 ? 192 : 64)  // activation row pitch in shared memory (bytes): 16-byte reads conflict-free
#define WO_THREADS (32 * WO_WARPS)
#define WO_NT (WO_WARPS * WO_R)       // n16 tiles per block
#define WO_STAGE_BYTES (WO_NT * WO_REC + WO_MT * 8 * WO_XS)

__device__ __forceinline__ u32 wo_mul2(u32 x, u32 y) {
#if WO_BF16
    u32 r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(y), "r"(0x80008000u));  // x * y + (-0): exact
    return r;
#else
    u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(y));
    return r;
#endif
}

// two codes in spread form -> two 16-bit values (low half: the even k)
__device__ __forceinline__ u32 wo_decode2(u32 s) {
    constexpr int NB = WO_EBITS + WO_MBITS;                 // magnitude bits
    constexpr u32 MAG = ((1u << NB) - 1u) * 0x10001u;
    constexpr u32 SGN = (1u << NB) * 0x10001u;
    constexpr int TM = WO_BF16 ? 7 : 10;                    // target mantissa bits
    const u32 mag = s & MAG;
    u32 r = (mag << (TM - WO_MBITS)) | ((s & SGN) << (15 - NB));
    if (WO_MUL != 0x3c003c00u && WO_MUL != 0x3f803f80u) r = wo_mul2(r, WO_MUL);  // times 1 needs nothing
#if WO_SPECIAL == 1  // e4m3fn: magnitude 0x7f is NaN
    r |= __vcmpeq2(mag, 0x007f007fu) & (WO_BF16 ? 0x7fc07fc0u : 0x7e007e00u);
#elif WO_SPECIAL == 2 && WO_BF16  // e5m2: exponent 31 is inf (mantissa 0) or NaN; f16 keeps them by placement
    const u32 sp = __vcmpgeu2(mag, 0x007c007cu);
    const u32 v = (r & 0x80008000u) | 0x7f807f80u | (__vcmpgtu2(mag, 0x007c007cu) & 0x00400040u);
    r = (r & ~sp) | (v & sp);
#endif
    return r;
}

template <int N>
__device__ __forceinline__ u32 wo_shl(u32 x) { return N >= 0 ? (x << (N >= 0 ? N : 0)) : (x >> (N < 0 ? -N : 0)); }

// register j (0..3) of k16 step s from a lane's 16 fragment bytes
template <int J>
__device__ __forceinline__ u32 wo_reg(const uint4& q, int s) {
    const u32 w[4] = {q.x, q.y, q.z, q.w};
#if WO_PACK4
    // codes at bits 4J..4J+3 and 16+4J..: magnitude straight to its target place, sign to bit 15 (two shifts)
    constexpr int TM = WO_BF16 ? 7 : 10;
    constexpr u32 MAGT = (7u << (TM - 1)) * 0x10001u;
    u32 r = (wo_shl<TM - 1 - 4 * J>(w[s]) & MAGT) | (wo_shl<12 - 4 * J>(w[s]) & 0x80008000u);
    if (WO_MUL != 0x3c003c00u && WO_MUL != 0x3f803f80u) r = wo_mul2(r, WO_MUL);
    return r;
#else
    return wo_decode2((w[2 * s + (J >> 1)] >> (8 * (J & 1))) & 0x00ff00ffu);
#endif
}

// 2^(code - 127) in fp32 for the scale byte at bit sh of `sc`, exact: code 0 is the subnormal 2^-127, 0xff is NaN.
// `special` (warp-uniform): some scale byte of the chunk is 0x00 or 0xff; else the code is the exponent field as is.
__device__ __forceinline__ float wo_factor(u32 sc, int sh, bool special) {  // sh: a constant after unrolling
    const u32 bits = (sh <= 23 ? sc << (23 - sh) : sc >> (sh - 23)) & 0x7f800000u;
    if (!special) return __uint_as_float(bits);
    const u32 code = (sc >> sh) & 0xffu;
    return __uint_as_float(code == 255u ? 0x7fc00000u : code ? bits : 0x00400000u);
}
// whether a word of scale bytes holds a 0x00 or 0xff byte (the zero-byte test of v and of ~v)
__device__ __forceinline__ bool wo_special(u32 v) {
    return (((v - 0x01010101u) & ~v) | ((~v - 0x01010101u) & v)) & 0x80808080u;
}

__device__ __forceinline__ float wo_fma(float a, float b, float c) {  // IEEE fma, subnormals kept
    float d;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
    return d;
}
__device__ __forceinline__ float wo_add(float a, float b) {
    float d;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

__device__ __forceinline__ void wo_mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(WO_MMA " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void wo_store(void* C, i64 idx, float v, int out_kind) {
    if (out_kind == 0)
        reinterpret_cast<float*>(C)[idx] = v;
    else
        reinterpret_cast<u16*>(C)[idx] = out_kind == 1 ? f32_to_f16(v) : f32_to_bf16(v);
}

extern "C" __global__ void __launch_bounds__(WO_THREADS)
mx_wonly_gemm(const u8* __restrict__ W, const u8* __restrict__ X, void* __restrict__ C, float* __restrict__ ws,
              u32* __restrict__ counters, int M, int N, int K, i64 lda, i64 ldc, int out_kind, int nchunks, int per) {
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
#if WO_BPC == 2
            sc[r] = *reinterpret_cast<const u32*>(rec + 512 + g * 4);
#else
            sc[r] = *reinterpret_cast<const u16*>(rec + 512 + g * 2);
#endif
        }
        u32 any = 0;
#pragma unroll
        for (int r = 0; r < WO_R; ++r) any |= wo_special(WO_BPC == 2 ? sc[r] : (sc[r] | 0x01010000u));
        const bool special = __any_sync(0xffffffffu, any != 0);
#pragma unroll
        for (int blk = 0; blk < WO_BPC; ++blk) {
            // X^T fragments of the block: lane (g, t) holds k = 32 blk + 8 t .. + 8 of row g (the packed K order,
            // WO_KPHYS, makes them contiguous): word 2 s2 + j is register j of k16 step s2
            uint4 xv[WO_MT];
#pragma unroll
            for (int mt = 0; mt < WO_MT; ++mt)
                xv[mt] = *reinterpret_cast<const uint4*>(xs + (mt * 8 + WO_B_N(lane)) * WO_XS +
                                                         WO_KPHYS(blk, 0, WO_B_K(lane, 0, 0)) * 2);
#pragma unroll
            for (int r = 0; r < WO_R; ++r) {
                float t[WO_MT][4] = {};
#pragma unroll
                for (int s2 = 0; s2 < 2; ++s2) {
                    u32 a[4];
                    a[0] = wo_reg<0>(q[r], blk * 2 + s2);
                    a[1] = wo_reg<1>(q[r], blk * 2 + s2);
                    a[2] = wo_reg<2>(q[r], blk * 2 + s2);
                    a[3] = wo_reg<3>(q[r], blk * 2 + s2);
#pragma unroll
                    for (int mt = 0; mt < WO_MT; ++mt) wo_mma(t[mt], a, s2 ? xv[mt].z : xv[mt].x, s2 ? xv[mt].w : xv[mt].y);
                }
                const float f0 = wo_factor(sc[r], 16 * blk, special);      // W^T row g
                const float f1 = wo_factor(sc[r], 16 * blk + 8, special);  // row g + 8
#pragma unroll
                for (int mt = 0; mt < WO_MT; ++mt)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[r][mt][i] = wo_fma(t[mt][i], WO_C_ROW(lane, i) >= 8 ? f1 : f0, acc[r][mt][i]);
            }
        }
    }
    cp_async_wait<0>();

    // epilogue: accumulator (row, col) = (n within the tile, m within the m8 tile); C directly, or (split K) the
    // fp32 partial products [z][M][ldw] (rows past M are not stored)
    const bool direct = gridDim.z == 1;
    const int ldw = gridDim.x * WO_NT * 16;
    float* part = ws + (i64)blockIdx.z * M * ldw;
#pragma unroll
    for (int r = 0; r < WO_R; ++r)
#pragma unroll
        for (int mt = 0; mt < WO_MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int n = (nt0 + warp * WO_R + r) * 16 + WO_C_ROW(lane, i), m = m0 + mt * 8 + WO_C_COL(lane, i);
                if (direct && n < N && m < M)
                    wo_store(C, (i64)m * ldc + n, acc[r][mt][i], out_kind);
                else if (!direct && m < M)
                    part[(i64)m * ldw + n] = acc[r][mt][i];
            }
    if (direct) return;
    __threadfence();
    __syncthreads();
    __shared__ int last;
    u32* counter = counters + blockIdx.y * gridDim.x + blockIdx.x;
    if (tid == 0) last = atomicAdd(counter, 1u) == gridDim.z - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    constexpr int TN = WO_NT * 16, TM = WO_MT * 8;
    for (int q = tid; q < TN * TM; q += WO_THREADS) {
        const int m = m0 + q / TN, n = nt0 * 16 + q % TN;
        if (m >= M || n >= N) continue;
        const float* p = ws + (i64)m * ldw + n;
        float v = __ldcg(p);
        for (int z = 1; z < (int)gridDim.z; ++z) v = wo_add(v, __ldcg(p + (i64)z * M * ldw));
        wo_store(C, (i64)m * ldc + n, v, out_kind);
    }
    if (tid == 0) *counter = 0u;  // ready for the next launch
}
