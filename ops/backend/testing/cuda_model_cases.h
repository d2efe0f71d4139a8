// The random-weight models and prompts the CUDA model tests run, and the CPU
// engine's greedy decoding they compare against. Shared by cuda_model_test
// (needs a GPU) and cuda_model_cases_test (CPU only: checks the cases are
// not degenerate, so a GPU run that "agrees" proves something). Test-only.
//
//   auto cpu = testing::LoadTinyModel(CudaCaseSpec("llama"), Precision::kBf16);
//   std::vector<int32_t> want = CpuGreedy(**cpu, CudaCasePrompts()[0], 32);
#ifndef KVD_OPS_BACKEND_TESTING_CUDA_MODEL_CASES_H_
#define KVD_OPS_BACKEND_TESTING_CUDA_MODEL_CASES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "ops/model/model.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::ops::testing {

// Big enough that a wrong kernel cannot hide (several layers, GQA 4:1, a
// separate output matrix so logits are not dominated by the input token's
// own embedding), small enough to generate and run on the CPU in seconds.
// Weights are a fixed function of the seed: the outcome is deterministic.
inline TinyModelSpec CudaCaseSpec(const std::string& family) {
  TinyModelSpec s;
  s.family = family;  // "llama" or "qwen2" (q/k/v bias)
  s.n_layers = 4;
  s.d_model = 256;
  s.n_heads = 8;
  s.n_kv_heads = 2;
  s.head_dim = 32;
  s.d_ff = 768;
  s.vocab_size = 2048;
  s.context_length = 4096;
  s.tied_embeddings = false;
  s.seed = 7;
  return s;
}

inline constexpr int64_t kCudaCaseNewTokens = 32;

// Tolerances of the GPU against the CPU engine on these cases. Random weights
// give flat next-token distributions: about a quarter of the greedy steps
// have a top-2 margin under 0.1, and a few are near-ties that any rounding
// difference may flip (the CPU's own bf16 and fp32 modes diverge at margins
// 0.003 and 0.007 on the llama case, their max |logit diff| being 0.034).
// So the token check is: greedy tokens equal until the first step whose CPU
// top-2 margin is under twice the max |logit diff| seen (a flip rounding can
// explain); a divergence anywhere else fails. The logits themselves are held
// to the bounds below.
// Max |logit diff| GPU vs CPU bf16 along the same tokens.
inline constexpr double kMaxLogitDiff = 0.1;
// Relative L2 of last-token logits, GPU vs CPU fp32 (the CPU bf16 mode:
// under 0.0071 on these cases).
inline constexpr double kCudaLogitTolerance = 0.03;

// Prompts of lengths 1, 5, 23, 37, 64 and 100 (one and several attention
// chunks), fixed pseudo-random ids.
inline std::vector<std::vector<int32_t>> CudaCasePrompts(int64_t vocab = 2048) {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<std::vector<int32_t>> prompts;
  for (int n : {1, 5, 23, 37, 64, 100}) {
    std::vector<int32_t> p(n);
    for (int32_t& t : p) t = id(rng);
    prompts.push_back(p);
  }
  return prompts;
}

// The CPU engine's greedy decoding: the prompt in one step, then one token
// per step; `step_logits` (optional) gets the logits each token was chosen
// from. Argmax ties go to the lowest id.
inline absl::StatusOr<std::vector<int32_t>> CpuGreedy(
    const Model& model, const std::vector<int32_t>& prompt, int64_t n,
    std::vector<std::vector<float>>* step_logits = nullptr) {
  KvCache cache = model.NewCache();
  std::vector<int32_t> out;
  std::vector<int32_t> feed = prompt;
  for (int64_t i = 0; i < n; ++i) {
    SequenceStep step{&cache, feed, LogitsMode::kLast};
    ForwardOutput fo;
    KVD_RETURN_IF_ERROR(model.Forward({&step, 1}, &fo));
    const float* l = fo.Logits(0);
    const int64_t v = model.config().vocab_size;
    if (step_logits != nullptr) step_logits->emplace_back(l, l + v);
    out.push_back(static_cast<int32_t>(std::max_element(l, l + v) - l));
    feed = {out.back()};
  }
  return out;
}

// Last-token logits of a prompt on the CPU engine.
inline absl::StatusOr<std::vector<float>> CpuLogits(
    const Model& model, const std::vector<int32_t>& prompt) {
  KvCache cache = model.NewCache();
  SequenceStep step{&cache, prompt, LogitsMode::kLast};
  ForwardOutput fo;
  KVD_RETURN_IF_ERROR(model.Forward({&step, 1}, &fo));
  return std::vector<float>(fo.Logits(0),
                            fo.Logits(0) + model.config().vocab_size);
}

// ||got - want|| / ||want||.
inline double RelL2(const std::vector<float>& got,
                    const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

// Whether n floats have the same bits. False for a null side (a vector left
// empty by a failed step), so the case fails instead of the binary crashing
// and losing the cases after it.
inline bool SameBits(const float* a, const float* b, size_t n) {
  if (a == nullptr || b == nullptr) return false;
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Top-1 minus top-2 logit: how close a greedy choice was to a tie.
inline float Top2Margin(const std::vector<float>& l) {
  float a = -INFINITY, b = -INFINITY;
  for (float x : l) {
    if (x > a) {
      b = a;
      a = x;
    } else if (x > b) {
      b = x;
    }
  }
  return a - b;
}

}  // namespace kvd::ops::testing

#endif  // KVD_OPS_BACKEND_TESTING_CUDA_MODEL_CASES_H_
