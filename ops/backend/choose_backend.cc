#include "ops/backend/choose_backend.h"

#include "base/status_macros.h"
#include "ops/backend/cuda_probe.h"

namespace kvd::ops {

absl::StatusOr<BackendChoice> ChooseBackend(absl::string_view flag,
                                            absl::string_view model_name) {
  KVD_ASSIGN_OR_RETURN(const BackendRequest request, ParseBackendRequest(flag));
  if (request == BackendRequest::kCpu) return BackendChoice{};
  return SelectBackend(request, ProbeCudaDevices(),
                       CudaServingSupport(model_name));
}

}  // namespace kvd::ops
