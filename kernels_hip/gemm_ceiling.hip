// gemm_ceiling.hip: the instruction ceiling -- a register-only loop of one MFMA, no memory traffic.
//
// Each wave keeps MX_CHAINS independent accumulators and issues MX_CHAINS MFMAs per iteration, so the
// matrix core never waits on a dependency.  Operands come from registers derived from the lane id
// (the compiler cannot fold them); the sum of the accumulators is written once so nothing is dead.
// FLOPs per launch = 2*M*N*K * MX_CHAINS * iters * waves.  -D defines: MX_BUILTIN, MX_AFRAG_T,
// MX_CFRAG_T, MX_C_SLOTS, MX_CHAINS, MX_SCALED, MX_CBSZ, MX_BLGP (backends/hip/variants.py ceiling_defines).

#ifndef MX_BUILTIN
#error "compile through backends/hip (HipBackend.instruction_ceiling)"
#endif

#include "mx_types.h"

template <typename T>
__device__ __forceinline__ T mx_fill(unsigned seed) {
    unsigned w[sizeof(T) / 4 > 0 ? sizeof(T) / 4 : 1];
#pragma unroll
    for (unsigned i = 0; i < sizeof(w) / 4; ++i) w[i] = (seed * 2654435761u + i) & 0x3C3C3C3Cu;  // small finite codes
    T t;
    __builtin_memcpy(&t, w, sizeof(T));
    return t;
}

extern "C" __global__ __launch_bounds__(256) void mx_mfma_ceiling(float* out, int iters, unsigned seed) {
    const unsigned lane = threadIdx.x;
    const MX_AFRAG_T a = mx_fill<MX_AFRAG_T>(lane ^ seed);
    const MX_AFRAG_T b = mx_fill<MX_AFRAG_T>(lane + seed);
    MX_CFRAG_T acc[MX_CHAINS];
#pragma unroll
    for (int c = 0; c < MX_CHAINS; ++c)
#pragma unroll
        for (int s = 0; s < MX_C_SLOTS; ++s) acc[c][s] = 0.0f;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < MX_CHAINS; ++c) {
#if MX_SCALED
            acc[c] = MX_BUILTIN(a, b, acc[c], MX_CBSZ, MX_BLGP, 0, 127, 0, 127);
#else
            acc[c] = MX_BUILTIN(a, b, acc[c], 0, 0, 0);
#endif
        }
    }
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < MX_CHAINS; ++c)
#pragma unroll
        for (int i = 0; i < MX_C_SLOTS; ++i) s += acc[c][i];
    out[blockIdx.x * 256 + threadIdx.x] = s;
}
