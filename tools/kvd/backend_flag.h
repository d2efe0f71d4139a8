// The backend flags of the commands that load a model (generate, chat,
// serve): --backend auto (default), cpu or cuda, and
// --tensor-parallel-size / --tensor-parallel-simulate; the rule is
// ops/backend/backend.h and the opening ops/backend/open_backend.h.
//
//   DeclareBackendFlag(args);
//   ...
//   KVD_ASSIGN_OR_RETURN(ops::BackendRequest req,
//   BackendRequestFromFlag(args));
#ifndef KVD_TOOLS_KVD_BACKEND_FLAG_H_
#define KVD_TOOLS_KVD_BACKEND_FLAG_H_

#include "absl/status/statusor.h"
#include "ops/backend/backend.h"
#include "tools/kvd/args.h"

namespace kvd::cli {

void DeclareBackendFlag(Args& args);

// INVALID_ARGUMENT naming the flag for anything but auto, cpu or cuda.
absl::StatusOr<ops::BackendRequest> BackendRequestFromFlag(const Args& args);

// INVALID_ARGUMENT naming the flag for a size that is not a whole number
// in [1, 64], or --tensor-parallel-simulate without a size above 1.
absl::StatusOr<ops::TensorParallelRequest> TensorParallelFromFlags(
    const Args& args);

}  // namespace kvd::cli

#endif  // KVD_TOOLS_KVD_BACKEND_FLAG_H_
