// mxcore benchmark diagnostics (``python -m mxcore bench --loop-ceilings``), NOT a GEMM: the output is not the
// product.  The GEMM's own block (gemm_block.cuh, same -D defines, tile, grid and operands as gemm.cu) with parts
// of its main loop removed, to measure what each part alone allows.  MX_DIAG:
//   1 "smem": operands resident in shared memory (the stages are filled once by the prologue; no global loads or
//     cp.async waits in the loop, barriers kept);
//   2 "mma": ldmatrix + mma alone (no loads, no barriers);
//   3 "feed": the global->shared feed alone (cp.async, waits and barriers; no ldmatrix, no mma).

#include "gemm_block.cuh"

#if !defined(MX_DIAG) || MX_DIAG < 1 || MX_DIAG > 3
#error "gemm_diag.cu needs -DMX_DIAG=1 (smem), 2 (mma) or 3 (feed)"
#endif

struct DiagLoop {
    static constexpr bool LOADS = MX_DIAG == 3, MATH = MX_DIAG != 3, SYNC = MX_DIAG != 2;
};

extern "C" __global__ void __launch_bounds__(NT)
mx_gemm_diag(const u8* __restrict__ A, const u8* __restrict__ B, void* __restrict__ C, int M, int N, int K, i64 lda,
             i64 ldb, i64 ldc, int exp0, const void* __restrict__ exp_a,
        const void* __restrict__ exp_b, int exp_u8, int out_kind, int k_split, i64 split_stride,
             i64 a_bstride, i64 b_bstride, i64 c_bstride, int f8_pair) {
    gemm_block<DiagLoop>(A, B, C, M, N, K, lda, ldb, ldc, exp0, exp_a, exp_b, exp_u8, out_kind, k_split, split_stride,
                         a_bstride, b_bstride, c_bstride, f8_pair);
}
