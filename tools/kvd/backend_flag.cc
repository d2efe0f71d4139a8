#include "tools/kvd/backend_flag.h"

#include <cstdio>

#include "base/status_macros.h"
#include "ops/backend/choose_backend.h"

namespace kvd::cli {

void DeclareBackendFlag(Args& a) {
  a.Flag("backend", "auto",
         "auto (CUDA when a device exists and can serve the model, else the "
         "CPU, saying why), cpu, or cuda (fail rather than fall back)");
}

absl::Status ApplyBackendFlag(const Args& args, const std::string& model) {
  KVD_ASSIGN_OR_RETURN(const ops::BackendChoice choice,
                       ops::ChooseBackend(args.Get("backend"), model));
  if (!choice.notice.empty()) {
    std::fprintf(stderr, "%s\n", choice.notice.c_str());
  }
  // Only the CPU engine exists today, and SelectBackend picks CUDA only once
  // ops::CudaServingSupport says the model can be served.
  if (choice.backend != ops::Backend::kCpu) {
    return absl::UnimplementedError(
        "the CUDA backend was selected but the engine cannot run on it yet");
  }
  return absl::OkStatus();
}

}  // namespace kvd::cli
