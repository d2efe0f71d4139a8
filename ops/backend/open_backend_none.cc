#include "absl/status/status.h"
#include "ops/backend/open_backend.h"

namespace kvd::ops {

absl::StatusOr<std::unique_ptr<ModelBackend>> MakeCudaBackend(
    const Model& model) {
  return absl::FailedPreconditionError(
      "this kvd was built without the CUDA toolkit; rebuild it on a machine "
      "with /usr/local/cuda (tools/setup.sh) to use a GPU");
}

absl::StatusOr<std::unique_ptr<ModelBackend>> MakeTpCudaBackend(
    const Model& model, const TensorParallelRequest& tp) {
  return MakeCudaBackend(model).status();
}

}  // namespace kvd::ops
