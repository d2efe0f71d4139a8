#include "ops/kvdirect/checkpoint_policy.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvd::ops {

std::string CheckpointPolicy::Name() const {
  switch (kind) {
    case Kind::kKv:
      return "kv";
    case Kind::kKvDirect:
      return "kv-direct";
    case Kind::kStride:
      return absl::StrCat("stride:", stride);
    case Kind::kTokens:
      return "tokens";
  }
  return "?";
}

absl::StatusOr<CheckpointPolicy> ParseCheckpointPolicy(absl::string_view name) {
  CheckpointPolicy p;
  if (name == "kv") {
    p.kind = CheckpointPolicy::Kind::kKv;
  } else if (name == "kv-direct") {
    p.kind = CheckpointPolicy::Kind::kKvDirect;
  } else if (name == "tokens") {
    p.kind = CheckpointPolicy::Kind::kTokens;
  } else if (absl::StartsWith(name, "stride:")) {
    p.kind = CheckpointPolicy::Kind::kStride;
    if (!absl::SimpleAtoi(name.substr(7), &p.stride) || p.stride < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint policy '", name,
                       "': the stride must be a whole number >= 1"));
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown checkpoint policy '", name,
                     "'; use kv, kv-direct, stride:<k> or tokens"));
  }
  return p;
}

std::vector<int64_t> CheckpointLayers(const CheckpointPolicy& policy,
                                      int64_t n_layers) {
  std::vector<int64_t> layers;
  const int64_t step =
      policy.kind == CheckpointPolicy::Kind::kKvDirect ? 1 : policy.stride;
  if (policy.kind == CheckpointPolicy::Kind::kKvDirect ||
      policy.kind == CheckpointPolicy::Kind::kStride) {
    for (int64_t l = 0; l < n_layers; l += step) layers.push_back(l);
  }
  return layers;
}

BytesPerToken ComputeBytesPerToken(const ModelConfig& config,
                                   Precision precision,
                                   const CheckpointPolicy& policy) {
  const int64_t elem = precision == Precision::kF32 ? 4 : 2;
  BytesPerToken b;
  b.residual_row = config.d_model * elem;
  b.kv_row_pair = 2 * config.kv_dim() * elem;
  auto global = [&](int64_t l) { return config.layers[l].sliding_window == 0; };
  if (policy.kind == CheckpointPolicy::Kind::kKv) {
    for (int64_t l = 0; l < config.n_layers; ++l) {
      b.state += b.kv_row_pair;
      if (global(l)) b.state_past_window += b.kv_row_pair;
    }
    return b;
  }
  const std::vector<int64_t> layers = CheckpointLayers(policy, config.n_layers);
  for (size_t i = 0; i < layers.size(); ++i) {
    b.state += b.residual_row;
    const int64_t end = i + 1 < layers.size() ? layers[i + 1] : config.n_layers;
    bool needed = false;
    for (int64_t l = layers[i]; l < end; ++l) needed |= global(l);
    if (needed) b.state_past_window += b.residual_row;
  }
  return b;
}

}  // namespace kvd::ops
