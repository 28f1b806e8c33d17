// Probe kernel for one MFMA instruction (one kernel per instruction and format/op_sel variant, chosen by -D).
//
// The kernel knows no layout.  Lane l loads its registers from lane-major buffers (a[l * MX_A_REGS + r],
// raw 32-bit words packed on the host from the layout table: slot 0 in register 0's low bits upward),
// executes exactly one MFMA through its __builtin_amdgcn_* intrinsic and writes D's registers back the
// same way.  Scaled f8f6f4 probes also load one 32-bit scale register per lane for A and B; MX_OPSEL_A/B
// choose which byte of it the instruction reads.  backends/probes.py packs and unpacks through
// mxcore.emulate.scatter/gather and the layout record.
//
// Defines (set by backends/probes.py from the layout record):
//   MX_PROBE_ENTRY       extern "C" entry point, mx_probe_<instruction suffix>
//   MX_INTRINSIC         the builtin, e.g. __builtin_amdgcn_mfma_f32_32x32x8f16
//   MX_A_T, MX_B_T       argument types (typedefs of mx_types.h), MX_C_T the accumulator vector type
//   MX_A_REGS, MX_B_REGS, MX_C_REGS   32-bit registers per lane the layout uses (A/B may be fewer than the
//                        argument type holds: fp6/fp4 operands of the f8f6f4 MFMAs; the rest are zero)
//   MX_F8F6F4            1 for the f8f6f4 family: arguments (a, b, c, cbsz, blgp, opsel_a, scale_a, opsel_b,
//                        scale_b); 0 for the classic form (a, b, c, cbsz, abid, blgp) with zero broadcast controls
//   MX_SCALED            1: scales come from the buffers (v_mfma_scale_*); 0: constant zero scales and op_sel,
//                        which the compiler emits as the unscaled v_mfma_f32_*_f8f6f4
//   MX_CBSZ, MX_BLGP     f8f6f4 format codes of A and B (0 fp8, 1 bf8, 2 fp6, 3 bf6, 4 fp4)
//   MX_OPSEL_A, MX_OPSEL_B   byte of the scale register that the scaled MFMA reads (0..3)
// Launch: one block of 64 threads (one wave64).

#if !defined(MX_PROBE_ENTRY) || !defined(MX_INTRINSIC) || !defined(MX_A_T) || !defined(MX_B_T) || \
    !defined(MX_C_T) || !defined(MX_A_REGS) || !defined(MX_B_REGS) || !defined(MX_C_REGS)
#error "probe_mfma.hip needs MX_PROBE_ENTRY, MX_INTRINSIC, MX_A_T, MX_B_T, MX_C_T and MX_A/B/C_REGS"
#endif
#ifndef MX_F8F6F4
#define MX_F8F6F4 0
#endif
#ifndef MX_SCALED
#define MX_SCALED 0
#endif
#ifndef MX_CBSZ
#define MX_CBSZ 0
#endif
#ifndef MX_BLGP
#define MX_BLGP 0
#endif
#ifndef MX_OPSEL_A
#define MX_OPSEL_A 0
#endif
#ifndef MX_OPSEL_B
#define MX_OPSEL_B 0
#endif

#include "mx_types.h"

// Load `used` words of lane `lane` (row length `used`) into a value of type T; words past `used` are zero.
template <typename T>
__device__ static T load_lane(const unsigned* __restrict__ buf, unsigned lane, unsigned used) {
    constexpr unsigned kWords = sizeof(T) / 4;
    unsigned w[kWords];
#pragma unroll
    for (unsigned r = 0; r < kWords; ++r) w[r] = r < used ? buf[lane * used + r] : 0u;
    T v;
    __builtin_memcpy(&v, w, sizeof(T));
    return v;
}

extern "C" __global__ void __launch_bounds__(64) MX_PROBE_ENTRY(const unsigned* __restrict__ a,
                                                                 const unsigned* __restrict__ b,
                                                                 const unsigned* __restrict__ c,
                                                                 unsigned* __restrict__ d,
                                                                 const unsigned* __restrict__ scale_a,
                                                                 const unsigned* __restrict__ scale_b) {
    const unsigned lane = __builtin_amdgcn_workitem_id_x();
    const MX_A_T va = load_lane<MX_A_T>(a, lane, MX_A_REGS);
    const MX_B_T vb = load_lane<MX_B_T>(b, lane, MX_B_REGS);
    const MX_C_T vc = load_lane<MX_C_T>(c, lane, MX_C_REGS);
#if MX_F8F6F4 && MX_SCALED
    const int sa = static_cast<int>(scale_a[lane]);
    const int sb = static_cast<int>(scale_b[lane]);
    const MX_C_T vd = MX_INTRINSIC(va, vb, vc, MX_CBSZ, MX_BLGP, MX_OPSEL_A, sa, MX_OPSEL_B, sb);
#elif MX_F8F6F4
    (void)scale_a;
    (void)scale_b;
    const MX_C_T vd = MX_INTRINSIC(va, vb, vc, MX_CBSZ, MX_BLGP, 0, 0, 0, 0);
#else
    (void)scale_a;
    (void)scale_b;
    const MX_C_T vd = MX_INTRINSIC(va, vb, vc, 0, 0, 0);
#endif
    unsigned w[MX_C_REGS];
    __builtin_memcpy(w, &vd, sizeof(w));
#pragma unroll
    for (unsigned r = 0; r < MX_C_REGS; ++r) d[lane * MX_C_REGS + r] = w[r];
}
