#include "ops/backend/backend.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvd::ops {

const char* BackendName(Backend backend) {
  return backend == Backend::kCuda ? "cuda" : "cpu";
}

absl::StatusOr<BackendRequest> ParseBackendRequest(absl::string_view text) {
  if (text == "auto") return BackendRequest::kAuto;
  if (text == "cpu") return BackendRequest::kCpu;
  if (text == "cuda") return BackendRequest::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("--backend must be auto, cpu or cuda, not '", text, "'"));
}

absl::StatusOr<BackendChoice> SelectBackend(BackendRequest request,
                                            const DeviceProbe& probe,
                                            const CudaModelSupport& support,
                                            bool auto_may_pick_cuda) {
  BackendChoice choice;
  if (request == BackendRequest::kCpu) return choice;
  std::string why_not;
  if (probe.device_count <= 0) {
    why_not = absl::StrCat("no CUDA device (", probe.detail, ")");
  } else if (!support.can_serve) {
    why_not = support.reason;
  }
  if (why_not.empty() && request == BackendRequest::kAuto &&
      !auto_may_pick_cuda) {
    choice.detail = "the CUDA backend has not passed its device check yet";
    choice.notice = absl::StrCat(
        "kvd: the CUDA backend has not passed its device check yet "
        "(ops::kCudaAutoSelectVerified), so --backend auto stays on the CPU "
        "backend; pass --backend cuda to use ",
        probe.device_name);
    return choice;
  }
  if (why_not.empty()) {
    choice.backend = Backend::kCuda;
    choice.notice = absl::StrCat("kvd: using the CUDA backend on ",
                                 probe.device_name, " (", probe.detail, ")");
    return choice;
  }
  if (request == BackendRequest::kCuda) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend cuda: ", why_not,
        "; run on a machine with a supported NVIDIA GPU, or pass "
        "--backend auto (falls back to the CPU) or --backend cpu"));
  }
  choice.detail = why_not;
  // No device at all is the ordinary laptop: nothing to tell on every run.
  if (probe.device_count > 0) {
    choice.notice = absl::StrCat("kvd: ", why_not, "; using the CPU backend");
  }
  return choice;
}

uint32_t CudaTpNumericsVersion(int degree) {
  if (degree <= 1) return kCudaNumericsVersion;
  return kCudaNumericsVersion + 1000 * static_cast<uint32_t>(degree);
}

}  // namespace kvd::ops
