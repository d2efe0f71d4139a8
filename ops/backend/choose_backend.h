// The backend for a command that loads a model: parses the --backend flag,
// probes the CUDA devices (only when the flag is not "cpu") and applies
// SelectBackend (backend.h).
//
//   KVD_ASSIGN_OR_RETURN(BackendChoice c,
//                        ChooseBackend(args.Get("backend"), model_path));
//   if (!c.notice.empty()) std::fprintf(stderr, "%s\n", c.notice.c_str());
//
// Thread-safety: as ProbeCudaDevices.
#ifndef KVD_OPS_BACKEND_CHOOSE_BACKEND_H_
#define KVD_OPS_BACKEND_CHOOSE_BACKEND_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ops/backend/backend.h"

namespace kvd::ops {

absl::StatusOr<BackendChoice> ChooseBackend(absl::string_view flag,
                                            absl::string_view model_name);

}  // namespace kvd::ops

#endif  // KVD_OPS_BACKEND_CHOOSE_BACKEND_H_
