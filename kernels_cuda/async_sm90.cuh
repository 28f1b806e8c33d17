// sm_90 asynchronous copies, their mbarriers and programmatic dependent launch: one tiny wrapper per PTX
// instruction, shared by the wgmma family (gemm_sm90.cu) and the weight-only kernel of sm_90a
// (gemm_wonly_wg.cu).
// Shared-memory operands are shared-window addresses (smem_u32).

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbarrier_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ u32 mbarrier_try_wait_parity(u32 bar, u32 parity) {
    u32 ok;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
    return ok;
}
__device__ __forceinline__ void mbarrier_wait(u32 bar, u32 parity) {
    while (!mbarrier_try_wait_parity(bar, parity)) {
    }
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory, completing on `bar`
__device__ __forceinline__ void cp_async_bulk_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// Shared-memory loads from a shared-window address, volatile so that they stay after the mbarrier wait before them
// (ld_shared_u32 also orders other memory accesses around it)
__device__ __forceinline__ u32 ld_shared_u32(u32 addr) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ u32 ld_shared_u16(u32 addr) {
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr));
    return v;
}
__device__ __forceinline__ int4 ld_shared_v4(u32 addr) {
    int4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

// Tensor copies (TMA): a 2-D box of the tensor map at coordinates (c0 inner, c1 outer) into shared memory,
// completing on `bar` by byte count (out-of-bounds elements zero-filled, counted); the multicast form writes the same
// offset in every block of `mask` and completes on each one's barrier at the same offset.  TmaMap: the driver's
// CUtensorMap (cuda.h is not available to NVRTC), 128 opaque bytes, 64-byte aligned, passed by value.
struct __align__(64) TmaMap {
    u64 opaque[16];
};
__device__ __forceinline__ void cp_async_bulk_tensor_2d(u32 dst, const TmaMap* map, int c0, int c1, u32 bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(dst), "l"((u64)map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
__device__ __forceinline__ void cp_async_bulk_tensor_2d_multicast(u32 dst, const TmaMap* map, int c0, int c1, u32 bar,
                                                                   u16 mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;"
                 ::"r"(dst), "l"((u64)map), "r"(c0), "r"(c1), "r"(bar), "h"(mask) : "memory");
}
__device__ __forceinline__ void prefetch_tensormap(const TmaMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"((u64)map) : "memory");
}

// Clusters: the same shared-memory offset in block `cta` of the cluster, an arrive on a barrier there, the block's
// rank, the cluster-wide barrier, and a bulk copy from this block's shared memory into another block's
// (`dst` and `bar` cluster addresses from mapa) completing on that block's barrier by byte count.
__device__ __forceinline__ u32 mapa(u32 addr, u32 cta) {
    u32 out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(cta));
    return out;
}
__device__ __forceinline__ void mbarrier_arrive_cluster(u32 cluster_bar) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar) : "memory");
}
__device__ __forceinline__ u32 cluster_ctarank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void barrier_cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}
__device__ __forceinline__ void barrier_cluster_wait() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
__device__ __forceinline__ void cp_async_bulk_s2cluster(u32 dst, u32 src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "r"(src), "r"(bytes), "r"(bar) : "memory");
}

// Programmatic dependent launch (a kernel launched with the programmatic-stream-serialization attribute may start
// before its predecessor in the stream has finished): griddepcontrol.wait blocks the executing thread until every
// prerequisite grid has completed and its memory is visible; launch_dependents lets the next such kernel start
// once every block of this grid has issued it (or exited).  Both are no-ops in a kernel launched normally.
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void griddep_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
