// mxcore weight-only GEMM: an MX weight W [K, N] (one uint8 code per element, any strides; E8M0 scales
// [ceil(K/32), N], any strides) -> the packed fragment records gemm_wonly.cu and gemm_wonly_gemv.cu stream (the layout is described
// in wonly_common.cuh; records in groups of `group` tiles).  One thread per (record, lane): the lane's 16 fragment bytes, and lanes < 16 * BPC one scale byte each.
// Codes past K or N are 0 (+0 in every MX element format); scales of padding rows / blocks are 127 (2^0).
// *specials |= 1 where a byte code c has (c & sp_mask) == sp_mask (e4m3fn's NaN magnitude, e5m2's exponent 31; sp_mask 0:
// none), so that the wgmma kernel decodes a weight without such codes with no fix for them (zeroed before).
// Runs once per weight (the backend caches the records on the MXTensor), followed by mx_wonly_ranges.  -D: the fragment formulas WO_A_ROW,
// WO_A_K, WO_C_ROW, WO_KPHYS and the 4-bit placement WO4_T, WO4_POS (see wonly_common.cuh).

#include "mx_common.cuh"

extern "C" __global__ void mx_wonly_pack(const u8* __restrict__ codes, i64 cs_k, i64 cs_n, const u8* __restrict__ scales,
                                         i64 ss_k, i64 ss_n, int K, int N, int pack4, int nchunks, int group,
                                         i64 total, u8* __restrict__ out, u32 sp_mask, u32* __restrict__ specials) {
    const int kc = pack4 ? 64 : 32, bpc = kc / 32, rec_bytes = 512 + 16 * bpc, nblocks = (K + 31) / 32;
    bool special = false;  // a code c with (c & sp_mask) == sp_mask (sp_mask 0: the format has no special codes)
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
        const int lane = (int)(idx & 31);
        const i64 rec = idx >> 5;  // records [tile group][chunk][tile in the group]
        const int tile = (int)(rec / ((i64)group * nchunks)) * group + (int)(rec % group);
        const int chunk = (int)((rec / group) % nchunks);
        u32 w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int s = 0; s < 4; ++s)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (s >= kc / 16) continue;
                const int n = tile * 16 + WO_A_ROW(lane, j);
#pragma unroll
                for (int p = 0; p < 2; ++p) {
                    const int k = chunk * kc + WO_KPHYS(s >> 1, s & 1, WO_A_K(lane, j, p));
                    const u32 code = (n < N && k < K) ? codes[(i64)k * cs_k + (i64)n * cs_n] : 0u;
                    if (pack4) {  // code bit b to WO4_POS (wonly_common.cuh)
#pragma unroll
                        for (int b = 0; b < 4; ++b)
                            w[s] |= ((code >> b) & 1u) << WO4_POS(j, WO4_T(p, b), b);
                    } else {
                        w[(2 * s + (j >> 1)) & 3] |= code << (8 * (j & 1) + 16 * p);
                        special |= sp_mask && (code & sp_mask) == sp_mask;
                    }
                }
            }
        u8* dst = out + rec * rec_bytes;
        *reinterpret_cast<uint4*>(dst + lane * 16) = make_uint4(w[0], w[1], w[2], w[3]);
        if (lane < 16 * bpc) {  // scale byte `lane`: fragment row g, block blk, half h (accumulator row g + 8h)
            const int g = lane / (2 * bpc), blk = (lane % (2 * bpc)) >> 1, h = lane & 1;
            const int n = tile * 16 + WO_C_ROW(4 * g, 2 * h), kb = chunk * bpc + blk;
            dst[512 + lane] = (n < N && kb < nblocks) ? scales[(i64)kb * ss_k + (i64)n * ss_n] : (u8)127;
        }
    }
    if (special) atomicOr(specials, 1u);
}

// The scale-code range of each record group's chunk, written after the records ([group][chunk]: the least and the
// greatest scale byte of its `group` records, pad rows' 127 included), and the least and greatest of all of them in
// span ({255 - least, greatest}, zeroed before: atomicMax on both).  One thread per (group, chunk); records are
// [group][chunk][tile], rec_bytes each, their scale bytes from byte 512 on.
extern "C" __global__ void mx_wonly_ranges(const u8* __restrict__ recs, int groups, int nchunks, int group,
                                           int rec_bytes, u8* __restrict__ ranges, u32* __restrict__ span) {
    const i64 items = (i64)groups * nchunks;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < items; i += (i64)gridDim.x * blockDim.x) {
        const u8* rec = recs + i * group * rec_bytes;
        u32 lo = 255u, hi = 0u;
        for (int t = 0; t < group; ++t)
            for (int b = 512; b < rec_bytes; ++b) {
                const u32 v = rec[(i64)t * rec_bytes + b];
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
            }
        ranges[2 * i] = (u8)lo;
        ranges[2 * i + 1] = (u8)hi;
        atomicMax(span, 255u - lo);
        atomicMax(span + 1, hi);
    }
}

// Nothing: launched normally after records were written (backends/cuda/wonly/records.py records_written), so that a
// weight-only kernel launched with programmatic dependent launch, which reads its records before waiting for its
// predecessor, can never start before they are complete.
extern "C" __global__ void mx_wonly_fence() {}
