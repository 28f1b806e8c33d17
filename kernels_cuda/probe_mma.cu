// Probe kernel for one warp-level mma.sync instruction (one kernel per instruction, chosen by -D defines).
//
// The kernel knows no layout.  Lane l loads its registers from lane-major buffers (a[l * MX_A_REGS + r],
// raw 32-bit words, packed on the host from the layout table: slot 0 in register 0's low bits upward),
// executes exactly one MX_PTX instruction and writes D's registers back the same way.  The host
// (backends/probes.py) packs and unpacks through mxcore.emulate.scatter/gather, so the hardware's answer
// is compared with the table and with the reference.
//
// Defines (set by backends/probes.py from the layout record):
//   MX_PROBE_ENTRY  extern "C" entry point, mx_probe_<instruction suffix>
//   MX_PTX          the instruction text, e.g. "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
//   MX_A_REGS, MX_B_REGS, MX_C_REGS   32-bit registers per lane of A, B and C (= D)
//   MX_C_F32        1 when C/D hold fp32 (".f32" registers), 0 when they hold packed f16x2
//   MX_BLOCK_SCALED (optional, sm_120a block_scale mma): when 1 the kernel takes two more lane-major buffers,
//                   one 32-bit scale register per lane for scale_A and scale_B, and the instruction gets
//                   "scale-a-data, {MX_SCALE_BYTE_A, MX_SCALE_THREAD_A}, scale-b-data, {MX_SCALE_BYTE_B,
//                   MX_SCALE_THREAD_B}" (immediate selectors) after C.
// Launch: one block of 32 threads (one warp).

#if !defined(MX_PROBE_ENTRY) || !defined(MX_PTX) || !defined(MX_A_REGS) || !defined(MX_B_REGS) || \
    !defined(MX_C_REGS) || !defined(MX_C_F32)
#error "probe_mma.cu needs MX_PROBE_ENTRY, MX_PTX, MX_A_REGS, MX_B_REGS, MX_C_REGS and MX_C_F32"
#endif

template <int NA, int NB, int NC, int F32C>
struct MmaOnce;  // one specialization per register shape; asm operands must be spelled out

template <>
struct MmaOnce<2, 1, 4, 1> {  // m16n8k8 f16/bf16, m16n8k4 tf32 (fp32 accumulators)
    static __device__ void run(unsigned* d, const unsigned* a, const unsigned* b, const unsigned* c) {
        float fd[4];
        asm volatile(MX_PTX " {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};\n"
                     : "=f"(fd[0]), "=f"(fd[1]), "=f"(fd[2]), "=f"(fd[3])
                     : "r"(a[0]), "r"(a[1]), "r"(b[0]), "f"(__uint_as_float(c[0])), "f"(__uint_as_float(c[1])),
                       "f"(__uint_as_float(c[2])), "f"(__uint_as_float(c[3])));
        for (int i = 0; i < 4; ++i) d[i] = __float_as_uint(fd[i]);
    }
};

template <>
struct MmaOnce<4, 2, 4, 1> {  // m16n8k16 f16/bf16, m16n8k8 tf32, m16n8k32 fp8 (fp32 accumulators)
    static __device__ void run(unsigned* d, const unsigned* a, const unsigned* b, const unsigned* c) {
        float fd[4];
        asm volatile(MX_PTX " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
                     : "=f"(fd[0]), "=f"(fd[1]), "=f"(fd[2]), "=f"(fd[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                       "f"(__uint_as_float(c[0])), "f"(__uint_as_float(c[1])), "f"(__uint_as_float(c[2])),
                       "f"(__uint_as_float(c[3])));
        for (int i = 0; i < 4; ++i) d[i] = __float_as_uint(fd[i]);
    }
};

template <>
struct MmaOnce<2, 1, 2, 0> {  // m16n8k8 f16 with f16x2 accumulators
    static __device__ void run(unsigned* d, const unsigned* a, const unsigned* b, const unsigned* c) {
        asm volatile(MX_PTX " {%0,%1}, {%2,%3}, {%4}, {%5,%6};\n"
                     : "=r"(d[0]), "=r"(d[1])
                     : "r"(a[0]), "r"(a[1]), "r"(b[0]), "r"(c[0]), "r"(c[1]));
    }
};

template <>
struct MmaOnce<4, 2, 2, 0> {  // m16n8k16 f16 (and fp8 with f16 accumulators) with f16x2 accumulators
    static __device__ void run(unsigned* d, const unsigned* a, const unsigned* b, const unsigned* c) {
        asm volatile(MX_PTX " {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%8,%9};\n"
                     : "=r"(d[0]), "=r"(d[1])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(c[0]), "r"(c[1]));
    }
};

#if defined(MX_BLOCK_SCALED) && MX_BLOCK_SCALED
#if !defined(MX_SCALE_BYTE_A) || !defined(MX_SCALE_THREAD_A) || !defined(MX_SCALE_BYTE_B) || !defined(MX_SCALE_THREAD_B)
#error "MX_BLOCK_SCALED needs MX_SCALE_BYTE_A, MX_SCALE_THREAD_A, MX_SCALE_BYTE_B and MX_SCALE_THREAD_B"
#endif
#define MX_STR2(x) #x
#define MX_STR(x) MX_STR2(x)
// m16n8k32 kind::mxf8f6f4 and m16n8k64 kind::mxf4 / mxf4nvf4: 4 A, 2 B, 4 fp32 C/D registers, one scale
// register each for A and B.
static __device__ void mma_scaled_once(unsigned* d, const unsigned* a, const unsigned* b, const unsigned* c,
                                       unsigned sa, unsigned sb) {
    float fd[4];
    asm volatile(MX_PTX " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13}, %14, {"
                 MX_STR(MX_SCALE_BYTE_A) ", " MX_STR(MX_SCALE_THREAD_A) "}, %15, {"
                 MX_STR(MX_SCALE_BYTE_B) ", " MX_STR(MX_SCALE_THREAD_B) "};\n"
                 : "=f"(fd[0]), "=f"(fd[1]), "=f"(fd[2]), "=f"(fd[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                   "f"(__uint_as_float(c[0])), "f"(__uint_as_float(c[1])), "f"(__uint_as_float(c[2])),
                   "f"(__uint_as_float(c[3])), "r"(sa), "r"(sb));
    for (int i = 0; i < 4; ++i) d[i] = __float_as_uint(fd[i]);
}

extern "C" __global__ void __launch_bounds__(32) MX_PROBE_ENTRY(const unsigned* __restrict__ a,
                                                                 const unsigned* __restrict__ b,
                                                                 const unsigned* __restrict__ c,
                                                                 const unsigned* __restrict__ scale_a,
                                                                 const unsigned* __restrict__ scale_b,
                                                                 unsigned* __restrict__ d) {
    static_assert(MX_A_REGS == 4 && MX_B_REGS == 2 && MX_C_REGS == 4 && MX_C_F32 == 1,
                  "block-scaled mma.sync probes have 4 A, 2 B and 4 fp32 C registers");
    const unsigned lane = threadIdx.x;
    unsigned ra[4], rb[2], rc[4], rd[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) ra[r] = a[lane * 4 + r];
#pragma unroll
    for (int r = 0; r < 2; ++r) rb[r] = b[lane * 2 + r];
#pragma unroll
    for (int r = 0; r < 4; ++r) rc[r] = c[lane * 4 + r];
    mma_scaled_once(rd, ra, rb, rc, scale_a[lane], scale_b[lane]);
#pragma unroll
    for (int r = 0; r < 4; ++r) d[lane * 4 + r] = rd[r];
}
#else
extern "C" __global__ void __launch_bounds__(32) MX_PROBE_ENTRY(const unsigned* __restrict__ a,
                                                                 const unsigned* __restrict__ b,
                                                                 const unsigned* __restrict__ c,
                                                                 unsigned* __restrict__ d) {
    const unsigned lane = threadIdx.x;
    unsigned ra[MX_A_REGS], rb[MX_B_REGS], rc[MX_C_REGS], rd[MX_C_REGS];
#pragma unroll
    for (int r = 0; r < MX_A_REGS; ++r) ra[r] = a[lane * MX_A_REGS + r];
#pragma unroll
    for (int r = 0; r < MX_B_REGS; ++r) rb[r] = b[lane * MX_B_REGS + r];
#pragma unroll
    for (int r = 0; r < MX_C_REGS; ++r) rc[r] = c[lane * MX_C_REGS + r];
    MmaOnce<MX_A_REGS, MX_B_REGS, MX_C_REGS, MX_C_F32>::run(rd, ra, rb, rc);
#pragma unroll
    for (int r = 0; r < MX_C_REGS; ++r) d[lane * MX_C_REGS + r] = rd[r];
}
#endif
