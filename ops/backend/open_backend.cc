#include "ops/backend/open_backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "ops/backend/choose_backend.h"
#include "ops/backend/cuda_probe.h"

namespace kvd::ops {

absl::Status PrecheckBackend(BackendRequest request) {
  if (request != BackendRequest::kCuda) return absl::OkStatus();
  // Any model: only the device is in question here.
  return SelectBackend(request, ProbeCudaDevices(), CudaModelSupport{true, ""})
      .status();
}

absl::StatusOr<OpenedBackend> OpenBackend(BackendRequest request,
                                          const Model& model) {
  KVD_ASSIGN_OR_RETURN(
      const BackendChoice choice,
      ChooseBackend(request, model.config(), model.precision()));
  OpenedBackend opened;
  opened.backend = &model;
  opened.notice = choice.notice;
  if (choice.backend == Backend::kCpu) return opened;
  absl::StatusOr<std::unique_ptr<ModelBackend>> gpu = MakeCudaBackend(model);
  if (!gpu.ok()) {
    if (request == BackendRequest::kCuda) {
      return absl::Status(
          gpu.status().code(),
          absl::StrCat("--backend cuda: ", gpu.status().message(),
                       "; pass --backend auto or cpu to run on the CPU"));
    }
    opened.notice =
        absl::StrCat("kvd: the CUDA backend did not start (",
                     gpu.status().message(), "); using the CPU backend");
    return opened;
  }
  opened.kind = Backend::kCuda;
  opened.owned = *std::move(gpu);
  opened.backend = opened.owned.get();
  return opened;
}

}  // namespace kvd::ops
