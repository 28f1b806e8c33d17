// mxcore NVIDIA GEMM, Hopper family (sm_90a): D[M,N] = 2^e * (A[M,K] @ B[K,N]), fp32 accumulation (e: out_scale).
//
// One persistent, warp-specialized kernel per -D variant:
//   * warpgroup 0 = producer: one thread issues TMA loads (cp.async.bulk.tensor.2d, 128-byte swizzle) of A and B
//     K slices (128 bytes of K per row per stage) into an SM90_STAGES-deep shared-memory ring; each stage has a
//     "full" mbarrier (arrive.expect_tx by the producer, completed by the copy engine's byte count) and an
//     "empty" mbarrier (one arrive per consumer warpgroup when its wgmma have read the stage).
//   * warpgroups 1, 2 = consumers: rows [64c, 64c + 64) of the 128 x SM90_BN block tile each, wgmma.mma_async
//     m64nNk{16,8,32} with both operands read from shared memory through matrix descriptors; fp32 accumulators
//     in registers; the epilogue scales by out_scale (mx_common.cuh) and writes fp32 / fp16 / bf16 straight from
//     registers (predicated on M, N).  setmaxnreg gives the consumers SM90_REG_CONSUMER registers, the producer
//     SM90_REG_PRODUCER.
//   * tiles are visited in SM90_GROUP_M-row groups (L2 reuse of B), work unit = blockIdx.x, += gridDim.x (a unit is
//     a tile, or one K split of a tile of the last wave: "Split K" below).
//
// -D defines (every one passed by backends/cuda/sm90.py Sm90Variant.options; none has a default here):
//   SM90_ELEM      0 f16, 1 bf16, 2 tf32 (fp32 bits, pre-rounded), 3 fp8 (SM90_A_E5M2 / SM90_B_E5M2: 0 e4m3, 1 e5m2)
//   SM90_TA/TB     1: the operand is M-major (A) / N-major (B) (16-bit only; wgmma's transpose bit); 0: K-major
//   SM90_BN        block tile N (= the wgmma N), 64..256
//   SM90_STAGES    ring depth
//   SM90_GROUP_M   tile rows per group of the tile order (L2 reuse of B)
//   SM90_EPI_COLS  output columns per epilogue round: with the TMA store whole 128-byte boxes, a divisor of SM90_BN
//                 (64 or 128); SM90_BN with direct stores (one round)
//   SM90_TMA_STORE 2 (fp16/bf16) or 4 (fp32): each consumer writes its output into a 128-byte-swizzled
//                 shared-memory buffer (64 rows x SM90_EPI_COLS columns per round) that TMA stores (map_c: dims
//                 {N, M}, boxes of 128 bytes x 64 rows; TMA clips at M and N); the next tile's main loop runs
//                 while the store drains.  0: direct predicated stores from registers (any output and pitch).
//   SM90_CLUSTER  1, or 2: two blocks (tile rows 2p, 2p + 1, same tile column) per cluster; each loads half of
//                 the B tile and multicasts it to both; a stage is refilled once both blocks' consumers freed it
//   SM90_PROMOTE   fp8: 1 = accumulate each stage (128 K) in a scratch accumulator and add it to the fp32 main
//                  accumulator (DeepGEMM's promotion); 0 = one accumulator (fast accumulation; other types: 0)
//   SM90_MX        1: exact OCP-MX fp8 (blocks of 32 K, E8M0 scales; fp8, K-major, not swapped).  Each 32-K block is
//                 one k32 wgmma into a scratch accumulator (scale-d 0), then main += 2^(ea(row)+eb(col)) * scratch in
//                 fp32: the factor's bits are built by one integer add, f = RA(row) + CB(col) with RA = sa << 23 and
//                 CB = (sb - 127) << 23 (sa, sb: E8M0 codes), which is exactly 2^E, E = (sa-127) + (sb-127), for E in
//                 [-126, 127] (a normal factor), then one FMA (IEEE: f32_fma).  The host's prep
//                 (gemm_sm90_mx.cu) writes RA as int32 [M][K/32 padded to 4] and CB as int32 [K/32 padded][N padded
//                 to 16, columns permuted within 16 so that one 16-byte load gives a thread its 4 columns], TMA-loaded
//                 with each stage (map_sa: box {4 blocks, 128 rows}; map_sb: box {BN, 4 blocks}, no swizzle).  All-zero
//                 blocks and NaN blocks get neutral codes there (their scratch is 0 whatever the factor); rows /
//                 columns holding a NaN block (code 0xFF) are set to NaN in the epilogue (nan_a[M], nan_b[N]), as the
//                 reference's whole row / column is NaN.  info_a / info_b (int32 x 4, from the prep): {255 - min live
//                 code, max live code, any NaN block, 0}; when every live pair has E in [-126, 127] the fast promotion
//                 runs, otherwise (codes near 0x00 / 0xFE whose sum leaves fp32's normal exponents) each element's 2^E
//                 is applied as two normal factors (s * 2^e1) * 2^e2, exact whenever the term is a normal number.
//                 MXFP4 / MXFP6 operands arrive folded into e4m3 (gemm_sm90_mx.cu's mx_sm90_fold: per 128-K window a
//                 shared power of two where the blocks' exponents allow it, exactly): fold_a / fold_b (uint8 per
//                 window, null: none folded); a window folded in both operands runs its 4 k32 wgmma into the scratch
//                 and one promotion by the window's factor (its block 0's), every other window the per-32 loop.
//                 When every row and column has one factor over all of K (info_a[3] = info_b[3] = 0), the stages'
//                 scratch is added unscaled and the factor (window 0's: fac_a [M][ld_fa], fac_b [.][ld_fb], the
//                 factor arrays the maps read) is applied once in the epilogue, exactly (two normal factors).
// Tensor maps (host): K-major operand: dims {K, rows}, box {128 bytes of K, rows of the tile};
// M/N-major operand: dims {rows, K}, box {64 elements, BK}, the tile loaded as rows/64 boxes.
//   SM90_SWAP      1: A and B were swapped by the host (small M: C^T = B^T A^T, the weight fills the 128-row
//                 side); the epilogue stores D transposed, straight from registers
// out_kind: 0 fp32, 1 fp16, 2 bf16.  ldc in elements.  pair_ok: C's base and ldc allow 2-element stores.
// Split K (the host's rule, sm90.split_tail): units [0, tail0) are whole tiles; the tiles from tail0 on (the last,
// partial wave's, or every tile of a problem with fewer tiles than blocks) are split along K into `splits` units of
// `per` ring stages (128-K promotion windows for fp8 / MX) each (unit_work).  Each split unit's warps store their fp32
// partial to ws; the last to arrive at the tile's counter (one per tile and consumer; reset afterwards) sums
// the partials in split order, so the bits do not depend on which unit arrives last, and runs the epilogue
// (split_fixup).  units: tail0 + (tiles - tail0) * splits (from the host).  splits = 1: no split.

#include "mx_common.cuh"
#include "async_sm90.cuh"

// the -D defines listed above, all from the host
#if !defined(SM90_ELEM) || !defined(SM90_A_E5M2) || !defined(SM90_B_E5M2) || !defined(SM90_TA) || !defined(SM90_TB) || \
    !defined(SM90_BN) || !defined(SM90_STAGES) || !defined(SM90_CLUSTER) || !defined(SM90_GROUP_M) ||                \
    !defined(SM90_TMA_STORE) || !defined(SM90_EPI_COLS) || !defined(SM90_SWAP) || !defined(SM90_PROMOTE) ||         \
    !defined(SM90_MX)
#error "gemm_sm90.cu needs every SM90_* define from mxcore's backends/cuda/sm90.py (Sm90Variant.options)"
#endif
static_assert(!(SM90_SWAP && SM90_TMA_STORE), "the transposed (swapped) epilogue stores directly (SM90_TMA_STORE 0)");
static_assert(!SM90_MX || (SM90_ELEM == 3 && !SM90_TA && !SM90_TB && !SM90_SWAP),
              "SM90_MX: fp8 operands, K-major, not swapped");
static_assert(SM90_ELEM == 0 || SM90_ELEM == 1 || !(SM90_TA || SM90_TB),
              "tf32 and fp8 wgmma read K-major operands only (SM90_TA = SM90_TB = 0)");
#define SM90_REG_PRODUCER 40   // setmaxnreg: the producer warpgroup's registers
#define SM90_REG_CONSUMER 232  // and each consumer's
#define SM90_SCRATCH (SM90_ELEM == 3 && (SM90_PROMOTE || SM90_MX))  // a scratch accumulator promoted into main
#define SM90_MN_LBO 8192  // M/N-major: bytes between 64-element swizzle atoms along M/N (one box)
#define SM90_MN_SBO 1024  // M/N-major: bytes between groups of 8 K rows (8 swizzled 128-byte rows)

#define SM90_CAT2(a, b) a##b
#define SM90_CAT(a, b) SM90_CAT2(a, b)
#define SM90_STR2(x) #x
#define SM90_STR(x) SM90_STR2(x)

// the wgmma's K and types by SM90_ELEM (an fp8 operand's type by SM90_A_E5M2 / SM90_B_E5M2), then its immediates:
// scale-d is the predicate; then imm-scale-a, imm-scale-b and, for 16-bit types only, imm-trans-a, imm-trans-b
#define SM90_F8_0 ".e4m3"
#define SM90_F8_1 ".e5m2"
#define SM90_F8_TYPE2(e5m2) SM90_F8_##e5m2
#define SM90_F8_TYPE(e5m2) SM90_F8_TYPE2(e5m2)
#define SM90_KTYPES_0 "k16.f32.f16.f16"
#define SM90_KTYPES_1 "k16.f32.bf16.bf16"
#define SM90_KTYPES_2 "k8.f32.tf32.tf32"
#define SM90_KTYPES_3 "k32.f32" SM90_F8_TYPE(SM90_A_E5M2) SM90_F8_TYPE(SM90_B_E5M2)
#define SM90_IMMS_0 ", 1, 1, " SM90_STR(SM90_TA) ", " SM90_STR(SM90_TB)
#define SM90_IMMS_1 SM90_IMMS_0
#define SM90_IMMS_2 ", 1, 1"
#define SM90_IMMS_3 ", 1, 1"
#define SM90_WGMMA_KTYPES SM90_CAT(SM90_KTYPES_, SM90_ELEM)
#define SM90_WGMMA_IMMS SM90_CAT(SM90_IMMS_, SM90_ELEM)
#define SM90_ESIZE (SM90_ELEM == 3 ? 1 : SM90_ELEM == 2 ? 4 : 2)  // element bytes

#define SM90_BM 128                         // two consumer warpgroups of 64 rows
#define SM90_BK (128 / SM90_ESIZE)          // K elements per stage: one 128-byte swizzle row
#define SM90_A_BYTES (SM90_BM * 128)        // per stage
#define SM90_B_BYTES (SM90_BN * 128)
#define SM90_SA_BYTES (SM90_MX ? SM90_BM * 16 : 0)  // per stage (MX): int32 RA of 4 blocks per tile row
#define SM90_SB_BYTES (SM90_MX ? SM90_BN * 16 : 0)  // per stage (MX): int32 CB of 4 blocks x BN (permuted) columns
#define SM90_STAGE_BYTES (SM90_A_BYTES + SM90_B_BYTES + SM90_SA_BYTES + SM90_SB_BYTES)
#define SM90_ACC (SM90_BN / 2)              // fp32 accumulator registers per consumer thread
// TMA-store epilogue: output columns per 128-byte box row, and both consumers' output buffers (0 bytes without)
#define SM90_BOX_COLS (128 / (SM90_TMA_STORE ? SM90_TMA_STORE : 4))
#define SM90_EPI_BYTES (2 * 64 * SM90_EPI_COLS * SM90_TMA_STORE)

// ---------------------------------------------------------------------------------------------------------------
// one tiny wrapper per PTX instruction (the loads, barriers and cluster primitives: async_sm90.cuh)
// ---------------------------------------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async_bulk_tensor_2d_store(const TmaMap* map, int c0, int c1, u32 src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                 ::"l"((u64)map), "r"(c0), "r"(c1), "r"(src) : "memory");
}
__device__ __forceinline__ void cp_async_bulk_commit_group() {
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
__device__ __forceinline__ void cp_async_bulk_wait_group_read0() {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void cp_async_bulk_wait_group0() {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void bar_sync(u32 id, u32 threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit_group() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait_group() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R)); }
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R)); }

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading / stride byte offsets (>> 4).
__device__ __forceinline__ u64 wgmma_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)((lbo & 0x3FFFF) >> 4) << 16) | ((u64)((sbo & 0x3FFFF) >> 4) << 32) |
           (1ull << 62);
}

// wgmma.mma_async m64nN: d (+)= A(desc_a) * B(desc_b); accumulate = 0 overwrites d.  One overload per N (the
// accumulator count), all of the same form (the accumulator list is long, so each N is written out).
__device__ __forceinline__ void wgmma_mma_async(float (&d)[32], u64 desc_a, u64 desc_b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64" SM90_WGMMA_KTYPES " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p"
                 SM90_WGMMA_IMMS ";\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_mma_async(float (&d)[64], u64 desc_a, u64 desc_b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128" SM90_WGMMA_KTYPES " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p"
                 SM90_WGMMA_IMMS ";\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_mma_async(float (&d)[96], u64 desc_a, u64 desc_b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192" SM90_WGMMA_KTYPES " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p"
                 SM90_WGMMA_IMMS ";\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_mma_async(float (&d)[128], u64 desc_a, u64 desc_b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256" SM90_WGMMA_KTYPES " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p"
                 SM90_WGMMA_IMMS ";\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// ---------------------------------------------------------------------------------------------------------------
// tile order: groups of SM90_GROUP_M tile rows, column-major inside a group
// ---------------------------------------------------------------------------------------------------------------
__device__ __forceinline__ void tile_coords(int tile, int tiles_m, int tiles_n, int& tm, int& tn) {
    constexpr int G = SM90_GROUP_M / SM90_CLUSTER > 0 ? SM90_GROUP_M / SM90_CLUSTER : 1;
    const int group_size = G * tiles_n;
    const int group = tile / group_size;
    const int first = group * G;
    const int rows = min(tiles_m - first, G);
    const int in_group = tile - group * group_size;
    tm = first + in_group % rows;
    tn = in_group / rows;
}

// Work unit u of the persistent grid (see "Split K" above): its tile (in tile_coords order), K stages [kb0, kb1)
// and split index z (0 for a whole tile).
struct Work {
    int tile, kb0, kb1, z;
};
__device__ __forceinline__ Work unit_work(int u, int tail0, int splits, int per, int kblocks) {
    if (u < tail0 || splits == 1) return {u, 0, kblocks, 0};
    const int v = u - tail0, z = v % splits;
    return {tail0 + v / splits, z * per, min(kblocks, (z + 1) * per), z};
}

__device__ __forceinline__ void store_pair(void* C, i64 off, float v0, float v1, bool two, bool pair_ok,
                                           int out_kind) {
    if (out_kind == 0) {
        float* c = (float*)C + off;
        if (two && pair_ok) {
            *(float2*)c = make_float2(v0, v1);
        } else {
            c[0] = v0;
            if (two) c[1] = v1;
        }
    } else {
        u16* c = (u16*)C + off;
        const u16 h0 = out_kind == 1 ? f32_to_f16(v0) : f32_to_bf16(v0);
        const u16 h1 = out_kind == 1 ? f32_to_f16(v1) : f32_to_bf16(v1);
        if (two && pair_ok) {
            *(u32*)c = (u32)h0 | ((u32)h1 << 16);
        } else {
            c[0] = h0;
            if (two) c[1] = h1;
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// MX block scales: main += 2^E * scratch per 32-K block (see SM90_MX above).  Accumulator j of n8 block b: row
// 16 warp + lane/4 + 8 ((j>>1)&1), col 8 b + 2 (lane%4) + (j&1); cb: shared address of this thread's 16 bytes of
// the block's CB row (columns 16 g + {2q, 2q+1, 8+2q, 9+2q} at cb + 64 g, q = lane % 4).
// ---------------------------------------------------------------------------------------------------------------
// This thread's accumulators walked against the column factors: per 16-column group g, one 16-byte load col4(g)
// (the group's 4 column factors of this thread, in the permuted order above), then op(i, ra, cf) for each of the
// group's accumulators i (2 n8 blocks x 2 row halves x 2 columns): ra = ra0 / ra1 (the row half's factor), cf the
// column's.  The promotions (factors from the stage's shared memory) and the whole-K epilogue (from global) share it.
template <class Col4, class Op>
__device__ __forceinline__ void mx_for_each_factor(int ra0, int ra1, Col4 col4, Op op) {
#pragma unroll
    for (int g = 0; g < SM90_BN / 16; ++g) {
        const int4 c4 = col4(g);
        const int cc[4] = {c4.x, c4.y, c4.z, c4.w};
#pragma unroll
        for (int bb = 0; bb < 2; ++bb)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < 2; ++e) op(4 * (2 * g + bb) + 2 * h + e, h ? ra1 : ra0, cc[2 * bb + e]);
    }
}

__device__ __forceinline__ void mx_promote_fast(float (&acc)[SM90_ACC], const float (&part)[SM90_ACC], int ra0,
                                                int ra1, u32 cb) {
    const auto col4 = [cb](int g) { return ld_shared_v4(cb + 64 * g); };
    mx_for_each_factor(ra0, ra1, col4, [&](int i, int ra, int cf) {
        acc[i] = f32_fma(__int_as_float(ra + cf), part[i], acc[i]);
    });
}

__device__ __forceinline__ void mx_promote_exact(float (&acc)[SM90_ACC], const float (&part)[SM90_ACC], int ra0,
                                                 int ra1, u32 cb) {
    mx_for_each_factor(ra0, ra1, [cb](int g) { return ld_shared_v4(cb + 64 * g); },
                       [&](int i, int ra, int cf) { acc[i] = mx_add_exact(acc[i], part[i], ra, cf); });
}

// split_fixup's sum: acc += the partials of splits 1 .. splits-1 (in that order), n8 column blocks of half H.
template <int H>
__device__ __forceinline__ void split_add(float (&acc)[SM90_ACC], const float4* part, int splits) {
    constexpr int Q = SM90_ACC / 4;
#pragma unroll 1
    for (int zz = 1; zz < splits; ++zz) {
        const float4* const pz = part + (i64)zz * Q * 32;
#pragma unroll
        for (int q = H * Q / 2; q < (H + 1) * Q / 2; ++q) {
            const float4 p = __ldcg(pz + q * 32);
            acc[4 * q] = f32_add(acc[4 * q], p.x);
            acc[4 * q + 1] = f32_add(acc[4 * q + 1], p.y);
            acc[4 * q + 2] = f32_add(acc[4 * q + 2], p.z);
            acc[4 * q + 3] = f32_add(acc[4 * q + 3], p.w);
        }
    }
}

// Split K: a consumer warpgroup's fp32 partial of a split tile (its 64 rows, all columns) goes to its slice of ws
// (per warp a float4 per lane and n8 column block: coalesced); the warpgroup whose atomic add brings its counter (one
// per tile and consumer) to `splits` is the tile's last unit to arrive for these rows: it sums the splits'
// partials in split order into acc (read back through L2, ld.global.cg, after the fence; its own too, so the order
// does not depend on which unit finishes), resets the counter and returns true: it runs the epilogue.  The others
// return false.  The decision is the whole warpgroup's (thread 0's atomic, broadcast through the shared word `flag`
// between named barriers 1 + c): wgmma and the epilogue's barriers are warpgroup-wide.
__device__ __forceinline__ bool split_fixup(float (&acc)[SM90_ACC], float* __restrict__ ws, u32* __restrict__ counters,
                                            u32 flag, int slot, int z, int splits, int c, int t) {
    constexpr int Q = SM90_ACC / 4;  // n8 column blocks (4 accumulators each per lane)
    const int lane = t % 32;
    const int wid = (slot * 2 + c) * 4 + t / 32;  // this warp's slice
    float4* const part = (float4*)ws + (i64)wid * splits * Q * 32 + lane;  // split zz, block q: part[(zz Q + q) 32]
    float4* const mine = part + (i64)z * Q * 32;
#pragma unroll
    for (int q = 0; q < Q; ++q)
        mine[q * 32] = make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
    __threadfence();
    bar_sync(1 + c, 128);  // the warpgroup's partial is stored and fenced (every thread read the last flag)
    u32* const counter = counters + slot * 2 + c;
    if (t == 0) st_shared_u32(flag, atomicAdd(counter, 1u) == (u32)splits - 1);
    bar_sync(1 + c, 128);
    if (!__shfl_sync(0xffffffffu, ld_shared_u32(flag), 0)) return false;  // shfl: warp-uniform to the compiler
    __threadfence();
#pragma unroll
    for (int q = 0; q < Q; ++q) {
        const float4 p = __ldcg(part + q * 32);
        acc[4 * q] = p.x;
        acc[4 * q + 1] = p.y;
        acc[4 * q + 2] = p.z;
        acc[4 * q + 3] = p.w;
    }
    split_add<0>(acc, part, splits);  // the other splits, by column halves: fewer loads in flight beside acc
    split_add<1>(acc, part, splits);
    if (t == 0) *counter = 0u;  // ready for the next launch
    return true;
}

// A consumer warpgroup has read stage buffers: tell the producer(s) that may refill them (called by every thread
// of the warpgroup; lane 0 of warp r signals block r of the cluster).
// (the MX variants: every warp arrives once it is done with the stage, so that a warp still reading the
// stage's factors keeps it, with no barrier among the warps)
#define SM90_WARP_RELEASE (SM90_MX && SM90_CLUSTER == 1)
__device__ __forceinline__ void release_stage(u32 empty_bar, int t) {
    if constexpr (SM90_WARP_RELEASE) {
        if ((t & 31) == 0) mbarrier_arrive(empty_bar);
    } else if constexpr (SM90_CLUSTER == 1) {
        if (t == 0) mbarrier_arrive(empty_bar);
    } else {
        if (t % 32 == 0 && t / 32 < SM90_CLUSTER) mbarrier_arrive_cluster(mapa(empty_bar, t / 32));
    }
}

#if SM90_CLUSTER > 1
#define SM90_CLUSTER_ATTR __cluster_dims__(SM90_CLUSTER, 1, 1)
#else
#define SM90_CLUSTER_ATTR
#endif

extern "C" __global__ void __launch_bounds__(384, 1) SM90_CLUSTER_ATTR
mx_gemm_sm90(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b,
             const __grid_constant__ TmaMap map_c, void* __restrict__ C, int M, int N, int K, i64 ldc, int exp0,
             const void* exp_a, const void* exp_b, int exp_u8, int out_kind, int pair_ok, int units, int tail0,
             int splits, int per, float* __restrict__ ws, u32* __restrict__ counters,
             const __grid_constant__ TmaMap map_sa, const __grid_constant__ TmaMap map_sb,
             const int* __restrict__ info_a, const int* __restrict__ info_b, const u8* __restrict__ nan_a,
             const u8* __restrict__ nan_b, const u8* __restrict__ fold_a, const u8* __restrict__ fold_b,
             const int* __restrict__ fac_a, i64 ld_fa, const int* __restrict__ fac_b, i64 ld_fb) {
    extern __shared__ __align__(1024) u8 smem_raw[];
    // 128-byte swizzle atoms repeat every 1024 bytes: the ring starts on a 1024-byte boundary
    u8* smem = (u8*)(((unsigned long long)smem_raw + 1023) & ~1023ull);
    const u32 ring = smem_u32(smem);
    const u32 epi = ring + SM90_STAGES * SM90_STAGE_BYTES;  // output buffers (SM90_TMA_STORE)
    const u32 bars = epi + SM90_EPI_BYTES;  // full[s] at bars + 8 s, empty[s] after them
    const u32 full0 = bars, empty0 = bars + 8 * SM90_STAGES;
    const u32 flags = bars + 16 * SM90_STAGES;  // one word per consumer (split_fixup)

    const int wg = threadIdx.x / 128;
    const int tiles_m = (M + SM90_BM - 1) / SM90_BM, tiles_n = (N + SM90_BN - 1) / SM90_BN;
    // work units: tiles, or with clusters tile pairs (rows 2p + rank); every block of a cluster runs the same units
    const u32 rank = SM90_CLUSTER > 1 ? cluster_ctarank() : 0;
    const int units_m = (tiles_m + SM90_CLUSTER - 1) / SM90_CLUSTER;
    const int kblocks = (K + SM90_BK - 1) / SM90_BK;
    const int unit0 = blockIdx.x / SM90_CLUSTER, unit_step = gridDim.x / SM90_CLUSTER;

    if (threadIdx.x == 0) {
        prefetch_tensormap(&map_a);
        prefetch_tensormap(&map_b);
        if constexpr (SM90_TMA_STORE) prefetch_tensormap(&map_c);
        if constexpr (SM90_MX) {
            prefetch_tensormap(&map_sa);
            prefetch_tensormap(&map_sb);
        }
        for (int s = 0; s < SM90_STAGES; ++s) {
            mbarrier_init(full0 + 8 * s, 1);
            mbarrier_init(empty0 + 8 * s, 2 * SM90_CLUSTER * (SM90_WARP_RELEASE ? 4 : 1));
        }
        fence_mbarrier_init();
    }
    if constexpr (SM90_CLUSTER > 1) {
        barrier_cluster_arrive();  // every block's barriers exist before any multicast or remote arrive
        barrier_cluster_wait();
    } else {
        __syncthreads();
    }

    if (wg == 0) {
        setmaxnreg_dec<SM90_REG_PRODUCER>();
        if (threadIdx.x == 0) {
            int s = 0;
            u32 phase = 0;
            // MX: one factor per row / column over all of K (see the consumers): no per-stage factors to load
            const bool no_factors =
                SM90_MX && fold_a != nullptr && fold_b != nullptr && info_a[3] == 0 && info_b[3] == 0;
            const u32 stage_tx = no_factors ? SM90_A_BYTES + SM90_B_BYTES : SM90_STAGE_BYTES;
            for (int u = unit0; u < units; u += unit_step) {
                const Work w = unit_work(u, tail0, splits, per, kblocks);
                int tm, tn;
                tile_coords(w.tile, units_m, tiles_n, tm, tn);
                tm = tm * SM90_CLUSTER + rank;
                const int m0 = tm * SM90_BM, n0 = tn * SM90_BN;
                for (int kb = w.kb0; kb < w.kb1; ++kb) {
                    mbarrier_wait(empty0 + 8 * s, phase ^ 1);
                    const u32 full = full0 + 8 * s;
                    const u32 sa = ring + s * SM90_STAGE_BYTES, sb = sa + SM90_A_BYTES;
                    const int k0 = kb * SM90_BK;
                    mbarrier_arrive_expect_tx(full, stage_tx);
                    if constexpr (SM90_TA) {
                        for (int c = 0; c < SM90_BM / 64; ++c)
                            cp_async_bulk_tensor_2d(sa + c * SM90_BK * 128, &map_a, m0 + 64 * c, k0, full);
                    } else {
                        cp_async_bulk_tensor_2d(sa, &map_a, k0, m0, full);
                    }
                    if constexpr (SM90_CLUSTER > 1 && SM90_TB) {
                        for (int c = rank; c < SM90_BN / 64; c += SM90_CLUSTER)
                            cp_async_bulk_tensor_2d_multicast(sb + c * SM90_BK * 128, &map_b, n0 + 64 * c, k0, full,
                                                              (1 << SM90_CLUSTER) - 1);
                    } else if constexpr (SM90_CLUSTER > 1) {
                        cp_async_bulk_tensor_2d_multicast(sb + rank * (SM90_BN / SM90_CLUSTER) * 128, &map_b, k0,
                                                          n0 + rank * (SM90_BN / SM90_CLUSTER), full,
                                                          (1 << SM90_CLUSTER) - 1);
                    } else if constexpr (SM90_TB) {
                        for (int c = 0; c < SM90_BN / 64; ++c)
                            cp_async_bulk_tensor_2d(sb + c * SM90_BK * 128, &map_b, n0 + 64 * c, k0, full);
                    } else {
                        cp_async_bulk_tensor_2d(sb, &map_b, k0, n0, full);
                    }
                    if constexpr (SM90_MX) {  // the stage's 4 blocks of row factors RA [128][4], CB [4][BN]
                        if (!no_factors) {
                            cp_async_bulk_tensor_2d(sb + SM90_B_BYTES, &map_sa, 4 * kb, m0, full);
                            cp_async_bulk_tensor_2d(sb + SM90_B_BYTES + SM90_SA_BYTES, &map_sb, n0, 4 * kb, full);
                        }
                    }
                    // the next stage; the phase flips at the ring's end.  Written as an xor of the wrap flag so that
                    // the loop compiles to the same code whatever form the loads above take (written as the consumers'
                    // branch, the K-major builds fold the flip into a select of the wait's phase ^ 1 instead)
                    const bool wrap = ++s == SM90_STAGES;
                    s = wrap ? 0 : s;
                    phase ^= wrap;
                }
            }
        }
    } else {
        setmaxnreg_inc<SM90_REG_CONSUMER>();
        const int c = wg - 1;                   // consumer index: rows [64c, 64c + 64) of the tile
        const int t = threadIdx.x - 128 * wg;   // thread in the warpgroup
        const int warp = t / 32, lane = t % 32;
        const float alpha = out_scale(exp0, exp_a, exp_b, exp_u8);  // 2^e; device exponents read here (mx_common)
        int s = 0;
        u32 phase = 0;
        float acc[SM90_ACC];
        float part[SM90_ACC];  // the scratch accumulator (SM90_SCRATCH; unused otherwise)
        // MX: fast promotion when every live pair of block codes has E = ea + eb in [-126, 127] (info: the prep's
        // ranges) (these flags and mx_whole share one register: the consumers have none to spare)
        const int mx_flags = !SM90_MX ? 0
                             : mx_fast_pair(info_a, info_b) |
                                   // every row of A and column of B folded with one factor over all of K (info[3] = 0
                                   // from mx_sm90_fold): the stages' scratch is added unscaled and 2^(Ea + Eb) applied
                                   // once, in the epilogue
                                   (fold_a != nullptr && fold_b != nullptr && info_a[3] == 0 && info_b[3] == 0) << 1 |
                                   ((info_a[2] | info_b[2]) != 0) << 2;
#define mx_fast ((mx_flags & 1) != 0)
#define mx_whole ((mx_flags & 2) != 0)
#define mx_nan ((mx_flags & 4) != 0)
        const int r_loc = 64 * c + 16 * warp + lane / 4;  // MX: this thread's first row in the tile (the other: + 8)
        for (int u = unit0; u < units; u += unit_step) {
            const Work w = unit_work(u, tail0, splits, per, kblocks);
            const int kb0 = w.kb0, kb1 = w.kb1;
            int tm, tn;
            tile_coords(w.tile, units_m, tiles_n, tm, tn);
            tm = tm * SM90_CLUSTER + rank;
            if constexpr (SM90_SCRATCH) {
#pragma unroll
                for (int i = 0; i < SM90_ACC; ++i) acc[i] = 0.f;
            }
            if constexpr (SM90_MX) {
                for (int kb = kb0; kb < kb1; ++kb) {  // one ring stage = 4 MX blocks of 32 K
                    mbarrier_wait(full0 + 8 * s, phase);
                    const u32 sa = ring + s * SM90_STAGE_BYTES, sb = sa + SM90_A_BYTES;
                    const u32 fs = sb + SM90_B_BYTES;  // RA [128][4] int32, then CB [4][BN] int32
                    const u32 cb = fs + SM90_SA_BYTES + 16 * (lane % 4);
                    if (mx_whole || (fold_a != nullptr && fold_b != nullptr && (fold_a[kb] & fold_b[kb]))) {
                        // a folded window (both operands): its 4 blocks share one factor: 4 wgmma, one promotion
                        wgmma_fence();
#pragma unroll
                        for (int kk = 0; kk < 4; ++kk)
                            wgmma_mma_async(part, wgmma_desc(sa + c * 64 * 128 + kk * 32, 16, 1024),
                                            wgmma_desc(sb + kk * 32, 16, 1024), kk > 0);
                        wgmma_commit_group();
                        wgmma_wait_group<0>();
                        if (mx_whole) {  // no factors in this stage (the producer loaded none)
                            release_stage(empty0 + 8 * s, t);  // nothing more to read: hand it back at once
#pragma unroll
                            for (int i = 0; i < SM90_ACC; ++i) acc[i] = f32_add(acc[i], part[i]);
                        } else {
                            const int ra0 = ld_shared_v4(fs + 16 * r_loc).x;
                            const int ra1 = ld_shared_v4(fs + 16 * (r_loc + 8)).x;
                            if (mx_fast)
                                mx_promote_fast(acc, part, ra0, ra1, cb);
                            else
                                mx_promote_exact(acc, part, ra0, ra1, cb);
                            release_stage(empty0 + 8 * s, t);
                        }
                        if (++s == SM90_STAGES) {
                            s = 0;
                            phase ^= 1;
                        }
                        continue;
                    }
#pragma unroll
                    for (int kk = 0; kk < 4; ++kk) {  // block kk: one k32 wgmma into the scratch, then the scaled add
                        wgmma_fence();
                        wgmma_mma_async(part, wgmma_desc(sa + c * 64 * 128 + kk * 32, 16, 1024),
                                        wgmma_desc(sb + kk * 32, 16, 1024), 0);
                        wgmma_commit_group();
                        wgmma_wait_group<0>();
                        // the rows' factors of block kk (loaded here, not once per stage: registers are few)
                        const int ra0 = (int)ld_shared_u32(fs + 16 * r_loc + 4 * kk);
                        const int ra1 = (int)ld_shared_u32(fs + 16 * (r_loc + 8) + 4 * kk);
                        if (mx_fast)
                            mx_promote_fast(acc, part, ra0, ra1, cb + kk * (SM90_BN * 4));
                        else
                            mx_promote_exact(acc, part, ra0, ra1, cb + kk * (SM90_BN * 4));
                    }
                    release_stage(empty0 + 8 * s, t);  // after the last block's factor loads
                    if (++s == SM90_STAGES) {
                        s = 0;
                        phase ^= 1;
                    }
                }
            } else {
                for (int kb = kb0; kb < kb1; ++kb) {
                    mbarrier_wait(full0 + 8 * s, phase);
                    const u32 sa = ring + s * SM90_STAGE_BYTES, sb = sa + SM90_A_BYTES;
                    wgmma_fence();
#pragma unroll
                    for (int kk = 0; kk < 4; ++kk) {  // 4 wgmma of 32 bytes of K each
                        u64 da, db;
                        if constexpr (SM90_TA)
                            da = wgmma_desc(sa + c * SM90_BK * 128 + kk * (32 / SM90_ESIZE) * 128, SM90_MN_LBO,
                                            SM90_MN_SBO);
                        else
                            da = wgmma_desc(sa + c * 64 * 128 + kk * 32, 16, 1024);
                        if constexpr (SM90_TB)
                            db = wgmma_desc(sb + kk * (32 / SM90_ESIZE) * 128, SM90_MN_LBO, SM90_MN_SBO);
                        else
                            db = wgmma_desc(sb + kk * 32, 16, 1024);
                        if constexpr (SM90_SCRATCH)  // fp8 promotion: this stage into the scratch
                            wgmma_mma_async(part, da, db, kk > 0);
                        else
                            wgmma_mma_async(acc, da, db, (kb > kb0) || (kk > 0));
                    }
                    wgmma_commit_group();
                    if constexpr (SM90_SCRATCH) {
                        wgmma_wait_group<0>();
                        release_stage(empty0 + 8 * s, t);
#pragma unroll
                        for (int i = 0; i < SM90_ACC; ++i) acc[i] = f32_add(acc[i], part[i]);
                    } else {
                        wgmma_wait_group<1>();  // the previous stage's wgmma are done: hand its buffers back
                        if (kb > kb0) release_stage(empty0 + 8 * (s ? s - 1 : SM90_STAGES - 1), t);
                    }
                    if (++s == SM90_STAGES) {
                        s = 0;
                        phase ^= 1;
                    }
                }
            }
            if constexpr (!SM90_SCRATCH) {
                wgmma_wait_group<0>();
                release_stage(empty0 + 8 * (s ? s - 1 : SM90_STAGES - 1), t);  // the last stage (s has moved past it)
            }
            if (splits > 1 && u >= tail0 &&
                !split_fixup(acc, ws, counters, flags + 4 * c, (w.tile - tail0) * SM90_CLUSTER + rank, w.z, splits,
                             c, t))
                continue;  // another unit of this tile finishes it
            if constexpr (SM90_MX) {
                // MX, whole K: the rows' and columns' one factor each (window 0's), applied once (as the promotion)
                if (mx_whole) {
                    // every factor load issued before the first use (one memory latency per tile, not one per group)
                    const int row0 = tm * SM90_BM + r_loc;
                    int ra[2];
                    int4 fb[SM90_BN / 16];
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        ra[h] = row0 + 8 * h < M ? fac_a[(i64)(row0 + 8 * h) * ld_fa] : 127 << 23;
#pragma unroll
                    for (int g = 0; g < SM90_BN / 16; ++g) {
                        // the 16-column group (fac_b: ld_fb columns, permuted)
                        const int col16 = tn * SM90_BN + 16 * g;
                        fb[g] = col16 < ld_fb ? *(const int4*)(fac_b + col16 + 4 * (lane % 4))
                                              : make_int4(0, 0, 0, 0);
                    }
                    mx_for_each_factor(
                        ra[0], ra[1], [&](int g) { return fb[g]; },
                        [&](int i, int r, int cf) {
                            acc[i] = mx_fast ? f32_mul(acc[i], __int_as_float(r + cf))
                                             : mx_add_exact(0.f, acc[i], r, cf);
                        });
                }
                // MX: a NaN block (code 0xFF) makes its whole row of A / column of B NaN, as in the reference
                if (mx_nan) {
                    const int row0 = tm * SM90_BM + r_loc, col0 = tn * SM90_BN + 2 * (lane % 4);
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const bool nr = row0 + 8 * h < M && nan_a[row0 + 8 * h];
#pragma unroll
                        for (int b = 0; b < SM90_BN / 8; ++b) {
#pragma unroll
                            for (int e = 0; e < 2; ++e) {
                                const int col = col0 + 8 * b + e;
                                if (nr || (col < N && nan_b[col])) acc[4 * b + 2 * h + e] = __int_as_float(0x7fc00000);
                            }
                        }
                    }
                }
            }
            // epilogue: accumulator j of n8 block b: row 16 warp + lane/4 + 8 ((j>>1)&1), col 8 b + 2 (lane%4) + (j&1)
            if constexpr (SM90_TMA_STORE) {
                // 128-byte swizzled boxes of 64 rows x 128 bytes: (row r, 16-byte chunk j) at
                // r * 128 + ((j ^ r % 8) << 4); a warp's 8 rows land in 8 different chunks (no bank conflict)
                const u32 buf = epi + c * (64 * SM90_EPI_COLS * SM90_TMA_STORE);
#pragma unroll
                for (int half = 0; half < SM90_BN / SM90_EPI_COLS; ++half) {
                    if (t == 0) cp_async_bulk_wait_group_read0();  // the previous store has read the buffer
                    bar_sync(1 + c, 128);
#pragma unroll
                    for (int bb = 0; bb < SM90_EPI_COLS / 8; ++bb) {
                        const int b = half * (SM90_EPI_COLS / 8) + bb;
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const int r = 16 * warp + lane / 4 + 8 * h;
                            const int col = 8 * bb + 2 * (lane % 4);  // in this round's buffer
                            const int byte = (col % SM90_BOX_COLS) * SM90_TMA_STORE;
                            const u32 addr = buf + (col / SM90_BOX_COLS) * (64 * 128) + r * 128 +
                                             (((byte >> 4) ^ (r % 8)) << 4) + (byte & 15);
                            const float v0 = f32_mul(alpha, acc[4 * b + 2 * h]);
                            const float v1 = f32_mul(alpha, acc[4 * b + 2 * h + 1]);
                            if constexpr (SM90_TMA_STORE == 4) {
                                asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(v0), "f"(v1)
                                             : "memory");
                            } else {
                                const u32 bits = out_kind == 1 ? (u32)f32_to_f16(v0) | ((u32)f32_to_f16(v1) << 16)
                                                               : (u32)f32_to_bf16(v0) | ((u32)f32_to_bf16(v1) << 16);
                                asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(bits) : "memory");
                            }
                        }
                    }
                    fence_proxy_async_shared();  // generic-proxy stores -> the copy engine's reads
                    bar_sync(1 + c, 128);
                    if (t == 0) {
#pragma unroll
                        for (int q = 0; q < SM90_EPI_COLS / SM90_BOX_COLS; ++q)
                            cp_async_bulk_tensor_2d_store(&map_c,
                                                          tn * SM90_BN + half * SM90_EPI_COLS + SM90_BOX_COLS * q,
                                                          tm * SM90_BM + 64 * c, buf + q * (64 * 128));
                        cp_async_bulk_commit_group();
                    }
                }
            } else {
                const int row0 = tm * SM90_BM + 64 * c + 16 * warp + lane / 4;
                const int col0 = tn * SM90_BN + 2 * (lane % 4);
#pragma unroll
                for (int b = 0; b < SM90_BN / 8; ++b) {
                    const int col = col0 + 8 * b;
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int row = row0 + 8 * h;
                        if constexpr (SM90_SWAP) {
                            // D is C transposed (A, B swapped by the host): D[row, col] -> C[col, row]
                            if (row < M && col < N)
                                store_pair(C, (i64)col * ldc + row, f32_mul(alpha, acc[4 * b + 2 * h]), 0.f, false,
                                           false, out_kind);
                            if (row < M && col + 1 < N)
                                store_pair(C, (i64)(col + 1) * ldc + row, f32_mul(alpha, acc[4 * b + 2 * h + 1]), 0.f,
                                           false, false, out_kind);
                        } else {
                            if (row < M && col < N)
                                store_pair(C, (i64)row * ldc + col, f32_mul(alpha, acc[4 * b + 2 * h]),
                                           f32_mul(alpha, acc[4 * b + 2 * h + 1]), col + 1 < N, pair_ok, out_kind);
                        }
                    }
                }
            }
        }
        if constexpr (SM90_TMA_STORE) {
            if (t == 0) cp_async_bulk_wait_group0();  // the last stores are complete
        }
    }
    if constexpr (SM90_CLUSTER > 1) {
        barrier_cluster_arrive();  // no block leaves while its peer may still multicast into it or arrive on it
        barrier_cluster_wait();
    }
}
