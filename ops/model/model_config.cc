#include "ops/model/model_config.h"

#include <cmath>

namespace kvd::ops {

const char* PrecisionName(Precision p) {
  return p == Precision::kF32 ? "fp32" : "bf16";
}

float ModelConfig::attn_scale() const {
  return attention_scale != 0.0f
             ? attention_scale
             : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

int64_t ModelConfig::ParameterCount(bool tied_output) const {
  const int64_t attn = d_model * (q_dim() + 2 * kv_dim()) + q_dim() * d_model;
  const int64_t mlp = 3 * d_model * d_ff;
  const int64_t embed = vocab_size * d_model * (tied_output ? 1 : 2);
  return n_layers * (attn + mlp) + embed;
}

}  // namespace kvd::ops
