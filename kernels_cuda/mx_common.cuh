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
