// The version of kvd's numerics contract (DESIGN.md section 3): the exact
// order of every floating-point reduction in the CPU kernels. Two builds with
// the same version produce bit-identical K/V, residuals and logits from the
// same weights; a stored checkpoint records it, and a build with another
// version (or the CUDA backend, ops/backend/backend.h kCudaNumericsVersion)
// re-prefills the session from its token ids rather than continue from
// residuals with different bits.
//
// Bump it whenever a kernel change can alter any output bit (GEMM lane order,
// attention chunking, exp/SiLU/GELU polynomials, RMSNorm or RoPE formulas).
// The golden tests against llama.cpp and the engine's bit-identity tests are
// the tripwire that tells you a change needs it.
#ifndef KVD_KERNELS_CPU_NUMERICS_VERSION_H_
#define KVD_KERNELS_CPU_NUMERICS_VERSION_H_

#include <cstdint>

namespace kvd::kernels::cpu {

// 2: the row-parallel projections (W_o, W_down) sum G ordered partials
//    (row_parallel_gemm.h), so tensor-parallel degrees dividing G agree.
// 3: the bf16 mode's GEMMs round their activations to bf16 and follow the
//    bf16 pair contract (internal/gemm_pairs.h: vdpbf16ps's order, denormals
//    flushed); the fp32 mode is unchanged.
inline constexpr uint32_t kNumericsVersion = 3;

}  // namespace kvd::kernels::cpu

#endif  // KVD_KERNELS_CPU_NUMERICS_VERSION_H_
