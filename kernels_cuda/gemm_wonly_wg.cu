// mxcore weight-only GEMM on wgmma (sm_90a; backends/cuda/wonly/): C[M,N] = X[M,K] @ W[K,N] with X fp16/bf16
// activations and W an MX weight in the packed fragment records of wonly_common.cuh, for the M where mma.sync runs
// out of issue slots (tens of rows).  Any M runs (grid.y covers M in steps of 8 * WO_MT).
//
// Swapped product: C^T = W^T X^T, one wgmma.mma_async m64n(8 WO_MT)k16 per k16 step and half of the block's record
// group, with the weight as the register-A operand (a record's lane fragment is exactly the register-A fragment
// of the warp's 16 rows: wgmma's register A is mma.sync's m16 A per warp) and the activations as B from shared
// memory (K-major, 128-byte swizzle, one 128-byte row of 64 K per token).  Warp w of the consumer warpgroup owns
// tiles 2w and 2w + 1 of the group: half r's wgmma covers tiles r, 2 + r, 4 + r, 6 + r.
//
// Block scales: on a chunk whose every scale byte s lies in [slo, shi] (the producer tests the chunk's range
// of scale codes, stored after the records, and publishes one bit per chunk with the stage: the decision is the
// same in every consumer warp), each code is decoded straight to its scaled value,
// the placed bits times 2^(target bias - element bias) * 2^(s - 127) in one exact 16-bit multiply (the range is
// where that factor is a normal 16-bit number and every value of the format times it is representable:
// backends/cuda/wonly/ fold_range), and the wgmma accumulate over the whole K range in fp32.  Any other chunk
// (scale codes near 0x00 / 0xFF, NaN blocks, or fp16's narrow range) runs block by block exactly as the mma.sync
// kernels do: the block's two wgmma into a zeroed scratch, then acc = fma(t, 2^(s - 127), acc) in fp32.
// WW_FOLD_ONLY builds drop that path (the plan runs them only on a weight whose every scale code folds: then up to
// 32 accumulators, wgmma N = 64, fit two blocks per SM); a chunk that does not fold there gives NaN, never a wrong
// sum.
//
// Warp specialization: warps 8.. are the producers.  Per ring stage (WW_CPS K chunks) warp 8's lane 0 bulk-copies
// the group's records (contiguous) completing on the stage's "full" mbarrier by byte count, and the lanes of the
// WW_GATHER_WARPS producer warps (each a share of the m8 row groups, or of the tokens: WW_GATHER_ROWS) gather the
// activations with 4-byte cp.async into the stage's swizzled rows (the records permute K inside each 32-K block,
// WO_KPHYS, so that a lane's 8 K of a block are contiguous; the rows put them back in k16 order: physical word
// (block b, lane t, i) of a token goes to 16-byte chunk 4 (b & 1) + i, word t, of its row), then, a stage later
// (cp.async.wait_group), fence them to the async proxy and arrive.  Consumers release a stage ("empty", one arrive
// per warp) once the wgmma that read it completed.  WW_WHOLE token-row builds gather a block whose tokens all lie
// inside M from source and destination offsets computed once (ww_rows): an add and two copies per token and stage.
//
// Clusters (WW_PAIR = P blocks on adjacent record groups, the same tokens and K): each block gathers a P-th of the
// tokens and bulk-copies those rows from its stage into the same slot of every peer (cp.async.bulk shared::cluster,
// completing on the peer's full barrier, whose expect_tx counts them), so the activations cross L2 once per cluster
// instead of once per block; a slot is free when the consumers of all P blocks released it (the empty barrier
// counts 8 P arrives, remote ones by mapa).  A cluster barrier after the barriers' init and before exit.
//
// WW_TMA: the activations come by tensor copy (TMA, 128-byte swizzle) from the plan's copy of X with the records' K
// permutation applied (mx_wonly_xperm below: in every 32-K block X word 4 t + i moved to word 4 i + t), one box of
// 64 K x the block's tokens per 64-K row, issued by warp 8's lane 0 after the records; the full barrier then counts
// two arrives, the records' and the activations', each with its bytes.  One producer warp; no gather, no clusters
// (clusters sharing the tiles by multicast measured no better: backends/cuda/tuning/wonly.json, wg_tma).
//
// Under WO_PDL the producer issues the first WW_STAGES record copies before the dependent part
// (wonly_common.cuh: wo_dependent_part); activations, workspace and output come after it.
//
// -D: those of wonly_common.cuh (WO_MT: m8 tiles = wgmma N / 8, 1 to 8), WW_STAGES, WW_CPS (K chunks
// per stage; even), WW_MMA_ASM (the wgmma with its operands, the mnemonic from mxcore.layouts.hopper),
// WW_FOLD_ONLY, WW_GATHER_WARPS, WW_GATHER_ROWS, WW_WHOLE, WW_PAIR, WW_TMA, WW_PIN, WW_KIND_LOOP (1: the consumer
// loop compiled once per element format, see ww_consume; the host always passes it).  Kernel arguments besides the
// operands: the weight's format (kind: wonly_common.cuh's WO_FORMATS; plus 256 for a weight without special codes,
// which the WW_KIND_LOOP builds decode with no fix for them: WO_PLAIN) and its fold range (slo, shi, eoff4: the scale
// codes decoded with their factor, whose exponent field is the code + eoff, eoff4 = eoff * 0x01010101 mod 2^32;
// backends/cuda/wonly/ fold_range).

#include "mx_common.cuh"
#include "async_sm90.cuh"
#include "wonly_common.cuh"

#define WW_MP (8 * WO_MT)                               // tokens per block (the wgmma N)
#define WW_BPS (WW_CPS * WO_BPC)                        // 32-K blocks per stage
#define WW_UNITS (WW_BPS / 2)                           // 64-K activation rows per token per stage
#define WW_ACT_BYTES (WW_UNITS * WW_MP * 128)
#define WW_REC_BYTES (WW_CPS * WO_GROUP * WO_REC)
#define WW_STAGE_BYTES ((WW_ACT_BYTES + WW_REC_BYTES + 1023) / 1024 * 1024)
#ifndef WW_GATHER_WARPS
#define WW_GATHER_WARPS 1  // producer warps (warp 8 also copies the records and publishes the fold bits)
#endif
#define WW_THREADS (32 * (8 + WW_GATHER_WARPS))
#ifndef WW_GATHER_ROWS
#define WW_GATHER_ROWS 0  // 1: the activations gathered per token row (ww_gather_rows_), 0: per row group of 8
#endif
#ifndef WW_WHOLE
#define WW_WHOLE 0  // 1: the token-row gather of a block inside M from offsets computed once (ww_gather_rows_whole)
#endif
#ifndef WW_TMA
#define WW_TMA 0  // 1: the activations by tensor copy from the permuted X (xmap), no gather
#endif
#ifndef WW_PAIR
#define WW_PAIR 0  // P > 1: clusters of P blocks (record groups Pc .. Pc + P - 1) share the activations: each
                   // gathers a P-th of the tokens and copies it to the others
#endif
#if WW_PAIR
#define WW_PART (WW_MP / WW_PAIR)                        // tokens a block of the cluster gathers
#define WW_SPAN (WW_PART / WW_GATHER_WARPS)              // tokens a producer warp gathers (contiguous)
#define WW_PEER_BYTES (WW_UNITS * (WW_MP - WW_PART) * 128)  // what the peers copy into a stage
static_assert(WW_PART % WW_GATHER_WARPS == 0 && WW_PART * WW_PAIR == WW_MP && WW_GATHER_ROWS && !WW_TMA,
              "clusters gather token rows, a producer warp's share of the block's part");
#define WW_CLUSTER __cluster_dims__(WW_PAIR, 1, 1)
#else
#define WW_PEER_BYTES 0
#define WW_CLUSTER
#endif
#ifndef WW_FOLD_ONLY
#define WW_FOLD_ONLY 0  // 1: every chunk folds (the plan checked the weight's scale codes); no fp32 block path
#endif
#define WW_LAG 1  // activation stages in flight before the producer arrives (at most WW_STAGES - 2)
// How the consumers' chunk loop passes the chunks a K tail's last stage lacks: leave the loop (break) or skip them
// (continue).  With break ptxas serializes every wgmma of the fold-only builds (C7513: each waits for the one before);
// with continue it pipelines all builds, yet that measured faster only for the 4-bit m32 tensor-copy builds (H100,
// 32 x 28672 x 8192: bf16 x mxfp4 66.1 -> 63.6 us, fp16 x mxfp4 78.2 -> 73.5 us) and slower or no
// better elsewhere (m24 / m32 gather and byte-code builds 0-4 % slower; fold-only m40 / m64 63.5 / 73.3 -> 65.4 /
// 74.1 us, bf16 x mxfp8 m64 153 -> 160 us).  So only those builds skip.
#define WW_TAIL_SKIP (WO_PACK4 && WO_MT == 4 && WW_TMA && !WW_FOLD_ONLY)
static_assert(WW_CPS % 2 == 0, "the decode alternates two register buffers by chunk parity inside a stage");
static_assert(WW_STAGES >= 3, "a stage is released while the next one is multiplied; the producer runs one ahead");
static_assert(WW_LAG >= 1 && WW_LAG <= WW_STAGES - 2, "the producer arrives on a stage before it waits for its slot");

__device__ __forceinline__ void ww_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void ww_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void ww_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// K-major operand in shared memory, 128-byte swizzle (rows of 128 bytes, 8-row atoms of 1024 bytes): the B of k16
// step s (0, 1) of 32-K block bb of the stage whose activation rows start at act (two blocks per 64-K row)
// (the stage's descriptor is formed once; a step's adds its offset / 16 to the start-address field, which cannot
// carry out of its 14 bits: shared memory ends below 2^18 bytes)
__device__ __forceinline__ u64 ww_desc0(u32 act) {
    return (u64)((act & 0x3FFFF) >> 4) | ((u64)(16 >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ u64 ww_desc(u64 desc0, int bb, int s) {
    const u32 lo = (u32)desc0 + (u32)(((bb >> 1) * WW_MP * 128 + 32 * (2 * (bb & 1) + s)) >> 4);
    return (desc0 & ~0xffffffffull) | lo;
}

// d (+)= A (registers a) * B (desc); acc = 0 overwrites d.  WW_MMA_ASM: the instruction with its operands
// numbered (backends/cuda/wonly/ writes it for the N = 8 WO_MT of the variant: d first, then a, desc, acc)
#define WW_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define WW_D1 WW_F4(0)
#define WW_D2 WW_D1, WW_F4(4)
#define WW_D3 WW_D2, WW_F4(8)
#define WW_D4 WW_D3, WW_F4(12)
#define WW_D5 WW_D4, WW_F4(16)
#define WW_D6 WW_D5, WW_F4(20)
#define WW_D7 WW_D6, WW_F4(24)
#define WW_D8 WW_D7, WW_F4(28)
#define WW_DCAT(n) WW_D##n
#define WW_DN(n) WW_DCAT(n)
#define WW_D WW_DN(WO_MT)
static_assert(WO_MT >= 1 && WO_MT <= 8, "wgmma N = 8 WO_MT: 8 to 64");
__device__ __forceinline__ void ww_mma(float (&d)[4 * WO_MT], const u32 (&a)[4], u64 desc, int acc) {
    asm volatile(WW_MMA_ASM : WW_D : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc));
}

__device__ __forceinline__ void ww_cp4(u32 dst, const void* src, u32 bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void ww_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void ww_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ww_fence_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// WW_PIN: the consumers form their shared addresses (ring, barriers, fold bits, the lane's record offsets) once and
// keep them in registers (ww_pin), reading the records by ld_shared_* (async_sm90.cuh); otherwise ptxas forms them
// again from the CTA's shared window (S2R SR_CgaCtaId) in every chunk.  Fold-only builds only: the m64 4-bit
// tensor-copy loop went from 239 to 210 instructions per stage, and (H100, us, two passes each) bf16 x
// mxfp4 64 x 28672 x 8192 73.5 -> 70.1 / 71.3, 64 x 8192 x 8192 31.8 -> 31.3, fp16 x mxfp4 64 x 28672 x 8192 83.6 ->
// 80.2, bf16 x mxfp8 153.1 -> 146.6, bf16 x mxfp6 101.5 -> 98.4.  Under the other builds' 96-register bound it
// spilled (4-bit m32 gather) or had ptxas serialize the wgmma (f16 x e5m2: C7519).
#define WW_PIN WW_FOLD_ONLY
__device__ __forceinline__ u32 ww_pin(u32 v) {
    asm volatile("" : "+r"(v));
    return v;
}

// The producer's activation gather of one stage (K from k0, WW_UNITS rows of 64 K per token), per row group of 8
// tokens.  Instruction
// (unit, row group, block b of the unit, i) moves word i of 8 tokens x 4 lanes t, physical K k0 + 64 unit + 32 b +
// 8 t + 2 i, to 16-byte chunk 4 b + i (swizzled by the row) of the token's row, word t: 32 distinct banks.  xr:
// the lane's token rows (row group g: token m0 + 8 g + lane / 4, clamped into M), live: 4 bytes for a token
// inside M, 0 (zero fill) past it; K is checked only in a stage that reaches past it.
template <bool INSIDE>
__device__ __forceinline__ void ww_gather_groups_(u32 act, const u16* const (&xr)[WO_MT], const u32 (&live)[WO_MT],
                                                  int K, int k0, int lane, int pw) {
    const int t = lane & 3, rr = lane >> 2;
    const u32 dl = act + rr * 128 + 4 * t;
#pragma unroll
    for (int u = 0; u < WW_UNITS; ++u)
#pragma unroll
        for (int g = 0; g < WO_MT; ++g) {
            if (g % WW_GATHER_WARPS != pw) continue;  // producer warp pw gathers row groups pw, pw + P, ...
            const u16* src = xr[g] + k0 + 64 * u + 8 * t;
#pragma unroll
            for (int b = 0; b < 2; ++b)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const u32 dst = dl + (u * WW_MP + g * 8) * 128 + (((4 * b + i) ^ rr) << 4);
                    if (INSIDE) {
                        ww_cp4(dst, src + 32 * b + 2 * i, live[g]);
                    } else {
                        const int k = k0 + 64 * u + 32 * b + 8 * t + 2 * i;
                        const u32 bytes = live[g] ? (u32)max(0, min(2, K - k)) * 2u : 0u;
                        ww_cp4(dst, bytes ? (const void*)(src + 32 * b + 2 * i) : (const void*)xr[0], bytes);
                    }
                }
        }
}
// The producer's activation gather of one stage (K from k0, WW_UNITS rows of 64 K per token): one 4-byte cp.async
// per token and 64-K row, lane l moving physical word l (block l >> 4 of the row, record lane t = (l >> 2) & 3,
// word i = l & 3: K k0 + 64 u + 2 l) to 16-byte chunk 4 (l >> 4) + i (swizzled by the token's row) of the token's
// row, word t: 128 contiguous bytes of X (4 sectors) into 32 distinct banks.  Producer warp pw takes WW_ROWS tokens
// n0, n0 + WW_ROW_STEP, ... of the block's WW_MP (n0 = pw, step WW_GATHER_WARPS; in a cluster its WW_SPAN contiguous
// tokens of the block's part); tokens past M are not gathered (their columns of the product are never stored); K is
// checked only in a stage that reaches past it.  x: the block's first token row.
#if WW_PAIR
#define WW_ROWS WW_SPAN
#define WW_ROW_STEP 1
#else
#define WW_ROWS (WW_MP / WW_GATHER_WARPS)
#define WW_ROW_STEP WW_GATHER_WARPS
static_assert(!WW_GATHER_ROWS || WW_MP % WW_GATHER_WARPS == 0, "the token-row gather: each warp an equal share");
#endif
// Where 4-byte word l of a token's 64 K of X (block b = l >> 4, record lane t = (l >> 2) & 3, word i = l & 3) sits in
// the k16 order of a stage's activation row: 16-byte chunk 4 b + i (ww_kchunk), word t of it (a 4 x 4 transpose in
// each 32-K block; the token-row gathers and the permuted copy, mx_wonly_xperm, place words by it)
__device__ __forceinline__ int ww_kchunk(int l) { return 4 * (l >> 4) + (l & 3); }
// lane's 4-byte word of token row n in a stage's first unit (the 128-byte swizzle of the activations' smem tile)
__device__ __forceinline__ u32 ww_row_word(int lane, int n) {
    return 4u * ((lane >> 2) & 3) + n * 128 + ((ww_kchunk(lane) ^ (n & 7)) << 4);
}
template <bool INSIDE>
__device__ __forceinline__ void ww_gather_rows_(u32 act, const u16* x, i64 lda, int live, int K, int k0, int lane,
                                                int n0) {
    const u16* row = x + (i64)n0 * lda + k0 + 2 * lane;
#pragma unroll
    for (int j = 0; j < WW_ROWS; ++j) {
        const int n = n0 + j * WW_ROW_STEP;
        if (n >= live) break;
#pragma unroll
        for (int u = 0; u < WW_UNITS; ++u) {
            const u32 dst = act + ww_row_word(lane, n) + u * WW_MP * 128;
            if (INSIDE) {
                ww_cp4(dst, row + 64 * u, 4u);
            } else {
                const int k = k0 + 64 * u + 2 * lane;
                const u32 bytes = (u32)max(0, min(2, K - k)) * 2u;
                ww_cp4(dst, bytes ? (const void*)(row + 64 * u) : (const void*)x, bytes);
            }
        }
        row += WW_ROW_STEP * lda;
    }
}
// The token-row gather of a block whose WW_MP tokens all lie inside M, their rows within 2^31 bytes of the first
// (ww_rows_whole), in a stage inside K: the lane's source and destination offsets of each token computed once per
// kernel (WwRows), so that a token's two 64-K rows cost an address add and two copies, with no test between tokens.
struct WwRows {
    u32 src[WW_ROWS];  // token j's row from the block's first row, plus the lane's word: bytes
    u32 dst[WW_ROWS];  // its swizzled word in a stage's first unit
};
__device__ __forceinline__ bool ww_rows_whole(int live, i64 lda) {
    return live >= WW_MP && (i64)(WW_MP - 1) * lda < (1ll << 30);
}
__device__ __forceinline__ WwRows ww_rows(i64 lda, int lane, int n0) {
    WwRows r;
#pragma unroll
    for (int j = 0; j < WW_ROWS; ++j) {
        const int n = n0 + j * WW_ROW_STEP;
        r.src[j] = (u32)(2 * (n * lda + 2 * lane));
        r.dst[j] = ww_row_word(lane, n);
    }
    return r;
}
__device__ __forceinline__ void ww_gather_rows_whole(u32 act, const u16* x, int k0, const WwRows& r) {
    const u8* xk = reinterpret_cast<const u8*>(x + k0);
#pragma unroll
    for (int j = 0; j < WW_ROWS; ++j)
#pragma unroll
        for (int u = 0; u < WW_UNITS; ++u) ww_cp4(act + r.dst[j] + u * WW_MP * 128, xk + r.src[j] + 128 * u, 4u);
}
// the stage's gather, per token row (WW_GATHER_ROWS, from token n0) or per row group
__device__ __forceinline__ void ww_gather(u32 act, const u16* x, i64 lda, int live, const u16* const (&xr)[WO_MT],
                                          const u32 (&lv)[WO_MT], int K, int k0, int lane, int pw, int n0,
                                          bool whole, const WwRows& rows) {
    if (WW_GATHER_ROWS) {
        if (k0 + WW_UNITS * 64 <= K) {
            if (whole)
                ww_gather_rows_whole(act, x, k0, rows);
            else
                ww_gather_rows_<true>(act, x, lda, live, K, k0, lane, n0);
        } else {
            ww_gather_rows_<false>(act, x, lda, live, K, k0, lane, n0);
        }
    } else {
        if (k0 + WW_UNITS * 64 <= K)
            ww_gather_groups_<true>(act, xr, lv, K, k0, lane, pw);
        else
            ww_gather_groups_<false>(act, xr, lv, K, k0, lane, pw);
    }
}

// The activations of a stage by tensor copy (WW_TMA; K from k0, WW_UNITS rows of 64 K per token): the expect_tx
// arrive for the whole tile, then per 64-K row one box of the block's tokens m0 .. m0 + WW_MP - 1 into its rows.
// Tokens past M and K past the permuted copy's width arrive as zeros.
__device__ __forceinline__ void ww_load_act(u32 act, const TmaMap* map, int k0, int m0, u32 bar) {
    mbarrier_arrive_expect_tx(bar, WW_ACT_BYTES);
#pragma unroll
    for (int u = 0; u < WW_UNITS; ++u) cp_async_bulk_tensor_2d(act + u * WW_MP * 128, map, k0 + 64 * u, m0, bar);
}
// factor of scale byte k of word e (e = the scale bytes plus the exponent offset, each in [1, 254]): the 16-bit
// power of two with exponent field e_k in both halves (bf16: bits 7..14; f16 takes the field at bits 10..14)
template <int BYTE>
__device__ __forceinline__ u32 ww_factor(u32 e) {
    const u32 two = __byte_perm(e, 0u, (BYTE << 4) | (BYTE << 12) | 0x0404);  // byte k at bytes 1 and 3, zeros else
    return WO_BF16 ? two >> 1 : two << 2;
}

// The chunks of a stage that fold, one bit per chunk (chunk cc of the stage: bit cc): the producer's lanes read the
// scale-code range of the record group's chunks (pack_weight stores min | max << 8 of its 8 records' scale bytes
// after the records, [group][chunk]) and test it against [slo, shi]
__device__ __forceinline__ u32 ww_fold_bits(u32 range, u32 slo, u32 shi) {
    const bool ok = (range & 0xffu) >= slo && (range >> 8) <= shi;
    return __ballot_sync(0xffffffffu, ok) & ((1u << WW_CPS) - 1u);
}
// the range of chunk c0 + lane for the lanes below WW_CPS (a folding range for the others and past c_end: a stage's
// fold bits are all set where every chunk of it before c_end folds)
__device__ __forceinline__ u32 ww_range(const u16* ranges, int c0, int c_end, int lane, u32 slo, u32 shi) {
    return lane < WW_CPS && c0 + lane < c_end ? (u32)__ldg(ranges + c0 + lane) : slo | shi << 8;
}

// A folding chunk's registers (lane's 16 code bytes q): k16 step u, block u / 2; registers 0, 2: row g, 1, 3: g + 8,
// each code decoded straight to its scaled value with the factors f of its block and row (ww_factor)
template <int KIND>
__device__ __forceinline__ void ww_decode_fold(u32 (&a)[2 * WO_BPC][4], const uint4& q, const u32 (&f)[4]) {
#pragma unroll
    for (int u = 0; u < 2 * WO_BPC; ++u) {
        const u32 f0 = f[2 * (u >> 1)], f1 = f[2 * (u >> 1) + 1];
        a[u][0] = wo_reg_by<0, KIND>(q, u, f0);
        a[u][1] = wo_reg_by<1, KIND>(q, u, f1);
        a[u][2] = wo_reg_by<2, KIND>(q, u, f0);
        a[u][3] = wo_reg_by<3, KIND>(q, u, f1);
    }
}
// block blk's registers of a chunk that does not fold: its two k16 steps, decoded without the block scale
template <int KIND>
__device__ __forceinline__ void ww_decode_block(u32 (&b2)[2][4], const uint4& q, int blk) {
#pragma unroll
    for (int s2 = 0; s2 < 2; ++s2) {
        b2[s2][0] = wo_reg<0, KIND>(q, 2 * blk + s2);
        b2[s2][1] = wo_reg<1, KIND>(q, 2 * blk + s2);
        b2[s2][2] = wo_reg<2, KIND>(q, 2 * blk + s2);
        b2[s2][3] = wo_reg<3, KIND>(q, 2 * blk + s2);
    }
}


// A consumer warp's part (warp w of the consumer warpgroups multiplies tile 2 (w % 4) + w / 4 of the record group):
// every stage's chunks, folded or block by block, into acc (fb: the fp32 block-scale path's sum).  KIND >= 0: the
// weight's format (wonly_common.cuh), fixed for the whole loop (the kernel branches on `kind` once, outside); -1:
// the loop branches on `kind` in every chunk.  WW_KIND_LOOP (-D, backends/cuda/tuning/wonly.json wg_kind_loop) picks
// the first form where it measured faster and ptxas neither spills nor serializes the wgmma.
template <int KIND>
__device__ __forceinline__ void ww_consume(float (&acc)[4 * WO_MT], float (&fb)[4 * WO_MT], const u32* fold_bits,
                                           const u8* ring_ptr, u32 ring, u32 full0, u32 empty0, int stages,
                                           int c_begin, int c_end, int warp, int lane, u32 rank, u32 eoff4,
                                           u32 kind) {
    constexpr int D = 4 * WO_MT;
    const int g = lane >> 2, tile = 2 * (warp & 3) + (warp >> 2);
    u32 a[2][2 * WO_BPC][4];  // [buffer][k16 step of the chunk][register]
    // the previous stage is free once the second chunk of this one passed its wait (every wgmma of the previous
    // stage completed): one arrive per warp
    const auto release = [&](int st, int cc) {
        if (cc == WW_CPS - 1 && st > 0 && lane == 0) {
            const u32 empty = empty0 + 8 * ((WW_PIN ? st + WW_STAGES - 1 : st - 1) % WW_STAGES);
            mbarrier_arrive(empty);
#if WW_PAIR
#pragma unroll
            for (int r = 1; r < WW_PAIR; ++r)  // the peers write into this slot too
                mbarrier_arrive_cluster(mapa(empty, (rank + r) % WW_PAIR));
#endif
        }
    };
    bool unfolded = false;    // a chunk outside the fold range (a fold-only build gives NaN: never a wrong sum)
#if WW_PIN  // the lane's shared addresses, formed once: the ring, the barriers, the fold bits, and the offsets of its
        // fragment of tile `tile` and of its scale word in a stage's first record chunk
    const u32 ring0 = ww_pin(ring), full = ww_pin(full0), folds0 = ww_pin(smem_u32(fold_bits));
    const u32 q_off = ww_pin(WW_ACT_BYTES + tile * WO_REC + lane * 16);
    const u32 sc_off = ww_pin(WW_ACT_BYTES + tile * WO_REC + 512 + g * (WO_BPC == 2 ? 4 : 2));
#endif
    float t[D];               // the fp32 path's block product (written by wgmma only)
#pragma unroll
    for (int i = 0; i < D; ++i) t[i] = 0.f;
    for (int st = 0; st < stages; ++st) {
        const int s = st % WW_STAGES;
#if WW_PIN
        const u32 stage = ring0 + s * WW_STAGE_BYTES;
        mbarrier_wait(full + 8 * s, (st / WW_STAGES) & 1);
        const u32 folds = ld_shared_u32(folds0 + 4 * s);
        const u64 desc0 = ww_desc0(stage);
#else
        mbarrier_wait(full0 + 8 * s, (st / WW_STAGES) & 1);
        const u32 folds = fold_bits[s];
        const u64 desc0 = ww_desc0(ring + s * WW_STAGE_BYTES);
        const u8* recs = ring_ptr + s * WW_STAGE_BYTES + WW_ACT_BYTES;
#endif
        if (WW_FOLD_ONLY) unfolded |= folds != (1u << WW_CPS) - 1u;  // (chunks past c_end read as folding)
#pragma unroll
        for (int cc = 0; cc < WW_CPS; ++cc) {
            const int c = c_begin + st * WW_CPS + cc;
            if (c >= c_end) {  // a K tail's last stage: see WW_TAIL_SKIP
                if (WW_TAIL_SKIP) continue;
                break;
            }
#if WW_PIN
            const u32 chunk = stage + cc * WO_GROUP * WO_REC;
            const int4 q4 = ld_shared_v4(chunk + q_off);
            const uint4 q = make_uint4(q4.x, q4.y, q4.z, q4.w);
            const u32 sc = WO_BPC == 2 ? ld_shared_u32(chunk + sc_off)
                                       : wo_scale_word(ld_shared_u16(chunk + sc_off));
#else
            const u8* rec = recs + cc * WO_GROUP * WO_REC + tile * WO_REC;
            const uint4 q = *reinterpret_cast<const uint4*>(rec + lane * 16);
            const u32 sc = WO_BPC == 2 ? *reinterpret_cast<const u32*>(rec + 512 + g * 4)
                                       : wo_scale_word(*reinterpret_cast<const u16*>(rec + 512 + g * 2));
#endif
            const bool fold = (folds >> cc) & 1u;
            if (WW_FOLD_ONLY || fold) {
                const int buf = cc & 1;  // chunk parity (WW_CPS is even): a constant after unrolling
                ww_wait<1>();            // the chunk that used this buffer two chunks ago is done
                release(st, cc);
                // each live byte + eoff lies in [1, 254]: no carry or borrow between them (the padding bytes
                // of a one-block word sit above the live ones)
                const u32 e = sc + eoff4;
                const u32 f[4] = {ww_factor<0>(e), ww_factor<1>(e), ww_factor<2>(e), ww_factor<3>(e)};
                if constexpr (KIND >= 0) {
                    ww_decode_fold<KIND>(a[buf], q, f);
                } else {
#define WW_FOLD(K) ww_decode_fold<K>(a[buf], q, f)
                    WO_BY_KIND(kind, WW_FOLD)
#undef WW_FOLD
                }
                ww_fence();
#pragma unroll
                for (int u = 0; u < 2 * WO_BPC; ++u) {
                    ww_mma(acc, a[buf][u], ww_desc(desc0, cc * WO_BPC + (u >> 1), u & 1), 1);
                }
                ww_commit();
            } else {  // block by block: the block's wgmma into t, then fb += 2^(s - 127) t in fp32
                ww_wait<0>();
                release(st, cc);
                const bool special = __any_sync(0xffffffffu, wo_special(sc));
#pragma unroll
                for (int blk = 0; blk < WO_BPC; ++blk) {
                    u32 b2[2][4];
                    if constexpr (KIND >= 0) {
                        ww_decode_block<KIND>(b2, q, blk);
                    } else {
#define WW_BLOCK(K) ww_decode_block<K>(b2, q, blk)
                        WO_BY_KIND(kind, WW_BLOCK)
#undef WW_BLOCK
                    }
                    ww_fence();
#pragma unroll
                    for (int s2 = 0; s2 < 2; ++s2) ww_mma(t, b2[s2], ww_desc(desc0, cc * WO_BPC + blk, s2), s2);
                    ww_commit();
                    ww_wait<0>();
                    const float f0 = wo_factor(sc, 16 * blk, special);      // W^T row g
                    const float f1 = wo_factor(sc, 16 * blk + 8, special);  // row g + 8
#pragma unroll
                    for (int i = 0; i < D; ++i) fb[i] = f32_fma(t[i], (i & 2) ? f1 : f0, fb[i]);
                }
            }
        }
    }
    ww_wait<0>();
    if (WW_FOLD_ONLY) {
        if (unfolded)
#pragma unroll
            for (int i = 0; i < D; ++i) acc[i] = __int_as_float(0x7fffffff);
    } else {
#pragma unroll
        for (int i = 0; i < D; ++i) acc[i] = f32_add(acc[i], fb[i]);
    }
}

#define WW_MINB (WO_MT <= 4 || WW_FOLD_ONLY ? 2 : 1)  // blocks per SM the registers must allow
extern "C" __global__ void WW_CLUSTER __launch_bounds__(WW_THREADS, WW_MINB)
mx_wonly_wg(const u8* __restrict__ W, const u8* __restrict__ X, void* __restrict__ C, float* __restrict__ ws,
            u32* __restrict__ counters, int M, int N, int K, i64 lda, i64 ldc, int out_kind, int nchunks, int per,
            u32 kind, u32 slo, u32 shi, u32 eoff4, const __grid_constant__ TmaMap xmap) {
    extern __shared__ u8 smem_raw[];
    __shared__ __align__(8) u64 bars[2 * WW_STAGES];  // full[s], then empty[s]
    __shared__ u32 fold_bits[WW_STAGES];               // stage s's chunks that fold (ww_fold_bits)
    const u32 ring = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const u32 rank = WW_PAIR ? cluster_ctarank() : 0u;
    u8* const ring_ptr = smem_raw + (ring - smem_u32(smem_raw));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int m0 = blockIdx.y * WW_MP;
    const int c_begin = blockIdx.z * per, c_end = min(nchunks, c_begin + per);
    const int stages = (c_end - c_begin + WW_CPS - 1) / WW_CPS;
    const u32 full0 = smem_u32(bars), empty0 = full0 + 8 * WW_STAGES;
    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < WW_STAGES; ++s) {
            // the record copy's expect_tx arrive, then the producer lanes (WW_TMA: the activations' expect_tx arrive)
            mbarrier_init(full0 + 8 * s, WW_TMA ? 2 : 1 + 32 * WW_GATHER_WARPS);
            mbarrier_init(empty0 + 8 * s, 8 * max(1, WW_PAIR));  // the consumer warps (of each block of a cluster)
        }
        fence_mbarrier_init();
    }
#if WW_PAIR
    barrier_cluster_arrive();  // every block's barriers exist before any copies into or arrives on another
    barrier_cluster_wait();
#else
    __syncthreads();
#endif

    constexpr int D = 4 * WO_MT;   // accumulator registers (the wgmma's, and the fp32 block-scale path's)
    float acc[D], fb[D];
#pragma unroll
    for (int i = 0; i < D; ++i) {  // pinned here: no zeroing of a wgmma accumulator may sink into the main loop
        asm volatile("mov.b32 %0, 0;" : "=f"(acc[i]));
        fb[i] = 0.f;
    }

    if (warp >= 8) {  // producer warp pw = warp - 8
        const u8* src = W + ((i64)blockIdx.x * nchunks + c_begin) * (WO_GROUP * WO_REC);
        const u32 total = (u32)(c_end - c_begin) * (WO_GROUP * WO_REC);
        auto records = [&](int st) {
            const int s = st % WW_STAGES;
            const u32 off = (u32)st * WW_REC_BYTES, bytes = min((u32)WW_REC_BYTES, total - off);
            mbarrier_arrive_expect_tx(full0 + 8 * s, bytes + WW_PEER_BYTES);  // (+ the peers' parts)
            cp_async_bulk_g2s(ring + s * WW_STAGE_BYTES + WW_ACT_BYTES, src + off, bytes, full0 + 8 * s);
        };
        const int pw = warp - 8;
        const bool copier = pw == 0 && lane == 0;  // the records' bulk copies and the fold bits: warp 8
        if (copier)
            for (int st = 0; st < min(stages, WW_STAGES); ++st) records(st);
        __syncwarp();
        // the scale-code ranges follow the records (grid x: one block column per record group); read, like the
        // records, before the dependent part
        const u16* ranges = reinterpret_cast<const u16*>(W + (i64)gridDim.x * nchunks * (WO_GROUP * WO_REC)) +
                            (i64)blockIdx.x * nchunks;
        u32 range = ww_range(ranges, c_begin, c_end, lane, slo, shi);
        // stage st's slot, once its previous stage was released, with its records requested (the first WW_STAGES
        // were above); and the chunk ranges of the stage after st
        const auto claim = [&](int st) {
            if (st >= WW_STAGES) {
                mbarrier_wait(empty0 + 8 * (st % WW_STAGES), ((st / WW_STAGES) - 1) & 1);
                if (copier) records(st);
            }
        };
        const auto next_range = [&](int st) {
            return ww_range(ranges, c_begin + (st + 1) * WW_CPS, c_end, lane, slo, shi);
        };
#if WW_TMA
        if (copier) prefetch_tensormap(&xmap);
        wo_dependent_part();
        for (int st = 0; st < stages; ++st) {
            const int s = st % WW_STAGES;
            claim(st);
            // stage st's fold bits (slot s is free), published by the arrive below
            const u32 bits = ww_fold_bits(range, slo, shi);
            if (copier) {
                fold_bits[s] = bits;
                ww_load_act(ring + s * WW_STAGE_BYTES, &xmap, (c_begin + st * WW_CPS) * WO_KC, m0, full0 + 8 * s);
            }
            range = next_range(st);
        }
#else
        wo_dependent_part();
        const u16* x = reinterpret_cast<const u16*>(X) + (i64)m0 * lda;
        const int live = M - m0;  // tokens of the block inside M
#if WW_PAIR
        const int n0 = (int)rank * WW_PART + pw * WW_SPAN;  // this warp's tokens: a share of the block's part
        // once this warp's gather of stage st is complete and fenced: its rows of each unit to each peer's slot,
        // completing on the peer's full barrier (which expects them: its copier's expect_tx)
        const auto to_peer = [&](int st) {
            __syncwarp();
            if (lane == 0) {
                const int s = st % WW_STAGES;
#pragma unroll
                for (int r = 1; r < WW_PAIR; ++r) {
                    const u32 peer = (rank + r) % WW_PAIR, bar = mapa(full0 + 8 * s, peer);
#pragma unroll
                    for (int u = 0; u < WW_UNITS; ++u) {
                        const u32 src = ring + s * WW_STAGE_BYTES + (u * WW_MP + n0) * 128;
                        cp_async_bulk_s2cluster(mapa(src, peer), src, WW_SPAN * 128, bar);
                    }
                }
            }
        };
#else
        const int n0 = pw;  // the token-row gather's first token
#endif
        const u16* xr[WO_MT];  // the groups gather's: the lane's token row in each row group, 4 bytes if inside M
        u32 lv[WO_MT];
#pragma unroll
        for (int g = 0; g < WO_MT; ++g) {
            const int m = m0 + 8 * g + (lane >> 2);
            xr[g] = reinterpret_cast<const u16*>(X) + (i64)min(m, M - 1) * lda;
            lv[g] = m < M ? 4u : 0u;
        }
        const bool whole = WW_WHOLE && WW_GATHER_ROWS && ww_rows_whole(live, lda);
        const WwRows rows = WW_WHOLE ? ww_rows(lda, lane, n0) : WwRows{};  // (read only by the whole-block gather)
        for (int st = 0; st < stages; ++st) {
            const int s = st % WW_STAGES;
            claim(st);
            ww_gather(ring + s * WW_STAGE_BYTES, x, lda, live, xr, lv, K, (c_begin + st * WW_CPS) * WO_KC, lane, pw,
                      n0, whole, rows);
            ww_cp_commit();
            // stage st's fold bits (slot s is free: its previous stage was released above), published by this
            // lane's arrive on full[s] below; then the next stage's ranges, in flight during its gather
            const u32 bits = ww_fold_bits(range, slo, shi);
            if (copier) fold_bits[s] = bits;
            range = next_range(st);
            if (st >= WW_LAG) {  // stage st - LAG's gather is complete: hand it to the async proxy, then arrive
                ww_cp_wait<WW_LAG>();
                ww_fence_async();
#if WW_PAIR
                to_peer(st - WW_LAG);
#endif
                mbarrier_arrive(full0 + 8 * ((st - WW_LAG) % WW_STAGES));
            }
        }
        ww_cp_wait<0>();
        ww_fence_async();
        for (int st = max(0, stages - WW_LAG); st < stages; ++st) {
#if WW_PAIR
            to_peer(st);
#endif
            mbarrier_arrive(full0 + 8 * (st % WW_STAGES));
        }
#endif
    } else {  // consumer warpgroup h = warp / 4 multiplies half h of the group: warp w's tile is 2 (w % 4) + h
        wo_dependent_part();
#define WW_CONSUME(K)                                                                                         \
    ww_consume<K>(acc, fb, fold_bits, ring_ptr, ring, full0, empty0, stages, c_begin, c_end, warp, lane, rank, \
                  eoff4, kind)
        if constexpr (WW_KIND_LOOP) {
            // the format read through a shuffle: ptxas then treats the branch as warp-uniform and keeps the f16
            // builds' wgmma unserialized (C7519 otherwise); a weight without special codes (kind bit 8) runs its
            // format's plain twin where the decode fixes them (wo_fixes)
            const u32 kind_u = __shfl_sync(0xffffffffu, kind, 0);
            const bool plain = kind_u >> 8;
#define WW_CONSUME_P(K)                                   \
    if constexpr (wo_fixes(K)) {                          \
        if (plain) {                                      \
            WW_CONSUME(K + WO_PLAIN);                     \
        } else {                                          \
            WW_CONSUME(K);                                \
        }                                                 \
    } else {                                              \
        WW_CONSUME(K);                                    \
    }
            WO_BY_KIND(kind_u & 0xffu, WW_CONSUME_P)
#undef WW_CONSUME_P
        } else {
            kind &= 0xffu;
            WW_CONSUME(-1);
        }
#undef WW_CONSUME
    }

#if WW_PAIR
    barrier_cluster_arrive();  // no block leaves while another may still copy into it or arrive on it
    barrier_cluster_wait();
#endif
    float out[1][WO_MT][4];
#pragma unroll
    for (int mt = 0; mt < WO_MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) out[0][mt][i] = acc[mt * 4 + i];
    wo_epilogue<1>(out, C, ws, counters, M, N, ldc, out_kind, m0, blockIdx.x * WO_GROUP + 2 * (warp & 3) + (warp >> 2),
                   WO_GROUP, lane, warp < 8);
}

// The permuted copy of X that a WW_TMA build loads (backends/cuda/wonly/plan.py launches it right before the product,
// both under WO_PDL with programmatic dependent launch): Xp[m][k] for k < kp (a multiple of 64), X's 4-byte words in
// the k16 order of a stage's rows (ww_kchunk: in every 32-K block word 4 t + i at 4 i + t), zeros from K on.  One
// thread per token and 32-K block; X's base and row pitch are 16-byte aligned (the plan's activations).
extern "C" __global__ void __launch_bounds__(256)
mx_wonly_xperm(const u16* __restrict__ X, u16* __restrict__ Xp, int M, int K, i64 lda, int kp) {
#if WO_PDL
    // the product may start now (its record prefetch overlapping the predecessor's tail): it reads Xp only after
    // its own wait, which returns once this grid completed, and this grid completes only after its wait below
    griddep_launch_dependents();
    griddep_wait();
#endif
    const int per_row = kp >> 5;
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)M * per_row) return;
    const int m = (int)(i / per_row), k0 = 32 * (int)(i % per_row);
    const u16* src = X + m * lda + k0;
    u32 w[16];  // X's words of the block
    if (k0 + 32 <= K) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const uint4 v = __ldg(reinterpret_cast<const uint4*>(src) + q);
            w[4 * q] = v.x, w[4 * q + 1] = v.y, w[4 * q + 2] = v.z, w[4 * q + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const u32 lo = k0 + 2 * j < K ? src[2 * j] : 0u, hi = k0 + 2 * j + 1 < K ? src[2 * j + 1] : 0u;
            w[j] = lo | hi << 16;
        }
    }
    u32 o[16];  // the block's words in k16 order
#pragma unroll
    for (int j = 0; j < 16; ++j) o[4 * ww_kchunk(j) + ((j >> 2) & 3)] = w[j];
    uint4* dst = reinterpret_cast<uint4*>(Xp + (i64)m * kp + k0);
#pragma unroll
    for (int c = 0; c < 4; ++c) dst[c] = make_uint4(o[4 * c], o[4 * c + 1], o[4 * c + 2], o[4 * c + 3]);
}
