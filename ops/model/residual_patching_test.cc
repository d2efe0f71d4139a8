// The residual patching experiment of the KV-Direct paper (arXiv 2603.19664):
// in one forward pass, replace the residual entering layer l at every position
// with the one another prompt (of the same length) produced there; the output
// distribution must then be exactly that other prompt's (KL = 0), for every l.
// It holds because everything from layer l on -- including the K/V of layers >=
// l -- is a function of the residuals entering layer l.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>

#include "base/model_dir.h"
#include "gtest/gtest.h"
#include "ops/model/model.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::ops {
namespace {

class Recorder : public ResidualObserver {
 public:
  explicit Recorder(int64_t d) : d_(d) {}
  void OnResidual(int64_t, int64_t layer, int64_t pos,
                  const float* h) override {
    rows[{layer, pos}] = std::vector<float>(h, h + d_);
  }
  std::map<std::pair<int64_t, int64_t>, std::vector<float>> rows;

 private:
  int64_t d_;
};

class Patcher : public ResidualPatcher {
 public:
  Patcher(const Recorder& source, int64_t layer)
      : source_(source), layer_(layer) {}
  void Patch(int64_t, int64_t layer, int64_t pos, float* h) override {
    if (layer != layer_) return;
    const std::vector<float>& row = source_.rows.at({layer, pos});
    std::copy(row.begin(), row.end(), h);
  }

 private:
  const Recorder& source_;
  int64_t layer_;
};

std::vector<float> AllLogits(const Model& m, const std::vector<int32_t>& tokens,
                             ResidualObserver* obs, ResidualPatcher* patch) {
  KvCache cache = m.NewCache();
  SequenceStep step{&cache, tokens, LogitsMode::kAll};
  ForwardOutput out;
  EXPECT_TRUE(m.Forward({&step, 1}, &out, obs, patch).ok());
  return out.logits;
}

// KL(p || q) over every position's softmax, in double.
double MaxKl(const std::vector<float>& p_logits,
             const std::vector<float>& q_logits, int64_t vocab) {
  double worst = 0;
  for (size_t at = 0; at < p_logits.size(); at += vocab) {
    auto log_softmax = [&](const std::vector<float>& l) {
      double mx = -1e300, sum = 0;
      for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, double(l[at + i]));
      for (int64_t i = 0; i < vocab; ++i) sum += std::exp(l[at + i] - mx);
      std::vector<double> out(vocab);
      for (int64_t i = 0; i < vocab; ++i)
        out[i] = l[at + i] - mx - std::log(sum);
      return out;
    };
    const std::vector<double> lp = log_softmax(p_logits),
                              lq = log_softmax(q_logits);
    double kl = 0;
    for (int64_t i = 0; i < vocab; ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
    worst = std::max(worst, kl);
  }
  return worst;
}

void CheckEveryLayer(const Model& m, const std::vector<int32_t>& a,
                     const std::vector<int32_t>& b) {
  ASSERT_EQ(a.size(), b.size());
  const int64_t vocab = m.config().vocab_size;
  Recorder from_b(m.config().d_model);
  const std::vector<float> b_logits = AllLogits(m, b, &from_b, nullptr);
  const std::vector<float> a_logits = AllLogits(m, a, nullptr, nullptr);
  ASSERT_NE(a_logits, b_logits)
      << "the prompts must differ for the test to mean anything";
  for (int64_t l = 0; l <= m.config().n_layers; ++l) {
    Patcher patch(from_b, l);
    const std::vector<float> patched = AllLogits(m, a, nullptr, &patch);
    EXPECT_EQ(patched, b_logits)
        << "layer " << l << ": patched output is not B's, bit for bit";
    EXPECT_EQ(MaxKl(b_logits, patched, vocab), 0.0) << "layer " << l;
  }
}

TEST(ResidualPatching, TinyModelsEveryLayerKlZero) {
  for (const std::string family : {"llama", "qwen2", "gemma3"}) {
    for (const Precision precision : {Precision::kF32, Precision::kBf16}) {
      SCOPED_TRACE(family + " " + PrecisionName(precision));
      testing::TinyModelSpec spec;
      spec.family = family;
      spec.n_layers = family == "gemma3" ? 6 : 3;
      absl::StatusOr<std::string> path =
          testing::WriteTinyModel(spec, ::testing::TempDir());
      ASSERT_TRUE(path.ok());
      LoadOptions opts;
      opts.precision = precision;
      opts.num_threads = 2;
      auto model = Model::Load(*path, opts);
      ASSERT_TRUE(model.ok()) << model.status();
      CheckEveryLayer(**model, testing::RandomTokens(40, 1, spec.vocab_size),
                      testing::RandomTokens(40, 2, spec.vocab_size));
    }
  }
}

TEST(ResidualPatching, SmolLm2EveryLayerKlZero) {
  const std::string path = CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (std::ifstream(path).fail())
    FAIL() << path << " missing: run tools/setup.sh --test";
  for (const Precision precision : {Precision::kF32, Precision::kBf16}) {
    SCOPED_TRACE(PrecisionName(precision));
    LoadOptions opts;
    opts.precision = precision;
    opts.num_threads = 2;
    auto model = Model::Load(path, opts);
    ASSERT_TRUE(model.ok()) << model.status();
    // Two different 16-token sequences of random ids.
    const std::vector<int32_t> a =
        testing::RandomTokens(16, 3, (*model)->config().vocab_size);
    const std::vector<int32_t> b =
        testing::RandomTokens(16, 4, (*model)->config().vocab_size);
    CheckEveryLayer(**model, a, b);
  }
}

}  // namespace
}  // namespace kvd::ops
