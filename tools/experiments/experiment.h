// The KV-Direct paper's token-match / KL experiment: how closely decoding
// under a K/V budget follows decoding with the full cache.
//
// For one prompt: the prompt minus its last token is prefilled with the full
// cache (the reference), then N greedy steps decode the reference tokens
// r_0..r_{N-1} (step 0 feeds the prompt's last token, step t feeds r_{t-1}).
// Every policy replays the same inputs teacher-forced, so every step is
// compared: a step matches if the policy's argmax is r_t, and its KL is
// KL(reference || policy) of the two next-token distributions.
//  - kv-direct: the prefill's residuals in a ResidualStore, decoding through
//    ResidualKvSource with hot window B (exact by construction: 100% / KL 0
//    is the claim under test).
//  - window, streaming-llm, h2o, tova, snapkv (eviction.h): one prefill with
//    the full cache observes the attention weights the score-based methods
//    need (its K/V must equal the reference's bit for bit, checked), then a
//    copy of each policy is compressed to B at the end of the prompt and
//    decoding keeps it within B (the setting of the H2O, TOVA and SnapKV
//    papers: the prompt is read whole, the cache is bounded afterwards).
//
// With `free_running`, every policy instead decodes greedily on its own: step
// 0 feeds the prompt's last token, step t the policy's own token t-1. Its N
// tokens are compared with r_0..r_{N-1} position by position (matches) and up
// to the first difference (identical_prefix). KL is then averaged only over
// the steps whose inputs are still the reference's (the identical prefix and
// the first diverging step): after that the two contexts differ and the
// distributions are not comparable. kv-direct's claim under test is the same:
// N of N tokens, with no assumption in the code that it holds.
//
//   TokenMatchOptions options;  // policies, budgets {64..1024}, 64 steps
//   KVD_ASSIGN_OR_RETURN(TokenMatchRun run,
//                        RunTokenMatch(model, prompt_ids, options));
//   for (const TokenMatchResult& r : run.results) ... r.match_fraction() ...
//
// Thread-safety: uses the model's pool; one call at a time per model is the
// sensible use (it is slow: 1 + policies x budgets decodes of N steps).
#ifndef KVD_TOOLS_EXPERIMENTS_EXPERIMENT_H_
#define KVD_TOOLS_EXPERIMENTS_EXPERIMENT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ops/model/model.h"
#include "tools/experiments/eviction.h"

namespace kvd::experiments {

struct TokenMatchOptions {
  // "kv-direct" or an eviction method name (ParseEvictionMethod).
  std::vector<std::string> policies = {"kv-direct", "window", "streaming-llm",
                                       "h2o",       "tova",   "snapkv"};
  std::vector<int64_t> budgets = {64, 128, 256, 512, 1024};  // B, >= 0
  int64_t steps = 64;  // N compared decode steps, > 0
  // false: teacher-forced (every policy fed the reference tokens); true: each
  // policy feeds back its own greedy tokens (see the header comment).
  bool free_running = false;
  // The methods' parameters; method and budget are set per run.
  EvictionOptions eviction;
  // Called after each (policy, budget) run, e.g. for progress; may be empty.
  std::function<void(const struct TokenMatchResult&)> on_result;
};

struct TokenMatchResult {
  std::string policy;
  int64_t budget = 0;
  int64_t steps = 0;
  int64_t matches = 0;  // steps whose argmax equals the reference token
  // Steps before the first whose argmax differs from the reference's (= steps
  // if none does). Teacher-forced runs fill it too.
  int64_t identical_prefix = 0;
  // Steps KL was averaged over: all of them teacher-forced; free-running, the
  // identical prefix plus the first diverging step.
  int64_t kl_steps = 0;
  double mean_kl = 0;  // nats, mean over kl_steps
  double max_kl = 0;
  std::vector<int32_t> tokens;  // the policy's argmax at every step
  double seconds = 0;           // wall time of the run's decode
  double match_fraction() const {
    return steps > 0 ? static_cast<double>(matches) / steps : 0.0;
  }
};

struct TokenMatchRun {
  int64_t prompt_tokens = 0;
  bool free_running = false;
  std::vector<int32_t> reference_tokens;  // r_0..r_{N-1}
  std::vector<TokenMatchResult> results;  // policies x budgets, in order
};

// INVALID_ARGUMENT for a prompt under 2 tokens, an unknown policy, a negative
// budget, or prompt + steps beyond the context; INTERNAL if the observing
// prefill's K/V differ from the reference's (a bug in the selection path).
absl::StatusOr<TokenMatchRun> RunTokenMatch(const ops::Model& model,
                                            absl::Span<const int32_t> prompt,
                                            const TokenMatchOptions& options);

// KL(p || q) in nats between the softmax distributions of two logit rows of n
// values, computed in double. Exactly 0 for identical rows.
double KlDivergence(const float* p_logits, const float* q_logits, int64_t n);

}  // namespace kvd::experiments

#endif  // KVD_TOOLS_EXPERIMENTS_EXPERIMENT_H_
