// cp.async (sm_80+): 16-byte global -> shared copies and their groups, shared by the mma.sync GEMM
// (gemm_block.cuh) and the weight-only kernel (gemm_wonly.cu).  Destinations are shared-window addresses.

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
// the same copy without a source size: all 16 bytes are read (interior blocks: no predicate, no select)
__device__ __forceinline__ void cp_async16_full(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
