// mxcore CUDA kernels: what every .cu file shares, defined once.  gemm.cu and gemm_prep.cu #include it;
// mxcore.kernels.kernel_source inlines it into their text, so NVRTC needs no include path and CuPy's kernel
// cache keys on its content too.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef long long i64;
typedef unsigned long long u64;

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
// alpha1 = 2^(e - floor(e/2)) in fp32 (ldexpf: exact, 0 / subnormal / inf outside fp32's range), the product
// rounded once in fp32, as the host formed it before.
__device__ __forceinline__ float out_scale(int exp0, const void* exp_a, const void* exp_b, int exp_u8) {
    int e = exp0;
    if (exp_a) e += exp_u8 ? (int)*(const u8*)exp_a : *(const int*)exp_a;
    if (exp_b) e += exp_u8 ? (int)*(const u8*)exp_b : *(const int*)exp_b;
    const int h = e >> 1;  // floor(e / 2) (arithmetic shift)
    return ldexpf(1.f, h) * ldexpf(1.f, e - h);
}
