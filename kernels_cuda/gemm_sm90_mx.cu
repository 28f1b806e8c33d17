// mxcore Hopper family: the block-scale factors of gemm_sm90.cu's exact MX fp8 variant (SM90_MX), from an MX
// operand's E8M0 scale codes.  One pass over the scales (and over the element codes of code-0 blocks only):
//   role 0 (A, rows = M): out[r * ld + j]       = RA = code << 23                      (int32 [M][blocks_pad])
//   role 1 (B, rows = N): out[j * ld + perm(r)] = CB = (code - 127) << 23              (int32 [blocks_pad][N16])
// so that RA + CB are the bits of the fp32 2^((sa - 127) + (sb - 127)) when that exponent is in [-126, 127].
// perm(r) keeps 16-column groups and orders a group as the wgmma accumulator's threads read it: position
// 4 q + 2 (w / 8) + (w % 2) holds column w = 8 (w / 8) + 2 q + (w % 2) (q = lane % 4), one 16-byte load per thread.
// Neutral blocks get code 127 (RA = 127 << 23, CB = 0): all-zero blocks of code 0 (their partial products are 0
// whatever the factor), NaN blocks (code 0xFF: the row / column is flagged in nan_rows and made NaN in the GEMM's
// epilogue), and the padding (blocks >= `blocks`, rows >= `rows`).  A code-0 block with a nonzero element is live.
// info (int32 x 4, zeroed by the caller): info[0] = max(255 - live code), info[1] = max(live code), info[2] = 1
// when a NaN block exists; with no live block info[0] = info[1] = 0 (range [255, 0]: empty).

#include "mx_common.cuh"

extern "C" __global__ void __launch_bounds__(256)
mx_sm90_block_factors(const u8* __restrict__ scales, i64 ss_r, i64 ss_j, const u8* __restrict__ codes, i64 cs_r,
                      i64 cs_k, int rows, int blocks, int K, int role, int rows_pad, int blocks_pad,
                      int* __restrict__ out, i64 ld, u8* __restrict__ nan_rows, int* __restrict__ info) {
    __shared__ int red[2][8];
    int lo_enc = 0, hi = 0, any_nan = 0;
    const i64 total = (i64)rows_pad * blocks_pad;
    for (i64 t = blockIdx.x * (i64)blockDim.x + threadIdx.x; t < total; t += (i64)gridDim.x * blockDim.x) {
        // A: blocks fastest (scales [M][blocks] row-major); B: rows fastest (scales [blocks][N])
        const int r = role == 0 ? (int)(t / blocks_pad) : (int)(t % rows_pad);
        const int j = role == 0 ? (int)(t % blocks_pad) : (int)(t / rows_pad);
        int code = 127;
        bool live = false;
        if (r < rows && j < blocks) {
            const int sc = scales[r * ss_r + j * ss_j];
            if (sc == 255) {
                nan_rows[r] = 1;
                any_nan = 1;
            } else if (sc != 0) {
                code = sc;
                live = true;
            } else {
                const int k1 = min(K, 32 * j + 32);
                for (int k = 32 * j; k < k1; ++k) {
                    if (codes[r * cs_r + k * cs_k] & 0x7f) {  // a nonzero magnitude: a live block of scale 2^-127
                        code = 0;
                        live = true;
                        break;
                    }
                }
            }
        }
        if (live) {
            lo_enc = max(lo_enc, 255 - code);
            hi = max(hi, code);
        }
        if (role == 0) {
            out[r * ld + j] = code << 23;
        } else {
            const int w = r & 15;
            out[j * ld + (r & ~15) + 4 * ((w & 7) >> 1) + 2 * (w >> 3) + (w & 1)] = (int)((u32)(code - 127) << 23);
        }
    }
    // block reduction of the live range, then one atomic per block
    for (int o = 16; o > 0; o >>= 1) {
        lo_enc = max(lo_enc, __shfl_xor_sync(0xffffffffu, lo_enc, o));
        hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
        any_nan |= __shfl_xor_sync(0xffffffffu, any_nan, o);
    }
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
        red[0][warp] = lo_enc;
        red[1][warp] = hi;
        if (any_nan) info[2] = 1;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)blockDim.x / 32; ++w) {
            lo_enc = max(lo_enc, red[0][w]);
            hi = max(hi, red[1][w]);
        }
        if (lo_enc) atomicMax(&info[0], lo_enc);
        if (hi) atomicMax(&info[1], hi);
    }
}
