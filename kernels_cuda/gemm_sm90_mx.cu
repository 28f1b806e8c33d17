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
//
// mx_sm90_fold: an MXFP4 / MXFP6 operand folded into e4m3 for the same variant (issue 11 part 2).  Per row and
// 128-K window (one ring stage, 4 blocks): when the live blocks' scale exponents e_j span at most hi - lo binades
// (formats.exact_shifts(element, "e4m3fn"): e2m1 14, e2m3 11, e3m2 9), every element is re-encoded exactly as
// the e4m3 code of its value times 2^(e_j - E), E = max(e_j) - hi clamped to
// E8M0's [-127, 127], and all 4 block factors of the window are 2^E; the window is folded.  Otherwise the
// elements are re-encoded unshifted (d = 0) and each block keeps its own factor.  Per-32 promotion is therefore
// right for every window; folded[w] (uint8) is cleared when any row's window w is not
// folded, and the GEMM promotes a stage once (per 128 K) when both operands' window is folded (1 written by
// mx_sm90_fold_rows).  NaN blocks and
// zero blocks write zero elements (NaN rows / columns are flagged as above).  codes: one code per byte, any
// strides; out: K-major [rows][ldk] element bytes (zeros from K to ldk).
// Whole rows: mx_sm90_fold_rows first picks one E per row from its scale codes alone (codes 0x00 and 0xFF left
// out: the quantizer's zero blocks and NaN blocks) when they span at most hi - lo binades (row_e = E + 127, else
// -1); every window whose live blocks fit that E uses it (empty windows too).  info[3] is set when some window of
// some row does not: with info[3] = 0 in both operands every row and column has one factor over all of K, and the
// GEMM adds the stages' scratch unscaled and applies 2^(Ea + Eb) once, in its epilogue.
//
// MXFP8 folded with its lost bits kept (lossy = 1; issue 11 part 1): e4m3 / e5m2 elements use their format's whole
// range, so a block shifted down by d = E - e binades (E the row's / window's largest block exponent, shifts down
// to -lo) keeps its elements only where they stay on the format's grid.  Each element is written as hi, its value
// times 2^-d truncated toward zero onto the grid (the format's smallest subnormal when that is 0: hi keeps the
// element's sign and never vanishes, so an inf of the other operand still meets a nonzero), and where
// lo = value * 2^-d - hi is not 0 (exact in fp32) the entry {k, lo} goes into the row's list (lo_ent [rows][cap],
// lo_cnt [rows]; info[4] = 1 when a row has more than cap), appended by atomics and then ordered by k by
// mx_sm90_lo_sort, so that the bits added do not depend on the atomics' order.  The GEMM adds none of them:
// mx_lo_fix (below) adds each term lo * (the other operand), exact per term, to the GEMM's fp32 result, from the
// lists and the folded elements transposed ([k][row]: el_t, written here as well).  When a row's list overflowed,
// the operand is folded again without loss (only_if = &info[4]: mx_sm90_fold_rows / mx_sm90_fold with lo = hi = 0
// rerun, lists emptied): the per-32 path of part 1 for blocks of different scales.

#include "mx_common.cuh"
#include "async_sm90.cuh"
#include "cp_async.cuh"

// a block factor in the layout the GEMM loads: A RA[r][j] = code << 23; B CB[j][perm(r)] = (code - 127) << 23
__device__ __forceinline__ void put_factor(int* out, i64 ld, int role, int r, int j, int code) {
    if (role == 0) {
        out[r * ld + j] = code << 23;
    } else {
        const int w = r & 15;  // fac_b_pos(r), spelled out: through the helper ptxas allocates the folds differently
        out[j * ld + (r & ~15) + 4 * ((w & 7) >> 1) + 2 * (w >> 3) + (w & 1)] = (int)((u32)(code - 127) << 23);
    }
}

// the block's live code range and NaN flag into info (one atomic per block; every thread of the block calls it)
__device__ __forceinline__ void reduce_info(int lo_enc, int hi, int any_nan, int* info) {
    __shared__ int red[2][8];
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

extern "C" __global__ void __launch_bounds__(256)
mx_sm90_block_factors(const u8* __restrict__ scales, i64 ss_r, i64 ss_j, const u8* __restrict__ codes, i64 cs_r,
                      i64 cs_k, int rows, int blocks, int K, int role, int rows_pad, int blocks_pad,
                      int* __restrict__ out, i64 ld, u8* __restrict__ nan_rows, int* __restrict__ info) {
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
        put_factor(out, ld, role, r, j, code);
    }
    reduce_info(lo_enc, hi, any_nan, info);
}


// an element code (ebits, mbits, bias; sign above them) times 2^d as an e4m3 code; exact for d in the format's
// exact_shifts range (the caller's check), +-0 for zero magnitudes
__device__ __forceinline__ u32 e4m3_shifted(u32 c, int ebits, int mbits, int bias, int d) {
    const u32 sign = ((c >> (ebits + mbits)) & 1u) << 7;
    const int ef = (int)(c >> mbits) & ((1 << ebits) - 1), m = (int)c & ((1 << mbits) - 1);
    const int sig = ef ? (1 << mbits) | m : m;  // value = sig * 2^q
    if (sig == 0) return sign;
    const int q = (ef ? ef : 1) - bias - mbits + d;
    const int p = 31 - __clz(sig);  // the leading bit: value = 1.f * 2^(q + p), p <= mbits <= 3
    if (q + p >= -6) return sign | (u32)((q + p + 7) << 3) | (u32)((sig << (3 - p)) & 7);
    return sign | (u32)(sig << (q + 9));  // subnormal: sig * 2^(q + 9) units of 2^-9
}

// An fp8 code's value (ebits, mbits, bias; sign above them; finite codes): exact in fp32
__device__ __forceinline__ float fp8_code_value(u32 c, int ebits, int mbits, int bias) {
    const int ef = (int)(c >> mbits) & ((1 << ebits) - 1), m = (int)c & ((1 << mbits) - 1);
    const int sig = ef ? (1 << mbits) | m : m;
    const float v = f32_mul((float)sig, __int_as_float(((ef ? ef : 1) - bias - mbits + 127) << 23));
    return __uint_as_float(__float_as_uint(v) | ((c >> (ebits + mbits)) & 1u) << 31);  // the sign (no FTZ negation)
}

// zero magnitude, or NaN / inf (specials: 1 = e4m3fn's S.1111.111, 2 = IEEE's all-ones exponent)
__device__ __forceinline__ bool fp8_plain(u32 c, int ebits, int mbits, int specials) {
    const u32 mag = c & ((1u << (ebits + mbits)) - 1);
    return mag == 0 || (specials == 1 && mag == (1u << (ebits + mbits)) - 1) ||
           (specials == 2 && (int)(mag >> mbits) == (1 << ebits) - 1);
}

// An fp8 code times 2^s (s <= 0) in the same format, truncated toward zero onto the format's grid; a nonzero value
// that truncates to 0 becomes the smallest subnormal of its sign.  NaN / inf codes (specials: 1 = e4m3fn's S.1111.111,
// 2 = IEEE's all-ones exponent) and zeros are returned as they are.
__device__ __forceinline__ u32 fp8_shift_trunc(u32 c, int ebits, int mbits, int bias, int specials, int s) {
    const u32 sign = c & (1u << (ebits + mbits)), mag = c & (sign - 1);
    const int ef = (int)(mag >> mbits), m = (int)mag & ((1 << mbits) - 1);
    if (s == 0 || fp8_plain(c, ebits, mbits, specials)) return c;
    const int sig = ef ? (1 << mbits) | m : m;
    const int q = (ef ? ef : 1) - bias - mbits + s;  // value = sig * 2^q
    const int p = 31 - __clz(sig);                  // value = 1.f * 2^(q + p)
    if (q + p >= 1 - bias)
        return sign | (u32)((q + p + bias) << mbits) | (u32)((sig << (mbits - p)) & ((1 << mbits) - 1));
    const int sh = (1 - bias - mbits) - q;  // subnormal units of 2^(1 - bias - mbits); sh > 0 here
    const int n = sh < 31 ? sig >> sh : 0;
    return sign | (u32)(n ? n : 1);
}

// what a lossy fold took off code c shifted by 2^d (d < 0) when written as code h (lut): the rest, exact in fp32;
// 0 for zeros, NaN / inf and values that stayed on the grid
__device__ __forceinline__ float lost_bits(u32 c, u32 h, int d, int ebits, int mbits, int bias, int specials) {
    if (fp8_plain(c, ebits, mbits, specials)) return 0.f;
    return f32_sub(f32_mul(fp8_code_value(c, ebits, mbits, bias), __int_as_float((d + 127) << 23)),
                   fp8_code_value(h, ebits, mbits, bias));
}

// One block per (32 rows, 128-K window): the codes tile is loaded coalesced in the source's own layout (16 bytes per
// thread along whichever of K / rows is contiguous) into shared memory as [row][k]; then 8 lanes per row, one
// 16-element run each, decide the window together (shuffles) and write its e4m3 codes as one 128-byte row segment.
#define FOLD_ROWS 32
#define FOLD_PITCH 144  // 128 bytes of K + 16 (bank spread for the transposing stores)
// mx_sm90_fold's load of a window's codes tile, coalesced in the source's own layout: rows-contiguous sources (B's
// [K][N] codes) 16 rows of one k per thread, else 16 k of one row; fold_store puts them in the tile as [row][k]
__device__ __forceinline__ uint4 fold_load(const u8* __restrict__ codes, i64 cs_r, i64 cs_k, int rows, int K, int r0,
                                           int k0, int t, bool rows_contig) {
    u32 q4[4] = {0, 0, 0, 0};
    if (rows_contig) {
        const int k = k0 + t / 2, rr = r0 + 16 * (t % 2);
        const u8* src = codes + (i64)k * cs_k + rr;
        if (k < K && rr + 16 <= rows && ((unsigned long long)src & 15) == 0) return *(const uint4*)src;
        if (k < K)
            for (int q = 0; q < 16; ++q)
                if (rr + q < rows) q4[q / 4] |= (u32)src[q] << (8 * (q % 4));
    } else {
        const int r = r0 + t / 8, k = k0 + 16 * (t % 8);
        const u8* src = codes + (i64)r * cs_r + (i64)k * cs_k;
        if (r < rows && cs_k == 1 && k + 16 <= K && ((unsigned long long)src & 15) == 0) return *(const uint4*)src;
        if (r < rows)
            for (int q = 0; q < 16; ++q)
                if (k + q < K) q4[q / 4] |= (u32)src[q * cs_k] << (8 * (q % 4));
    }
    return make_uint4(q4[0], q4[1], q4[2], q4[3]);
}
__device__ __forceinline__ void fold_store(u8* tile, uint4 v, bool rows_contig, int t) {
    if (rows_contig) {
        const u32 q4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 16; ++q) tile[(16 * (t % 2) + q) * FOLD_PITCH + t / 2] = (u8)(q4[q / 4] >> (8 * (q % 4)));
    } else {
        *(uint4*)(tile + (t / 8) * FOLD_PITCH + 16 * (t % 8)) = v;
    }
}

// (256, 1): with no minimum given, ptxas spilled 4 bytes at 48 registers
extern "C" __global__ void __launch_bounds__(256, 1)
mx_sm90_fold(const u8* __restrict__ scales, i64 ss_r, i64 ss_j, const u8* __restrict__ codes, i64 cs_r, i64 cs_k,
             int rows, int blocks, int K, int role, int rows_pad, int blocks_pad, int ebits, int mbits, int bias,
             int lo, int hi_shift, const int* __restrict__ row_e, u8* __restrict__ elems, i64 ldk,
             int* __restrict__ out, i64 ld, u8* __restrict__ folded, u8* __restrict__ nan_rows,
             int* __restrict__ info, int lossy, int specials, int cap, int* __restrict__ lo_cnt,
             int2* __restrict__ lo_ent, const int* __restrict__ only_if,
             u8* __restrict__ el_t, i64 ldt) {
    if (only_if != nullptr && *only_if == 0) return;  // the lossless rerun: only after a list overflowed
    const int r0 = blockIdx.x * FOLD_ROWS, t = threadIdx.x;
    const bool rows_contig = cs_r == 1 && cs_k != 1;
    const int y0 = blockIdx.y, gy = gridDim.y, windows = blocks_pad / 4;
    // lanes 8 g .. 8 g + 7 of a warp hold row t / 8's runs; runs 2b, 2b + 1 are block b of a window
    const int r = r0 + t / 8, run = t % 8, b = run / 2;
    const int re = r < rows ? row_e[r] - 127 : 0;  // the row's one exponent (-128: none)
    // this lane's scale code of block j of its row (127 past the rows or blocks)
    const auto scale_of = [&](int j) { return r < rows && j < blocks ? (int)scales[r * ss_r + j * ss_j] : 127; };
    // a window's codes and this lane's block scale, loaded one window ahead (the first beside the tables)
    uint4 next = make_uint4(0, 0, 0, 0);
    int sc_next = 127;
    if (y0 < windows) {
        next = fold_load(codes, cs_r, cs_k, rows, K, r0, 128 * y0, t, rows_contig);
        sc_next = scale_of(4 * y0 + b);
    }
    // every (shift, code) pair's code: lut[(d - lo) * ncodes + c]: e4m3 (fp4 / fp6, 15 shifts x 64 codes at most),
    // or with lossy the same fp8 format, truncated (16 shifts x 256 codes), and with lossy what that takes off the
    // element (lost_bits, exact in fp32: rest[(d - lo) * ncodes + c]); built once per block, which then folds
    // windows blockIdx.y, blockIdx.y + gridDim.y, ...
    __shared__ u8 lut[16 * 256];
    __shared__ float rest[16 * 256];
    __shared__ __align__(16) u8 tile[FOLD_ROWS * FOLD_PITCH];
    const int lg = 1 + ebits + mbits, ncodes = 1 << lg;
    for (int i = threadIdx.x; i < (hi_shift - lo + 1) * ncodes; i += blockDim.x)
        lut[i] = (u8)(lossy ? fp8_shift_trunc(i & (ncodes - 1), ebits, mbits, bias, specials, lo + (i >> lg))
                            : e4m3_shifted(i & (ncodes - 1), ebits, mbits, bias, lo + (i >> lg)));
    __syncthreads();
    if (lossy)
        for (int i = threadIdx.x; i < (hi_shift - lo + 1) * ncodes; i += blockDim.x)
            rest[i] = lo + (i >> lg) == 0
                          ? 0.f
                          : lost_bits(i & (ncodes - 1), lut[i], lo + (i >> lg), ebits, mbits, bias, specials);
    __syncthreads();
    int lo_enc = 0, hi = 0, some_not_whole = 0;  // over the block's windows (reduce_info, info[3])
    for (int w = y0; w < windows; w += gy) {  // a barrier ends each window (tile reused)
        const int k0 = 128 * w;
        fold_store(tile, next, rows_contig, t);  // this window's codes and scale (loaded during the previous one)
        const int sc = sc_next, j = 4 * w + b;
        if (w + gy < windows) {  // the next window's, in flight while this one folds
            next = fold_load(codes, cs_r, cs_k, rows, K, r0, 128 * (w + gy), t, rows_contig);
            sc_next = scale_of(j + 4 * gy);
        }
        __syncthreads();
        // decide
        const uint4 v = *(const uint4*)(tile + (t / 8) * FOLD_PITCH + 16 * run);
        const u32 mag4 = ((1u << (ebits + mbits)) - 1) * 0x01010101u;
        const bool nz = ((v.x | v.y | v.z | v.w) & mag4) != 0;
        const int nz_pair = __shfl_xor_sync(0xffffffffu, (int)nz, 1);  // every lane (a short-circuited shuffle hangs)
        const bool live = (nz || nz_pair) && sc != 255 && r < rows && j < blocks;
        if (run % 2 == 0 && r < rows && j < blocks && sc == 255) {
            nan_rows[r] = 1;
            atomicOr(&info[2], 1);
        }
        int emax = live ? sc - 127 : -1000, emin = live ? sc - 127 : 1000;
        for (int o = 1; o < 8; o <<= 1) {
            emax = max(emax, __shfl_xor_sync(0xffffffffu, emax, o));
            emin = min(emin, __shfl_xor_sync(0xffffffffu, emin, o));
        }
        const bool any = emax >= emin;
        const bool whole = re >= -127 && (!any || (emax - re <= hi_shift && emin - re >= lo));
        const bool fold = whole || emax - emin <= hi_shift - lo;
        const int E = whole ? re : any ? min(max(emax - hi_shift, -127), 127) : 0;
        if (!fold && run == 0) folded[w] = 0;
        const int not_whole = !whole && r < rows;
        // elements: this lane's 16 codes (zeros in NaN / zero blocks)
        int nlost = 0;  // lossy: this lane's elements whose shift lost bits
        const u32 v4[4] = {v.x, v.y, v.z, v.w};
        u32 o[4] = {0, 0, 0, 0};
        if (r < rows && k0 + 16 * run < ldk) {
            const int d = fold ? sc - 127 - E : 0;
            const u8* tab = lut + (d - lo) * ncodes;
            if (live)
#pragma unroll
                for (int q = 0; q < 16; ++q) o[q / 4] |= (u32)tab[(v4[q / 4] >> (8 * (q % 4))) & 0xff] << (8 * (q % 4));
            *(uint4*)(elems + r * ldk + k0 + 16 * run) = make_uint4(o[0], o[1], o[2], o[3]);
            if (lossy && live && d != 0) {  // the bits the shift lost: how many of this lane's 16
                const float* const rtab = rest + (d - lo) * ncodes;
#pragma unroll
                for (int q = 0; q < 16; ++q) nlost += f32_nonzero(rtab[(v4[q / 4] >> (8 * (q % 4))) & 0xff]);
            }
        }
        if (lossy) {  // each as a {k, lo} entry of its row's list
            if (nlost) {
                const float* const rtab = rest + (sc - 127 - E - lo) * ncodes;  // (d = sc - 127 - E: nlost > 0)
                for (int q = 0; q < 16; ++q) {
                    const float rb = rtab[(v4[q / 4] >> (8 * (q % 4))) & 0xff];
                    if (!f32_nonzero(rb)) continue;
                    const int k = k0 + 16 * run + q;
                    const int pos = atomicAdd(&lo_cnt[r], 1);
                    if (pos < cap)
                        lo_ent[(i64)r * cap + pos] = make_int2(k, __float_as_int(rb));
                    else
                        info[4] = 1;
                }
            }
        }
        if (el_t != nullptr) {  // lossy, or the partner of a lossy operand: the elements once more, transposed ([k][row],
            // ldt bytes per k; zeros past rows): mx_lo_fix reads a k's codes of 32 consecutive rows as one 32-byte run
            __syncthreads();  // every lane has read its run of the tile
            *(uint4*)(tile + (t / 8) * FOLD_PITCH + 16 * run) = make_uint4(o[0], o[1], o[2], o[3]);
            __syncthreads();
            const int kt = t / 2, rh = 16 * (t % 2);
            u32 q4[4] = {0, 0, 0, 0};
#pragma unroll
            for (int q = 0; q < 16; ++q) q4[q / 4] |= (u32)tile[(rh + q) * FOLD_PITCH + kt] << (8 * (q % 4));
            *(uint4*)(el_t + (i64)(k0 + kt) * ldt + r0 + rh) = make_uint4(q4[0], q4[1], q4[2], q4[3]);
        }
        // factors (one lane per block): the window's 2^E on all 4 blocks (folded), else each live block's own code
        if (run % 2 == 0 && r < rows_pad) {
            const int code = fold ? (any || whole ? E + 127 : 127) : (live ? sc : 127);
            if (fold ? any : live) {
                lo_enc = max(lo_enc, 255 - code);
                hi = max(hi, code);
            }
            put_factor(out, ld, role, r, j, code);
        }
        some_not_whole |= not_whole;
        __syncthreads();
    }
    if (__syncthreads_or(some_not_whole) && threadIdx.x == 0) info[3] = 1;
    reduce_info(lo_enc, hi, 0, info);
}

// mx_sm90_fold's lossy lists, each row's entries ordered by k (distinct in a row): a warp per row, each lane ranks
// its entries (up to 2 per lane: cap <= 64) against all of the row's and writes them at their rank
extern "C" __global__ void __launch_bounds__(256)
mx_sm90_lo_sort(int rows, int cap, const int* __restrict__ lo_cnt, int2* __restrict__ lo_ent) {
    __shared__ int2 buf[8][64];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int r = blockIdx.x * 8 + warp; r < rows; r += gridDim.x * 8) {
        const int n = min(lo_cnt[r], cap);
        if (n < 2) continue;
        int2* const e = lo_ent + (i64)r * cap;
        for (int i = lane; i < n; i += 32) buf[warp][i] = e[i];
        __syncwarp();
        for (int i = lane; i < n; i += 32) {
            const int2 x = buf[warp][i];
            int rank = 0;
            for (int j = 0; j < n; ++j) rank += buf[warp][j].x < x.x;
            e[rank] = x;
        }
        __syncwarp();
    }
}

// one exponent per row for mx_sm90_fold: row_e[r] = E + 127 with E = max(e) - hi (clamped to [-127, 127]) when the
// row's scale codes other than 0x00 / 0xFF span at most hi - lo binades (127 when it has none), else -1; and every
// window's folded flag set to 1 (mx_sm90_fold clears it)
extern "C" __global__ void __launch_bounds__(256)
mx_sm90_fold_rows(const u8* __restrict__ scales, i64 ss_r, i64 ss_j, int rows, int blocks, int lo, int hi_shift,
                  int* __restrict__ row_e, u8* __restrict__ folded, int windows, const int* __restrict__ only_if,
                  int* __restrict__ info, int* __restrict__ lo_cnt) {
    if (only_if != nullptr) {  // the lossless rerun of a lossy fold whose lists overflowed (info[4] = 1): start over
        if (*only_if == 0) return;
        if (blockIdx.x == 0 && threadIdx.x < 6 && threadIdx.x != 4) info[threadIdx.x] = 0;
        for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) lo_cnt[r] = 0;
    }
    const int lane = threadIdx.x % 32, warps = gridDim.x * blockDim.x / 32;
    for (int w = blockIdx.x * blockDim.x + threadIdx.x; w < windows; w += gridDim.x * blockDim.x) folded[w] = 1;
    for (int r = (blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {  // a warp per row
        int emax = -1000, emin = 1000;
        for (int j = lane; j < blocks; j += 32) {
            const int sc = scales[r * ss_r + j * ss_j];
            if (sc == 0 || sc == 255) continue;
            emax = max(emax, sc - 127);
            emin = min(emin, sc - 127);
        }
        for (int o = 16; o > 0; o >>= 1) {
            emax = max(emax, __shfl_xor_sync(0xffffffffu, emax, o));
            emin = min(emin, __shfl_xor_sync(0xffffffffu, emin, o));
        }
        if (lane == 0)
            row_e[r] = emax < emin ? 127 : emax - emin <= hi_shift - lo ? min(max(emax - hi_shift, -127), 127) + 127 : -1;
    }
}

// An fp8 code's value into v (format fmt = ebits | mbits << 4 | bias << 8 | specials << 16, specials as in
// fp8_plain); false for zeros and NaN / inf (no term to add: see mx_lo_fix)
__device__ __forceinline__ bool fp8_term_value(u32 c, int fmt, float& v) {
    const int ebits = fmt & 15, mbits = (fmt >> 4) & 15, bias = (fmt >> 8) & 255, specials = fmt >> 16;
    if (fp8_plain(c, ebits, mbits, specials)) return false;
    v = fp8_code_value(c, ebits, mbits, bias);
    return true;
}

// The bits a lossy MXFP8 fold (mx_sm90_fold) took off the elements, added to the GEMM's fp32 result after it: the
// GEMM gave A_hi B_hi (times the block factors); this adds A_lo (B_hi + B_lo) and then A_hi B_lo, from the sorted
// lists {k, lo} per row of A / column of B (folded units) and the folded elements transposed (el_t: [k][row]), each
// term an exact product (a few bits) times its two block factors 2^(ea + eb) (mx_term), added in fp32 in list
// order: per element its row's entries, then its column's.  Terms whose element in the other operand is 0 or NaN /
// inf are left out (the GEMM's product of that element with hi, which is never 0 where the element is not and
// keeps its sign, is already the reference's).  A block per 32 x 256 tile of C, held in shared memory (cp.async),
// in three phases between barriers, each element owned by one thread per phase:
//   * prologue: the rows' entries flattened in row then list order (warp 0 scans the rows' counts, then thread i
//     loads entry i, up to FIX_LIST), the columns' entries flattened in column then list order (a block scan of
//     the counts, up to FIX_CLIST) with each entry's run of A's codes at its k for the tile's 32 rows (32 bytes,
//     cp.async); then griddepcontrol.wait and the tile of C (cp.async).  The host launches it with programmatic
//     dependent launch: its blocks may start on the SMs that the GEMM's blocks leave and run the prologue (which
//     reads only what the staging wrote before the GEMM) while the GEMM finishes; every thread waits for the GEMM
//     before it reads C, and before it exits (a kernel after it sees the GEMM's writes complete too);
//   * rows: a thread per column adds the rows' entries against its column's codes of B at k (FIX_GROUP loaded at
//     once; entries past the list are read from global memory), B_lo from its column's first two entries held in
//     registers (the list beyond them from global memory);
//   * columns: a warp per listed column, a lane per row, adds the column's entries against the runs (a column past
//     the shared list is added by its own thread at the end of the rows' phase, from global memory).
// Element codes are decoded through per-block tables (0 for the codes that add nothing).  src (fp32, row pitch
// lds) is read, dst (ldd; out_kind 0 fp32, 1 fp16, 2 bf16) written; in place (src == dst, fp32) tiles without
// entries are left as they are.  fmt_a / fmt_b: the elements' formats (fp8_term_value); folded: 1 when both
// operands are folded (mx_sm90_fold; else info[3] means nothing).  Five blocks per SM (48 registers, 44.5 KB of
// shared memory each).
#define FIX_ROWS 32
#define FIX_COLS 256
#define FIX_PITCH (FIX_COLS + 1)  // a tile row in shared memory: a column's 32 rows fall in 32 banks
#define FIX_LIST 128              // the rows' entries held in shared memory
#define FIX_CLIST 128             // the columns' entries held in shared memory (five blocks per SM)
#define FIX_GROUP 8               // the rows' entries whose codes of B one thread loads at once
// one fp32 element from global to shared memory (cp.async; 0 where `in` is false), and the wait for all of a
// thread's copies (16-byte ones: cp_async.cuh)
__device__ __forceinline__ void cp_async_f32(float* dst, const float* src, bool in) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_u32(dst)), "l"(in ? src : nullptr),
                 "r"(in ? 4 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

struct FixSmem {
    float tile[FIX_ROWS][FIX_PITCH];
    float val_a[256], val_b[256];  // the codes' values (0: no term)
    int4 list[FIX_LIST];           // the rows' entries: {k, lo bits, row in the tile, A's factor}
    int2 clist[FIX_CLIST];         // the columns' entries {k, lo bits}
    uint4 runs[FIX_CLIST][2];      // A's codes at each column entry's k, the tile's 32 rows
    int4 groups[FIX_CLIST];        // per listed column: {column in the tile, first entry, count, B's factor or pos}
    int ra[FIX_ROWS];              // the rows' first block factor
    int wsum[8], gcnt[8];          // the column scan's warp sums, the listed columns per warp
    int roff[FIX_ROWS];            // where each row's entries start in the rows' list
    int total;                     // the rows' entries
};

// what the phases read besides shared memory (one thread's column)
struct FixArgs {
    const int2* my;   // this column's entries (nb of them; e0, e1 the first two, k = -1 where absent)
    int nb;
    int2 e0, e1;
    bool listed;      // this column's entries are in the shared list
    int m0, t, col;
    bool on;
    int cf0, pc;
    const int* fac_a;
    i64 ld_fa;
    const int* fac_b;
    i64 ld_fb;
    int cap;
    const int2* ent_a;
    const u8* elt_a;
    i64 ldt_a;
    const u8* elt_b;
    i64 ldt_b;
    bool fast, whole;
};

// acc + s * 2^(ea + eb) (ra, cf: the factors' bits); SIMPLE: the fast form (mx_term) known
template <bool SIMPLE>
__device__ __forceinline__ float fix_add(float acc, float s, int ra, int cf, bool fast) {
    return mx_term(acc, s, ra, cf, SIMPLE || fast);
}

// B_lo of the thread's column at k (its list sorted by k: the first two entries in registers)
__device__ __forceinline__ float fix_own_lo(const FixArgs& f, int k) {
    float lo = f32_add(k == f.e0.x ? __int_as_float(f.e0.y) : 0.f, k == f.e1.x ? __int_as_float(f.e1.y) : 0.f);
    if (f.nb > 2 && k > f.e1.x) lo = lo_at(f.my + 2, f.nb - 2, k);
    return lo;
}

// the rows' phase: the rows' entries, in row then list order, against the thread's column, then (a column past the
// shared list) the column's own entries.  SIMPLE: every factor pair in the fast form, one factor per row / column.
template <bool SIMPLE>
__device__ __forceinline__ void fix_rows(FixSmem& s, const FixArgs& f) {
    const bool whole = SIMPLE || f.whole;
    const int t = f.t, total = s.total, listed = min(total, FIX_LIST);
    for (int i0 = 0; f.on && i0 < listed; i0 += FIX_GROUP) {
        u32 code[FIX_GROUP];
#pragma unroll
        for (int j = 0; j < FIX_GROUP; ++j)
            code[j] = i0 + j < listed ? f.elt_b[(i64)s.list[i0 + j].x * f.ldt_b + f.col]
                                      : 0;
#pragma unroll
        for (int j = 0; j < FIX_GROUP; ++j) {
            if (i0 + j >= listed) break;
            const int4 en = s.list[i0 + j];
            const float bh = s.val_b[code[j]];
            const float b = f32_add(bh, fix_own_lo(f, en.x));  // exact in fp32
            float& x = s.tile[en.z][t];
            const float y = fix_add<SIMPLE>(x, f32_mul(__int_as_float(en.y), b), en.w,
                                            whole ? f.cf0 : f.fac_b[(en.x >> 5) * f.ld_fb + f.pc], f.fast);
            if (f32_nonzero(bh)) x = y;
        }
    }
    if (f.on && total > FIX_LIST) {  // the entries past the list, from global memory (rows past the list's end)
        for (int r = 0; r < FIX_ROWS; ++r) {  // row r's entries: [roff[r], the next row's start) of the flattened order
            const int m = f.m0 + r, beg = s.roff[r], end = r + 1 < FIX_ROWS ? s.roff[r + 1] : total;
            for (int i = max(FIX_LIST, beg); i < end; ++i) {
                const int2 en = f.ent_a[(i64)m * f.cap + i - beg];
                const int k = en.x, blk = k >> 5;
                const float bh = s.val_b[f.elt_b[(i64)k * f.ldt_b + f.col]];
                if (!f32_nonzero(bh)) continue;
                const float b = f32_add(bh, fix_own_lo(f, k));  // exact in fp32
                s.tile[r][t] = fix_add<SIMPLE>(s.tile[r][t], f32_mul(__int_as_float(en.y), b),
                                               whole ? s.ra[r] : f.fac_a[(i64)m * f.ld_fa + blk],
                                               whole ? f.cf0 : f.fac_b[blk * f.ld_fb + f.pc], f.fast);
            }
        }
    }
    for (int e = 0; !f.listed && e < f.nb; ++e) {  // a column past the shared list: its own entries, A_hi * lo
        const int2 en = f.my[e];
        const int k = en.x, blk = k >> 5;
        const float lo = __int_as_float(en.y);
        const int cf = whole ? f.cf0 : f.fac_b[blk * f.ld_fb + f.pc];
        const u8* const run = f.elt_a + (i64)k * f.ldt_a + f.m0;
        for (int r = 0; r < FIX_ROWS; ++r) {
            const float a = s.val_a[run[r]];  // 0: no term (rows past M hold 0)
            if (f32_nonzero(a))
                s.tile[r][t] = fix_add<SIMPLE>(s.tile[r][t], f32_mul(a, lo),
                                               whole ? s.ra[r] : f.fac_a[(i64)(f.m0 + r) * f.ld_fa + blk], cf, f.fast);
        }
    }
}

// the columns' phase: warp w adds listed columns w, w + 8, ... (their entries in list order), lane r row r
template <bool SIMPLE>
__device__ __forceinline__ void fix_cols(FixSmem& s, const FixArgs& f, int groups) {
    const bool whole = SIMPLE || f.whole;
    const int r = f.t & 31, mr = f.m0 + r, ra = s.ra[r];
    for (int g = f.t >> 5; g < groups; g += 8) {
        const int4 gr = s.groups[g];  // {column, first entry, count, B's factor (whole) or its position}
        float x = s.tile[r][gr.x];
        for (int e = gr.y; e < gr.y + gr.z; ++e) {
            const int2 en = s.clist[e];
            const float a = s.val_a[((const u8*)s.runs[e])[r]];  // 0: no term (rows past M hold 0)
            const float lo = __int_as_float(en.y);
            if (SIMPLE) {  // a select, not a branch
                const float y = fix_add<true>(x, f32_mul(a, lo), ra, gr.w, true);
                if (f32_nonzero(a)) x = y;
            } else if (f32_nonzero(a)) {
                const int blk = en.x >> 5;
                x = mx_term(x, f32_mul(a, lo), whole ? ra : f.fac_a[(i64)mr * f.ld_fa + blk],
                            whole ? gr.w : f.fac_b[blk * f.ld_fb + gr.w], f.fast);
            }
        }
        s.tile[r][gr.x] = x;
    }
}

extern "C" __global__ void __launch_bounds__(256, 5)
mx_lo_fix(const float* __restrict__ src, i64 lds, void* __restrict__ dst, i64 ldd, int out_kind, int M, int N,
          const int* __restrict__ info_a, const int* __restrict__ info_b, const int* __restrict__ fac_a, i64 ld_fa,
          const int* __restrict__ fac_b, i64 ld_fb, int cap, const int* __restrict__ cnt_a,
          const int2* __restrict__ ent_a, const u8* __restrict__ elt_a, i64 ldt_a, int fmt_a,
          const int* __restrict__ cnt_b, const int2* __restrict__ ent_b, const u8* __restrict__ elt_b, i64 ldt_b,
          int fmt_b, int folded) {
    __shared__ FixSmem s;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int m0 = blockIdx.y * FIX_ROWS, col = blockIdx.x * FIX_COLS + t;
    const bool on = col < N;
    // every load that does not depend on the GEMM first: the counts, this column's first two entries
    const int rows = min(FIX_ROWS, M - m0);
    const int nb = cnt_b != nullptr && on ? min(cnt_b[col], cap) : 0;
    const int m = m0 + t;
    const int na = cnt_a != nullptr && t < FIX_ROWS && m < M ? min(cnt_a[m], cap) : 0;
    const int2* const my = ent_b + (i64)col * cap;
    const int2 none = make_int2(-1, 0), e0 = nb > 0 ? my[0] : none, e1 = nb > 1 ? my[1] : none;
    const bool whole = folded && info_a[3] == 0 && info_b[3] == 0;  // one factor per row / column over all of K
    const bool fast = mx_fast_pair(info_a, info_b);
    const int pc = fac_b_pos(col);
    const int cf0 = on ? fac_b[pc] : 0;
    // the columns' entries: offsets in the shared list (an inclusive scan of the counts, clamped: bits 0-16) and
    // the listed columns' numbers (of the columns with entries: bits 17-)
    const int own = min(nb, FIX_CLIST + 1) | (nb > 0) << 17;
    int incl = own;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31) s.wsum[warp] = incl;
    if (t < 32) {  // warp 0 (row t): where its entries start in the flattened list (a scan)
        s.ra[t] = m < M ? fac_a[(i64)m * ld_fa] : 0;
        int rincl = na;
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, rincl, o);
            if (t >= o) rincl += y;
        }
        s.roff[t] = rincl - na;
        if (t == 31) s.total = rincl;
    }
    float x;
    s.val_a[t] = fp8_term_value(t, fmt_a, x) ? x : 0.f;
    s.val_b[t] = fp8_term_value(t, fmt_b, x) ? x : 0.f;
    __syncthreads();
    for (int w = 0; w < warp; ++w) incl += s.wsum[w];
    const int excl = incl - own, beg = excl & 0x1ffff;
    const bool listed = (incl & 0x1ffff) <= FIX_CLIST;  // so are the columns before it
    const u32 in_list = __ballot_sync(0xffffffffu, listed && nb > 0);
    if (lane == 0) s.gcnt[warp] = __popc(in_list);
    if (t < min(s.total, FIX_LIST)) {  // entry t of the rows' list: its row (the last whose entries start at or
        int r = 0;                       // before t: rows without entries share the next one's start)
#pragma unroll
        for (int step = 16; step; step >>= 1)
            if (s.roff[r + step] <= t) r += step;  // r + step <= 31
        const i64 mr = m0 + r;
        const int2 en = ent_a[mr * cap + t - s.roff[r]];
        s.list[t] = make_int4(en.x, en.y, r, whole ? s.ra[r] : fac_a[mr * ld_fa + (en.x >> 5)]);
    }
    if (listed && nb > 0) {
        s.groups[excl >> 17] = make_int4(t, beg, nb, whole ? cf0 : pc);
        for (int e = 0; e < nb; ++e) {
            const int2 en = e == 0 ? e0 : e == 1 ? e1 : my[e];
            s.clist[beg + e] = en;
            const u8* const run = elt_a + (i64)en.x * ldt_a + m0;
            cp_async16_full(smem_u32(&s.runs[beg + e][0]), run);
            cp_async16_full(smem_u32(&s.runs[beg + e][1]), run + 16);
        }
    }
    const bool any = __syncthreads_or(nb != 0 || na != 0);
    griddep_wait();  // the GEMM's result is complete and visible from here on
    if (!any && (const void*)src == dst) return;
    const float* sp = src + (i64)m0 * lds + col;
#pragma unroll 8
    for (int r = 0; r < FIX_ROWS; ++r, sp += lds) cp_async_f32(&s.tile[r][t], sp, on && r < rows);
    cp_async_wait_all();
    __syncthreads();
    int groups = 0;
#pragma unroll
    for (int w = 0; w < 8; ++w) groups += s.gcnt[w];
    const FixArgs fa = {my, nb, e0, e1, listed, m0, t, col, on, cf0, pc, fac_a, ld_fa, fac_b, ld_fb, cap, ent_a,
                        elt_a, ldt_a, elt_b, ldt_b, fast, whole};
    if (fast && whole) {  // the common case, without the general factor's code in the loops
        fix_rows<true>(s, fa);
        __syncthreads();
        fix_cols<true>(s, fa, groups);
    } else {
        fix_rows<false>(s, fa);
        __syncthreads();
        fix_cols<false>(s, fa, groups);
    }
    __syncthreads();
    if (!on) return;
    if (out_kind == 0) {
        float* dp = (float*)dst + (i64)m0 * ldd + col;
#pragma unroll 8
        for (int r = 0; r < rows; ++r, dp += ldd) *dp = s.tile[r][t];
    } else {
        u16* dp = (u16*)dst + (i64)m0 * ldd + col;
#pragma unroll 8
        for (int r = 0; r < rows; ++r, dp += ldd)
            *dp = out_kind == 1 ? f32_to_f16(s.tile[r][t]) : f32_to_bf16(s.tile[r][t]);
    }
}
