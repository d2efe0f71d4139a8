#include "tools/kvd/backend_flag.h"

namespace kvd::cli {

void DeclareBackendFlag(Args& a) {
  a.Flag("backend", "auto",
         "auto (the CPU, saying why; CUDA where a device can run the model "
         "once the CUDA backend has passed its device check), cpu, or cuda "
         "(GPU 0; fail rather than fall back)");
}

absl::StatusOr<ops::BackendRequest> BackendRequestFromFlag(const Args& args) {
  return ops::ParseBackendRequest(args.Get("backend"));
}

}  // namespace kvd::cli
