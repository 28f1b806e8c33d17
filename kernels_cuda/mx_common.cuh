// mxcore CUDA kernels: what every .cu file shares, defined once.  gemm.cu and gemm_prep.cu #include it;
// mxcore.kernels.kernel_source inlines it into their text, so NVRTC needs no include path and CuPy's kernel
// cache keys on its content too.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef long long i64;
typedef unsigned long long u64;

// IEEE fp32 arithmetic with subnormals kept, whatever -ftz says: CuPy compiles with -ftz=true, under which plain C
// arithmetic flushes subnormal inputs and results to zero (FFMA.FTZ).  Every fp32 operation of the block-scaled
// kernels whose operands or result may be subnormal is one of these (CI checks their SASS for .FTZ).
__device__ __forceinline__ float f32_fma(float a, float b, float c) {
    float d;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
    return d;
}
__device__ __forceinline__ float f32_add(float a, float b) {
    float d;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}
__device__ __forceinline__ float f32_sub(float a, float b) {
    float d;
    asm("sub.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}
__device__ __forceinline__ float f32_mul(float a, float b) {
    float d;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}
__device__ __forceinline__ bool f32_nonzero(float x) { return (__float_as_uint(x) << 1) != 0u; }  // subnormals too

// fp32 -> f16 / bf16 bits: cvt.rn, IEEE round to nearest even with subnormals and overflow to inf
__device__ __forceinline__ u16 f32_to_f16(float v) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}
__device__ __forceinline__ u16 f32_to_bf16(float v) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}

// The output scale of a GEMM: 2^e with e = exp0 + *exp_a + *exp_b, where exp_a / exp_b point to device scalars
// (int32 per-tensor fp8 scale exponents, or, with exp_u8, uint8 MX scale maxima) and null adds 0; read on the
// device, so the caller never copies them to the host.  Returned as alpha0 * alpha1 with alpha0 = 2^floor(e/2),
// alpha1 = 2^(e - floor(e/2)) in fp32 (pow2f: exact, 0 / subnormal / inf outside fp32's normal range), the product
// rounded once in fp32, as the host formed it before.
__device__ __forceinline__ float pow2f(int x) {  // 2^x in fp32, exact: inf above 127, subnormal, 0 below -149
    if (x > 127) return __int_as_float(0x7f800000);
    if (x >= -126) return __int_as_float((x + 127) << 23);
    if (x >= -149) return __int_as_float(1 << (x + 149));
    return 0.f;
}
// one exponent scalar (u8 or s32), loaded where it is used: the volatile load stays in the epilogue instead of
// being hoisted across the main loop (where its pointer and value would occupy registers)
__device__ __forceinline__ int load_exp(const void* p, int u8) {
    u32 v;
    if (u8)
        asm volatile("ld.global.u8 %0, [%1];" : "=r"(v) : "l"(p));
    else
        asm volatile("ld.global.b32 %0, [%1];" : "=r"(v) : "l"(p));
    return (int)v;
}
__device__ __forceinline__ float out_scale(int exp0, const void* exp_a, const void* exp_b, int exp_u8) {
    int e = exp0;
    if (exp_a) e += load_exp(exp_a, exp_u8);
    if (exp_b) e += load_exp(exp_b, exp_u8);
    const int h = e >> 1;  // floor(e / 2) (arithmetic shift)
    return f32_mul(pow2f(h), pow2f(e - h));
}

// Column col's place in B's block-factor rows (gemm_sm90_mx.cu put_factor): 16-column groups, a group ordered as the
// wgmma accumulator's threads read it (position 4 q + 2 (w / 8) + (w % 2) holds column w = 8 (w / 8) + 2 q + (w % 2))
__device__ __forceinline__ int fac_b_pos(int col) {
    const int w = col & 15;
    return (col & ~15) + 4 * ((w & 7) >> 1) + 2 * (w >> 3) + (w & 1);
}

// the lost bits at k of a row / column whose list (sorted by k) is ent[0 .. n), 0 when it has none there
__device__ __forceinline__ float lo_at(const int2* __restrict__ ent, int n, int k) {
    for (int j = 0; j < n; ++j) {
        const int2 e = ent[j];
        if (e.x >= k) return e.x == k ? __int_as_float(e.y) : 0.f;
    }
    return 0.f;
}

// The exact MX fp8 operands' factor range (info, from gemm_sm90_mx.cu's prep: {255 - min live code, max live code,
// ...}): true when every live pair of block codes has E = ea + eb in [-126, 127], so that the factor's bits are one
// integer add (mx_term's fast form)
__device__ __forceinline__ bool mx_fast_pair(const int* __restrict__ info_a, const int* __restrict__ info_b) {
    return (255 - info_a[0]) + (255 - info_b[0]) >= 128 && info_a[1] + info_b[1] <= 381;
}

// 2^E * s added to acc with two normal factors (s * 2^e1) * 2^e2: exact whenever the term is a normal number
// (E in [-254, 254]; the first product stays normal then); terms of E <= -253 (far below fp32) are not kept.
__device__ __forceinline__ float mx_add_exact(float acc, float s, int ra, int cb) {
    const int e = (ra >> 23) + (cb >> 23) - 127;  // ra = sa << 23 (sa <= 254), cb = (sb - 127) << 23
    int e1, e2;
    if (e > 127) {
        e1 = 127;
        e2 = e - 127;
    } else if (e < -126) {
        e1 = max(e + 126, -126);
        e2 = -126;
    } else {
        e1 = e;
        e2 = 0;
    }
    return f32_fma(f32_mul(s, __int_as_float((e1 + 127) << 23)), __int_as_float((e2 + 127) << 23), acc);
}

// 2^E * s added to acc: one FFMA with the factor's bits ra + cf where E is in fp32's normal range (fast), else
// mx_add_exact
__device__ __forceinline__ float mx_term(float acc, float s, int ra, int cf, bool fast) {
    return fast ? f32_fma(s, __int_as_float(ra + cf), acc) : mx_add_exact(acc, s, ra, cf);
}
