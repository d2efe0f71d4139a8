// Instruction-set selection for the CPU kernels.
//
// Every kernel has three implementations -- portable scalar, AVX2 (two 8-lane
// registers) and AVX-512 (one 16-lane register) -- that produce bit-identical
// results because they follow the same canonical reduction order (see
// kernels/cpu/README.md). The active ISA defaults to the best the machine
// supports; tests switch it to prove the paths agree bit for bit.
//
//   KVD_ISA=avx2 kvd generate ...        // force a path from the environment
//   kvd::kernels::cpu::SetIsa(Isa::kScalar);  // or from code (tests)
//
// Thread-safety: SetIsa is meant for start-up and tests; kernels read the
// setting atomically.
#ifndef KVD_KERNELS_CPU_CPU_FEATURES_H_
#define KVD_KERNELS_CPU_CPU_FEATURES_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvd::kernels::cpu {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// Whether this machine can run `isa` (scalar always; AVX2 needs AVX2+FMA+F16C;
// AVX-512 needs F, BW, VL and DQ).
bool IsaSupported(Isa isa);

// Whether the AVX-512 path may use AVX512-BF16 (vdpbf16ps) for the bf16 pair
// contract (internal/gemm_pairs.h); the other paths emulate it.
bool HasAvx512Bf16();

// The best ISA this machine supports.
Isa BestIsa();

// The ISA kernels use now: KVD_ISA from the environment on first use if set and
// supported, else BestIsa().
Isa ActiveIsa();

// Selects the ISA; FAILED_PRECONDITION if the machine lacks it.
absl::Status SetIsa(Isa isa);

const char* IsaName(Isa isa);
absl::StatusOr<Isa> ParseIsa(std::string_view name);

}  // namespace kvd::kernels::cpu

#endif  // KVD_KERNELS_CPU_CPU_FEATURES_H_
