// Lossy K/V eviction baselines, implemented only to be measured against
// KV-Direct (DESIGN.md section 4: the product never evicts lossily). Each is a
// KeySelection (ops/model/model.h): per layer and K/V head it keeps a set of
// at most `budget` cached positions, and attention visits only those plus the
// step's own tokens (the same accounting as kv-direct's hot window of B). The
// cache itself keeps every row: this simulates what an evicting cache would
// attend to, it does not save memory.
//
// Methods and their parameters (positions are absolute, L = positions so far):
//  - window: the last B positions. No parameters.
//  - streaming-llm (Xiao et al. 2023, "Efficient Streaming Language Models
//    with Attention Sinks", arXiv 2309.17453): the first S "sink" positions
//    plus the last B - S. S = sink_tokens (paper: 4), clamped to B.
//  - h2o (Zhang et al. 2023, "H2O: Heavy-Hitter Oracle for Efficient
//    Generative Inference of Large Language Models", arXiv 2306.14048): per
//    K/V head, the last R positions plus the B - R "heavy hitters" with the
//    largest attention weight accumulated over every query so far (summed
//    over the query heads that share the K/V head), R = round(B *
//    h2o_recent_fraction) (paper: half the budget each). An evicted position
//    never returns.
//  - tova (Oren et al. 2024, "Transformers are Multi-State RNNs", arXiv
//    2401.06104): per layer (all heads keep the same positions), whenever the
//    set exceeds B, keep the B positions with the largest weight from the
//    step's last query, averaged over all query heads of the layer; during
//    decoding that drops the single lowest-weighted key per step (the new
//    token included). No parameters.
//  - snapkv (Li et al. 2024, "SnapKV: LLM Knows What You are Looking for
//    Before Generation", arXiv 2404.14469): the first time the set exceeds B
//    (the end of the prompt), the last W queries vote for earlier positions
//    with their attention weights (summed over the group's query heads), the
//    votes are max-pooled over positions with kernel K to keep neighbours
//    together, and per K/V head the B - W prefix positions with the most
//    pooled votes are selected; the last W positions (the observation window)
//    are kept too. The original then lets the cache grow with the generated
//    tokens; to hold B, each later position that does not fit evicts the
//    selected prefix position with the fewest pooled votes, and once none is
//    left, the oldest remaining position. W = snapkv_window (paper: 32),
//    K = snapkv_kernel (paper: 7). The votes come from the last
//    min(W, step length) queries of the step that overflows.
// Ties in a score rank the later position higher. With budget >= L every
// method keeps everything, and attention is bit-identical to the full cache.
//
// Usage, one policy per sequence:
//   KVD_ASSIGN_OR_RETURN(EvictionPolicy policy,
//                        EvictionPolicy::Create(model.config(), options));
//   KVD_RETURN_IF_ERROR(ForwardWithEviction(model, &cache, tokens,
//                                           LogitsMode::kLast, &policy, &out));
//
// Thread-safety: OnWeights may run concurrently (Forward's attention tasks);
// everything else belongs to one thread. Copies are independent.
#ifndef KVD_TOOLS_EXPERIMENTS_EVICTION_H_
#define KVD_TOOLS_EXPERIMENTS_EVICTION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "ops/model/model.h"

namespace kvd::experiments {

enum class EvictionMethod { kWindow, kStreamingLlm, kH2o, kTova, kSnapKv };

// "window", "streaming-llm", "h2o", "tova", "snapkv"; INVALID_ARGUMENT
// otherwise.
absl::StatusOr<EvictionMethod> ParseEvictionMethod(absl::string_view name);
std::string EvictionMethodName(EvictionMethod method);

struct EvictionOptions {
  static constexpr int64_t kUnlimited = -1;
  EvictionMethod method = EvictionMethod::kWindow;
  // B: cached positions each (layer, K/V head) keeps between steps;
  // kUnlimited keeps all. The step's own tokens are attended on top.
  int64_t budget = kUnlimited;
  int64_t sink_tokens = 4;           // streaming-llm: S
  double h2o_recent_fraction = 0.5;  // h2o: R / B, in [0, 1]
  int64_t snapkv_window = 32;        // snapkv: W, > 0
  int64_t snapkv_kernel = 7;         // snapkv: K, odd, > 0
};

class EvictionPolicy : public ops::KeySelection {
 public:
  // INVALID_ARGUMENT for a parameter outside its range.
  static absl::StatusOr<EvictionPolicy> Create(const ops::ModelConfig& config,
                                               const EvictionOptions& options);

  const EvictionOptions& options() const { return options_; }
  // Positions seen (the cache length the policy expects).
  int64_t length() const { return length_; }
  // The kept set of one (layer, K/V head), ascending.
  const std::vector<int64_t>& Kept(int64_t layer, int64_t kv_head) const {
    return kept_[layer * n_kv_heads_ + kv_head];
  }

  // Around every forward step of `n_new` tokens (ForwardWithEviction does
  // both): EndStep adds the step's positions to the kept sets and evicts down
  // to the budget.
  void BeginStep(int64_t n_new);
  void EndStep();
  // Changes the budget and evicts down to it now: the experiment observes one
  // prefill with an unlimited budget, then compresses copies to each budget.
  void SetBudget(int64_t budget);

  // KeySelection.
  absl::Span<const int64_t> KeptKeys(int64_t layer, int64_t kv_head,
                                     int64_t cache_length) const override;
  bool WantsWeights() const override;
  void OnWeights(int64_t layer, int64_t kv_head, int64_t position,
                 absl::Span<const int64_t> keys, const float* weights) override;

 private:
  // absl::Mutex cannot be copied; a copied policy gets a fresh one.
  struct Lock {
    Lock() = default;
    Lock(const Lock&) {}
    Lock& operator=(const Lock&) { return *this; }
    absl::Mutex mu;
  };

  EvictionPolicy(const ops::ModelConfig& config,
                 const EvictionOptions& options);
  void Evict();
  void EvictLayer(int64_t layer);
  // Keeps the `keep` highest-scored of `set` (ascending result); ties keep the
  // later position.
  static void KeepTop(std::vector<int64_t>& set, int64_t keep,
                      const std::vector<double>& score);

  EvictionOptions options_;
  int64_t n_layers_ = 0, n_kv_heads_ = 0;
  int64_t group_ = 1;  // query heads per K/V head
  int64_t length_ = 0;
  int64_t step_end_ = 0;  // one past the current step's last position
  std::vector<std::vector<int64_t>> kept_;  // per (layer, K/V head)
  // Per (layer, K/V head), by position: h2o's accumulated weight, tova's
  // weight from the last query, snapkv's votes.
  std::vector<std::vector<double>> score_;
  bool snapkv_selected_ = false;
  // Per (layer, K/V head): the selected prefix positions still kept, and the
  // pooled votes that rank them.
  std::vector<std::vector<int64_t>> snapkv_keep_;
  std::vector<std::vector<double>> snapkv_pooled_;
  Lock lock_;
};

// policy->BeginStep, Model::Forward of `tokens` for one sequence with the
// policy as its KeySelection, policy->EndStep. FAILED_PRECONDITION if the
// cache and the policy disagree about the length.
absl::Status ForwardWithEviction(const ops::Model& model, ops::KvCache* cache,
                                 absl::Span<const int32_t> tokens,
                                 ops::LogitsMode logits, EvictionPolicy* policy,
                                 ops::ForwardOutput* out);

}  // namespace kvd::experiments

#endif  // KVD_TOOLS_EXPERIMENTS_EVICTION_H_
