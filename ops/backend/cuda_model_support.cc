#include "ops/backend/cuda_model_support.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvd::ops {

absl::Status CheckCudaModelSupport(const ModelConfig& c, Precision precision) {
  std::vector<std::string> missing;
  if (precision != Precision::kBf16) {
    missing.push_back(absl::StrCat("the ", PrecisionName(precision),
                                   " precision mode (only bf16)"));
  }
  if (c.qk_norm) missing.push_back("QK-norm");
  if (c.post_attn_norm) missing.push_back("post-attention norm");
  if (c.post_ffn_norm) missing.push_back("post-FFN norm");
  // kernels/cuda/attention.h's limit.
  if (c.head_dim > 256 || c.head_dim <= 0) {
    missing.push_back(absl::StrCat("head_dim ", c.head_dim, " (1..256)"));
  }
  if (c.rope_dim > c.head_dim) {
    missing.push_back(absl::StrCat("rope_dim ", c.rope_dim, " > head_dim"));
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat("the CUDA model path cannot run ",
                   c.name.empty() ? "this model" : c.name, " (architecture ",
                   c.architecture, "): it lacks ", absl::StrJoin(missing, ", "),
                   "; use --backend cpu (the CPU engine runs every family)"));
}

CudaModelSupport CudaModelPathSupport(const ModelConfig& config,
                                      Precision precision) {
  const absl::Status s = CheckCudaModelSupport(config, precision);
  CudaModelSupport support;
  support.can_serve = s.ok();
  if (!s.ok()) support.reason = std::string(s.message());
  return support;
}

}  // namespace kvd::ops
