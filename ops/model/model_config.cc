#include "ops/model/model_config.h"

#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace kvd::ops {

const char* PrecisionName(Precision p) {
  return p == Precision::kF32 ? "fp32" : "bf16";
}

absl::StatusOr<Precision> ParsePrecision(absl::string_view name) {
  if (name == "fp32") return Precision::kF32;
  if (name == "bf16") return Precision::kBf16;
  return absl::InvalidArgumentError(absl::StrCat(
      "precision must be fp32 or bf16, not '", std::string(name), "'"));
}

int64_t ModelConfig::row_parallel_groups() const {
  if (n_kv_heads <= 0 || d_ff <= 0) return 1;
  return std::gcd(n_kv_heads, d_ff);
}

float ModelConfig::attn_scale() const {
  return attention_scale != 0.0f
             ? attention_scale
             : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

absl::Status ModelConfig::ValidateSizes() const {
  const struct {
    const char* what;
    int64_t value, max;
  } bounds[] = {{"layer count", n_layers, 1024},
                {"model width", d_model, 1 << 16},
                {"MLP width", d_ff, 1 << 18},
                {"head count", n_heads, 1024},
                {"K/V head count", n_kv_heads, 1024},
                {"head size", head_dim, 1024},
                {"vocabulary size", vocab_size, 1 << 22},
                {"context length", context_length, int64_t{1} << 30}};
  for (const auto& b : bounds) {
    if (b.value <= 0 || b.value > b.max) {
      return absl::InvalidArgumentError(absl::StrCat(
          "implausible ", b.what, " ", b.value, " (expected 1..", b.max, ")"));
    }
  }
  if (n_heads % n_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head count ", n_heads,
                     " is not a multiple of the K/V head count ", n_kv_heads));
  }
  if (head_dim % 2 != 0 || rope_dim <= 0 || rope_dim > head_dim ||
      rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported head size ", head_dim, " / RoPE size ",
                     rope_dim, " (both even, RoPE <= head)"));
  }
  // NaN fails every comparison, so test for the good range.
  if (!(std::isfinite(rms_eps) && rms_eps >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RMSNorm epsilon ", rms_eps, " is not a finite number >= 0"));
  }
  return absl::OkStatus();
}

absl::Status ModelConfig::Validate() const {
  if (absl::Status s = ValidateSizes(); !s.ok()) return s;
  if (static_cast<int64_t>(layers.size()) != n_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        layers.size(), " layer settings for ", n_layers, " layers"));
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    if (!(std::isfinite(layers[l].rope_base) && layers[l].rope_base > 0.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, ": RoPE base ", layers[l].rope_base,
                       " is not a finite number > 0"));
    }
    if (layers[l].sliding_window < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, ": sliding window ",
                       layers[l].sliding_window, " is negative"));
    }
  }
  return absl::OkStatus();
}

int64_t ModelConfig::ParameterCount(bool tied_output) const {
  const int64_t attn = d_model * (q_dim() + 2 * kv_dim()) + q_dim() * d_model;
  const int64_t mlp = 3 * d_model * d_ff;
  const int64_t embed = vocab_size * d_model * (tied_output ? 1 : 2);
  return n_layers * (attn + mlp) + embed;
}

}  // namespace kvd::ops
