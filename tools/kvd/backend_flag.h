// The backend flags of the commands that load a model (generate, chat,
// serve): --backend auto (default), cpu or cuda, and
// --tensor-parallel-size / --tensor-parallel-simulate; the rule is
// ops/backend/backend.h and the opening ops/backend/open_backend.h. Also
// --precision, whose default (auto) depends on the hardware found.
//
//   DeclareBackendFlag(args);
//   ...
//   KVD_ASSIGN_OR_RETURN(ops::BackendRequest req,
//   BackendRequestFromFlag(args));
#ifndef KVD_TOOLS_KVD_BACKEND_FLAG_H_
#define KVD_TOOLS_KVD_BACKEND_FLAG_H_

#include <string>

#include "absl/status/statusor.h"
#include "ops/backend/backend.h"
#include "ops/model/model_config.h"
#include "tools/kvd/args.h"

namespace kvd::cli {

void DeclareBackendFlag(Args& args);

// INVALID_ARGUMENT naming the flag for anything but auto, cpu or cuda.
absl::StatusOr<ops::BackendRequest> BackendRequestFromFlag(const Args& args);

// INVALID_ARGUMENT naming the flag for a size that is not a whole number
// in [1, 64], or --tensor-parallel-simulate without a size above 1.
absl::StatusOr<ops::TensorParallelRequest> TensorParallelFromFlags(
    const Args& args);

// --precision auto (default), fp32 or bf16.
void DeclarePrecisionFlag(Args& args);

struct PrecisionChoice {
  ops::Precision precision = ops::Precision::kBf16;
  // Why, for the start-up log: "fp32 (auto: ...)" or "bf16 (--precision)".
  std::string why;
};
// The --precision a command runs at: as given, or for auto the exact mode
// that is fastest where it runs (AutoPrecision) for the backend --backend
// and --tensor-parallel-size ask for. INVALID_ARGUMENT naming the flag for
// anything but auto, fp32 or bf16 (and the backend flags' own errors).
absl::StatusOr<PrecisionChoice> PrecisionFromFlags(const Args& args);

// --precision auto's rule: bf16 for the CUDA backend (its only mode); on
// the CPU, bf16 where the CPU multiplies bf16 pairs natively (AVX512-BF16)
// and fp32 elsewhere, where bf16 products are emulated and run slower than
// fp32 over the file's own blocks. Both modes are exact; a session keeps the
// precision it was stored in, so nodes that share sessions must agree
// (pin --precision in a mixed cluster).
PrecisionChoice AutoPrecision(ops::BackendRequest backend,
                              bool cpu_has_bf16_pairs);

}  // namespace kvd::cli

#endif  // KVD_TOOLS_KVD_BACKEND_FLAG_H_
