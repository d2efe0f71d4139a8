// KV-Direct session-state policies (DESIGN.md section 4) and their honest byte
// accounting.
//
// A policy names what a session keeps per token besides its token id:
//   "kv"         plain K/V at every layer (the baseline and the hot tier);
//   "kv-direct"  the residual entering every layer;
//   "stride:k"   the residual entering layers 0, k, 2k, ... (k >= 1);
//   "tokens"     nothing (rebuild = re-prefill).
// Every policy is exact; they trade bytes for rebuild compute.
//
//   KVD_ASSIGN_OR_RETURN(CheckpointPolicy p,
//   ParseCheckpointPolicy("stride:4")); std::vector<int64_t> layers =
//   CheckpointLayers(p, config.n_layers); BytesPerToken b =
//   ComputeBytesPerToken(config, Precision::kBf16, p);
//
// Thread-safety: pure functions on values.
#ifndef KVD_OPS_KVDIRECT_CHECKPOINT_POLICY_H_
#define KVD_OPS_KVDIRECT_CHECKPOINT_POLICY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ops/model/model_config.h"

namespace kvd::ops {

struct CheckpointPolicy {
  enum class Kind { kKv, kKvDirect, kStride, kTokens };
  Kind kind = Kind::kKvDirect;
  int64_t stride = 1;  // kStride only: checkpoint every `stride`-th layer

  std::string Name() const;  // the string ParseCheckpointPolicy accepts
};

// INVALID_ARGUMENT for anything but the four spellings above.
absl::StatusOr<CheckpointPolicy> ParseCheckpointPolicy(absl::string_view name);

// Layers whose input residual the policy stores, ascending: all for
// kv-direct, 0, k, 2k, ... for stride:k, none for kv and tokens.
std::vector<int64_t> CheckpointLayers(const CheckpointPolicy& policy,
                                      int64_t n_layers);

// Bytes one token costs under a policy, from the model's shape and the
// precision's dtype (4 bytes fp32, 2 bytes bf16). "Past the window" counts
// what a token still needs once it is older than the sliding windows: Gemma
// 3's local layers only ever see the last W positions, so only global layers'
// K/V -- or, for a checkpointed layer, only one whose rebuild segment (up to
// the next checkpoint) contains a global layer -- must be kept for the whole
// session. An all-local segment needs its checkpoint for (segment length) x W
// positions back, still bounded.
struct BytesPerToken {
  int64_t token_id = 4;
  int64_t residual_row = 0;  // one layer's residual: d_model values
  int64_t kv_row_pair = 0;   // one layer's K and V rows
  int64_t state = 0;         // per token, the policy's stored state
  int64_t state_past_window = 0;
};
BytesPerToken ComputeBytesPerToken(const ModelConfig& config,
                                   Precision precision,
                                   const CheckpointPolicy& policy);

}  // namespace kvd::ops

#endif  // KVD_OPS_KVDIRECT_CHECKPOINT_POLICY_H_
