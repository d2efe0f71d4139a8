#include "ops/sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/elementwise.h"

namespace kvd::ops {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

absl::Status FieldError(absl::string_view field, double value,
                        absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat(
      "sampling parameter ", field, " = ", value, " is invalid: ", rule));
}

// NaN can never win; +inf becomes the largest finite float so that differences
// stay finite.
float Sanitize(float logit) {
  if (std::isnan(logit)) return -kInf;
  if (logit == kInf) return std::numeric_limits<float>::max();
  return logit;
}

}  // namespace

absl::Status SamplingParams::Validate() const {
  // Each test is written so that NaN fails it.
  if (!(temperature >= 0.0f && std::isfinite(temperature))) {
    return FieldError("temperature", temperature,
                      "must be finite and >= 0 (0 = greedy)");
  }
  if (top_k < 0) return FieldError("top_k", top_k, "must be >= 0 (0 = off)");
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return FieldError("top_p", top_p, "must be in (0, 1] (1 = off)");
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return FieldError("min_p", min_p, "must be in [0, 1] (0 = off)");
  }
  if (!(repetition_penalty > 0.0f && std::isfinite(repetition_penalty))) {
    return FieldError("repetition_penalty", repetition_penalty,
                      "must be finite and > 0 (1 = off)");
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return FieldError("frequency_penalty", frequency_penalty,
                      "must be in [-2, 2] (0 = off)");
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return FieldError("presence_penalty", presence_penalty,
                      "must be in [-2, 2] (0 = off)");
  }
  if (repeat_last_n < -1) {
    return FieldError("repeat_last_n", repeat_last_n,
                      "must be >= -1 (-1 = all, 0 = none)");
  }
  return absl::OkStatus();
}

void ApplyPenalties(const SamplingParams& params,
                    absl::Span<const int32_t> history, float* logits,
                    int32_t n_vocab) {
  if (params.repeat_last_n == 0 ||
      (params.repetition_penalty == 1.0f && params.frequency_penalty == 0.0f &&
       params.presence_penalty == 0.0f)) {
    return;
  }
  size_t n = history.size();
  if (params.repeat_last_n > 0)
    n = std::min(n, static_cast<size_t>(params.repeat_last_n));
  std::vector<int32_t> window(history.end() - n, history.end());
  std::sort(window.begin(), window.end());
  for (size_t i = 0; i < window.size();) {
    size_t j = i;
    while (j < window.size() && window[j] == window[i]) ++j;
    const int32_t id = window[i];
    const float count = static_cast<float>(j - i);
    i = j;
    if (id < 0 || id >= n_vocab) continue;
    float& l = logits[id];
    l = l <= 0.0f ? l * params.repetition_penalty
                  : l / params.repetition_penalty;
    l -= count * params.frequency_penalty + params.presence_penalty;
  }
}

absl::StatusOr<Sampler> Sampler::Create(const SamplingParams& params) {
  absl::Status s = params.Validate();
  if (!s.ok()) return s;
  return Sampler(params);
}

int32_t Sampler::Sample(const float* logits, int32_t n_vocab,
                        absl::Span<const int32_t> history) {
  if (n_vocab <= 0) return -1;
  candidates_.resize(static_cast<size_t>(n_vocab));
  weights_.resize(static_cast<size_t>(n_vocab));
  // Penalise a sanitised copy; weights_ doubles as that buffer until the
  // weights are needed.
  float* penalised = weights_.data();
  for (int32_t i = 0; i < n_vocab; ++i) penalised[i] = Sanitize(logits[i]);
  ApplyPenalties(params_, history, penalised, n_vocab);

  // Strictly greater: the lowest id wins a tie.
  const auto better = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  if (params_.temperature == 0.0f) {
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab; ++i) {
      if (penalised[i] > penalised[best]) best = i;
    }
    return best;
  }

  // Always exactly one draw per non-greedy call.
  const double u = rng_.NextDouble();
  for (int32_t i = 0; i < n_vocab; ++i)
    candidates_[i] = Candidate{penalised[i], i};
  Candidate* c = candidates_.data();
  size_t n = candidates_.size();

  // 2. top_k. `better` is a strict total order, so the kept set and its order
  // are unique.
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    std::nth_element(c, c + params_.top_k, c + n, better);
    n = static_cast<size_t>(params_.top_k);
  }
  const bool sorted = params_.top_k > 0 || params_.top_p < 1.0f;
  if (sorted) std::sort(c, c + n, better);
  size_t top = 0;
  if (!sorted) {
    for (size_t i = 1; i < n; ++i) {
      if (better(c[i], c[top])) top = i;
    }
  }
  const float max_logit = c[top].logit;
  if (max_logit == -kInf)
    return c[top].id;  // every token is impossible; take the lowest id

  // Weights relative to the top token, before temperature (top_p and min_p use
  // these).
  float* w = weights_.data();
  if (params_.top_p < 1.0f || params_.min_p > 0.0f) {
    for (size_t i = 0; i < n; ++i)
      w[i] = kernels::cpu::Exp(c[i].logit - max_logit);
  }
  // 3. top_p: c is sorted here; keep up to and including the token that reaches
  // top_p.
  if (params_.top_p < 1.0f) {
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += w[i];
    const double target = static_cast<double>(params_.top_p) * total;
    double cumulative = 0;
    for (size_t i = 0; i < n; ++i) {
      cumulative += w[i];
      if (cumulative >= target) {
        n = i + 1;
        break;
      }
    }
  }
  // 4. min_p: the top token has weight 1 >= min_p, so at least one survives.
  if (params_.min_p > 0.0f) {
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i) {
      if (w[i] >= params_.min_p) c[kept++] = c[i];
    }
    n = kept;
  }
  // 5 + 6. Temperature, then one draw from the softmax, walking the candidates
  // in order.
  const float t = params_.temperature;
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    w[i] = kernels::cpu::Exp((c[i].logit - max_logit) / t);
    total += w[i];
  }
  const double target = u * total;
  double cumulative = 0;
  size_t last_possible = 0;
  for (size_t i = 0; i < n; ++i) {
    if (w[i] == 0.0f) continue;
    cumulative += w[i];
    last_possible = i;
    if (target < cumulative) return c[i].id;
  }
  return c[last_possible].id;  // u * total rounded up to total
}

LogProbs ComputeLogProbs(const float* logits, int32_t n_vocab, int32_t chosen,
                         int32_t top_n) {
  LogProbs out;
  out.chosen = TokenLogProb{chosen, -kInf};
  if (n_vocab <= 0) return out;
  float max_logit = -kInf;
  for (int32_t i = 0; i < n_vocab; ++i)
    max_logit = std::max(max_logit, Sanitize(logits[i]));
  double log_z = kInf;  // all impossible: every logprob is -inf
  if (max_logit != -kInf) {
    double sum = 0;
    for (int32_t i = 0; i < n_vocab; ++i) {
      sum += kernels::cpu::Exp(Sanitize(logits[i]) - max_logit);
    }
    log_z = static_cast<double>(max_logit) + std::log(sum);
  }
  const auto logprob = [&](int32_t id) {
    return static_cast<float>(static_cast<double>(Sanitize(logits[id])) -
                              log_z);
  };
  if (chosen >= 0 && chosen < n_vocab) out.chosen.logprob = logprob(chosen);

  top_n = std::clamp(top_n, 0, n_vocab);
  std::vector<int32_t> ids(static_cast<size_t>(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i) ids[i] = i;
  std::partial_sort(ids.begin(), ids.begin() + top_n, ids.end(),
                    [&](int32_t a, int32_t b) {
                      const float la = Sanitize(logits[a]);
                      const float lb = Sanitize(logits[b]);
                      return la > lb || (la == lb && a < b);
                    });
  for (int32_t i = 0; i < top_n; ++i)
    out.top.push_back(TokenLogProb{ids[i], logprob(ids[i])});
  return out;
}

}  // namespace kvd::ops
