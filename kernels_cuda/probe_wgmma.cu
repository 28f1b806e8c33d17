// mxcore layout probes for wgmma.mma_async (sm_90a): one warpgroup runs one wgmma on arange-coded operands and
// writes every lane's accumulator registers in register order: out[lane * slots + slot].  The host decodes the
// values into (row, col) and compares them with mxcore.layouts.hopper (backends/probes/wgmma.py).
//
// Operands in shared memory are stored K-major with the 128-byte swizzle (row r of 128 bytes, 16-byte chunk c
// at physical chunk c ^ (r % 8)), described by K-major descriptors (LBO 16, SBO 1024), as gemm_sm90.cu does.
//
// probe_wgmma_d      m64n64k16 f16, A and B from shared memory: A (64 x 64, K-major) and B (64 rows n x 64 k)
//                    as given; the host picks A[i,0] = i, A[i,1] = 1, B[0,j] = 256, B[1,j] = j, so D = 256 i + j.
// probe_wgmma_a_f16  m64n16k16 f16 with A in registers: slot s of lane t holds t * 8 + s; B[j, k] = (j == k), so
//                    D[i, j] = A[i, j] names the (lane, slot) holding A[i, j].
// probe_wgmma_a_tf32 m64n16k8 tf32, A in registers (t * 4 + s), B[j, k] = (j == k) for k < 8.

#include "mx_common.cuh"

__device__ __forceinline__ u32 probe_smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ u64 probe_desc(u32 addr) {  // 128-byte swizzle, LBO 16, SBO 1024
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(16 >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}

// copy rows x 128 bytes from global (row pitch 128 bytes) into swizzled shared memory
__device__ __forceinline__ void probe_fill(u8* dst, const u8* src, int rows) {
    for (int i = threadIdx.x; i < rows * 8; i += blockDim.x) {
        const int r = i / 8, c = i % 8;
        *(uint4*)(dst + r * 128 + ((c ^ (r % 8)) << 4)) = *(const uint4*)(src + r * 128 + c * 16);
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic-proxy stores -> wgmma reads
    __syncthreads();
}

__device__ __forceinline__ void probe_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void probe_wgmma_commit_wait() {
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;" ::: "memory");
}

extern "C" __global__ void __launch_bounds__(128) probe_wgmma_d(const u8* A, const u8* B, float* out) {
    __shared__ __align__(1024) u8 sa[64 * 128];
    __shared__ __align__(1024) u8 sb[64 * 128];
    probe_fill(sa, A, 64);
    probe_fill(sb, B, 64);
    float d[32];
    probe_wgmma_fence();
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]),
          "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]),
          "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]),
          "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
        : "l"(probe_desc(probe_smem_u32(sa))), "l"(probe_desc(probe_smem_u32(sb))), "r"(0));
    probe_wgmma_commit_wait();
    for (int s = 0; s < 32; ++s) out[threadIdx.x * 32 + s] = d[s];
}

extern "C" __global__ void __launch_bounds__(128) probe_wgmma_a_f16(const u8* B, float* out) {
    __shared__ __align__(1024) u8 sb[16 * 128];
    probe_fill(sb, B, 16);
    u32 a[4];
    for (int r = 0; r < 4; ++r) {
        const u16 lo = f32_to_f16((float)(threadIdx.x * 8 + 2 * r)), hi = f32_to_f16((float)(threadIdx.x * 8 + 2 * r + 1));
        a[r] = (u32)lo | ((u32)hi << 16);  // slot 2r in the low half, 2r + 1 in the high half
    }
    float d[8];
    probe_wgmma_fence();
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, "
        "%12, p, 1, 1, 0;\n}\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(probe_desc(probe_smem_u32(sb))), "r"(0));
    probe_wgmma_commit_wait();
    for (int s = 0; s < 8; ++s) out[threadIdx.x * 8 + s] = d[s];
}

extern "C" __global__ void __launch_bounds__(128) probe_wgmma_a_tf32(const u8* B, float* out) {
    __shared__ __align__(1024) u8 sb[16 * 128];
    probe_fill(sb, B, 16);
    u32 a[4];
    for (int r = 0; r < 4; ++r) a[r] = __float_as_uint((float)(threadIdx.x * 4 + r));
    float d[8];
    probe_wgmma_fence();
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, "
        "%12, p, 1, 1;\n}\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(probe_desc(probe_smem_u32(sb))), "r"(0));
    probe_wgmma_commit_wait();
    for (int s = 0; s < 8; ++s) out[threadIdx.x * 8 + s] = d[s];
}

// ---------------------------------------------------------------------------------------------------------------
// One wgmma from its layout record (backends/probes/wgmma.py: wgmma_probe_kernel, run_wgmma).  The host builds the
// shared-memory image through the record (mxcore.emulate.smem_write: the descriptor's canonical layout and swizzle)
// and the descriptors with start addresses relative to the image; the kernel copies the image verbatim to a
// 1024-byte aligned buffer (so every swizzle pattern starts on its repeat boundary, base offset 0), adds the
// buffer's address to each descriptor's start field, loads C (and A's registers) lane-major and runs exactly one
// wgmma; D goes back lane-major.  The instruction text and its operand lists come from the host (-D):
//   MX_WG_ENTRY  entry name;  MX_WG_ACC  accumulator registers (N / 2);  MX_WG_AREGS  4 (A in registers) or 0;
//   MX_WG_ASM    the asm text;  MX_WG_OUTS / MX_WG_INS  its output / input operand lists.
// ---------------------------------------------------------------------------------------------------------------
#ifdef MX_WG_ENTRY
#define MX_WG_SMEM_BYTES 40960  // the largest image: B m64n256 K-major 128B (32 KB) + A (8 KB)
extern "C" __global__ void __launch_bounds__(128) MX_WG_ENTRY(const uint4* image, const u32* a_words, const float* c,
                                                              float* d_out, u64 desc_a, u64 desc_b) {
    __shared__ __align__(1024) uint4 smem[MX_WG_SMEM_BYTES / 16];
    for (int i = threadIdx.x; i < MX_WG_SMEM_BYTES / 16; i += blockDim.x) smem[i] = image[i];
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic-proxy stores -> wgmma reads
    __syncthreads();
    const u64 base = (u64)((probe_smem_u32(smem) & 0x3FFFF) >> 4);
    const u64 da = desc_a + base, db = desc_b + base;
    float d[MX_WG_ACC];
    for (int s = 0; s < MX_WG_ACC; ++s) d[s] = c[threadIdx.x * MX_WG_ACC + s];
#if MX_WG_AREGS
    u32 a[MX_WG_AREGS];
    for (int r = 0; r < MX_WG_AREGS; ++r) a[r] = a_words[threadIdx.x * MX_WG_AREGS + r];
#endif
    (void)da;
    probe_wgmma_fence();
    asm volatile(MX_WG_ASM : MX_WG_OUTS : MX_WG_INS : "memory");
    probe_wgmma_commit_wait();
    for (int s = 0; s < MX_WG_ACC; ++s) d_out[threadIdx.x * MX_WG_ACC + s] = d[s];
}
#endif
