// mxcore NVIDIA GEMM (mma.sync family): D[M,N] = alpha0 * alpha1 * (A[M,K] @ B[K,N]), fp32 accumulation on tensor
// cores.  The block's work (cp.async ring, ldmatrix, mma, epilogue) and its -D defines: gemm_block.cuh.
//
// out_kind: 0 fp32, 1 fp16, 2 bf16.  ldc in elements.  alpha0, alpha1: powers of two of one sign of exponent
// (per-tensor fp8 scales, MX global shifts) so that each product is exact; 1, 1 otherwise.
// Split K: block z multiplies K range [z * k_split, min(K, (z + 1) * k_split)) (k_split a multiple of BK) and
// writes its partial product to C + z * split_stride elements (fp32, alpha 1); mx_splitk_reduce (gemm_prep.cu)
// then sums the slices in z order.  Without a split: gridDim.z = 1, k_split >= K.
// Batch: block y multiplies batch element y: A + y * a_bstride, B + y * b_bstride, C + y * c_bstride (elements;
// a stride of 0 shares that operand across the batch).  Unbatched: gridDim.y = 1.

#include "gemm_block.cuh"

extern "C" __global__ void __launch_bounds__(NT)
mx_gemm(const u8* __restrict__ A, const u8* __restrict__ B, void* __restrict__ C, int M, int N, int K, i64 lda,
        i64 ldb, i64 ldc, float alpha0, float alpha1, int out_kind, int k_split, i64 split_stride,
        i64 a_bstride, i64 b_bstride, i64 c_bstride) {
    gemm_block<FullLoop>(A, B, C, M, N, K, lda, ldb, ldc, alpha0, alpha1, out_kind, k_split, split_stride,
                         a_bstride, b_bstride, c_bstride);
}
