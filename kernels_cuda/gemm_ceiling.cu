// mxcore: issue ceiling of one mma.sync form, register operands only (no memory traffic in the loop).
// -D MX_MMA_OP "<mnemonic>" (from mxcore.layouts), MX_CHAINS independent accumulators per warp.
// Each iteration issues MX_CHAINS mma; flops per warp per iteration = 2 * m * n * k * MX_CHAINS.

typedef unsigned int u32;

#ifndef MX_CHAINS
#define MX_CHAINS 8
#endif

extern "C" __global__ void __launch_bounds__(256) mx_mma_ceiling(float* out, int iters, u32 seed) {
    // operands: small finite values in every format (0x38 bytes / 0x3800 halves / 0x3f000000 words are ~0.5-1)
    u32 a0 = 0x38383838u ^ (seed & 0x01010101u), a1 = a0 ^ 0x00010001u, a2 = a0 ^ 0x01000100u, a3 = a0;
    u32 b0 = 0x38383838u ^ ((seed >> 8) & 0x01010101u), b1 = b0 ^ 0x00010001u;
    float acc[MX_CHAINS][4];
#pragma unroll
    for (int c = 0; c < MX_CHAINS; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < MX_CHAINS; ++c)
            asm volatile(MX_MMA_OP " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                         : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < MX_CHAINS; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
