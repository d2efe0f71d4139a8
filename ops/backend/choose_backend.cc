#include "ops/backend/choose_backend.h"

#include "ops/backend/cuda_model_support.h"
#include "ops/backend/cuda_probe.h"

namespace kvd::ops {

absl::StatusOr<BackendChoice> ChooseBackend(BackendRequest request,
                                            const ModelConfig& config,
                                            Precision precision) {
  if (request == BackendRequest::kCpu) return BackendChoice{};
  return SelectBackend(request, ProbeCudaDevices(),
                       CudaModelPathSupport(config, precision));
}

}  // namespace kvd::ops
