#include "tools/experiments/experiment.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/kvdirect/residual_store.h"

namespace kvd::experiments {

using ops::CheckpointLayers;
using ops::CheckpointPolicy;
using ops::ForwardOutput;
using ops::KeySelection;
using ops::KvCache;
using ops::LogitsMode;
using ops::Model;
using ops::ModelConfig;
using ops::ParseCheckpointPolicy;
using ops::ResidualKvSource;
using ops::ResidualStore;
using ops::SequenceStep;
namespace {

constexpr char kKvDirect[] = "kv-direct";

// Lets several policies with unlimited budgets watch one prefill. Before
// any eviction their kept sets are identical (every position), so the first
// one answers for all.
class ObservePrefill : public KeySelection {
 public:
  explicit ObservePrefill(std::vector<EvictionPolicy*> policies)
      : policies_(std::move(policies)) {}
  absl::Span<const int64_t> KeptKeys(int64_t layer, int64_t kv_head,
                                     int64_t cache_length) const override {
    return policies_[0]->KeptKeys(layer, kv_head, cache_length);
  }
  bool WantsWeights() const override {
    for (const EvictionPolicy* p : policies_) {
      if (p->WantsWeights()) return true;
    }
    return false;
  }
  void OnWeights(int64_t layer, int64_t kv_head, int64_t position,
                 absl::Span<const int64_t> keys,
                 const float* weights) override {
    for (EvictionPolicy* p : policies_) {
      if (p->WantsWeights())
        p->OnWeights(layer, kv_head, position, keys, weights);
    }
  }

 private:
  std::vector<EvictionPolicy*> policies_;
};

bool SameRows(const KvCache& a, const KvCache& b) {
  if (a.length() != b.length()) return false;
  for (int64_t l = 0; l < a.n_layers(); ++l) {
    for (int64_t p = 0; p < a.length(); ++p) {
      if (std::memcmp(a.KeyBytes(l, p), b.KeyBytes(l, p), a.row_bytes()) != 0 ||
          std::memcmp(a.ValueBytes(l, p), b.ValueBytes(l, p), a.row_bytes()) !=
              0)
        return false;
    }
  }
  return true;
}

int32_t Argmax(const float* logits, int64_t n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

// Scores one policy's decode against the reference and, free-running, says
// which token the policy feeds itself next.
class Scorer {
 public:
  Scorer(std::string policy, int64_t budget, const TokenMatchRun& ref,
         const std::vector<std::vector<float>>& ref_logits, int64_t vocab)
      : ref_(ref), ref_logits_(ref_logits), vocab_(vocab) {
    result_.policy = std::move(policy);
    result_.budget = budget;
    start_ = std::chrono::steady_clock::now();
  }
  void Add(int64_t step, const float* logits) {
    const int32_t token = Argmax(logits, vocab_);
    const bool same = token == ref_.reference_tokens[step];
    // Free-running, the inputs stay the reference's only through the first
    // diverging step; KL beyond it compares different contexts.
    if (!ref_.free_running || !diverged_) {
      const double kl = KlDivergence(ref_logits_[step].data(), logits, vocab_);
      result_.mean_kl += kl;
      result_.max_kl = std::max(result_.max_kl, kl);
      ++result_.kl_steps;
    }
    result_.matches += same;
    if (!same) diverged_ = true;
    if (!diverged_) ++result_.identical_prefix;
    result_.tokens.push_back(token);
    ++result_.steps;
  }
  // The input of step t + 1 (after Add(t)).
  int32_t NextInput(int64_t t, const std::vector<int32_t>& ref_inputs) const {
    return ref_.free_running ? result_.tokens[t] : ref_inputs[t + 1];
  }
  TokenMatchResult Finish() {
    if (result_.kl_steps > 0) result_.mean_kl /= result_.kl_steps;
    result_.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
            .count();
    return result_;
  }

 private:
  const TokenMatchRun& ref_;
  const std::vector<std::vector<float>>& ref_logits_;
  int64_t vocab_;
  bool diverged_ = false;
  TokenMatchResult result_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

double KlDivergence(const float* p_logits, const float* q_logits, int64_t n) {
  auto log_normalizer = [n](const float* x) {
    const double max = *std::max_element(x, x + n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(double{x[i]} - max);
    return max + std::log(sum);
  };
  const double zp = log_normalizer(p_logits), zq = log_normalizer(q_logits);
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double lp = p_logits[i] - zp, lq = q_logits[i] - zq;
    kl += std::exp(lp) * (lp - lq);
  }
  return kl;
}

absl::StatusOr<TokenMatchRun> RunTokenMatch(const Model& model,
                                            absl::Span<const int32_t> prompt,
                                            const TokenMatchOptions& options) {
  const ModelConfig& c = model.config();
  if (prompt.size() < 2) {
    return absl::InvalidArgumentError(
        "token match: the prompt needs at least 2 tokens");
  }
  if (options.steps <= 0 ||
      static_cast<int64_t>(prompt.size()) + options.steps > c.context_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token match: ", prompt.size(), " prompt tokens + ", options.steps,
        " steps must be positive and fit the context of ", c.context_length));
  }
  for (int64_t b : options.budgets) {
    if (b < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("token match: budget ", b, " is negative"));
    }
  }
  std::vector<EvictionMethod> methods;
  for (const std::string& name : options.policies) {
    if (name == kKvDirect) continue;
    KVD_ASSIGN_OR_RETURN(EvictionMethod m, ParseEvictionMethod(name));
    methods.push_back(m);
  }

  TokenMatchRun run;
  run.prompt_tokens = prompt.size();
  run.free_running = options.free_running;
  const absl::Span<const int32_t> prefix = prompt.subspan(0, prompt.size() - 1);

  // Reference: the plain forward pass, residuals kept for kv-direct.
  KVD_ASSIGN_OR_RETURN(CheckpointPolicy direct_policy,
                       ParseCheckpointPolicy(kKvDirect));
  ResidualStore prefill_store(c, model.precision(),
                              CheckpointLayers(direct_policy, c.n_layers));
  KvCache prefill_cache = model.NewCache();
  {
    SequenceStep step{&prefill_cache, prefix, LogitsMode::kNone, 0};
    ForwardOutput out;
    KVD_RETURN_IF_ERROR(model.Forward({&step, 1}, &out, &prefill_store));
    KVD_RETURN_IF_ERROR(prefill_store.status());
  }
  std::vector<std::vector<float>> ref_logits;
  std::vector<int32_t> inputs = {prompt.back()};  // input of step t
  {
    KvCache cache = prefill_cache;
    for (int64_t t = 0; t < options.steps; ++t) {
      SequenceStep step{&cache, absl::MakeConstSpan(&inputs[t], 1),
                        LogitsMode::kLast, 0};
      ForwardOutput out;
      KVD_RETURN_IF_ERROR(model.Forward({&step, 1}, &out));
      ref_logits.emplace_back(out.Logits(0), out.Logits(0) + c.vocab_size);
      run.reference_tokens.push_back(Argmax(out.Logits(0), c.vocab_size));
      inputs.push_back(run.reference_tokens.back());
    }
  }

  // One observing prefill for every eviction method.
  std::vector<EvictionPolicy> observed;
  KvCache observed_cache = model.NewCache();
  if (!methods.empty()) {
    for (EvictionMethod m : methods) {
      EvictionOptions o = options.eviction;
      o.method = m;
      o.budget = EvictionOptions::kUnlimited;
      KVD_ASSIGN_OR_RETURN(EvictionPolicy p, EvictionPolicy::Create(c, o));
      observed.push_back(std::move(p));
    }
    std::vector<EvictionPolicy*> ptrs;
    for (EvictionPolicy& p : observed) {
      ptrs.push_back(&p);
      p.BeginStep(prefix.size());
    }
    ObservePrefill watch(ptrs);
    SequenceStep step{&observed_cache, prefix, LogitsMode::kNone, 0};
    step.key_selection = &watch;
    ForwardOutput out;
    KVD_RETURN_IF_ERROR(model.Forward({&step, 1}, &out));
    for (EvictionPolicy& p : observed) p.EndStep();
    if (!SameRows(observed_cache, prefill_cache)) {
      return absl::InternalError(
          "token match: the prefill through the KeySelection path cached "
          "different K/V than the plain forward pass");
    }
  }

  size_t next_method = 0;
  for (const std::string& name : options.policies) {
    EvictionPolicy* base =
        name == kKvDirect ? nullptr : &observed[next_method++];
    for (int64_t budget : options.budgets) {
      Scorer scorer(name, budget, run, ref_logits, c.vocab_size);
      int32_t input = inputs[0];
      if (base == nullptr) {
        ResidualStore store = prefill_store;
        KvCache cache = prefill_cache;
        ResidualKvSource source(&store, 0, budget);
        for (int64_t t = 0; t < options.steps; ++t) {
          SequenceStep step{&cache, absl::MakeConstSpan(&input, 1),
                            LogitsMode::kLast, 0, &source};
          ForwardOutput out;
          KVD_RETURN_IF_ERROR(model.Forward({&step, 1}, &out, &store));
          KVD_RETURN_IF_ERROR(store.status());
          scorer.Add(t, out.Logits(0));
          input = scorer.NextInput(t, inputs);
        }
      } else {
        EvictionPolicy policy = *base;
        policy.SetBudget(budget);
        KvCache cache = observed_cache;
        for (int64_t t = 0; t < options.steps; ++t) {
          ForwardOutput out;
          KVD_RETURN_IF_ERROR(
              ForwardWithEviction(model, &cache, absl::MakeConstSpan(&input, 1),
                                  LogitsMode::kLast, &policy, &out));
          scorer.Add(t, out.Logits(0));
          input = scorer.NextInput(t, inputs);
        }
      }
      run.results.push_back(scorer.Finish());
      if (options.on_result) options.on_result(run.results.back());
    }
  }
  return run;
}

}  // namespace kvd::experiments
