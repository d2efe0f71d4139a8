#include "tools/experiments/eviction.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace kvd::experiments {

using ops::ForwardOutput;
using ops::KvCache;
using ops::LogitsMode;
using ops::Model;
using ops::ModelConfig;
using ops::SequenceStep;

absl::StatusOr<EvictionMethod> ParseEvictionMethod(absl::string_view name) {
  if (name == "window") return EvictionMethod::kWindow;
  if (name == "streaming-llm") return EvictionMethod::kStreamingLlm;
  if (name == "h2o") return EvictionMethod::kH2o;
  if (name == "tova") return EvictionMethod::kTova;
  if (name == "snapkv") return EvictionMethod::kSnapKv;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown eviction method '", std::string(name),
                   "'; expected window, streaming-llm, h2o, tova or snapkv"));
}

std::string EvictionMethodName(EvictionMethod method) {
  switch (method) {
    case EvictionMethod::kWindow:
      return "window";
    case EvictionMethod::kStreamingLlm:
      return "streaming-llm";
    case EvictionMethod::kH2o:
      return "h2o";
    case EvictionMethod::kTova:
      return "tova";
    case EvictionMethod::kSnapKv:
      return "snapkv";
  }
  return "unknown";
}

EvictionPolicy::EvictionPolicy(const ModelConfig& config,
                               const EvictionOptions& options)
    : options_(options),
      n_layers_(config.n_layers),
      n_kv_heads_(config.n_kv_heads),
      group_(config.n_heads / config.n_kv_heads),
      kept_(n_layers_ * n_kv_heads_),
      score_(n_layers_ * n_kv_heads_),
      snapkv_keep_(n_layers_ * n_kv_heads_),
      snapkv_pooled_(n_layers_ * n_kv_heads_) {}

absl::StatusOr<EvictionPolicy> EvictionPolicy::Create(
    const ModelConfig& config, const EvictionOptions& options) {
  if (options.budget < 0 && options.budget != EvictionOptions::kUnlimited) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eviction budget ", options.budget, " must be >= 0 (or kUnlimited)"));
  }
  if (options.sink_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "streaming-llm sink_tokens ", options.sink_tokens, " must be >= 0"));
  }
  if (!(options.h2o_recent_fraction >= 0 && options.h2o_recent_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("h2o_recent_fraction ",
                                                   options.h2o_recent_fraction,
                                                   " must be in [0, 1]"));
  }
  if (options.snapkv_window <= 0 || options.snapkv_kernel <= 0 ||
      options.snapkv_kernel % 2 == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "snapkv window ", options.snapkv_window, " must be > 0 and kernel ",
        options.snapkv_kernel, " odd and > 0"));
  }
  return EvictionPolicy(config, options);
}

void EvictionPolicy::BeginStep(int64_t n_new) {
  step_end_ = length_ + n_new;
  const bool fresh_scores =
      options_.method == EvictionMethod::kTova ||
      (options_.method == EvictionMethod::kSnapKv && !snapkv_selected_);
  for (std::vector<double>& s : score_) {
    if (fresh_scores) s.assign(s.size(), 0.0);
    s.resize(step_end_, 0.0);
  }
}

void EvictionPolicy::EndStep() {
  for (std::vector<int64_t>& kept : kept_) {
    for (int64_t p = length_; p < step_end_; ++p) kept.push_back(p);
  }
  length_ = step_end_;
  Evict();
}

void EvictionPolicy::SetBudget(int64_t budget) {
  options_.budget = budget;
  Evict();
}

absl::Span<const int64_t> EvictionPolicy::KeptKeys(int64_t layer,
                                                   int64_t kv_head,
                                                   int64_t cache_length) const {
  return kept_[layer * n_kv_heads_ + kv_head];
}

bool EvictionPolicy::WantsWeights() const {
  switch (options_.method) {
    case EvictionMethod::kH2o:
    case EvictionMethod::kTova:
      return true;
    case EvictionMethod::kSnapKv:
      return !snapkv_selected_;
    default:
      return false;
  }
}

void EvictionPolicy::OnWeights(int64_t layer, int64_t kv_head, int64_t position,
                               absl::Span<const int64_t> keys,
                               const float* weights) {
  const int64_t n = keys.size();
  switch (options_.method) {
    case EvictionMethod::kTova:
      if (position != step_end_ - 1) return;
      break;
    case EvictionMethod::kSnapKv:
      if (snapkv_selected_ || position < step_end_ - options_.snapkv_window)
        return;
      break;
    case EvictionMethod::kH2o:
      break;
    default:
      return;
  }
  absl::MutexLock hold(&lock_.mu);
  std::vector<double>& score = score_[layer * n_kv_heads_ + kv_head];
  // weights holds group_ query heads x n keys.
  for (int64_t j = 0; j < n; ++j) {
    double w = 0;
    for (int64_t i = 0; i < group_; ++i) w += weights[i * n + j];
    score[keys[j]] += w;
  }
}

void EvictionPolicy::KeepTop(std::vector<int64_t>& set, int64_t keep,
                             const std::vector<double>& score) {
  if (static_cast<int64_t>(set.size()) <= keep) return;
  std::vector<int64_t> order = set;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (score[a] != score[b]) return score[a] > score[b];
    return a > b;
  });
  order.resize(keep);
  std::sort(order.begin(), order.end());
  set = std::move(order);
}

void EvictionPolicy::Evict() {
  if (options_.budget == EvictionOptions::kUnlimited) return;
  // Before its vote snapkv's sets all hold every position; the vote is taken
  // by the first eviction.
  const bool voting = options_.method == EvictionMethod::kSnapKv &&
                      !snapkv_selected_ &&
                      static_cast<int64_t>(kept_[0].size()) > options_.budget;
  for (int64_t l = 0; l < n_layers_; ++l) EvictLayer(l);
  if (voting) snapkv_selected_ = true;
}

void EvictionPolicy::EvictLayer(int64_t l) {
  const int64_t budget = options_.budget;
  std::vector<int64_t>* kept = &kept_[l * n_kv_heads_];
  if (options_.method == EvictionMethod::kTova) {
    // One set per layer: rank by the last query's weight summed over heads.
    if (static_cast<int64_t>(kept[0].size()) <= budget) return;
    std::vector<double> layer_score(length_, 0.0);
    for (int64_t g = 0; g < n_kv_heads_; ++g) {
      const std::vector<double>& s = score_[l * n_kv_heads_ + g];
      for (int64_t p = 0; p < length_ && p < static_cast<int64_t>(s.size());
           ++p)
        layer_score[p] += s[p];
    }
    KeepTop(kept[0], budget, layer_score);
    for (int64_t g = 1; g < n_kv_heads_; ++g) kept[g] = kept[0];
    return;
  }
  for (int64_t g = 0; g < n_kv_heads_; ++g) {
    std::vector<int64_t>& set = kept[g];
    const int64_t size = set.size();
    if (size <= budget) continue;
    switch (options_.method) {
      case EvictionMethod::kWindow:
        set.erase(set.begin(), set.end() - budget);
        break;
      case EvictionMethod::kStreamingLlm: {
        const int64_t sinks = std::min(options_.sink_tokens, budget);
        std::vector<int64_t> next;
        for (int64_t p : set) {
          if (p < sinks) next.push_back(p);
        }
        const int64_t recent = budget - static_cast<int64_t>(next.size());
        for (int64_t i = std::max<int64_t>(size - recent, 0); i < size; ++i) {
          if (set[i] >= sinks) next.push_back(set[i]);
        }
        set = std::move(next);
        break;
      }
      case EvictionMethod::kH2o: {
        const int64_t recent = std::min<int64_t>(
            budget, std::llround(budget * options_.h2o_recent_fraction));
        std::vector<int64_t> heavy(set.begin(), set.end() - recent);
        KeepTop(heavy, budget - recent, score_[l * n_kv_heads_ + g]);
        heavy.insert(heavy.end(), set.end() - recent, set.end());
        set = std::move(heavy);
        break;
      }
      case EvictionMethod::kSnapKv: {
        std::vector<int64_t>& keep = snapkv_keep_[l * n_kv_heads_ + g];
        std::vector<double>& pooled = snapkv_pooled_[l * n_kv_heads_ + g];
        if (!snapkv_selected_) {
          // Vote once: pooled votes over the positions before the window.
          const int64_t window = std::min(options_.snapkv_window, budget);
          const std::vector<double>& votes = score_[l * n_kv_heads_ + g];
          // Positions before the window's first; with no window (budget
          // 0) every kept position (set[size] would read past the end).
          const int64_t prefix_end =
              window > 0 ? set[size - window] : set[size - 1] + 1;
          const int64_t half = options_.snapkv_kernel / 2;
          pooled.assign(prefix_end, 0.0);
          for (int64_t p = 0; p < prefix_end; ++p) {
            for (int64_t q = std::max<int64_t>(0, p - half);
                 q <= std::min(prefix_end - 1, p + half); ++q)
              pooled[p] = std::max(pooled[p], votes[q]);
          }
          keep.assign(set.begin(), set.end() - window);
          KeepTop(keep, budget - window, pooled);
          std::vector<int64_t> next = keep;
          next.insert(next.end(), set.end() - window, set.end());
          set = std::move(next);
          break;
        }
        // Later positions push out the least-voted selected ones first, then
        // the oldest. The selected positions lead the set (they precede the
        // observation window).
        const int64_t selected = keep.size();
        const int64_t from_keep = std::min(size - budget, selected);
        KeepTop(keep, selected - from_keep, pooled);
        const int64_t oldest = size - budget - from_keep;
        std::vector<int64_t> next = keep;
        next.insert(next.end(), set.begin() + selected + oldest, set.end());
        set = std::move(next);
        break;
      }
      case EvictionMethod::kTova:
        break;
    }
  }
}

absl::Status ForwardWithEviction(const Model& model, KvCache* cache,
                                 absl::Span<const int32_t> tokens,
                                 LogitsMode logits, EvictionPolicy* policy,
                                 ForwardOutput* out) {
  if (cache == nullptr || policy == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("ForwardWithEviction: null argument");
  }
  if (cache->length() != policy->length()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ForwardWithEviction: the cache holds ", cache->length(),
        " positions but the eviction policy has seen ", policy->length(),
        "; use one policy per sequence from its first token"));
  }
  policy->BeginStep(tokens.size());
  SequenceStep step{cache, tokens, logits, 0};
  step.key_selection = policy;
  const absl::Status s = model.Forward({&step, 1}, out);
  if (!s.ok()) {
    policy->BeginStep(0);  // nothing was written: forget the step
    return s;
  }
  policy->EndStep();
  return absl::OkStatus();
}

}  // namespace kvd::experiments
