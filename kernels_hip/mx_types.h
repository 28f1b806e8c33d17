// mx_types.h: the MFMA operand and accumulator types, declared once for every HIP kernel of mxcore.
//
// Each __builtin_amdgcn_mfma_* takes its A/B fragment as one of these vector types and its C/D
// accumulator as mx_f32x{4,16}.  backends/hip/fragments.py (frag_type) picks the name from the
// instruction's record in mxcore.layouts (element bits, registers per lane, scaled family); the
// kernels read the register count back with sizeof, so no count is restated anywhere.
// Included (inlined by mxcore.kernels.kernel_source) by gemm_mfma.hip, gemm_ceiling.hip, probe_mfma.hip.
#pragma once

typedef float mx_f32;                                          // fp32 A/B (1 register)
typedef float mx_f32x1;                                        // probe kernels' name for a 1-register C
typedef float mx_f32x2 __attribute__((ext_vector_type(2)));    // xf32 A/B (CDNA3)
typedef float mx_f32x4 __attribute__((ext_vector_type(4)));    // 16x16 accumulators
typedef float mx_f32x16 __attribute__((ext_vector_type(16)));  // 32x32 accumulators
typedef _Float16 mx_f16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 mx_f16x8 __attribute__((ext_vector_type(8)));
typedef short mx_i16x4 __attribute__((ext_vector_type(4)));    // bf16 bits of the CDNA3 *bf16_1k builtins
typedef __bf16 mx_bf16x8 __attribute__((ext_vector_type(8)));  // CDNA4 bf16 builtins
typedef long mx_i64;                                           // 8 fp8/bf8 bytes of the CDNA3 fp8 MFMAs
typedef int mx_i32x8 __attribute__((ext_vector_type(8)));      // 32 f8/f6/f4 codes of the f8f6f4 MFMAs
