// The backend for a loaded model: probes the CUDA devices (only when the
// request is not kCpu), asks CudaModelPathSupport whether the CUDA path runs
// this model and precision, and applies SelectBackend (backend.h).
//
//   KVD_ASSIGN_OR_RETURN(BackendChoice c,
//                        ChooseBackend(request, model.config(),
//                                      model.precision()));
//   if (!c.notice.empty()) std::fprintf(stderr, "%s\n", c.notice.c_str());
//
// Thread-safety: as ProbeCudaDevices.
#ifndef KVD_OPS_BACKEND_CHOOSE_BACKEND_H_
#define KVD_OPS_BACKEND_CHOOSE_BACKEND_H_

#include "absl/status/statusor.h"
#include "ops/backend/backend.h"
#include "ops/model/model_config.h"

namespace kvd::ops {

absl::StatusOr<BackendChoice> ChooseBackend(BackendRequest request,
                                            const ModelConfig& config,
                                            Precision precision);

}  // namespace kvd::ops

#endif  // KVD_OPS_BACKEND_CHOOSE_BACKEND_H_
