// Whether the CUDA model path (cuda_model.h) can run a model, decided from
// its config and precision alone, so it is testable and answerable without a
// GPU or the CUDA toolkit.
//
//   absl::Status s = CheckCudaModelSupport(model->config(),
//                                          model->precision());
//   if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
//
// Thread-safety: pure function.
#ifndef KVD_OPS_BACKEND_CUDA_MODEL_SUPPORT_H_
#define KVD_OPS_BACKEND_CUDA_MODEL_SUPPORT_H_

#include "absl/status/status.h"
#include "ops/backend/backend.h"
#include "ops/model/model_config.h"

namespace kvd::ops {

// OK for the llama family as the CUDA path implements it (RMSNorm, RoPE,
// GQA, optional q/k/v bias, gated MLP, head_dim <= 256) in the bf16 mode;
// UNIMPLEMENTED naming the model, every missing feature and what to do
// otherwise.
absl::Status CheckCudaModelSupport(const ModelConfig& config,
                                   Precision precision);

// The same answer as a CudaModelSupport for SelectBackend: can_serve when
// the CUDA model path runs the model (ChooseBackend asks it).
CudaModelSupport CudaModelPathSupport(const ModelConfig& config,
                                      Precision precision);

}  // namespace kvd::ops

#endif  // KVD_OPS_BACKEND_CUDA_MODEL_SUPPORT_H_
