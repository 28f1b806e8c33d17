// mxcore NVIDIA GEMM (mma.sync family): D[M,N] = 2^e * (A[M,K] @ B[K,N]), fp32 accumulation on tensor cores.  The block's work (cp.async ring, ldmatrix, mma, epilogue) and its -D defines: gemm_block.cuh.
//
// out_kind: 0 fp32, 1 fp16, 2 bf16.  ldc in elements.  e = exp0 + *exp_a + *exp_b (mx_common.cuh out_scale): the
// per-tensor fp8 scale exponents (int32 device scalars) or the MX global shifts (exp0 = -254 and the operands'
// uint8 scale maxima, exp_u8 = 1); a null pointer adds 0, host exponents arrive in exp0.  Nothing is read back on
// the host.
// Split K: block z multiplies K range [z * k_split, min(K, (z + 1) * k_split)) (k_split a multiple of BK) and
// writes its partial product to C + z * split_stride elements (fp32, scale 1: exp0 0, null pointers); mx_splitk_reduce (gemm_prep.cu)
// then sums the slices in z order.  Without a split: gridDim.z = 1, k_split >= K.
// Batch: block y multiplies batch element y: A + y * a_bstride, B + y * b_bstride, C + y * c_bstride (elements;
// a stride of 0 shares that operand across the batch).  Unbatched: gridDim.y = 1.
// f8_pair (last): the fp8 formats of MX_F8_CVT builds, bit 0: A is e5m2, bit 1: B is e5m2 (gemm_block.cuh); every
// other build takes and ignores it (one signature for every build).

#include "gemm_block.cuh"

extern "C" __global__ void __launch_bounds__(NT)
mx_gemm(const u8* __restrict__ A, const u8* __restrict__ B, void* __restrict__ C, int M, int N, int K, i64 lda,
        i64 ldb, i64 ldc, int exp0, const void* __restrict__ exp_a,
        const void* __restrict__ exp_b, int exp_u8, int out_kind, int k_split, i64 split_stride,
        i64 a_bstride, i64 b_bstride, i64 c_bstride, int f8_pair) {
    gemm_block<FullLoop>(A, B, C, M, N, K, lda, ldb, ldc, exp0, exp_a, exp_b, exp_u8, out_kind, k_split, split_stride,
                         a_bstride, b_bstride, c_bstride, f8_pair);
}
