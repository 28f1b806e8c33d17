// mxcore NVIDIA operand preparation: turn a user's operand (any strides, any float type, fp8/MX codes) into the
// buffer the GEMM kernel reads: row-major [rows][ld], K contiguous, 16-byte aligned rows, zero padding (the
// caller allocates zeroed buffers).  One rounding from the exact input value, as mxcore.reference does.
//
// Both kernels work on 32x32 tiles through shared memory, so reads are coalesced along whichever source axis is
// contiguous and writes along the destination row.  Launch: block (32, 8), grid (ceil(cols/32), ceil(rows/32))
// (mx_prep_float: times the batch in z).
//
// mx_prep_float: src kind 0 f64, 1 f32, 2 f16, 3 bf16 (bits)  ->  dst kind
//     0 f16 bits, 1 bf16 bits, 2 tf32 (fp32 storage, RNE to 10 mantissa bits),
//     3 the tf32 residual rne_tf32(x - rne_tf32(x)) (the "small" half of the 3xTF32 split; x rounded to fp32 first;
//       0 where rne_tf32(x) is inf or NaN), 5 rne_tf32(x) where finite, else 0 (the big half of the cross terms)
// mx_prep_codes: uint8 element codes (fp8 / fp6 / fp4, one per byte) with an optional E8M0 scale per 32 columns
//     -> dst kind 0 f16 bits, 1 bf16 bits (decoded value * 2^(scale - exp_bias)), or 4: the code byte itself.
// Exactness: every fp8/fp6/fp4 value times a power of two is exact in bf16 while the product stays in bf16's
// range (|v| < 2^128 and v a multiple of 2^-133); e4m3/e5m2 values are exact in f16 (no scale).  Outside that
// range the value is rounded once (RNE, overflow to inf); the backend picks exp_bias to keep blocks in range.

#include "mx_common.cuh"

// RNE of x to a binary format with `mbits` mantissa bits, minimum normal exponent `emin`, largest finite `maxv`
// (overflow rounds to inf, like IEEE).  Exact arithmetic in double.
__device__ __forceinline__ double round_fmt(double x, int mbits, int emin, double maxv) {
    const double ax = fabs(x);
    if (!(ax <= 1.7976931348623157e308) || ax == 0.0) return x;  // nan, inf, zero
    int e = ilogb(ax);
    if (e < emin) e = emin;
    const double q = ldexp(1.0, e - mbits);
    double r = rint(x / q) * q;
    const double lim = maxv + ldexp(1.0, ilogb(maxv) - mbits - 1);  // midpoint between maxv and the next step
    if (fabs(r) > maxv) r = (ax >= lim) ? copysign(__longlong_as_double(0x7ff0000000000000LL), x) : copysign(maxv, x);
    return r;
}

__device__ __forceinline__ float f16_bits_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// RNE of fp32 bits to tf32 (10 mantissa bits) in integer arithmetic; overflow carries into inf as IEEE does.
__device__ __forceinline__ u32 f32_bits_to_tf32(u32 b) {
    if ((b & 0x7f800000u) == 0x7f800000u) return (b & 0x007fffffu) ? (b | 0x7fc00000u) : b;  // NaN stays NaN
    b += 0x0fffu + ((b >> 13) & 1u);
    return b & 0xffffe000u;
}

// value -> destination bits (as u32; 16-bit kinds use the low half)
__device__ __forceinline__ u32 encode_dst(double v, int dst_kind) {
    if (dst_kind == 0) {  // f16
        const double r = round_fmt(v, 10, -14, 65504.0);
        return f32_to_f16((float)r);  // exact: r has 11 significant bits in f16's range
    }
    if (dst_kind == 1) {  // bf16
        const double r = round_fmt(v, 7, -126, 3.3895313892515355e38);
        const float f = (float)r;
        if (f != f) return 0x7fc0u;
        return __float_as_uint(f) >> 16;  // exact: low 16 bits are zero
    }
    // tf32 kinds round through fp32 first, as mxcore.operands does (float64 -> float32 -> tf32)
    const float x = (float)v;
    const u32 big = f32_bits_to_tf32(__float_as_uint(x));
    if (dst_kind == 2) return big;
    // 3xTF32 parts where big is inf or NaN: the residual (3) and the big part of the cross terms (5) are 0, so the
    // sum big_a*big_b + big_a'*small_b + small_a*big_b' carries inf and NaN as IEEE x*y does (never inf*0 or
    // inf - inf from a split that does not exist)
    const bool special = (big & 0x7f800000u) == 0x7f800000u;
    if (dst_kind == 5) return special ? 0u : big;
    // 3: residual of the 3xTF32 split of the fp32 value (x - big is exact in fp32)
    if (special) return 0u;
    return f32_bits_to_tf32(__float_as_uint(x - __uint_as_float(big)));
}


// Single-rounding shortcuts for the common sources (identical results to encode_dst's exact double path):
// fp32 -> f16 / bf16 (cvt.rn, IEEE RNE with subnormals and overflow to inf), fp32 -> tf32 (integer RNE),
// f16 -> f16 and bf16 -> bf16 (bit copies).  Returns false when the double path must be used.
__device__ __forceinline__ bool fast_float(const void* src, int src_kind, i64 idx, int dst_kind, u32& bits) {
    if (src_kind == 1 && dst_kind <= 2) {
        const float f = ((const float*)src)[idx];
        bits = dst_kind == 0 ? f32_to_f16(f) : dst_kind == 1 ? f32_to_bf16(f) : f32_bits_to_tf32(__float_as_uint(f));
        return true;
    }
    if ((src_kind == 2 && dst_kind == 0) || (src_kind == 3 && dst_kind == 1)) {
        bits = ((const u16*)src)[idx];
        return true;
    }
    return false;
}

__device__ __forceinline__ double load_float(const void* src, int kind, i64 idx) {
    if (kind == 0) return ((const double*)src)[idx];
    if (kind == 1) return (double)((const float*)src)[idx];
    if (kind == 2) return (double)f16_bits_to_f32(((const u16*)src)[idx]);
    return (double)__uint_as_float(((u32)((const u16*)src)[idx]) << 16);
}

__device__ __forceinline__ void store_dst(void* dst, int dst_kind, i64 idx, u32 bits) {
    if (dst_kind <= 1)
        ((u16*)dst)[idx] = (u16)bits;
    else if (dst_kind == 4)
        ((u8*)dst)[idx] = (u8)bits;
    else
        ((u32*)dst)[idx] = bits;
}

// dst[z * d_b + i * ld + col_off + j] = encode(src[z * s_b + i * s_r + j * s_c]) for i < rows, j < cols and batch
// element z = blockIdx.z.  src_row_fast: the source is contiguous along i (read with threadIdx.x along i).
extern "C" __global__ void __launch_bounds__(256)
mx_prep_float(const void* __restrict__ src, int src_kind, int rows, int cols, i64 s_r, i64 s_c, int src_row_fast,
              void* __restrict__ dst, int dst_kind, i64 ld, i64 col_off, i64 s_b, i64 d_b) {
    __shared__ u32 tile[32][33];
    const int i0 = blockIdx.y * 32, j0 = blockIdx.x * 32;
    const i64 zs = blockIdx.z * s_b, zd = blockIdx.z * d_b;
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int r = ty; r < 32; r += 8) {
        const int i = src_row_fast ? i0 + tx : i0 + r;
        const int j = src_row_fast ? j0 + r : j0 + tx;
        if (i < rows && j < cols) {
            const i64 idx = zs + i * s_r + j * s_c;
            u32 bits;
            if (!fast_float(src, src_kind, idx, dst_kind, bits)) bits = encode_dst(load_float(src, src_kind, idx), dst_kind);
            if (src_row_fast) tile[tx][r] = bits; else tile[r][tx] = bits;
        }
    }
    __syncthreads();
    for (int r = ty; r < 32; r += 8) {
        const int i = i0 + r, j = j0 + tx;
        if (i < rows && j < cols) store_dst(dst, dst_kind, zd + i * ld + col_off + j, tile[r][tx]);
    }
}

// decode one element code of a (1, ebits, mbits) format with exponent bias `bias`.
// special: 0 no inf/nan (fp6, fp4), 1 "fn" (all-ones exponent and mantissa = NaN: e4m3fn), 2 IEEE-like (e5m2)
__device__ __forceinline__ double decode_code(u32 code, int ebits, int mbits, int bias, int special) {
    const u32 mmask = (1u << mbits) - 1u, emask = (1u << ebits) - 1u;
    const u32 m = code & mmask, e = (code >> mbits) & emask, s = (code >> (ebits + mbits)) & 1u;
    const double nan = __longlong_as_double(0x7ff8000000000000LL);
    if (special == 1 && e == emask && m == mmask) return nan;
    if (special == 2 && e == emask) return m ? nan : (s ? -1.0 : 1.0) * __longlong_as_double(0x7ff0000000000000LL);
    double v = e == 0 ? ldexp((double)m, 1 - bias - mbits) : ldexp((double)((1u << mbits) + m), (int)e - bias - mbits);
    return s ? -v : v;
}

__device__ __forceinline__ u32 scaled_bits(u32 tv, u32 sc, int exp_bias, int dst_kind) {
    if (sc == 255u) return dst_kind == 0 ? 0x7e00u : 0x7fc0u;
    const int e = (int)sc - exp_bias;
    const float v = __uint_as_float(tv);
    if (e >= -126 && e <= 127) {
        const float f = v * __uint_as_float((u32)(e + 127) << 23);
        return dst_kind == 0 ? f32_to_f16(f) : f32_to_bf16(f);
    }
    return encode_dst(ldexp((double)v, e), dst_kind);
}

// dst[i * ld + col_off + j] from codes[i * s_r + j * s_c] and, if scales != 0, the E8M0 scale
// scales[i * ss_r + (j / 32) * ss_c]: value = decode(code) * 2^(scale - exp_bias)  (scale 255 = NaN).  exp_bias_at:
// when not null, exp_bias is read there (a device MXTensor's uint8 scale_max: no host read).
// Each block first decodes all 256 codes into a shared table (exact fp32 values, or the final bits when there
// are no scales); with a scale, v * 2^e is formed in fp32 (exact: <= 4 significant bits and e >= -126 keep it
// above 2^-149) and rounded once by cvt.rn; e outside [-126, 127] takes the exact double path.
extern "C" __global__ void __launch_bounds__(256)
mx_prep_codes(const u8* __restrict__ codes, int rows, int cols, i64 s_r, i64 s_c, int src_row_fast,
              const u8* __restrict__ scales, i64 ss_r, i64 ss_c, int exp_bias, const u8* __restrict__ exp_bias_at,
              int ebits, int mbits, int bias, int special, void* __restrict__ dst, int dst_kind, i64 ld, i64 col_off) {
    if (exp_bias_at) exp_bias = *exp_bias_at;
    __shared__ u32 tile[32][33];
    __shared__ u32 table[256];
    const int tx = threadIdx.x, ty = threadIdx.y;
    {
        const u32 code = ty * 32 + tx;
        const double v = decode_code(code, ebits, mbits, bias, special);
        table[code] = dst_kind == 4 ? code : (scales ? __float_as_uint((float)v) : encode_dst(v, dst_kind));
    }
    __syncthreads();
    const int i0 = blockIdx.y * 32, j0 = blockIdx.x * 32;
    for (int r = ty; r < 32; r += 8) {
        const int i = src_row_fast ? i0 + tx : i0 + r;
        const int j = src_row_fast ? j0 + r : j0 + tx;
        if (i < rows && j < cols) {
            u32 bits = table[codes[i * s_r + j * s_c]];
            if (scales && dst_kind != 4) bits = scaled_bits(bits, scales[i * ss_r + (j / 32) * ss_c], exp_bias, dst_kind);
            if (src_row_fast) tile[tx][r] = bits; else tile[r][tx] = bits;
        }
    }
    __syncthreads();
    for (int r = ty; r < 32; r += 8) {
        const int i = i0 + r, j = j0 + tx;
        if (i < rows && j < cols) store_dst(dst, dst_kind, i * ld + col_off + j, tile[r][tx]);
    }
}

// mx_transpose_bytes: dst (C x R bytes, row stride ldd) = transpose of src (R x C bytes, row stride lds); R and C
// multiples of 64, rows 16-byte aligned.  fp8 codes staged K-major for the fp8 GEMM (B arrives K x N).  A block
// moves one 64 x 64 byte tile: 16-byte loads and stores, the byte shuffle through shared memory.
extern "C" __global__ void __launch_bounds__(256)
mx_transpose_bytes(const u8* __restrict__ src, int R, int C, i64 lds, u8* __restrict__ dst, i64 ldd) {
    __shared__ u32 tile[64][17];  // 64 source rows of 16 words (+1 against bank conflicts)
    const int t = threadIdx.x;
    const int r0 = blockIdx.y * 64, c0 = blockIdx.x * 64;
    if (r0 >= R || c0 >= C) return;
    {
        const int r = t >> 2, q = (t & 3) * 4;
        const uint4 v = *(const uint4*)(src + (i64)(r0 + r) * lds + c0 + q * 4);
        tile[r][q] = v.x;
        tile[r][q + 1] = v.y;
        tile[r][q + 2] = v.z;
        tile[r][q + 3] = v.w;
    }
    __syncthreads();
    const int j = t >> 2, rb = (t & 3) * 16;  // destination row c0 + j, bytes from source rows rb .. rb + 15
    const int word = j >> 2, shift = (j & 3) * 8;
    u32 w[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        u32 acc = 0;
#pragma unroll
        for (int b = 0; b < 4; ++b) acc |= ((tile[rb + q * 4 + b][word] >> shift) & 0xffu) << (8 * b);
        w[q] = acc;
    }
    *(uint4*)(dst + (i64)(c0 + j) * ldd + r0 + rb) = make_uint4(w[0], w[1], w[2], w[3]);
}

// Split-K epilogue: C[i, j] = convert(2^e * sum_z ws[z * slice + i * N + j]), z in order (deterministic); e as in
// the GEMM (exp0, exp_a, exp_b, exp_u8: mx_common.cuh out_scale).  out_kind 0 fp32, 1 fp16, 2 bf16.  Grid-stride
// loop over M * N.
extern "C" __global__ void __launch_bounds__(256)
mx_splitk_reduce(const float* __restrict__ ws, int splits, i64 slice, void* __restrict__ C, int M, int N, i64 ldc,
                 int exp0, const void* __restrict__ exp_a, const void* __restrict__ exp_b, int exp_u8, int out_kind) {
    const float alpha = out_scale(exp0, exp_a, exp_b, exp_u8);
    const i64 total = (i64)M * N;
    for (i64 t = blockIdx.x * (i64)blockDim.x + threadIdx.x; t < total; t += (i64)gridDim.x * blockDim.x) {
        float acc = 0.f;
        for (int z = 0; z < splits; ++z) acc = f32_add(acc, ws[z * slice + t]);  // IEEE: subnormal sums kept
        const float v = f32_mul(acc, alpha);
        const i64 i = t / N, j = t % N, o = i * ldc + j;
        if (out_kind == 0)
            ((float*)C)[o] = v;
        else
            ((u16*)C)[o] = out_kind == 1 ? f32_to_f16(v) : f32_to_bf16(v);
    }
}

// Elementwise decode without transposition (the 16-bit GEMM reads either majorness): dst[e] for the contiguous
// [rows][cols] code array, 8 codes per thread (8-byte loads, 16-byte stores; cols % 8 == 0).  table[code]: the
// destination bits (no scales) or the exact fp32 value of the code (with scales, applied as in mx_prep_codes).
// exp_bias / exp_bias_at as in mx_prep_codes.
// Element (i, j) reads scale scales[(i / bi) * s_i + (j / bj) * s_j]: (bi, bj) = (1, 32) for A, (32, 1) for B
// (B: s_j == 1 and s_i % 8 == 0, so a thread's 8 scales are one aligned 8-byte load).
extern "C" __global__ void __launch_bounds__(256)
mx_decode_codes(const u8* __restrict__ codes, int rows, int cols, const u32* __restrict__ table,
                const u8* __restrict__ scales, int bi, int bj, i64 s_i, i64 s_j, int exp_bias,
                const u8* __restrict__ exp_bias_at, int dst_kind, u16* __restrict__ dst) {
    if (exp_bias_at) exp_bias = *exp_bias_at;
    const i64 chunks = (i64)rows * cols / 8;
    for (i64 t = blockIdx.x * (i64)blockDim.x + threadIdx.x; t < chunks; t += (i64)gridDim.x * blockDim.x) {
        const i64 e0 = t * 8;
        const int i = (int)(e0 / cols), j0 = (int)(e0 % cols);
        const unsigned long long raw = *(const unsigned long long*)(codes + e0);
        // the 8 elements' scales: one shared byte (A: blocks of 32 along the row) or 8 consecutive bytes (B)
        unsigned long long sc8 = 0;
        if (scales) {
            if (bj == 32) {
                sc8 = 0x0101010101010101ull * scales[(i / bi) * s_i + (j0 / 32) * s_j];
            } else {
                sc8 = *(const unsigned long long*)(scales + (i / bi) * s_i + j0 * s_j);
            }
        }
        u32 out[4];
#pragma unroll
        for (int h = 0; h < 4; ++h) {
            u32 pair = 0;
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const int x = 2 * h + q;
                u32 bits = __ldg(table + ((raw >> (8 * x)) & 0xffu));
                if (scales) bits = scaled_bits(bits, (u32)((sc8 >> (8 * x)) & 0xffu), exp_bias, dst_kind);
                pair |= (bits & 0xffffu) << (16 * q);
            }
            out[h] = pair;
        }
        *(uint4*)(dst + e0) = make_uint4(out[0], out[1], out[2], out[3]);
    }
}
