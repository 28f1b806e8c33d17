// mxcore weight-only kernels (gemm_wonly.cu: the cp.async ring; gemm_wonly_gemv.cu: direct loads, small M;
// gemm_wonly_wg.cu: wgmma with the weight as register A, sm_90a): the packed fragment record, the code
// decode, the E8M0 block factors, the fp32 operations that keep subnormals, the activation loads, the mma, the
// output store and the programmatic-dependent-launch boundary, defined once.
//
// Packed weight (wonly_pack.cu writes it once per weight; backends/cuda/wonly/ caches it on the MXTensor):
// records [n16 tile group of 8][K chunk][tile in the group], WO_REC bytes each, chunk = WO_KC K (64 for 4-bit
// codes, 32 for byte codes).
//   bytes [0, 512): lane L's 16 bytes at 16 L, its A-fragment codes for the chunk's k16 steps:
//     4-bit: u32 word s = step s; the 8 codes of registers j = 0..3 (even k in the low half, odd k in the high
//       half) at the bit positions WO4_POS(j, p, b) (p: the half, b: code bit 0 m, 1 e0, 2 e1, 3 sign), chosen so
//       that register j comes out of the word in bf16 placement (magnitude at bits 6..8, sign at 15, per half)
//       with one shift or rotate and one mask (j = 0..2) or one shift and two masks (j = 3): 9 integer
//       operations per word, the fewest for any placement (an exhaustive search); see wo4_reg below
//     bytes: u32 words 2s, 2s+1 = step s; register j: word 2s + (j >> 1), byte (j & 1) (k even) and 2 + (j & 1)
//   bytes [512, WO_REC): E8M0 scales, 2 * WO_BPC per fragment row g: byte g*2*BPC + 2*blk + h = scale of W^T row
//     g + 8h, K block blk of the chunk (pad rows / blocks: 127)
//   (row, k) of lane L's register j, half p: WO_A_ROW(L, j), WO_A_K(L, j, p); K inside a 32-K block permuted by
//   WO_KPHYS (backends/cuda/wonly/records.py emits the formulas; tests/test_cuda_wonly_index.py checks them)
// Decode: codes go to two 16-bit values of the activation type by bit placement (magnitude under the target
// exponent, sign to bit 15) and one exact multiply by 2^(target bias - element bias); exact for every e2m1 / e2m3
// / e3m2 / e4m3 / e5m2 value (all lie in f16's and bf16's range); e4m3's NaN code and e5m2's inf/NaN codes are set
// explicitly.  Block scales are applied in fp32: every 32-K block's two mma run into a zeroed accumulator t, then
// acc = fma(t, 2^(scale - 127), acc) (exact factor: code 0 is the subnormal 2^-127, 0xFF NaN).  CuPy compiles with
// -ftz=true, so every fp32 operation that may meet a subnormal is explicit PTX without .ftz (mx_common.cuh: f32_fma,
// f32_add).
//
// -D: WO_PACK4 (4-bit codes, else byte codes) WO_FORMATS (the formats a build decodes: WoFormat) WO_BF16 (activation
// type bf16, else f16) WO_MT (m8 tiles per block)
// WO_MMA (the mma mnemonic, from the layout record) and the fragment formulas WO_A_ROW WO_A_K WO_B_K WO_B_N
// WO_C_ROW WO_C_COL WO_KPHYS; WO_PDL (sm_90: launched with programmatic dependent launch, see wo_dependent_part).
//
// Programmatic dependent launch (WO_PDL, backends/cuda/plan.py RawLaunch(pdl=True)): a kernel may start while its
// predecessor in the stream still runs.  Before wo_dependent_part() a kernel reads nothing but its packed weight
// records (into registers or a shared-memory ring); the activations, the workspace, the split-K counters and the
// output only after it, in every thread.  Safety of the early record reads, which the code relies on: the records
// are written only by the pack kernel (wonly_pack.cu) or by a device copy of them (a plan's clone), and
// backends/cuda/wonly/records.py launches an empty kernel normally right after each (records_written:
// mx_wonly_fence).  A normally launched kernel starts only after everything before it in the stream completed, so
// whenever a PDL kernel starts early (once its predecessor started; in a chain of PDL kernels, once the previous
// one passed its own wait, since launch_dependents is issued only after the wait: the chain stays transitive; the
// one exception, gemm_wonly_wg.cu's mx_wonly_xperm, issues it first, so that the product after it starts once it
// started, which is still after every normally launched kernel before it completed), every record it reads was
// complete before that.  Records written on another stream need the caller's usual event dependency.

#ifndef WO_PDL
#define WO_PDL 0
#endif
#if WO_PDL
#include "async_sm90.cuh"
#endif

#define WO_KC (WO_PACK4 ? 64 : 32)    // K per chunk (16 bytes of codes per lane)
#define WO_STEPS (WO_KC / 16)         // mma k16 steps per chunk
#define WO_BPC (WO_KC / 32)           // MX blocks per chunk
#define WO_REC (512 + 16 * WO_BPC)    // record bytes: fragments + scales
#define WO_GROUP 8                    // n16 tiles per record group

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

// The weight's element format: the kernels take its index `kind` (a kernel argument, warp-uniform) into the build's
// table WO_FORMATS (-D: {ebits, mbits, special, mul} per format, from backends/cuda/wonly/: every byte-code format in
// one build, e2m1 alone in a WO_PACK4 build; special 1: e4m3fn's NaN code, 2: e5m2's inf / NaN codes; mul: the
// 16-bit x2 bits of 2^(target bias - element bias)).  Each kernel branches on kind into code specialised for that
// format (KIND: a compile-time index), so the decode costs what a build per format costs: once per chunk, or once per
// launch into a loop per format (gemv; the wgmma kernel's WW_KIND_LOOP builds).
struct WoFormat {
    int ebits, mbits, special;
    u32 mul;
};
__host__ __device__ constexpr WoFormat wo_format(int k) {
    constexpr WoFormat t[] = WO_FORMATS;
    return t[k < (int)(sizeof(t) / sizeof(t[0])) ? k : 0];
}
__host__ __device__ constexpr int wo_formats() {
    constexpr WoFormat t[] = WO_FORMATS;
    return (int)(sizeof(t) / sizeof(t[0]));
}
// Format index K + WO_PLAIN: format K without its special codes (a weight that holds none of them: the decode sets
// no NaN / inf, wo_fix2; the wgmma kernel's builds only)
#define WO_PLAIN 8
__host__ __device__ constexpr WoFormat wo_format_k(int k) {
    WoFormat f = wo_format(k % WO_PLAIN);
    if (k >= WO_PLAIN) f.special = 0;
    return f;
}
// `CALL(K)` with K the compile-time index of the weight's format `kind`
#define WO_BY_KIND(kind, CALL)                                  \
    if (wo_formats() == 1 || (kind) == 0) {                    \
        CALL(0);                                                \
    } else if (wo_formats() == 2 || (kind) == 1) {             \
        CALL(1);                                                \
    } else if (wo_formats() == 3 || (kind) == 2) {             \
        CALL(2);                                                \
    } else {                                                    \
        CALL(3);                                                \
    }

// two byte codes in spread form -> their bits placed in two 16-bit values (low half: the even k), not yet multiplied
template <int KIND>
__device__ __forceinline__ u32 wo_place2(u32 s) {
    constexpr WoFormat F = wo_format_k(KIND);
    constexpr int NB = F.ebits + F.mbits;  // magnitude bits
    constexpr u32 MAG = ((1u << NB) - 1u) * 0x10001u, SGN = (1u << NB) * 0x10001u;
    constexpr int TM = WO_BF16 ? 7 : 10;   // target mantissa bits
    return ((s & MAG) << (TM - F.mbits)) | ((s & SGN) << (15 - NB));
}
// times 2^(target bias - element bias); times 1 needs nothing
template <int KIND>
__device__ __forceinline__ u32 wo_scale2(u32 r) {
    constexpr u32 MUL = wo_format_k(KIND).mul;
    return (MUL != 0x3c003c00u && MUL != 0x3f803f80u) ? wo_mul2(r, MUL) : r;
}
// whether the decode of format index k sets special codes (e4m3fn's NaN; e5m2's inf / NaN into bf16: f16 keeps
// them by placement) in wo_fix2 (backends/cuda/wonly/formats.py decode_fixes says the same on the host)
__host__ __device__ constexpr bool wo_fixes(int k) {
    return wo_format_k(k).special == 1 || (wo_format_k(k).special == 2 && WO_BF16);
}
// the special codes of the spread pair s set in its multiplied values r
template <int KIND>
__device__ __forceinline__ u32 wo_fix2(u32 r, u32 s) {
    constexpr WoFormat F = wo_format_k(KIND);
    constexpr u32 MAG = ((1u << (F.ebits + F.mbits)) - 1u) * 0x10001u;
    if constexpr (!wo_fixes(KIND)) {
        return r;
    } else if constexpr (F.special == 1) {  // e4m3fn: magnitude 0x7f is NaN
        r |= __vcmpeq2(s & MAG, 0x007f007fu) & (WO_BF16 ? 0x7fc07fc0u : 0x7e007e00u);
    } else {  // e5m2 into bf16: exponent 31 is inf (mantissa 0) or NaN
        const u32 mag = s & MAG;
        const u32 sp = __vcmpgeu2(mag, 0x007c007cu);
        const u32 v = (r & 0x80008000u) | 0x7f807f80u | (__vcmpgtu2(mag, 0x007c007cu) & 0x00400040u);
        r = (r & ~sp) | (v & sp);
    }
    return r;
}
// two byte codes in spread form -> two 16-bit values of the activation type
template <int KIND>
__device__ __forceinline__ u32 wo_decode2(u32 s) {
    return wo_fix2<KIND>(wo_scale2<KIND>(wo_place2<KIND>(s)), s);
}

__device__ __forceinline__ u32 wo_rotl(u32 x, int n) { return __funnelshift_l(x, x, n); }

// register J (0..3) of a k16 step from its 4-bit code word (the WO4_POS placement), not yet multiplied
template <int J>
__device__ __forceinline__ u32 wo4_place(u32 w) {
#if WO_BF16  // magnitude to bits 6..8 / 22..24, sign to 15 / 31
    constexpr u32 K = 0x81c081c0u;
    return J == 0 ? (w << 6) & K
         : J == 1 ? wo_rotl(w, 12) & K
         : J == 2 ? (w << 2) & K
                  : ((w >> 8) & 0x00400040u) | (w & 0x81808180u);
#else  // f16: magnitude to bits 9..11 / 25..27, sign to 15 / 31 (from the same placement: two or three parts)
    constexpr u32 MAG = 0x0e000e00u, SGN = 0x80008000u;
    return J == 0 ? ((w << 9) & MAG) | ((w << 6) & SGN)
         : J == 1 ? (wo_rotl(w, 15) & MAG) | (wo_rotl(w, 12) & SGN)
         : J == 2 ? ((w << 5) & MAG) | ((w << 2) & SGN)
                  : ((w >> 5) & 0x02000200u) | ((w << 3) & 0x0c000c00u) | (w & SGN);
#endif
}

// the codes of register J (0..3) of k16 step s in a lane's 16 fragment bytes: the step's word of 8 4-bit codes, or
// the register's two byte codes in spread form
template <int J>
__device__ __forceinline__ u32 wo_codes(const uint4& q, int s) {
    const u32 w[4] = {q.x, q.y, q.z, q.w};
    return WO_PACK4 ? w[s] : (w[2 * s + (J >> 1)] >> (8 * (J & 1))) & 0x00ff00ffu;
}
// register J (0..3) of k16 step s from a lane's 16 fragment bytes
template <int J, int KIND>
__device__ __forceinline__ u32 wo_reg(const uint4& q, int s) {
    const u32 c = wo_codes<J>(q, s);
    return WO_PACK4 ? wo_scale2<KIND>(wo4_place<J>(c)) : wo_decode2<KIND>(c);
}
// the same register multiplied by m (two equal 16-bit powers of two: 2^(target bias - element bias) times the
// block scale, which the caller has checked keeps every value of the format exact)
template <int J, int KIND>
__device__ __forceinline__ u32 wo_reg_by(const uint4& q, int s, u32 m) {
    const u32 c = wo_codes<J>(q, s);
    return WO_PACK4 ? wo_mul2(wo4_place<J>(c), m) : wo_fix2<KIND>(wo_mul2(wo_place2<KIND>(c), m), c);
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
// the scale word of a lane's fragment row g (4 bytes with two blocks per chunk, else 2: the other two set to 1)
__device__ __forceinline__ u32 wo_scale_word(u32 raw) { return WO_BPC == 2 ? raw : ((raw & 0xffffu) | 0x01010000u); }

// 8 activations from k on (row pointer xr, K elements): one 16-byte load inside K (kept in L1: every warp of a
// block reads them), zeros past it
__device__ __forceinline__ uint4 wo_ld_x(const u16* xr, int k, int K) {
    if (k + 8 <= K) {
        uint4 v;
        asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(xr + k));
        return v;
    }
    u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 lo = k + 2 * i < K ? xr[k + 2 * i] : 0u, hi = k + 2 * i + 1 < K ? xr[k + 2 * i + 1] : 0u;
        w[i] = lo | (hi << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// Where a kernel's dependent part starts (every thread, before its first read of the activations, the workspace,
// the counters or the output): under WO_PDL, wait for the predecessor grid, then let the next kernel start.
__device__ __forceinline__ void wo_dependent_part() {
#if WO_PDL
    griddep_wait();
    griddep_launch_dependents();
#endif
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

// One n16 tile's 32-K block blk: t = the block's two k16 steps of mma from zero (the lane's 16 code bytes q, the
// activation fragments x of the block, one per m8 tile), then acc += 2^(scale - 127) * t in fp32 (rows g and g + 8
// of the fragment take their own scale byte of the word sc).
template <int MT, int KIND>
__device__ __forceinline__ void wo_block(float (&acc)[MT][4], const uint4& q, const uint4 (&x)[MT], u32 sc, int blk,
                                         bool special, int lane) {
    float t[MT][4] = {};
#pragma unroll
    for (int s2 = 0; s2 < 2; ++s2) {
        u32 a[4];
        a[0] = wo_reg<0, KIND>(q, blk * 2 + s2);
        a[1] = wo_reg<1, KIND>(q, blk * 2 + s2);
        a[2] = wo_reg<2, KIND>(q, blk * 2 + s2);
        a[3] = wo_reg<3, KIND>(q, blk * 2 + s2);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) wo_mma(t[mt], a, s2 ? x[mt].z : x[mt].x, s2 ? x[mt].w : x[mt].y);
    }
    const float f0 = wo_factor(sc, 16 * blk, special);      // W^T row g
    const float f1 = wo_factor(sc, 16 * blk + 8, special);  // row g + 8
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][i] = f32_fma(t[mt][i], WO_C_ROW(lane, i) >= 8 ? f1 : f0, acc[mt][i]);
}

// Split K, after every block stored its fp32 partial tile (rows m0 .. m0 + tm, columns n0 .. n0 + tn) to
// ws[blockIdx.z][M][ldw]: the last block of the tile to arrive (a counter per tile, reset afterwards) sums the
// partials in z order (deterministic) and writes C.  The finish is the launch's tail and the next launch waits for
// it, so it is latency-bound.  Arrival: the block's partial stores, a barrier, then one acquire-release atomic by
// thread 0 (release is cumulative over the barrier, as a semaphore's; no fence in every thread).  The sum: each
// thread takes WO_FIN items of 4 columns (16-byte loads: n0, ldw and M ldw are multiples of 16 floats) and issues the
// loads of WO_FIN_Z partials of all its items, the first partial among them, before it adds them in order (-D: fewer
// where registers are short; WO_FIN 0: a column and a partial at a time).  -D WO_FIN, WO_FIN_Z: from
// backends/cuda/tuning/wonly.json, splitk_finish, by the build's m8 tiles.
#if !defined(WO_FIN) || !defined(WO_FIN_Z)
#error "WO_FIN and WO_FIN_Z come from the tuning table (backends/cuda/wonly/: WonlyVariant.finish_options)"
#endif
__device__ __forceinline__ void wo_add4(float4& v, const float4& u) {
    v.x = f32_add(v.x, u.x), v.y = f32_add(v.y, u.y), v.z = f32_add(v.z, u.z), v.w = f32_add(v.w, u.w);
}
__device__ __forceinline__ void wo_splitk_finish(void* C, const float* ws, u32* counters, int M, int N, i64 ldc,
                                                 int ldw, int out_kind, int m0, int n0, int tm, int tn) {
    __shared__ int last;
    u32* counter = counters + blockIdx.y * gridDim.x + blockIdx.x;
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 old;
        asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
        last = old == gridDim.z - 1;
    }
    __syncthreads();
    if (!last) return;
#if WO_FIN == 0  // one column at a time, a partial at a time: the fewest registers
    for (int q = threadIdx.x; q < tn * tm; q += blockDim.x) {
        const int m = m0 + q / tn, n = n0 + q % tn;
        if (m >= M || n >= N) continue;
        const float* p = ws + (i64)m * ldw + n;
        float v = __ldcg(p);
        for (int z = 1; z < (int)gridDim.z; ++z) v = f32_add(v, __ldcg(p + (i64)z * M * ldw));
        wo_store(C, (i64)m * ldc + n, v, out_kind);
    }
#else
    const int quads = tn / 4, items = min(tm, M - m0) * quads, Z = gridDim.z;
    const i64 zstride = (i64)M * ldw / 4;  // float4 between partials
    for (int q0 = 0; q0 < items; q0 += WO_FIN * blockDim.x) {
        const float4* p[WO_FIN];
        float4 v[WO_FIN];
        bool on[WO_FIN];
#pragma unroll
        for (int i = 0; i < WO_FIN; ++i) {
            const int q = q0 + i * blockDim.x + threadIdx.x;
            on[i] = q < items;
            const int qq = on[i] ? q : 0;
            p[i] = reinterpret_cast<const float4*>(ws + (i64)(m0 + qq / quads) * ldw + n0 + 4 * (qq % quads));
        }
        for (int z0 = 0; z0 < Z; z0 += WO_FIN_Z) {  // every load of the batch in flight, then the adds in z order
            float4 u[WO_FIN_Z][WO_FIN];
#pragma unroll
            for (int j = 0; j < WO_FIN_Z; ++j)
#pragma unroll
                for (int i = 0; i < WO_FIN; ++i)
                    u[j][i] = on[i] && z0 + j < Z ? __ldcg(p[i] + (z0 + j) * zstride) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int j = 0; j < WO_FIN_Z; ++j)
#pragma unroll
                for (int i = 0; i < WO_FIN; ++i) {
                    if (z0 + j >= Z) continue;  // (not an added zero: -0 + 0 is +0)
                    if (z0 + j == 0)
                        v[i] = u[j][i];
                    else
                        wo_add4(v[i], u[j][i]);
                }
        }
#pragma unroll
        for (int i = 0; i < WO_FIN; ++i) {
            if (!on[i]) continue;
            const int q = q0 + i * blockDim.x + threadIdx.x, m = m0 + q / quads, n = n0 + 4 * (q % quads);
            const float w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (n + j < N) wo_store(C, (i64)m * ldc + n + j, w[j], out_kind);
        }
    }
#endif
    if (threadIdx.x == 0) *counter = 0u;  // ready for the next launch
}

// The epilogue of a block of `tiles` n16 tiles (a warp's R of them from tile0) and WO_MT m8 tiles from row m0:
// accumulator (row, col) = (n within the tile, m within the m8 tile); C directly, or (split K) the fp32 partial
// products [z][M][ldw] (rows past M are not stored) and the ordered finish.
// holds = false: a warp without tiles (a producer warp) that only takes part in the split-K finish.
template <int R>
__device__ __forceinline__ void wo_epilogue(const float (&acc)[R][WO_MT][4], void* C, float* ws, u32* counters, int M,
                                            int N, i64 ldc, int out_kind, int m0, int tile0, int tiles, int lane,
                                            bool holds = true) {
    const bool direct = gridDim.z == 1;
    const int ldw = gridDim.x * tiles * 16;
    float* part = ws + (i64)blockIdx.z * M * ldw;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int mt = 0; mt < WO_MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int n = (tile0 + r) * 16 + WO_C_ROW(lane, i), m = m0 + mt * 8 + WO_C_COL(lane, i);
                if (holds && direct && n < N && m < M)
                    wo_store(C, (i64)m * ldc + n, acc[r][mt][i], out_kind);
                else if (holds && !direct && m < M)
                    part[(i64)m * ldw + n] = acc[r][mt][i];
            }
    if (direct) return;
    wo_splitk_finish(C, ws, counters, M, N, ldc, ldw, out_kind, m0, blockIdx.x * tiles * 16, WO_MT * 8, tiles * 16);
}
