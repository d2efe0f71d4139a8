// Token sampler: turns one step's logits into a token id, deterministically for
// a given seed.
//
// Pipeline, in the order of llama.cpp's common default chain (minus the
// samplers kvd does not have):
//   1. penalties: repetition (CTRL / llama.cpp: positive logits are divided
//      by the penalty, non-positive ones multiplied), then frequency and
//      presence (OpenAI: logit -= count * frequency_penalty
//      + (count > 0) * presence_penalty), over the last `repeat_last_n`
//      tokens of the history;
//   2. top_k: keep the k highest logits;
//   3. top_p: keep the smallest prefix (by descending probability) whose
//      probability reaches top_p, the token that crosses it included;
//   4. min_p: keep tokens with probability >= min_p * the top token's;
//   5. temperature: divide the logits by it;
//   6. sample: draw one token from the softmax of what is left.
// As in llama.cpp, top_p and min_p see the distribution *before* temperature.
// temperature = 0 is greedy: the argmax of the penalised logits, no random
// draw. Ties always go to the lowest token id (candidates are ordered by logit
// descending, then id ascending), so results do not depend on the standard
// library's sort.
//
// Determinism: the same seed, logits and history give the same token on every
// platform. The random stream is kvd's own (rng.h); exp is kvd's fixed
// polynomial (kernels/cpu Exp); sums run in a fixed order in double; the
// package is built with -ffp-contract=off. Every non-greedy Sample() call draws
// exactly one uniform number, so the stream position is the count of such
// calls, and rng() state can be checkpointed and restored.
//
// NaN logits are treated as -inf (never sampled) and +inf as the largest float.
//
// Thread-safety: a Sampler is not thread-safe (it owns its random state); use
// one per request.
//
//   SamplingParams params;
//   params.temperature = 0.7f;
//   params.top_p = 0.9f;
//   params.seed = 1234;
//   // Create validates the parameters.
//   KVD_ASSIGN_OR_RETURN(Sampler sampler, Sampler::Create(params));
//   int32_t token = sampler.Sample(logits, n_vocab, history);
#ifndef KVD_OPS_SAMPLER_SAMPLER_H_
#define KVD_OPS_SAMPLER_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ops/sampler/rng.h"

namespace kvd::ops {

// The defaults switch every stage off except plain sampling at temperature 1
// (OpenAI's defaults).
struct SamplingParams {
  float temperature = 1.0f;         // >= 0; 0 = greedy
  int32_t top_k = 0;                // >= 0; 0 = off
  float top_p = 1.0f;               // in (0, 1]; 1 = off
  float min_p = 0.0f;               // in [0, 1]; 0 = off
  float repetition_penalty = 1.0f;  // > 0; 1 = off
  float frequency_penalty = 0.0f;   // in [-2, 2] (OpenAI's range); 0 = off
  float presence_penalty = 0.0f;    // in [-2, 2]; 0 = off
  // How many of the most recent history tokens the penalties look at: -1 = all,
  // 0 = none.
  int32_t repeat_last_n = 64;
  uint64_t seed = 0;

  // INVALID_ARGUMENT naming the first field that is NaN, infinite or out of
  // range.
  absl::Status Validate() const;
};

// Stage 1 on its own, in place: applies the repetition, frequency and presence
// penalties of `params` to logits[0, n_vocab) for the tokens in the last
// repeat_last_n entries of `history` (ids outside [0, n_vocab) are ignored).
void ApplyPenalties(const SamplingParams& params,
                    absl::Span<const int32_t> history, float* logits,
                    int32_t n_vocab);

class Sampler {
 public:
  // INVALID_ARGUMENT if `params` fails Validate().
  static absl::StatusOr<Sampler> Create(const SamplingParams& params);

  // Picks the next token from logits[0, n_vocab). `history` holds the tokens so
  // far (the prompt too, if the caller wants it penalised). Returns -1 only if
  // n_vocab <= 0.
  int32_t Sample(const float* logits, int32_t n_vocab,
                 absl::Span<const int32_t> history);

  const SamplingParams& params() const { return params_; }
  Rng& rng() { return rng_; }

 private:
  explicit Sampler(const SamplingParams& params)
      : params_(params), rng_(params.seed) {}

  struct Candidate {
    float logit;
    int32_t id;
  };

  SamplingParams params_;
  Rng rng_;
  std::vector<Candidate> candidates_;  // scratch, reused across calls
  std::vector<float> weights_;         // scratch
};

// Log-probabilities for the API (OpenAI's `logprobs`): log-softmax of the raw
// logits, before any penalty, filter or temperature.
struct TokenLogProb {
  int32_t token;
  float logprob;
};
struct LogProbs {
  TokenLogProb chosen;  // the sampled token's
  // The top_n most likely, descending; ties by lowest id.
  std::vector<TokenLogProb> top;
};
// `chosen` must be in [0, n_vocab); top_n is clamped to [0, n_vocab]. The
// normaliser is computed in double with std::log, so the last bit may differ
// between libms; it is reported, not sampled.
LogProbs ComputeLogProbs(const float* logits, int32_t n_vocab, int32_t chosen,
                         int32_t top_n);

}  // namespace kvd::ops

#endif  // KVD_OPS_SAMPLER_SAMPLER_H_
