// mxcore Hopper family: the split-K reduction of gemm_sm90.cu's swapped small-M launches.  ws holds `splits` fp32
// partial products of M x N (row pitch ldc, slice stride `slice` elements); C = 2^e * sum over z in
// z order (deterministic), written as fp32 / fp16 / bf16 (out_kind 0 / 1 / 2) with row pitch ldc.

#include "mx_common.cuh"

extern "C" __global__ void __launch_bounds__(256)
mx_sm90_splitk_reduce(const float* __restrict__ ws, int splits, i64 slice, void* __restrict__ C, int M, int N,
                      i64 ldc, int exp0, const void* exp_a, const void* exp_b, int exp_u8, int out_kind) {
    const float alpha = out_scale(exp0, exp_a, exp_b, exp_u8);
    const i64 total = (i64)M * N;
    for (i64 t = blockIdx.x * (i64)blockDim.x + threadIdx.x; t < total; t += (i64)gridDim.x * blockDim.x) {
        const i64 off = (t / N) * ldc + t % N;
        float acc = 0.f;
        for (int z = 0; z < splits; ++z) acc += ws[z * slice + off];
        acc *= alpha;
        if (out_kind == 0) {
            ((float*)C)[off] = acc;
        } else {
            ((u16*)C)[off] = out_kind == 1 ? f32_to_f16(acc) : f32_to_bf16(acc);
        }
    }
}
