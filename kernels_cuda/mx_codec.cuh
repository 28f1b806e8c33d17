// mx_codec.cuh: mxcore's number-format codecs on the GPU, one source for NVIDIA (NVRTC) and AMD (hiprtc,
// clang-22).  Encode (one rounding from the exact input value), decode, OCP-MX block quantization (codes and
// E8M0 scales in one pass), per-tensor power-of-two fp8 scaling (one amax reduction, the exponent kept on the
// device), dequantization, fp4/fp6 packing.  The rules are mxcore.formats' and mxcore.mx's, bit for bit; the
// GPU tests compare every kernel with the numpy path.  OCP-MX quantization has two kernels:
// mx_quantize_mx_fast_* (two lanes per contiguous block of 32, 16-byte loads/stores, one float rounding per
// element) and mx_quantize_mx_* (one thread per block, any layout); backends/codec.py picks one per call.
//
// The format is compile-time data: backends/codec.py turns a mxcore.formats.FormatSpec into -D defines
// (MXF_BITS, MXF_EBITS, MXF_MBITS, MXF_BIAS, MXF_EMIN, MXF_EMAX, MXF_SIGNED, MXF_SUBNORMALS, MXF_SPECIALS
// (0 ieee, 1 fn, 2 fnuz, 3 none), MXF_HAS_INF, MXF_HAS_NAN, MXF_NAN_CODE, MXF_INF_CODE, MXF_MAX_MAGCODE,
// MXF_MAXSIG (max normal's integer significand), MXF_CODE_T); nothing here restates a format.  Without
// MXF_BITS only the format-free kernels (packing) are compiled.
//
// Exactness: every input (float32, float16, bfloat16, float64) is split into sign, an integer significand S
// and an exponent E with value S * 2^E, exactly, by integer operations on its bits; a power-of-two scale only
// moves E.  Rounding works on S's bits (remainder against the half quantum), so there is no intermediate
// float rounding anywhere, for float64 inputs too (64-bit significands).  The fast MX quantizer instead rounds
// with one float32 add whose result is provably the same (see its comment).
//
// Vendor differences are confined to the shim below (count-leading-zeros, atomics, bit casts, non-contracted
// float ops, the lane-pair exchange, CTA-level staging).  Launch: 1-D grids of MXC_THREADS threads (from the host,
// backends/codec_runtime.py; blockDim and gridDim are not read, so the same code runs under hip_shim.h).
//
// Three builds: CUDA (NVRTC), HIP (hiprtc, clang-22), and the host (MXC_HOST defined as 1: a plain C++ build for
// CPU tests; tests/test_codec_compile.py runs the kernels' arithmetic on the host, one thread at a time, against
// numpy; its harness maps __device__, __shared__, threadIdx, __syncthreads ... to host forms).

#if defined(MXC_HOST)
#define MXC_HIP 0
#elif defined(__HIP__) || defined(__HIPCC__) || defined(__HIPCC_RTC__) || defined(__HIP_DEVICE_COMPILE__)
#define MXC_HOST 0
#define MXC_HIP 1
#else
#define MXC_HOST 0
#define MXC_HIP 0
#endif

typedef unsigned char mxc_u8;
typedef unsigned short mxc_u16;
typedef unsigned int mxc_u32;
typedef unsigned long long mxc_u64;
typedef long long mxc_i64;

// ---- vendor shim ---------------------------------------------------------------------------------------------
// bit length, float bits, non-contracted float arithmetic (each op rounds once, RNE), |x|, per-halfword unsigned
// max, byte permute: clang's builtins and plain C++ (host, HIP), or CUDA's intrinsics
#if MXC_HOST || MXC_HIP
__device__ __forceinline__ int mxc_bitlen(mxc_u32 x) { return x ? 32 - __builtin_clz(x) : 0; }
__device__ __forceinline__ int mxc_bitlen(mxc_u64 x) { return x ? 64 - __builtin_clzll(x) : 0; }
__device__ __forceinline__ mxc_u32 mxc_f2u(float f) { return __builtin_bit_cast(mxc_u32, f); }
__device__ __forceinline__ float mxc_u2f(mxc_u32 u) { return __builtin_bit_cast(float, u); }
__device__ __forceinline__ float mxc_fmul(float a, float b) { return a * b; }
__device__ __forceinline__ float mxc_fadd(float a, float b) { return a + b; }
__device__ __forceinline__ float mxc_fabs(float a) { return __builtin_fabsf(a); }
__device__ __forceinline__ mxc_u32 mxc_vmaxu2(mxc_u32 a, mxc_u32 b) {
    const mxc_u32 lo = (a & 0xffffu) > (b & 0xffffu) ? (a & 0xffffu) : (b & 0xffffu);
    const mxc_u32 hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
    return lo | (hi << 16);
}
// bytes of the 8-byte value b:a picked by the four selector nibbles of s (low nibble: result byte 0)
__device__ __forceinline__ mxc_u32 mxc_byte_perm(mxc_u32 a, mxc_u32 b, mxc_u32 s) {
    const mxc_u64 v = ((mxc_u64)b << 32) | a;
    mxc_u32 r = 0u;
    for (int i = 0; i < 4; ++i) r |= (mxc_u32)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
}
#else
__device__ __forceinline__ int mxc_bitlen(mxc_u32 x) { return 32 - __clz(x); }
__device__ __forceinline__ int mxc_bitlen(mxc_u64 x) { return 64 - __clzll((long long)x); }
__device__ __forceinline__ mxc_u32 mxc_f2u(float f) { return __float_as_uint(f); }
__device__ __forceinline__ float mxc_u2f(mxc_u32 u) { return __uint_as_float(u); }
__device__ __forceinline__ float mxc_fmul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float mxc_fadd(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float mxc_fabs(float a) { return fabsf(a); }
__device__ __forceinline__ mxc_u32 mxc_vmaxu2(mxc_u32 a, mxc_u32 b) { return __vmaxu2(a, b); }
__device__ __forceinline__ mxc_u32 mxc_byte_perm(mxc_u32 a, mxc_u32 b, mxc_u32 s) { return __byte_perm(a, b, s); }
#endif

// atomics (device scope, relaxed), float16 bits -> float32 exactly (subnormals included: the hardware conversion
// on the GPUs, integer operations in the host build, which may run with float32 subnormals flushed), the
// out-of-line function attribute, and `v` of the partner lane (lane ^ 1; every lane of the warp / wavefront
// executes this; the host build runs one thread at a time, so there it evaluates `partner()`: the partner lane's
// own computation of the value)
#if MXC_HOST
__device__ __forceinline__ void mxc_atomic_max(mxc_u32* p, mxc_u32 v) { *p = *p > v ? *p : v; }
__device__ __forceinline__ void mxc_atomic_max(mxc_u64* p, mxc_u64 v) { *p = *p > v ? *p : v; }
__device__ __forceinline__ void mxc_atomic_add(mxc_u32* p, mxc_u32 v) { *p += v; }
__device__ __forceinline__ float mxc_h2f(mxc_u16 h) {
    const mxc_u32 e = (h >> 10) & 0x1fu, m = h & 0x3ffu, sign = (mxc_u32)(h >> 15) << 31;
    if (e == 0) return mxc_u2f(mxc_f2u((float)m * mxc_u2f(103u << 23)) | sign);  // m * 2^-24: normal or 0
    return mxc_u2f(sign | ((e == 31 ? 0xffu : e + 112u) << 23) | (m << 13));
}
#define MXC_NOINLINE __attribute__((noinline))
template <class F>
__device__ __forceinline__ mxc_u32 mxc_lane_xor1(mxc_u32 v, F partner) {
    (void)v;
    return partner();
}
#elif MXC_HIP
__device__ __forceinline__ void mxc_atomic_max(mxc_u32* p, mxc_u32 v) {
    __hip_atomic_fetch_max(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
__device__ __forceinline__ void mxc_atomic_max(mxc_u64* p, mxc_u64 v) {
    __hip_atomic_fetch_max(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
__device__ __forceinline__ void mxc_atomic_add(mxc_u32* p, mxc_u32 v) {
    __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
__device__ __forceinline__ float mxc_h2f(mxc_u16 h) { return (float)__builtin_bit_cast(_Float16, h); }
#define MXC_NOINLINE __device__ __attribute__((noinline))
template <class F>
__device__ __forceinline__ mxc_u32 mxc_lane_xor1(mxc_u32 v, F partner) {
    (void)partner;
    return (mxc_u32)__builtin_amdgcn_mov_dpp((int)v, 0xB1, 0xF, 0xF, false);  // quad_perm [1,0,3,2]
}
#else
__device__ __forceinline__ void mxc_atomic_max(mxc_u32* p, mxc_u32 v) { atomicMax(p, v); }
__device__ __forceinline__ void mxc_atomic_max(mxc_u64* p, mxc_u64 v) {
    atomicMax((unsigned long long*)p, (unsigned long long)v);
}
__device__ __forceinline__ void mxc_atomic_add(mxc_u32* p, mxc_u32 v) { atomicAdd(p, v); }
__device__ __forceinline__ float mxc_h2f(mxc_u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
#define MXC_NOINLINE __device__ __noinline__
template <class F>
__device__ __forceinline__ mxc_u32 mxc_lane_xor1(mxc_u32 v, F partner) {
    (void)partner;
    return __shfl_xor_sync(0xffffffffu, v, 1);
}
#endif

// a per-CTA maximum staged in shared memory and folded into *global by one atomic per CTA (the host build, one
// thread at a time, folds straight into *global)
template <typename T>
__device__ __forceinline__ T* mxc_cta_max_begin(T* global) {
    if constexpr (MXC_HOST) {
        return global;
    } else {
        __shared__ T cta_max;
        if (threadIdx.x == 0) cta_max = 0;
        __syncthreads();
        return &cta_max;
    }
}
template <typename T>
__device__ __forceinline__ void mxc_cta_max_end(T* cta, T* global) {
    if constexpr (!MXC_HOST) {
        __syncthreads();
        if (threadIdx.x == 0 && *cta) mxc_atomic_max(global, *cta);
    }
}

// 16 bytes moved by one vector load/store (LDG.128 / global_load_dwordx4)
struct alignas(16) mxc_v16 {
    mxc_u32 w[4];
};

__device__ __forceinline__ mxc_i64 mxc_thread_index() {
    return (mxc_i64)blockIdx.x * MXC_THREADS + threadIdx.x;
}

// ---- input formats: bits type, significand type, field widths -------------------------------------------------
template <typename B, typename S, int EB, int MB>
struct MxcIn {
    typedef B bits_t;
    typedef S sig_t;
    static const int ebits = EB, mbits = MB, width = 8 * sizeof(B), bias = (1 << (EB - 1)) - 1;
};
typedef MxcIn<mxc_u32, mxc_u32, 8, 23> MxcF32;
typedef MxcIn<mxc_u16, mxc_u32, 5, 10> MxcF16;
typedef MxcIn<mxc_u16, mxc_u32, 8, 7> MxcBF16;
typedef MxcIn<mxc_u64, mxc_u64, 11, 52> MxcF64;

enum { MXC_ZERO = 0, MXC_FINITE = 1, MXC_INF = 2, MXC_NAN = 3 };

// bits -> class, sign, and (finite) value = s * 2^e exactly
template <class In>
__device__ __forceinline__ int mxc_split(typename In::bits_t b, bool& neg, int& e, typename In::sig_t& s) {
    typedef typename In::bits_t B;
    typedef typename In::sig_t S;
    neg = ((b >> (In::width - 1)) & 1) != 0;
    const int fld = (int)((b >> In::mbits) & (B)((1 << In::ebits) - 1));
    s = (S)(b & (((B)1 << In::mbits) - 1));
    if (fld == (1 << In::ebits) - 1) return s ? MXC_NAN : MXC_INF;
    if (fld == 0) {
        e = 1 - In::bias - In::mbits;
        return s ? MXC_FINITE : MXC_ZERO;
    }
    s |= (S)1 << In::mbits;
    e = fld - In::bias - In::mbits;
    return MXC_FINITE;
}

// magnitude bits (sign cleared) of the largest finite |x| compare as integers; non-finite ones are >= this
template <class In>
__device__ __forceinline__ typename In::bits_t mxc_inf_bits() {
    return (typename In::bits_t)(((typename In::bits_t)1 << In::ebits) - 1) << In::mbits;
}

// floor(log2(amax)) and whether amax's significand exceeds `maxsig` (an integer significand of `mbits`
// fraction bits): the two facts both MX scale rules and the per-tensor scale need.  amax > 0, finite.
template <class In>
__device__ __forceinline__ int mxc_log2_parts(typename In::bits_t amax, mxc_u64 maxsig, int mbits, bool& above) {
    bool neg;
    int e;
    typename In::sig_t s;
    mxc_split<In>(amax, neg, e, s);
    const int len = mxc_bitlen(s);
    const mxc_u64 sa = (mxc_u64)s << (64 - len);
    const mxc_u64 sm = maxsig << (63 - mbits);
    above = sa > sm;
    return e + len - 1;
}

// exact float32 / float64 bits of (neg ? -1 : 1) * s * 2^e, s < 2^24; values beyond the range give inf.
// Every value a codec produces is a short significand well inside the subnormal range (e >= -149).
__device__ __forceinline__ mxc_u32 mxc_f32_bits(bool neg, mxc_u32 s, int e) {
    const mxc_u32 sign = neg ? 0x80000000u : 0u;
    if (!s) return sign;
    const int len = mxc_bitlen(s);
    const int top = e + len - 1;
    if (top > 127) return sign | 0x7f800000u;
    if (top >= -126) return sign | ((mxc_u32)(top + 127) << 23) | ((s << (24 - len)) & 0x7fffffu);
    return sign | (s << (e + 149));
}
__device__ __forceinline__ mxc_u64 mxc_f64_bits(bool neg, mxc_u32 s, int e) {
    const mxc_u64 sign = neg ? 0x8000000000000000ull : 0ull;
    if (!s) return sign;
    const int len = mxc_bitlen(s);
    const int top = e + len - 1;
    return sign | ((mxc_u64)(top + 1023) << 52) | (((mxc_u64)s << (53 - len)) & 0xfffffffffffffull);
}
#define MXC_F32_NAN 0x7fc00000u
#define MXC_F64_NAN 0x7ff8000000000000ull

#ifdef MXF_BITS
// ---- the format (from -D defines generated from a FormatSpec) --------------------------------------------------
typedef MXF_CODE_T mxc_code_t;
#define MXF_SIGN_BIT (MXF_SIGNED ? (1u << (MXF_BITS - 1)) : 0u)
#define MXF_MAG_MASK ((1u << (MXF_BITS - MXF_SIGNED)) - 1u)

// magnitude code of s * 2^e (s > 0) rounded once (rne, or rtz when `rtz`); `over` when it exceeds max normal
template <typename S>
__device__ __forceinline__ mxc_u32 mxc_round_mag(S s, int e, bool rtz, bool& over) {
    const int top = e + mxc_bitlen(s) - 1;
    if (top > MXF_EMAX) {  // rounding never lowers a binade
        over = true;
        return 0u;
    }
    const int eq = top > MXF_EMIN ? top : MXF_EMIN;  // exponent whose quantum applies
    const int shift = eq - MXF_MBITS - e;           // r = s / 2^shift, rounded
    S r;
    if (shift <= 0) {
        r = s << (-shift);
    } else if (shift >= (int)(8 * sizeof(S))) {
        r = 0;  // s < 2^(width-1) <= half a quantum
    } else {
        r = s >> shift;
        const S rem = s & (((S)1 << shift) - 1);
        const S half = (S)1 << (shift - 1);
        if (!rtz && (rem > half || (rem == half && (r & 1)))) r += 1;
    }
    if (!MXF_SUBNORMALS && r < ((S)1 << MXF_MBITS)) r = (S)1 << MXF_MBITS;  // no zero: clamp up to min normal
    const mxc_u32 mag = ((mxc_u32)(eq - MXF_EMIN) << MXF_MBITS) + (mxc_u32)r - (MXF_SUBNORMALS ? 0u : (1u << MXF_MBITS));
    over = mag > (mxc_u32)MXF_MAX_MAGCODE;
    return mag;
}

#define MXF_OVER_CODE (MXF_HAS_INF ? (mxc_u32)MXF_INF_CODE : (mxc_u32)MXF_NAN_CODE)

// the canonical code of x * 2^-kshift (mxcore.formats.encode's rules).  A NaN in a format without NaN gives
// code 0 and is counted in *nan_count (the host raises or keeps the zero, per nan=).
template <class In>
__device__ __forceinline__ mxc_u32 mxc_encode(typename In::bits_t b, int kshift, bool rtz, bool ovf_nan,
                                              mxc_u32* nan_count) {
    bool neg;
    int e = 0;
    typename In::sig_t s;
    const int cls = mxc_split<In>(b, neg, e, s);
    if (cls == MXC_NAN) {
        if constexpr (MXF_HAS_NAN) {
            return (MXF_SIGNED && MXF_SPECIALS != 2 && neg) ? ((mxc_u32)MXF_NAN_CODE | MXF_SIGN_BIT)
                                                            : (mxc_u32)MXF_NAN_CODE;
        } else {
            if (nan_count) mxc_atomic_add(nan_count, 1u);
            return 0u;
        }
    }
    mxc_u32 mag = 0u;
    if (cls == MXC_INF) {
        mag = (ovf_nan && MXF_HAS_NAN) ? MXF_OVER_CODE : (mxc_u32)MXF_MAX_MAGCODE;
    } else if (cls == MXC_FINITE) {
        bool over = false;
        mag = mxc_round_mag(s, e - kshift, rtz, over);
        if (over) mag = (ovf_nan && !rtz && MXF_HAS_NAN) ? MXF_OVER_CODE : (mxc_u32)MXF_MAX_MAGCODE;
    }
    if constexpr (!MXF_SIGNED) {
        return (neg || cls == MXC_ZERO) ? (mxc_u32)MXF_NAN_CODE : mag;  // unsigned (e8m0): no zero, no negatives
    } else if constexpr (MXF_SPECIALS == 2) {
        if (mag == (mxc_u32)MXF_NAN_CODE) return (mxc_u32)MXF_NAN_CODE;  // FNUZ: one NaN, no -0
        return (neg && mag != 0u) ? (mag | MXF_SIGN_BIT) : mag;
    } else {
        return neg ? (mag | MXF_SIGN_BIT) : mag;
    }
}

// a code as (class, sign, significand, exponent); value = s * 2^e
__device__ __forceinline__ int mxc_code_split(mxc_u32 c, bool& neg, mxc_u32& s, int& e) {
    const mxc_u32 mag = c & MXF_MAG_MASK;
    const int fld = (int)(mag >> MXF_MBITS);
    const mxc_u32 mant = mag & ((1u << MXF_MBITS) - 1u);
    neg = MXF_SIGNED && ((c >> (MXF_BITS - 1)) & 1u);
    if constexpr (MXF_SPECIALS == 0) {  // ieee
        if (fld == (1 << MXF_EBITS) - 1) return mant ? MXC_NAN : MXC_INF;
    } else if constexpr (MXF_SPECIALS == 1) {  // fn: the all-ones magnitude is NaN
        if (mag == MXF_MAG_MASK) return MXC_NAN;
    } else if constexpr (MXF_SPECIALS == 2) {  // fnuz: one NaN code
        if (c == (mxc_u32)MXF_NAN_CODE) {
            neg = false;
            return MXC_NAN;
        }
    }
    if (MXF_SUBNORMALS && fld == 0) {
        s = mant;
        e = MXF_EMIN - MXF_MBITS;
    } else {
        s = mant | (1u << MXF_MBITS);
        e = fld - MXF_BIAS - MXF_MBITS;
    }
    return s ? MXC_FINITE : MXC_ZERO;
}

// value of code c times 2^scale_exp (a NaN scale: pass scale_nan) as float32 / float64 bits.  NaN keeps its
// code's sign (as decode does); a NaN scale on a non-NaN element gives +NaN.
__device__ __forceinline__ mxc_u32 mxc_decode_f32(mxc_u32 c, int scale_exp, bool scale_nan) {
    bool neg;
    mxc_u32 s = 0u;
    int e = 0;
    const int cls = mxc_code_split(c, neg, s, e);
    const mxc_u32 sign = neg ? 0x80000000u : 0u;
    if (cls == MXC_NAN) return sign | MXC_F32_NAN;
    if (scale_nan) return MXC_F32_NAN;
    if (cls == MXC_INF) return sign | 0x7f800000u;
    return mxc_f32_bits(neg, s, e + scale_exp);
}
__device__ __forceinline__ mxc_u64 mxc_decode_f64(mxc_u32 c, int scale_exp, bool scale_nan) {
    bool neg;
    mxc_u32 s = 0u;
    int e = 0;
    const int cls = mxc_code_split(c, neg, s, e);
    const mxc_u64 sign = neg ? 0x8000000000000000ull : 0ull;
    if (cls == MXC_NAN) return sign | MXC_F64_NAN;
    if (scale_nan) return MXC_F64_NAN;
    if (cls == MXC_INF) return sign | 0x7ff0000000000000ull;
    return mxc_f64_bits(neg, s, e + scale_exp);
}

// ---- kernels ---------------------------------------------------------------------------------------------------
template <class In>
__device__ __forceinline__ void mxc_encode_kernel(const typename In::bits_t* x, mxc_code_t* out, mxc_i64 n, int rtz,
                                                  int ovf_nan, mxc_u32* nan_count) {
    const mxc_i64 i = mxc_thread_index();
    if (i < n) out[i] = (mxc_code_t)mxc_encode<In>(x[i], 0, rtz != 0, ovf_nan != 0, nan_count);
}

// The MX element encode: rne, saturating, for a finite input of at most 32 bits times 2^-k, in straight-line
// integer code (no branches: the block is 32 of these).  Same result as mxc_encode<In>(b, k, false, false, 0)
// for every finite b, given what the MX scale guarantees: |x| * 2^-k < 2^(MXF_EMAX + 1).
template <class In>
__device__ __forceinline__ mxc_u32 mxc_encode_mx(typename In::bits_t b, int k) {
    const mxc_u32 neg = (mxc_u32)(b >> (In::width - 1)) & 1u;
    const int fld = (int)((b >> In::mbits) & (typename In::bits_t)((1 << In::ebits) - 1));
    const mxc_u32 mant = (mxc_u32)(b & (((typename In::bits_t)1 << In::mbits) - 1));
    const mxc_u32 s = fld ? (mant | (1u << In::mbits)) : mant;
    const int e = (fld ? fld : 1) - In::bias - In::mbits - k;  // value = s * 2^e
    const int top = s ? e + mxc_bitlen(s) - 1 : MXF_EMIN;
    const int eq = top > MXF_EMIN ? top : MXF_EMIN;
    const int shift = eq - MXF_MBITS - e;  // r = s / 2^shift; negative only for a short subnormal input significand
    const int rs = shift > 0 ? (shift < 31 ? shift : 31) : 0;  // s < 2^24: 25 or more leaves 0, below half
    const int ls = shift < 0 ? (shift > -31 ? -shift : 31) : 0;
    const mxc_u32 r = (s << ls) >> rs;
    const mxc_u32 rem = s & ((1u << rs) - 1u);
    const mxc_u32 half = (1u << rs) >> 1;
    const mxc_u32 up = (rem > half) ? 1u : ((rem == half && rs) ? (r & 1u) : 0u);
    mxc_u32 mag = ((mxc_u32)(eq - MXF_EMIN) << MXF_MBITS) + r + up;
    mag = mag < (mxc_u32)MXF_MAX_MAGCODE ? mag : (mxc_u32)MXF_MAX_MAGCODE;
    if constexpr (MXF_SPECIALS == 2) return mag | ((neg && mag) ? MXF_SIGN_BIT : 0u);  // fnuz: no -0
    return mag | (neg ? MXF_SIGN_BIT : 0u);
}

// the element code inside a finite MX block: straight-line for inputs of at most 32 bits, generic for float64
template <class In>
__device__ __forceinline__ mxc_u32 mxc_mx_element(typename In::bits_t b, int k) {
    if constexpr (MXF_SUBNORMALS && MXF_BITS <= 8 && In::width <= 32) return mxc_encode_mx<In>(b, k);
    return mxc_encode<In>(b, k, false, false, 0);
}

// OCP MX: the input viewed as [outer][K][inner] (contiguous), blocks of `block` along K.  One thread per block:
// it reads its elements once (into registers when block == MXC_MX_BLOCK), writes the codes and the E8M0 scale,
// and the CTA folds the largest finite scale code into *scale_max1 (stored + 1; 0: no finite scale).
#define MXC_MX_BLOCK 32
#define MXC_E8M0_NAN 0xFFu

template <class In>
__device__ __forceinline__ int mxc_mx_exp(typename In::bits_t amax, bool rceil) {
    if (amax == 0) return -127;  // all-zero block: the clamp of floor(log2(0))
    bool above;
    const int top = mxc_log2_parts<In>(amax, (mxc_u64)MXF_MAXSIG, MXF_MBITS, above);
    int k = top - MXF_EMAX + ((rceil && above) ? 1 : 0);
    return k < -127 ? -127 : (k > 127 ? 127 : k);
}

template <class In, bool FIXED>
__device__ __forceinline__ void mxc_quantize_mx_kernel(const typename In::bits_t* x, mxc_u8* codes, mxc_u8* scales,
                                                       mxc_u32* scale_max1, mxc_i64 outer, mxc_i64 K, mxc_i64 inner,
                                                       int block, int rceil) {
    typedef typename In::bits_t B;
    mxc_u32* cta_max = mxc_cta_max_begin(scale_max1);  // this CTA's maximum, folded into *scale_max1 at the end
    const mxc_i64 nb = (K + block - 1) / block;
    const mxc_i64 t = mxc_thread_index();
    if (t < outer * nb * inner) {
        const mxc_i64 i = t % inner;
        const mxc_i64 rest = t / inner;
        const mxc_i64 kb = rest % nb;
        const mxc_i64 o = rest / nb;
        const mxc_i64 k0 = kb * block;
        const int len = (int)((K - k0) < block ? (K - k0) : block);
        const mxc_i64 base = (o * K + k0) * inner + i;
        const B* p = x + base;
        mxc_u8* q = codes + base;
        const B absmask = (B)(~((B)1 << (In::width - 1)));
        const B inf = mxc_inf_bits<In>();
        B amax = 0;
        if (FIXED) {
            B v[MXC_MX_BLOCK];
            const bool vec = inner == 1 && len == MXC_MX_BLOCK && ((((unsigned long long)p) & 15u) == 0u);
            if (vec) {
                const mxc_v16* pv = (const mxc_v16*)p;
                const int words = MXC_MX_BLOCK * (int)sizeof(B) / 16;
#pragma unroll
                for (int w = 0; w < words; ++w) {
                    const mxc_v16 chunk = pv[w];
                    const int per = 16 / (int)sizeof(B);
#pragma unroll
                    for (int j = 0; j < per; ++j) {
                        if constexpr (sizeof(B) == 8) {
                            v[w * per + j] = (B)(((mxc_u64)chunk.w[2 * j + 1] << 32) | chunk.w[2 * j]);
                        } else {
                            v[w * per + j] = (B)(chunk.w[(j * sizeof(B)) / 4] >> (8 * ((j * sizeof(B)) % 4)));
                        }
                    }
                }
            } else {
#pragma unroll
                for (int j = 0; j < MXC_MX_BLOCK; ++j) v[j] = j < len ? p[(mxc_i64)j * inner] : (B)0;
            }
#pragma unroll
            for (int j = 0; j < MXC_MX_BLOCK; ++j) {
                const B m = v[j] & absmask;
                amax = m > amax ? m : amax;
            }
            const bool bad = amax >= inf;
            const int k = mxc_mx_exp<In>(amax, rceil != 0);
            mxc_u32 c[MXC_MX_BLOCK];
#pragma unroll
            for (int j = 0; j < MXC_MX_BLOCK; ++j) c[j] = bad ? 0u : mxc_mx_element<In>(v[j], k);
            if (vec && ((((unsigned long long)q) & 15u) == 0u)) {
                mxc_v16* qv = (mxc_v16*)q;
#pragma unroll
                for (int w = 0; w < MXC_MX_BLOCK / 16; ++w) {
                    mxc_v16 chunk;
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const int b0 = 16 * w + 4 * j;
                        chunk.w[j] = c[b0] | (c[b0 + 1] << 8) | (c[b0 + 2] << 16) | (c[b0 + 3] << 24);
                    }
                    qv[w] = chunk;
                }
            } else {
#pragma unroll
                for (int j = 0; j < MXC_MX_BLOCK; ++j)
                    if (j < len) q[(mxc_i64)j * inner] = (mxc_u8)c[j];
            }
            const mxc_u32 sc = bad ? MXC_E8M0_NAN : (mxc_u32)(k + 127);
            scales[(o * nb + kb) * inner + i] = (mxc_u8)sc;
            if (!bad) mxc_atomic_max(cta_max, sc + 1u);
        } else {  // any block length: read twice (the second pass hits the cache)
            for (int j = 0; j < len; ++j) {
                const B m = p[(mxc_i64)j * inner] & absmask;
                amax = m > amax ? m : amax;
            }
            const bool bad = amax >= inf;
            const int k = mxc_mx_exp<In>(amax, rceil != 0);
            for (int j = 0; j < len; ++j)
                q[(mxc_i64)j * inner] = (mxc_u8)(bad ? 0u : mxc_mx_element<In>(p[(mxc_i64)j * inner], k));
            const mxc_u32 sc = bad ? MXC_E8M0_NAN : (mxc_u32)(k + 127);
            scales[(o * nb + kb) * inner + i] = (mxc_u8)sc;
            if (!bad) mxc_atomic_max(cta_max, sc + 1u);
        }
    }
    mxc_cta_max_end(cta_max, scale_max1);
}

// ---- the fast MX quantizer: contiguous blocks of 32 along the last axis, inputs of at most 32 bits ----------
// The input is a flat run of blocks (K % 32 == 0, the block axis the contiguous one, 16-byte aligned x and
// codes).  Each lane owns half a block, 16 elements: sizeof(B) 16-byte loads, one 16-byte store of codes; the
// two lanes of a block exchange their half maxima (mxc_lane_xor1), both derive the scale, the even lane writes
// it.  Grid-stride over half blocks (the loop bound is uniform in the CTA, so whole warps run every exchange).
//
// The element encode (MXC_FAST_FLOAT formats) rounds once, with one float32 add, and never computes with a
// float32 subnormal that matters: y = x * 2^-k is exact in float32 (x has at most 24 significant bits; 2^-k is
// a normal float32 because k <= 126 for inputs of at most 32 bits when MXF_EMAX >= 2; a product below 2^-126 is
// far below half the smallest subnormal code, so its own rounding, or a flush to zero, cannot change the result).
// With E = max(floor(log2|y|), MXF_EMIN) and M = 2^(E + 23 - MXF_MBITS), the float32 sum s = |y| + M lies in
// [M, 2M) where one ulp is the format's quantum 2^(E - MXF_MBITS): the add rounds |y| to the format's grid, RNE,
// and s's mantissa field holds q = |y| / quantum (at most 2^(MXF_MBITS + 1): a round-up into the next binade).
// The magnitude code is then q + (E - MXF_EMIN) * 2^MXF_MBITS (a normal |y| has q >= 2^MXF_MBITS, which adds the
// implicit 1 to the exponent field; a subnormal one has E = MXF_EMIN and q < 2^MXF_MBITS), computed by integer
// operations: bits(s) << (23 - MXF_MBITS) drops s's exponent (23 - MXF_MBITS >= 9) and leaves q at the top, and
// bits(M) - bits(M_emin) = (E - MXF_EMIN) << 23 adds the exponent.  The constant bits(M_emin) is subtracted once
// per packed word (mxc_fast_word_base).  Clamping saturates above the largest normal, as the MX rule does.
// Subnormal inputs: float16 values are converted by the hardware (exact); float32/bfloat16 subnormals matter only
// in blocks whose scale exponent is below MXC_FAST_TINY_K, which take mxc_fast_tiny (integer arithmetic, out of
// line).  So the result does not depend on float32 subnormal support (an H200 flushed them in this kernel).
// Other formats use mxc_mx_element (same results, slower).
#define MXC_HALF 16
#define MXC_FAST_FLOAT (MXF_BITS <= 8 && MXF_SIGNED && MXF_SUBNORMALS && MXF_SPECIALS != 2 && MXF_EMAX >= 2 && \
                        MXF_MBITS >= 1 && MXF_MBITS <= 14 && MXF_EMAX + 23 - MXF_MBITS <= 127 && MXF_EMIN >= -125)
#define MXC_FAST_SHIFT (23 - MXF_MBITS)
// bits(M) for E = MXF_EMIN
#define MXC_FAST_MEMIN ((((mxc_u32)(MXF_EMIN + 127)) << 23) + ((mxc_u32)MXC_FAST_SHIFT << 23))
// scale exponents below this: a float32/bfloat16 subnormal input can reach the format's half smallest subnormal
#define MXC_FAST_TINY_K (-(MXF_EMIN - MXF_MBITS + 125))

// the magnitude code of |y| (y exact, |y| < 2^(MXF_EMAX + 1)) at bit MXC_FAST_SHIFT, plus MXC_FAST_MEMIN
__device__ __forceinline__ mxc_u32 mxc_fast_mag_hi(float y) {
    const mxc_u32 e = mxc_f2u(y) & 0x7f800000u;
    const mxc_u32 eminf = (mxc_u32)(MXF_EMIN + 127) << 23;
    const mxc_u32 m = (e > eminf ? e : eminf) + ((mxc_u32)MXC_FAST_SHIFT << 23);  // bits(M)
    const mxc_u32 s = mxc_f2u(mxc_fadd(mxc_fabs(y), mxc_u2f(m)));
    const mxc_u32 hi = (s << MXC_FAST_SHIFT) + m;  // (q << SHIFT) + (E - EMIN) << 23 + MXC_FAST_MEMIN
    const mxc_u32 top = ((mxc_u32)MXF_MAX_MAGCODE << MXC_FAST_SHIFT) + MXC_FAST_MEMIN;
    return hi < top ? hi : top;
}

// v >> s for s > 0, v << -s otherwise (a compile-time s: one shift; the packing adds disjoint fields, so the
// shift and the add fuse into one LEA / LEA.HI)
__device__ __forceinline__ mxc_u32 mxc_shr(mxc_u32 v, int s) { return s > 0 ? v >> s : v << (-s); }

// what the four mxc_fast_mag_hi terms of a packed word add beyond the codes (MXC_FAST_MEMIN at each byte's
// shift), negated: a compile-time constant added once per word (all arithmetic mod 2^32)
__device__ __forceinline__ mxc_u32 mxc_fast_word_base() {
    mxc_u32 b = 0u;
#pragma unroll
    for (int j = 0; j < 4; ++j) b += mxc_shr(MXC_FAST_MEMIN, MXC_FAST_SHIFT - 8 * j);
    return 0u - b;
}

// the sign bits of elements 4q..4q+3 at bit 7 of each byte
template <class In>
__device__ __forceinline__ mxc_u32 mxc_fast_signs(const mxc_u32* wd, int q) {
    if constexpr (In::width == 16) {
        return mxc_byte_perm(wd[2 * q], wd[2 * q + 1], 0x7531u) & 0x80808080u;  // each element's high byte
    } else {
        return ((wd[4 * q] >> 24) & 0x80u) | ((wd[4 * q + 1] >> 16) & 0x8000u) | ((wd[4 * q + 2] >> 8) & 0x800000u) |
               (wd[4 * q + 3] & 0x80000000u);
    }
}

// element j of a lane's 16 (words: the lane's 16 * sizeof(B) bytes as 32-bit words), as input bits
template <class In>
__device__ __forceinline__ typename In::bits_t mxc_fast_bits(const mxc_u32* wd, int j) {
    if constexpr (In::width == 16) return (typename In::bits_t)(wd[j >> 1] >> (16 * (j & 1)));
    else return (typename In::bits_t)wd[j];
}

// element j's value as float32 (exact) and its sign bit
template <class In>
__device__ __forceinline__ float mxc_fast_value(const mxc_u32* wd, int j) {
    if constexpr (In::width == 32) {
        return mxc_u2f(wd[j]);
    } else if constexpr (In::ebits == 8) {  // bfloat16: the top half of a float32
        return mxc_u2f((j & 1) ? (wd[j >> 1] & 0xffff0000u) : (wd[j >> 1] << 16));
    } else {  // float16 (subnormals included: mxc_h2f is exact)
        return mxc_h2f((mxc_u16)((j & 1) ? (wd[j >> 1] >> 16) : wd[j >> 1]));
    }
}

// the largest magnitude bits among a lane's 16 elements
template <class In>
__device__ __forceinline__ mxc_u32 mxc_fast_half_amax(const mxc_u32* wd) {
    mxc_u32 m = 0u;
    if constexpr (In::width == 16) {
#pragma unroll
        for (int w = 0; w < MXC_HALF / 2; ++w) m = mxc_vmaxu2(m, wd[w] & 0x7fff7fffu);
        return (m & 0xffffu) > (m >> 16) ? (m & 0xffffu) : (m >> 16);
    } else {
#pragma unroll
        for (int w = 0; w < MXC_HALF; ++w) {
            const mxc_u32 a = wd[w] & 0x7fffffffu;
            m = a > m ? a : m;
        }
        return m;
    }
}

// mxc_mx_exp for inputs of at most 32 bits: a normal amax read as float32 bits gives floor(log2) and the
// significand comparison directly; zero and subnormal maxima take the general path
template <class In>
__device__ __forceinline__ int mxc_fast_exp(mxc_u32 amax, bool rceil) {
    if (!(amax >> In::mbits)) return mxc_mx_exp<In>((typename In::bits_t)amax, rceil);
    const mxc_u32 a = In::width == 32 ? amax : (In::ebits == 8 ? amax << 16 : (amax << 13) + (112u << 23));
    const bool above = (a & 0x7fffffu) > (mxc_u32)((MXF_MAXSIG << (23 - MXF_MBITS)) & 0x7fffffu);
    const int k = (int)(a >> 23) - 127 - MXF_EMAX + ((rceil && above) ? 1 : 0);
    return k < -127 ? -127 : (k > 127 ? 127 : k);
}

template <class In>
__device__ __forceinline__ void mxc_fast_load(const typename In::bits_t* x, mxc_i64 h, mxc_u32* wd) {
    const mxc_v16* pv = (const mxc_v16*)(x + h * MXC_HALF);
#pragma unroll
    for (int c = 0; c < (int)sizeof(typename In::bits_t); ++c) {
        const mxc_v16 chunk = pv[c];
#pragma unroll
        for (int j = 0; j < 4; ++j) wd[4 * c + j] = chunk.w[j];
    }
}

// 16 elements (a lane's words) under block scale 2^k by the exact integer encode, packed like mxc_fast_encode16
template <class In>
__device__ __forceinline__ mxc_v16 mxc_mx_encode16(const mxc_u32* wd, int k) {
    mxc_v16 out;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        mxc_u32 word = 0u;
#pragma unroll
        for (int j = 0; j < 4; ++j) word |= (mxc_mx_element<In>(mxc_fast_bits<In>(wd, 4 * q + j), k) & 0xffu) << (8 * j);
        out.w[q] = word;
    }
    return out;
}

// 16 finite elements (a lane's words) times scale = 2^-k, encoded and packed: byte j of word q is element 4q + j
template <class In>
__device__ __forceinline__ mxc_v16 mxc_fast_encode16(const mxc_u32* wd, float scale) {
    mxc_v16 out;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        mxc_u32 word = mxc_shr(mxc_fast_signs<In>(wd, q), 8 - MXF_BITS) + mxc_fast_word_base();
#pragma unroll
        for (int j = 0; j < 4; ++j)
            word += mxc_shr(mxc_fast_mag_hi(mxc_fmul(mxc_fast_value<In>(wd, 4 * q + j), scale)), MXC_FAST_SHIFT - 8 * j);
        out.w[q] = word;
    }
    return out;
}

// a half block whose scale exponent k is below MXC_FAST_TINY_K: the exact integer encode (mxc_mx_element), kept
// out of line so that the main loop stays short; only data below ~2^-100 gets here
template <class In>
MXC_NOINLINE mxc_v16 mxc_fast_tiny(mxc_v16 c0, mxc_v16 c1, mxc_v16 c2, mxc_v16 c3, int k) {
    // the lane's words by value (registers: an array passed by address would live in local memory)
    const mxc_u32 wd[16] = {c0.w[0], c0.w[1], c0.w[2], c0.w[3], c1.w[0], c1.w[1], c1.w[2], c1.w[3],
                            c2.w[0], c2.w[1], c2.w[2], c2.w[3], c3.w[0], c3.w[1], c3.w[2], c3.w[3]};
    return mxc_mx_encode16<In>(wd, k);
}

template <class In>
__device__ __forceinline__ void mxc_quantize_mx_fast_kernel(const typename In::bits_t* x, mxc_u8* codes,
                                                            mxc_u8* scales, mxc_u32* scale_max1, mxc_i64 halves,
                                                            mxc_i64 stride, int rceil) {
    typedef typename In::bits_t B;
    static_assert(In::width <= 32, "the fast MX quantizer takes inputs of at most 32 bits");
    mxc_u32* cta_max = mxc_cta_max_begin(scale_max1);  // this CTA's maximum, folded into *scale_max1 at the end
    mxc_u32 lane_max = 0u;  // largest finite scale code + 1 seen by this lane
    for (mxc_i64 h0 = (mxc_i64)blockIdx.x * MXC_THREADS; h0 < halves; h0 += stride) {
        const mxc_i64 h = h0 + threadIdx.x;
        const bool live = h < halves;  // halves is even: both lanes of a block are live or neither
        mxc_u32 wd[MXC_HALF * sizeof(B) / 4];
        if (live) {
            mxc_fast_load<In>(x, h, wd);
        } else {
#pragma unroll
            for (int w = 0; w < (int)(MXC_HALF * sizeof(B) / 4); ++w) wd[w] = 0u;
        }
        const mxc_u32 part = mxc_fast_half_amax<In>(wd);
        const mxc_u32 other = mxc_lane_xor1(part, [&]() {
            mxc_u32 pw[MXC_HALF * sizeof(B) / 4];
            mxc_fast_load<In>(x, h ^ 1, pw);
            return mxc_fast_half_amax<In>(pw);
        });
        const B amax = (B)(part > other ? part : other);
        const bool bad = amax >= mxc_inf_bits<In>();
        const int k = mxc_fast_exp<In>((mxc_u32)amax, rceil != 0);
        mxc_v16 out;
        if constexpr (MXC_FAST_FLOAT)
            out = mxc_fast_encode16<In>(wd, mxc_u2f((mxc_u32)(127 - k) << 23));  // scale 2^-k
        else
            out = mxc_mx_encode16<In>(wd, k);
#pragma unroll
        for (int q = 0; q < 4; ++q) out.w[q] = bad ? 0u : out.w[q];
        // float32 / bfloat16: subnormal inputs may matter
        if constexpr (MXC_FAST_FLOAT && (In::width == 32 || In::ebits == 8)) {
            if (k < MXC_FAST_TINY_K && !bad) {
                mxc_v16 c[4];
#pragma unroll
                for (int w = 0; w < 16; ++w) c[w >> 2].w[w & 3] = w < (int)(MXC_HALF * sizeof(B) / 4) ? wd[w] : 0u;
                out = mxc_fast_tiny<In>(c[0], c[1], c[2], c[3], k);
            }
        }
        if (live) {
            *(mxc_v16*)(codes + h * MXC_HALF) = out;
            const mxc_u32 sc = bad ? MXC_E8M0_NAN : (mxc_u32)(k + 127);
            if (!(h & 1)) scales[h >> 1] = (mxc_u8)sc;
            if (!bad && sc + 1u > lane_max) lane_max = sc + 1u;
        }
    }
    if (lane_max) mxc_atomic_max(cta_max, lane_max);
    mxc_cta_max_end(cta_max, scale_max1);
}

// ---- the column MX quantizer: blocks of 32 along the second-to-last axis of a C-contiguous [outer][K][N] array
// (B [K, N] quantized along K), inputs of at most 32 bits, K a multiple of 32.  One thread per block of 32 rows
// and one 32-bit word of columns (two 16-bit columns or one float32 column): a warp reads 128 contiguous bytes
// per row.  Elements are encoded as in the fast quantizer (mxc_fast_mag_hi: one float add; tiny blocks and
// formats without MXC_FAST_FLOAT through mxc_mx_element).  Codes [outer][K][N], scales [outer][K/32][N].
template <class In>
__device__ __forceinline__ float mxc_value_of_bits(mxc_u32 b) {
    if constexpr (In::width == 32) return mxc_u2f(b);
    else if constexpr (In::ebits == 8) return mxc_u2f(b << 16);
    else return mxc_h2f((mxc_u16)b);
}

template <class In>
__device__ __forceinline__ void mxc_quantize_mx_cols_kernel(const typename In::bits_t* x, mxc_u8* codes,
                                                           mxc_u8* scales, mxc_u32* scale_max1, mxc_i64 outer,
                                                           mxc_i64 K, mxc_i64 N, int rceil) {
    typedef typename In::bits_t B;
    static_assert(In::width <= 32, "the column MX quantizer takes inputs of at most 32 bits");
    constexpr int C = (int)(4 / sizeof(B));  // columns per 32-bit word
    mxc_u32* cta_max = mxc_cta_max_begin(scale_max1);  // this CTA's maximum, folded into *scale_max1 at the end
    const mxc_i64 groups = N / C, nb = K / MXC_MX_BLOCK, t = mxc_thread_index();
    mxc_u32 lane_max = 0u;
    if (t < outer * nb * groups) {
        const mxc_i64 g = t % groups, rest = t / groups, kb = rest % nb, o = rest / nb;
        const mxc_i64 row0 = o * K + kb * MXC_MX_BLOCK;
        const mxc_u32* p = (const mxc_u32*)(x + row0 * N + g * C);
        mxc_u32 w[MXC_MX_BLOCK];
#pragma unroll
        for (int r = 0; r < MXC_MX_BLOCK; ++r) w[r] = p[r * groups];
        mxc_u32 out[MXC_MX_BLOCK];
#pragma unroll
        for (int r = 0; r < MXC_MX_BLOCK; ++r) out[r] = 0u;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const mxc_u32 absmask = (mxc_u32)(B)(~((B)1 << (In::width - 1)));
            mxc_u32 amax = 0u;
#pragma unroll
            for (int r = 0; r < MXC_MX_BLOCK; ++r) {
                const mxc_u32 m = (w[r] >> (16 * c)) & absmask;
                amax = m > amax ? m : amax;
            }
            const bool bad = amax >= (mxc_u32)mxc_inf_bits<In>();
            const int k = mxc_fast_exp<In>(amax, rceil != 0);
            if (MXC_FAST_FLOAT && !(k < MXC_FAST_TINY_K && (In::width == 32 || In::ebits == 8))) {
                const float scale = mxc_u2f((mxc_u32)(127 - k) << 23);  // 2^-k
#pragma unroll
                for (int r = 0; r < MXC_MX_BLOCK; ++r) {
                    const mxc_u32 b = (w[r] >> (16 * c)) & (C == 1 ? 0xffffffffu : 0xffffu);
                    const mxc_u32 mag = (mxc_fast_mag_hi(mxc_fmul(mxc_value_of_bits<In>(b), scale)) - MXC_FAST_MEMIN) >>
                                        MXC_FAST_SHIFT;
                    const mxc_u32 code = mag | ((b >> (In::width - 1)) << (MXF_BITS - 1));
                    out[r] |= (bad ? 0u : code) << (8 * c);
                }
            } else {
#pragma unroll
                for (int r = 0; r < MXC_MX_BLOCK; ++r) {
                    const B b = (B)((w[r] >> (16 * c)) & (C == 1 ? 0xffffffffu : 0xffffu));
                    out[r] |= (bad ? 0u : (mxc_mx_element<In>(b, k) & 0xffu)) << (8 * c);
                }
            }
            const mxc_u32 sc = bad ? MXC_E8M0_NAN : (mxc_u32)(k + 127);
            scales[(o * nb + kb) * N + g * C + c] = (mxc_u8)sc;
            if (!bad && sc + 1u > lane_max) lane_max = sc + 1u;
        }
#pragma unroll
        for (int r = 0; r < MXC_MX_BLOCK; ++r) {
            if constexpr (C == 2) ((mxc_u16*)(codes + (row0 + r) * N))[g] = (mxc_u16)out[r];
            else codes[(row0 + r) * N + g] = (mxc_u8)out[r];
        }
    }
    if (lane_max) mxc_atomic_max(cta_max, lane_max);
    mxc_cta_max_end(cta_max, scale_max1);
}

// per-tensor scale, pass 1: the largest finite magnitude's bits, folded per CTA, then one atomic per CTA
template <class In>
__device__ __forceinline__ void mxc_amax_kernel(const typename In::bits_t* x, mxc_i64 n, mxc_i64 stride,
                                               mxc_u64* amax_bits) {
    typedef typename In::bits_t B;
    mxc_u64* cta_max = mxc_cta_max_begin(amax_bits);  // this CTA's maximum, folded into *amax_bits at the end
    const B absmask = (B)(~((B)1 << (In::width - 1)));
    const B inf = mxc_inf_bits<In>();
    B m = 0;
    for (mxc_i64 i = mxc_thread_index(); i < n; i += stride) {
        const B v = x[i] & absmask;
        if (v < inf && v > m) m = v;
    }
    if (m) mxc_atomic_max(cta_max, (mxc_u64)m);
    mxc_cta_max_end(cta_max, amax_bits);
}

// the per-tensor scale exponent k = ceil(log2(amax / max_normal)) (0 for amax == 0), clamped to [-126, 127]
template <class In>
__device__ __forceinline__ int mxc_tensor_exp(typename In::bits_t amax) {
    if (!amax) return 0;
    bool above;
    const int k = mxc_log2_parts<In>(amax, (mxc_u64)MXF_MAXSIG, MXF_MBITS, above) - MXF_EMAX + (above ? 1 : 0);
    return k < -126 ? -126 : (k > 127 ? 127 : k);
}

// one element under the per-tensor scale 2^k: encode(x / 2^k) when finite, encode(x, overflow='nan') otherwise
template <class In>
__device__ __forceinline__ mxc_u32 mxc_tensor_element(typename In::bits_t b, int k, mxc_u32* nan_count) {
    typedef typename In::bits_t B;
    const bool finite = (B)(b & (B)(~((B)1 << (In::width - 1)))) < mxc_inf_bits<In>();
    return finite ? mxc_encode<In>(b, k, false, false, 0) : mxc_encode<In>(b, 0, false, true, nan_count);
}

// per-tensor scale, pass 2: k = ceil(log2(amax / max_normal)) (0 for amax == 0), clamped to [-126, 127], read
// from the device; codes = encode(x / 2^k) for finite x, encode(x, overflow='nan') for inf / NaN.  The first
// thread stores k and 2^k (float32) for the GEMM.
template <class In>
__device__ __forceinline__ void mxc_quantize_tensor_kernel(const typename In::bits_t* x, mxc_u8* codes, mxc_i64 n,
                                                           const mxc_u64* amax_bits, int* scale_exp, float* scale,
                                                           mxc_u32* nan_count) {
    typedef typename In::bits_t B;
    const B amax = (B)*amax_bits;
    const int k = mxc_tensor_exp<In>(amax);
    const mxc_i64 i = mxc_thread_index();
    if (i == 0) {
        *scale_exp = k;
        *(mxc_u32*)scale = (mxc_u32)(k + 127) << 23;
    }
    if (i < n) {
        codes[i] = (mxc_u8)mxc_tensor_element<In>(x[i], k, nan_count);
    }
}

// per-tensor scale, both passes over runs of 16 elements (n a multiple of 16, x and codes 16-byte aligned; inputs
// of at most 32 bits), 16-byte loads and stores, grid-stride over the runs.  Same results as the kernels above.

// the largest finite magnitude's bits over runs of 16 elements from run `first` in steps of `step` (0: none)
template <class In>
__device__ __forceinline__ mxc_u32 mxc_fast_runs_amax(const typename In::bits_t* x, mxc_i64 runs, mxc_i64 first,
                                                      mxc_i64 step) {
    typedef typename In::bits_t B;
    const mxc_u32 inf = (mxc_u32)mxc_inf_bits<In>();
    mxc_u32 m = 0u;
    for (mxc_i64 h = first; h < runs; h += step) {
        mxc_u32 wd[MXC_HALF * sizeof(B) / 4];
        mxc_fast_load<In>(x, h, wd);
#pragma unroll
        for (int j = 0; j < MXC_HALF; ++j) {
            const mxc_u32 v = (mxc_u32)mxc_fast_bits<In>(wd, j) & (mxc_u32)(B)(~((B)1 << (In::width - 1)));
            m = (v < inf && v > m) ? v : m;  // finite magnitudes only
        }
    }
    return m;
}

template <class In>
__device__ __forceinline__ void mxc_amax_fast_kernel(const typename In::bits_t* x, mxc_i64 runs, mxc_i64 stride,
                                                    mxc_u64* amax_bits) {
    static_assert(In::width <= 32, "the fast per-tensor kernels take inputs of at most 32 bits");
    mxc_u64* cta_max = mxc_cta_max_begin(amax_bits);  // this CTA's maximum, folded into *amax_bits at the end
    const mxc_u32 m = mxc_fast_runs_amax<In>(x, runs, mxc_thread_index(), stride);
    if (m) mxc_atomic_max(cta_max, (mxc_u64)m);
    mxc_cta_max_end(cta_max, amax_bits);
}

// the encode pass over runs of 16 elements from run `first` in steps of `step`, under the amax given; `first` 0
// stores k and 2^k
template <class In>
__device__ __forceinline__ void mxc_tensor_fast_encode(const typename In::bits_t* x, mxc_u8* codes, mxc_i64 runs,
                                                      mxc_i64 first, mxc_i64 step, typename In::bits_t amax,
                                                      int* scale_exp, float* scale, mxc_u32* nan_count) {
    typedef typename In::bits_t B;
    const int k = mxc_tensor_exp<In>(amax);
    if (first == 0) {
        *scale_exp = k;
        *(mxc_u32*)scale = (mxc_u32)(k + 127) << 23;
    }
    // MXC_FAST_FLOAT: every scaled value is at most the largest normal (k's choice), so nothing saturates; 2^-k is a
    // normal float32
    const float sc = mxc_u2f((mxc_u32)(127 - k) << 23);
    const bool exact_path = k < MXC_FAST_TINY_K && (In::width == 32 || In::ebits == 8);  // uniform: the whole grid
    for (mxc_i64 h = first; h < runs; h += step) {
        mxc_u32 wd[MXC_HALF * sizeof(B) / 4];
        mxc_fast_load<In>(x, h, wd);
        mxc_v16 out;
        const bool special = mxc_fast_half_amax<In>(wd) >= (mxc_u32)mxc_inf_bits<In>();  // inf / NaN in the run
        if (MXC_FAST_FLOAT && !special && !exact_path) {
            out = mxc_fast_encode16<In>(wd, sc);
        } else {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                mxc_u32 word = 0u;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    word |= (mxc_tensor_element<In>(mxc_fast_bits<In>(wd, 4 * q + j), k, nan_count) & 0xffu) << (8 * j);
                }
                out.w[q] = word;
            }
        }
        *(mxc_v16*)(codes + h * MXC_HALF) = out;
    }
}

template <class In>
__device__ __forceinline__ void mxc_quantize_tensor_fast_kernel(const typename In::bits_t* x, mxc_u8* codes,
                                                               mxc_i64 runs, mxc_i64 stride,
                                                               const mxc_u64* amax_bits, int* scale_exp,
                                                               float* scale, mxc_u32* nan_count) {
    static_assert(In::width <= 32, "the fast per-tensor kernels take inputs of at most 32 bits");
    mxc_tensor_fast_encode<In>(x, codes, runs, mxc_thread_index(), stride, (typename In::bits_t)*amax_bits,
                               scale_exp, scale, nan_count);
}

// per-tensor scale, both passes in one CTA, for a small tensor (its reduction's zeroing, launch and atomic cost more
// than its data): the largest finite magnitude over the runs (as mx_amax_fast), reduced through shared memory, then
// mx_quantize_tensor_fast's encode under it.  The same results as those two kernels; no zeroed counter.
template <class In>
__device__ __forceinline__ void mxc_quantize_tensor_small_kernel(const typename In::bits_t* x, mxc_u8* codes,
                                                                mxc_i64 runs, int* scale_exp, float* scale,
                                                                mxc_u32* nan_count) {
    typedef typename In::bits_t B;
    static_assert(In::width <= 32, "the fast per-tensor kernels take inputs of at most 32 bits");
    // the host build runs one thread at a time: there thread 0 does the whole CTA's work (the reduction crosses
    // threads)
    if (MXC_HOST && threadIdx.x) return;
    const int first = MXC_HOST ? 0 : threadIdx.x, step = MXC_HOST ? 1 : MXC_THREADS;
    mxc_u32 m = mxc_fast_runs_amax<In>(x, runs, first, step);
    __shared__ mxc_u32 red[MXC_THREADS];
    if constexpr (!MXC_HOST) {
        red[threadIdx.x] = m;
        __syncthreads();
        for (int half = MXC_THREADS / 2; half > 0; half >>= 1) {
            const mxc_u32 other = threadIdx.x < half ? red[threadIdx.x + half] : 0u;
            if (other > red[threadIdx.x]) red[threadIdx.x] = other;
            __syncthreads();
        }
        m = red[0];
    }
    mxc_tensor_fast_encode<In>(x, codes, runs, first, step, (B)m, scale_exp, scale, nan_count);
}

// per-tensor scale, pass 2 writing the codes transposed: x [R][C] row-major -> codes [C][R] (B [K, N] -> the K-major
// bytes the fp8 GEMMs read, so that no staging transpose follows).  One CTA per 64 x 64 tile: 16-byte loads along
// x's rows, each element encoded (as mx_quantize_tensor_fast: the one-add float encode where it applies), staged
// in shared memory, 16-byte stores along the codes' rows.  R and C multiples of 64, x 16-byte aligned.
#define MXC_T_TILE 64
template <class In>
__device__ __forceinline__ void mxc_quantize_tensor_t_kernel(const typename In::bits_t* x, mxc_u8* codes, mxc_i64 R,
                                                            mxc_i64 C, const mxc_u64* amax_bits, int* scale_exp,
                                                            float* scale, mxc_u32* nan_count) {
    typedef typename In::bits_t B;
    static_assert(In::width <= 32, "the transposing per-tensor kernel takes inputs of at most 32 bits");
    constexpr int EPV = (int)(16 / sizeof(B));  // elements per 16-byte load
    const int k = mxc_tensor_exp<In>((B)*amax_bits);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *scale_exp = k;
        *(mxc_u32*)scale = (mxc_u32)(k + 127) << 23;
    }
    const float sc = mxc_u2f((mxc_u32)(127 - k) << 23);  // 2^-k: normal (see mxc_quantize_tensor_fast_kernel)
    const bool fast = MXC_FAST_FLOAT && !(k < MXC_FAST_TINY_K && (In::width == 32 || In::ebits == 8));
    // the host build runs one thread at a time: there thread 0 does the whole CTA's work (the tile crosses threads)
    if (MXC_HOST && threadIdx.x) return;
    __shared__ mxc_u8 tile[MXC_T_TILE][MXC_T_TILE + 4];  // [column of x][row of x]
    const int first = MXC_HOST ? 0 : threadIdx.x, step = MXC_HOST ? 1 : MXC_THREADS;
    const mxc_i64 tiles_c = C / MXC_T_TILE;
    const mxc_i64 tr = (mxc_i64)blockIdx.x / tiles_c, tc = (mxc_i64)blockIdx.x % tiles_c;
    for (int v = first; v < MXC_T_TILE * MXC_T_TILE / EPV; v += step) {
        const int r = v / (MXC_T_TILE / EPV), c0 = (v % (MXC_T_TILE / EPV)) * EPV;
        const mxc_v16 chunk = *(const mxc_v16*)(x + (tr * MXC_T_TILE + r) * C + tc * MXC_T_TILE + c0);
#pragma unroll
        for (int j = 0; j < EPV; ++j) {
            const B b = mxc_fast_bits<In>(chunk.w, j);
            mxc_u32 code;
            const bool finite = (B)(b & (B)(~((B)1 << (In::width - 1)))) < mxc_inf_bits<In>();
            if (fast && finite) {
                const mxc_u32 mag = (mxc_fast_mag_hi(mxc_fmul(mxc_value_of_bits<In>(b), sc)) - MXC_FAST_MEMIN) >>
                                    MXC_FAST_SHIFT;
                code = mag | (((mxc_u32)b >> (In::width - 1)) << (MXF_BITS - 1));
            } else {
                code = mxc_tensor_element<In>(b, k, nan_count);
            }
            tile[c0 + j][r] = (mxc_u8)code;
        }
    }
    __syncthreads();
    for (int v = first; v < MXC_T_TILE * MXC_T_TILE / 16; v += step) {
        const int c = v / (MXC_T_TILE / 16), q = v % (MXC_T_TILE / 16);
        mxc_v16 out;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const mxc_u8* t = &tile[c][16 * q + 4 * w];
            out.w[w] = (mxc_u32)t[0] | ((mxc_u32)t[1] << 8) | ((mxc_u32)t[2] << 16) | ((mxc_u32)t[3] << 24);
        }
        *(mxc_v16*)(codes + (tc * MXC_T_TILE + c) * R + tr * MXC_T_TILE + 16 * q) = out;
    }
}

// MX dequantization: codes [outer][K][inner], scales [outer][ceil(K/block)][inner] -> float32 / float64 bits
template <typename O>
__device__ __forceinline__ void mxc_dequantize_mx_kernel(const mxc_u8* codes, const mxc_u8* scales, O* out,
                                                         mxc_i64 outer, mxc_i64 K, mxc_i64 inner, int block) {
    const mxc_i64 t = mxc_thread_index();
    if (t >= outer * K * inner) return;
    const mxc_i64 i = t % inner;
    const mxc_i64 rest = t / inner;
    const mxc_i64 k = rest % K;
    const mxc_i64 o = rest / K;
    const mxc_i64 nb = (K + block - 1) / block;
    const mxc_u32 sc = scales[(o * nb + k / block) * inner + i];
    const bool nan = sc == MXC_E8M0_NAN;
    if constexpr (sizeof(O) == 4) out[t] = mxc_decode_f32(codes[t], (int)sc - 127, nan);
    else out[t] = mxc_decode_f64(codes[t], (int)sc - 127, nan);
}

// decode (scale_exp 0) and per-tensor dequantization (scale exponent read from the device when given)
template <typename O>
__device__ __forceinline__ void mxc_decode_kernel(const mxc_code_t* codes, O* out, mxc_i64 n, const int* scale_exp) {
    const mxc_i64 t = mxc_thread_index();
    if (t >= n) return;
    const int k = scale_exp ? *scale_exp : 0;
    if constexpr (sizeof(O) == 4) out[t] = mxc_decode_f32(codes[t], k, false);
    else out[t] = mxc_decode_f64(codes[t], k, false);
}

#define MXC_INPUT_KERNELS(SUF, IN)                                                                                  \
    extern "C" __global__ void __launch_bounds__(MXC_THREADS)                                                      \
        mx_encode_##SUF(const IN::bits_t* x, mxc_code_t* out, mxc_i64 n, int rtz, int ovf_nan, mxc_u32* nan_count) { \
        mxc_encode_kernel<IN>(x, out, n, rtz, ovf_nan, nan_count);                                                  \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(MXC_THREADS)                                                      \
        mx_quantize_mx_##SUF(const IN::bits_t* x, mxc_u8* codes, mxc_u8* scales, mxc_u32* scale_max1,               \
                             mxc_i64 outer, mxc_i64 K, mxc_i64 inner, int block, int rceil) {                       \
        if (block == MXC_MX_BLOCK)                                                                                 \
            mxc_quantize_mx_kernel<IN, true>(x, codes, scales, scale_max1, outer, K, inner, block, rceil);          \
        else                                                                                                       \
            mxc_quantize_mx_kernel<IN, false>(x, codes, scales, scale_max1, outer, K, inner, block, rceil);         \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(MXC_THREADS)                                                      \
        mx_amax_##SUF(const IN::bits_t* x, mxc_i64 n, mxc_i64 stride, mxc_u64* amax_bits) {                         \
        mxc_amax_kernel<IN>(x, n, stride, amax_bits);                                                               \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(MXC_THREADS)                                                      \
        mx_quantize_tensor_##SUF(const IN::bits_t* x, mxc_u8* codes, mxc_i64 n, const mxc_u64* amax_bits,           \
                                 int* scale_exp, float* scale, mxc_u32* nan_count) {                                \
        mxc_quantize_tensor_kernel<IN>(x, codes, n, amax_bits, scale_exp, scale, nan_count);                        \
    }

MXC_INPUT_KERNELS(f32, MxcF32)
MXC_INPUT_KERNELS(f16, MxcF16)
MXC_INPUT_KERNELS(bf16, MxcBF16)
MXC_INPUT_KERNELS(f64, MxcF64)

#define MXC_FAST_KERNEL(SUF, IN)                                                                                    \
    extern "C" __global__ void __launch_bounds__(MXC_THREADS)                                                      \
        mx_quantize_mx_fast_##SUF(const IN::bits_t* x, mxc_u8* codes, mxc_u8* scales, mxc_u32* scale_max1,          \
                                  mxc_i64 halves, mxc_i64 stride, int rceil) {                                      \
        mxc_quantize_mx_fast_kernel<IN>(x, codes, scales, scale_max1, halves, stride, rceil);                       \
    }
#define MXC_COLS_KERNEL(SUF, IN)                                                                                    \
    extern "C" __global__ void __launch_bounds__(MXC_THREADS)                                                      \
        mx_quantize_mx_cols_##SUF(const IN::bits_t* x, mxc_u8* codes, mxc_u8* scales, mxc_u32* scale_max1,          \
                                  mxc_i64 outer, mxc_i64 K, mxc_i64 N, int rceil) {                                 \
        mxc_quantize_mx_cols_kernel<IN>(x, codes, scales, scale_max1, outer, K, N, rceil);                          \
    }
MXC_COLS_KERNEL(f32, MxcF32)
MXC_COLS_KERNEL(f16, MxcF16)
MXC_COLS_KERNEL(bf16, MxcBF16)
#define MXC_FAST_TENSOR_KERNELS(SUF, IN)                                                                            \
    extern "C" __global__ void __launch_bounds__(MXC_THREADS)                                                      \
        mx_amax_fast_##SUF(const IN::bits_t* x, mxc_i64 runs, mxc_i64 stride, mxc_u64* amax_bits) {                  \
        mxc_amax_fast_kernel<IN>(x, runs, stride, amax_bits);                                                       \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(MXC_THREADS)                                                      \
        mx_quantize_tensor_fast_##SUF(const IN::bits_t* x, mxc_u8* codes, mxc_i64 runs, mxc_i64 stride,             \
                                      const mxc_u64* amax_bits, int* scale_exp, float* scale, mxc_u32* nan_count) {   \
        mxc_quantize_tensor_fast_kernel<IN>(x, codes, runs, stride, amax_bits, scale_exp, scale, nan_count);          \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(MXC_THREADS)                                                      \
        mx_quantize_tensor_small_##SUF(const IN::bits_t* x, mxc_u8* codes, mxc_i64 runs, int* scale_exp, float* scale, \
                                       mxc_u32* nan_count) {                                                        \
        mxc_quantize_tensor_small_kernel<IN>(x, codes, runs, scale_exp, scale, nan_count);                           \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(MXC_THREADS)                                                      \
        mx_quantize_tensor_t_##SUF(const IN::bits_t* x, mxc_u8* codes, mxc_i64 R, mxc_i64 C,                        \
                                   const mxc_u64* amax_bits, int* scale_exp, float* scale, mxc_u32* nan_count) {      \
        mxc_quantize_tensor_t_kernel<IN>(x, codes, R, C, amax_bits, scale_exp, scale, nan_count);                    \
    }
MXC_FAST_KERNEL(f32, MxcF32)
MXC_FAST_KERNEL(f16, MxcF16)
MXC_FAST_KERNEL(bf16, MxcBF16)
MXC_FAST_TENSOR_KERNELS(f32, MxcF32)
MXC_FAST_TENSOR_KERNELS(f16, MxcF16)
MXC_FAST_TENSOR_KERNELS(bf16, MxcBF16)

// an MX quantization's largest finite scale code from its counter (largest code + 1; 0: every block NaN -> 127)
extern "C" __global__ void __launch_bounds__(MXC_THREADS) mx_scale_max_finish(const mxc_u32* scale_max1, mxc_u8* out) {
    if (mxc_thread_index() == 0) out[0] = (mxc_u8)(*scale_max1 ? *scale_max1 - 1u : 127u);
}
extern "C" __global__ void __launch_bounds__(MXC_THREADS)
    mx_decode_f32(const mxc_code_t* codes, mxc_u32* out, mxc_i64 n, const int* scale_exp) {
    mxc_decode_kernel<mxc_u32>(codes, out, n, scale_exp);
}
extern "C" __global__ void __launch_bounds__(MXC_THREADS)
    mx_decode_f64(const mxc_code_t* codes, mxc_u64* out, mxc_i64 n, const int* scale_exp) {
    mxc_decode_kernel<mxc_u64>(codes, out, n, scale_exp);
}
extern "C" __global__ void __launch_bounds__(MXC_THREADS)
    mx_dequantize_mx_f32(const mxc_u8* codes, const mxc_u8* scales, mxc_u32* out, mxc_i64 outer, mxc_i64 K,
                         mxc_i64 inner, int block) {
    mxc_dequantize_mx_kernel<mxc_u32>(codes, scales, out, outer, K, inner, block);
}
extern "C" __global__ void __launch_bounds__(MXC_THREADS)
    mx_dequantize_mx_f64(const mxc_u8* codes, const mxc_u8* scales, mxc_u64* out, mxc_i64 outer, mxc_i64 K,
                         mxc_i64 inner, int block) {
    mxc_dequantize_mx_kernel<mxc_u64>(codes, scales, out, outer, K, inner, block);
}
#endif  // MXF_BITS

// ---- packing (format-free): rows of n codes along the last axis; pad codes are zero ----------------------------
// fp4: byte j = code[2j] | code[2j+1] << 4.  fp6: bytes 3g..3g+2 = the little-endian 24-bit word
// code[4g] | code[4g+1] << 6 | code[4g+2] << 12 | code[4g+3] << 18.  Codes wider than the field are counted in
// *bad (the host raises).
extern "C" __global__ void __launch_bounds__(MXC_THREADS)
    mx_pack_fp4(const mxc_u8* codes, mxc_u8* out, mxc_i64 rows, mxc_i64 n, mxc_u32* bad) {
    const mxc_i64 nout = (n + 1) / 2;
    const mxc_i64 t = mxc_thread_index();
    if (t >= rows * nout) return;
    const mxc_i64 r = t / nout, j = t % nout;
    const mxc_u8* row = codes + r * n;
    const mxc_u32 a = row[2 * j], b = 2 * j + 1 < n ? row[2 * j + 1] : 0u;
    if ((a | b) > 0xFu) mxc_atomic_add(bad, 1u);
    out[t] = (mxc_u8)((a & 0xFu) | ((b & 0xFu) << 4));
}
extern "C" __global__ void __launch_bounds__(MXC_THREADS)
    mx_unpack_fp4(const mxc_u8* packed, mxc_u8* out, mxc_i64 rows, mxc_i64 nbytes) {
    const mxc_i64 t = mxc_thread_index();
    if (t >= rows * nbytes) return;
    const mxc_u32 p = packed[t];
    out[2 * t] = (mxc_u8)(p & 0xFu);
    out[2 * t + 1] = (mxc_u8)(p >> 4);
}
// fp4, flat fast path (the caller checks: an even n, so that row boundaries fall on whole bytes; rows * n a
// multiple of 32; both arrays 16-byte aligned): every 32 codes (two 16-byte loads) become 16 packed bytes (one
// 16-byte store), grid-stride over those units.  Same bytes as mx_pack_fp4 / mx_unpack_fp4.
__device__ __forceinline__ mxc_u32 mxc_pack4_word(mxc_u32 w) {  // codes c0..c3 (bytes) -> c0|c1<<4|c2<<8|c3<<12
    const mxc_u32 x = w & 0x0F0F0F0Fu, y = x | (x >> 4);         // bytes 0 and 2 hold the two packed bytes
    return (y & 0xFFu) | ((y >> 8) & 0xFF00u);
}
__device__ __forceinline__ mxc_u32 mxc_unpack4_half(mxc_u32 h) {  // packed bytes b0, b1 -> four code bytes
    const mxc_u32 t = (h & 0xFFu) | ((h & 0xFF00u) << 8);          // b0 in byte 0, b1 in byte 2
    return (t & 0x000F000Fu) | ((t & 0x00F000F0u) << 4);
}
extern "C" __global__ void __launch_bounds__(MXC_THREADS)
    mx_pack_fp4_fast(const mxc_v16* codes, mxc_v16* out, mxc_i64 units, mxc_i64 stride, mxc_u32* bad) {
    mxc_u32 wide = 0u;
    for (mxc_i64 u = mxc_thread_index(); u < units; u += stride) {
        const mxc_v16 lo = codes[2 * u], hi = codes[2 * u + 1];
        mxc_v16 o;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            o.w[i] = mxc_pack4_word(lo.w[2 * i]) | (mxc_pack4_word(lo.w[2 * i + 1]) << 16);
            o.w[i + 2] = mxc_pack4_word(hi.w[2 * i]) | (mxc_pack4_word(hi.w[2 * i + 1]) << 16);
            wide |= (lo.w[2 * i] | lo.w[2 * i + 1] | hi.w[2 * i] | hi.w[2 * i + 1]) & 0xF0F0F0F0u;
        }
        out[u] = o;
    }
    if (wide) mxc_atomic_add(bad, 1u);
}
extern "C" __global__ void __launch_bounds__(MXC_THREADS)
    mx_unpack_fp4_fast(const mxc_v16* packed, mxc_v16* out, mxc_i64 units, mxc_i64 stride) {
    for (mxc_i64 u = mxc_thread_index(); u < units; u += stride) {
        const mxc_v16 p = packed[u];
        mxc_v16 lo, hi;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            lo.w[2 * i] = mxc_unpack4_half(p.w[i]);
            lo.w[2 * i + 1] = mxc_unpack4_half(p.w[i] >> 16);
            hi.w[2 * i] = mxc_unpack4_half(p.w[i + 2]);
            hi.w[2 * i + 1] = mxc_unpack4_half(p.w[i + 2] >> 16);
        }
        out[2 * u] = lo;
        out[2 * u + 1] = hi;
    }
}
extern "C" __global__ void __launch_bounds__(MXC_THREADS)
    mx_pack_fp6(const mxc_u8* codes, mxc_u8* out, mxc_i64 rows, mxc_i64 n, mxc_u32* bad) {
    const mxc_i64 groups = (n + 3) / 4;
    const mxc_i64 t = mxc_thread_index();
    if (t >= rows * groups) return;
    const mxc_i64 r = t / groups, g = t % groups;
    const mxc_u8* row = codes + r * n;
    mxc_u32 word = 0u, any = 0u;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const mxc_u32 c = 4 * g + j < n ? row[4 * g + j] : 0u;
        any |= c;
        word |= (c & 0x3Fu) << (6 * j);
    }
    if (any > 0x3Fu) mxc_atomic_add(bad, 1u);
    mxc_u8* o = out + r * 3 * groups + 3 * g;
    o[0] = (mxc_u8)word;
    o[1] = (mxc_u8)(word >> 8);
    o[2] = (mxc_u8)(word >> 16);
}
extern "C" __global__ void __launch_bounds__(MXC_THREADS)
    mx_unpack_fp6(const mxc_u8* packed, mxc_u8* out, mxc_i64 rows, mxc_i64 groups) {
    const mxc_i64 t = mxc_thread_index();
    if (t >= rows * groups) return;
    const mxc_u8* p = packed + 3 * t;
    const mxc_u32 word = p[0] | ((mxc_u32)p[1] << 8) | ((mxc_u32)p[2] << 16);
#pragma unroll
    for (int j = 0; j < 4; ++j) out[4 * t + j] = (mxc_u8)((word >> (6 * j)) & 0x3Fu);
}
