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
