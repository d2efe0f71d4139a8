#include "tools/kvd/backend_flag.h"

namespace kvd::cli {

void DeclareBackendFlag(Args& a) {
  a.Flag("backend", "auto",
         "auto (CUDA when a device exists and can run the model, else the "
         "CPU, saying why), cpu, or cuda (fail rather than fall back)");
}

absl::StatusOr<ops::BackendRequest> BackendRequestFromFlag(const Args& args) {
  return ops::ParseBackendRequest(args.Get("backend"));
}

}  // namespace kvd::cli
