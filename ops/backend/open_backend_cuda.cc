#include "ops/backend/cuda_backend_model.h"
#include "ops/backend/open_backend.h"

namespace kvd::ops {

absl::StatusOr<std::unique_ptr<ModelBackend>> MakeCudaBackend(
    const Model& model) {
  absl::StatusOr<std::unique_ptr<CudaBackendModel>> gpu =
      CudaBackendModel::Create(model);
  if (!gpu.ok()) return gpu.status();
  return std::unique_ptr<ModelBackend>(std::move(*gpu));
}

}  // namespace kvd::ops
