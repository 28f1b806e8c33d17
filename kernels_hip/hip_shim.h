// hip_shim.h: what hiprtc predefines, for offline compiles with plain clang (no ROCm headers).
//
// hiprtc compiles a kernel source with the HIP device runtime already in scope (__global__,
// __shared__, threadIdx, __syncthreads, ...).  Debian's clang-22 with -nogpuinc has none of it, so
// backends/hip_tools.py passes `-include hip_shim.h` ahead of the very same source string that
// goes to hiprtc.  Device-only; defines just what mxcore's kernels use.  Never included by hiprtc.
#pragma once

#if defined(__HIPCC_RTC__)
#error "hip_shim.h is for offline clang compiles only; hiprtc predefines all of this"
#endif

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(threads, ...) __attribute__((amdgpu_flat_work_group_size(1, threads)))

// threadIdx.x and friends, read through the amdgcn builtins like HIP's own headers do.
#define MX_SHIM_COORD(NAME, FN)                                                                      \
    struct NAME##_t {                                                                               \
        __declspec(property(get = get_x)) unsigned x;                                               \
        __declspec(property(get = get_y)) unsigned y;                                               \
        __declspec(property(get = get_z)) unsigned z;                                               \
        static __device__ __forceinline__ unsigned get_x() { return FN##_x(); }                     \
        static __device__ __forceinline__ unsigned get_y() { return FN##_y(); }                     \
        static __device__ __forceinline__ unsigned get_z() { return FN##_z(); }                     \
    };                                                                                              \
    extern const __device__ NAME##_t NAME;

MX_SHIM_COORD(threadIdx, __builtin_amdgcn_workitem_id)
MX_SHIM_COORD(blockIdx, __builtin_amdgcn_workgroup_id)
#undef MX_SHIM_COORD

static __device__ __forceinline__ void __syncthreads() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
