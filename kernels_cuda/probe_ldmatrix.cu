// Probe kernel for one ldmatrix instruction (m8n8 .b16, .x1/.x2/.x4, with or without .trans).
//
// The host fills `tile` with MX_LDSM_REGS 8x8 matrices of 16-bit codes (matrix q, row r, column c at
// element (q * 8 + r) * 8 + c; an arange, so every code names its element) and gives every lane the
// element offset of the row it supplies (`row_offset[lane]`, from the layout table's address map; lanes
// whose address the instruction ignores get 0).  The kernel copies the tile to shared memory, executes
// exactly one MX_LDSM_PTX instruction and writes each lane's MX_LDSM_REGS registers to
// out[lane * MX_LDSM_REGS + r].  The host then reads which element arrived in which lane and slot.
//
// Defines (set by backends/probes.py):
//   MX_PROBE_ENTRY  extern "C" entry point, mx_probe_<instruction suffix>
//   MX_LDSM_PTX     e.g. "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
//   MX_LDSM_REGS    1, 2 or 4 (= number of 8x8 matrices)
// Launch: one block of 32 threads (one warp).

#if !defined(MX_PROBE_ENTRY) || !defined(MX_LDSM_PTX) || !defined(MX_LDSM_REGS)
#error "probe_ldmatrix.cu needs MX_PROBE_ENTRY, MX_LDSM_PTX and MX_LDSM_REGS"
#endif

template <int N>
struct LdmatrixOnce;

template <>
struct LdmatrixOnce<1> {
    static __device__ void run(unsigned* r, unsigned addr) {
        asm volatile(MX_LDSM_PTX " {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr));
    }
};

template <>
struct LdmatrixOnce<2> {
    static __device__ void run(unsigned* r, unsigned addr) {
        asm volatile(MX_LDSM_PTX " {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
    }
};

template <>
struct LdmatrixOnce<4> {
    static __device__ void run(unsigned* r, unsigned addr) {
        asm volatile(MX_LDSM_PTX " {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
    }
};

extern "C" __global__ void __launch_bounds__(32) MX_PROBE_ENTRY(const unsigned short* __restrict__ tile,
                                                                 const unsigned* __restrict__ row_offset,
                                                                 unsigned* __restrict__ out) {
    __shared__ __align__(16) unsigned short smem[MX_LDSM_REGS * 64];
    const unsigned lane = threadIdx.x;
    for (unsigned i = lane; i < MX_LDSM_REGS * 64; i += 32) smem[i] = tile[i];
    __syncwarp();
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem + row_offset[lane]));
    unsigned r[MX_LDSM_REGS];
    LdmatrixOnce<MX_LDSM_REGS>::run(r, addr);
#pragma unroll
    for (int i = 0; i < MX_LDSM_REGS; ++i) out[lane * MX_LDSM_REGS + i] = r[i];
}
