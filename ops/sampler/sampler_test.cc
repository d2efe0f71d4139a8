#include "ops/sampler/sampler.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::ops {
namespace {

using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();

Sampler MakeSampler(const SamplingParams& params) {
  absl::StatusOr<Sampler> s = Sampler::Create(params);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

// Token -> count over `draws` samples.
std::map<int32_t, int> Histogram(Sampler& sampler,
                                 const std::vector<float>& logits, int draws) {
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) {
    ++counts[sampler.Sample(logits.data(), static_cast<int32_t>(logits.size()),
                            {})];
  }
  return counts;
}

std::set<int32_t> Support(const std::map<int32_t, int>& counts) {
  std::set<int32_t> ids;
  for (const auto& [id, n] : counts) ids.insert(id);
  return ids;
}

// Softmax in double with the C library's exp: an implementation independent of
// the sampler's.
std::vector<double> Softmax(const std::vector<float>& logits,
                            double temperature) {
  double max = -std::numeric_limits<double>::infinity();
  for (float l : logits) max = std::max(max, static_cast<double>(l));
  std::vector<double> p;
  double sum = 0;
  for (float l : logits) {
    p.push_back(std::exp((l - max) / temperature));
    sum += p.back();
  }
  for (double& x : p) x /= sum;
  return p;
}

// Logits whose softmax is exactly `probs` (up to rounding).
std::vector<float> LogitsFor(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

SamplingParams With(void (*edit)(SamplingParams&)) {
  SamplingParams p;
  edit(p);
  return p;
}

TEST(SamplingParamsTest, DefaultsAreValid) {
  EXPECT_TRUE(SamplingParams().Validate().ok());
}

TEST(SamplingParamsTest, OutOfRangeValuesAreRejectedByName) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::pair<SamplingParams, std::string>> cases = {
      {With([](SamplingParams& p) { p.temperature = -0.1f; }), "temperature"},
      {With([](SamplingParams& p) { p.temperature = kInf; }), "temperature"},
      {With([](SamplingParams& p) { p.top_k = -1; }), "top_k"},
      {With([](SamplingParams& p) { p.top_p = 0.0f; }), "top_p"},
      {With([](SamplingParams& p) { p.top_p = 1.01f; }), "top_p"},
      {With([](SamplingParams& p) { p.min_p = -0.01f; }), "min_p"},
      {With([](SamplingParams& p) { p.min_p = 1.5f; }), "min_p"},
      {With([](SamplingParams& p) { p.repetition_penalty = 0.0f; }),
       "repetition_penalty"},
      {With([](SamplingParams& p) { p.frequency_penalty = 2.5f; }),
       "frequency_penalty"},
      {With([](SamplingParams& p) { p.presence_penalty = -3.0f; }),
       "presence_penalty"},
      {With([](SamplingParams& p) { p.repeat_last_n = -2; }), "repeat_last_n"},
  };
  for (const auto& [params, field] : cases) {
    const absl::Status s = params.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(s.message(), HasSubstr(field));
    EXPECT_FALSE(Sampler::Create(params).ok()) << field;
  }
  // NaN fails every range check.
  SamplingParams p;
  p.temperature = nan;
  EXPECT_THAT(p.Validate().message(), HasSubstr("temperature"));
  p = SamplingParams();
  p.top_p = nan;
  EXPECT_THAT(p.Validate().message(), HasSubstr("top_p"));
  p = SamplingParams();
  p.min_p = nan;
  EXPECT_THAT(p.Validate().message(), HasSubstr("min_p"));
  p = SamplingParams();
  p.repetition_penalty = nan;
  EXPECT_THAT(p.Validate().message(), HasSubstr("repetition_penalty"));
  p = SamplingParams();
  p.frequency_penalty = nan;
  EXPECT_THAT(p.Validate().message(), HasSubstr("frequency_penalty"));
  p = SamplingParams();
  p.presence_penalty = nan;
  EXPECT_THAT(p.Validate().message(), HasSubstr("presence_penalty"));
}

TEST(SamplerTest, GreedyIsArgmaxWithTiesToLowestIdAndDrawsNothing) {
  SamplingParams params;
  params.temperature = 0.0f;
  Sampler sampler = MakeSampler(params);
  const Rng::State before = sampler.rng().state();

  // Pseudo-random logits from a fixed LCG; the expected argmax is found by a
  // plain loop.
  uint32_t x = 12345;
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> logits(1000);
    for (float& l : logits) {
      x = x * 1664525u + 1013904223u;
      l = static_cast<float>(x >> 8) / 16777216.0f * 20.0f - 10.0f;
    }
    int32_t want = 0;
    for (int32_t i = 1; i < 1000; ++i) {
      if (logits[i] > logits[want]) want = i;
    }
    EXPECT_EQ(sampler.Sample(logits.data(), 1000, {}), want);
  }
  const std::vector<float> ties = {1.0f, 3.0f, 2.0f, 3.0f, 3.0f};
  EXPECT_EQ(sampler.Sample(ties.data(), 5, {}), 1);
  EXPECT_EQ(sampler.rng().state(), before);
}

TEST(SamplerTest, TopKOneIsArgmaxAtAnyTemperature) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  for (float t : {0.01f, 0.5f, 1.0f, 2.0f, 100.0f}) {
    SamplingParams params;
    params.temperature = t;
    params.top_k = 1;
    params.seed = 99;
    Sampler sampler = MakeSampler(params);
    for (int i = 0; i < 1000; ++i) {
      ASSERT_EQ(sampler.Sample(logits.data(), 5, {}), 1) << "temperature " << t;
    }
  }
}

std::vector<int32_t> Sequence(uint64_t seed, int n) {
  SamplingParams params;
  params.seed = seed;
  Sampler sampler = MakeSampler(params);
  const std::vector<float> logits(50, 0.0f);  // uniform over 50 tokens
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i)
    out.push_back(sampler.Sample(logits.data(), 50, {}));
  return out;
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedsDiffer) {
  EXPECT_EQ(Sequence(7, 200), Sequence(7, 200));
  EXPECT_NE(Sequence(7, 200), Sequence(8, 200));
  EXPECT_NE(Sequence(0, 200), Sequence(1, 200));
}

// Each call draws u from the seeded stream and returns the inverse CDF of the
// (unsorted, id order) distribution at u. The expected tokens here come from a
// separate Rng and a softmax in double, so this pins the exact stream semantics
// that seeded sessions rely on.
TEST(SamplerTest, SamplingIsTheInverseCdfOfTheSeededStream) {
  const std::vector<float> logits = {0.3f, -1.2f, 2.2f, 0.0f,
                                     1.1f, -0.4f, 1.7f};
  SamplingParams params;
  params.temperature = 0.8f;
  params.seed = 2024;
  Sampler sampler = MakeSampler(params);
  Rng rng(2024);
  const std::vector<double> p = Softmax(logits, 0.8);
  for (int i = 0; i < 2000; ++i) {
    const double u = rng.NextDouble();
    int32_t want = 0;
    double cumulative = p[0];
    while (u >= cumulative && want + 1 < static_cast<int32_t>(p.size()))
      cumulative += p[++want];
    ASSERT_EQ(sampler.Sample(logits.data(), 7, {}), want)
        << "draw " << i << " u " << u;
  }
}

// Empirical frequencies against the softmax. With a fixed seed the outcome is
// deterministic; the 5-sigma band (binomial standard deviation) is what a
// correct sampler satisfies with overwhelming probability for any seed, and a
// wrong temperature or distribution misses it by far.
TEST(SamplerTest, FrequenciesMatchTheSoftmax) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f, 3.0f};
  constexpr int kDraws = 100000;
  for (float t : {1.0f, 0.5f, 2.0f}) {
    SamplingParams params;
    params.temperature = t;
    params.seed = 31337;
    Sampler sampler = MakeSampler(params);
    const std::map<int32_t, int> counts = Histogram(sampler, logits, kDraws);
    const std::vector<double> p = Softmax(logits, t);
    for (int32_t id = 0; id < 6; ++id) {
      const double mean = kDraws * p[id];
      const double sigma = std::sqrt(kDraws * p[id] * (1 - p[id]));
      const int got = counts.count(id) ? counts.at(id) : 0;
      EXPECT_NEAR(got, mean, 5 * sigma)
          << "token " << id << " temperature " << t;
    }
  }
}

TEST(SamplerTest, TopKKeepsExactlyTheKHighestWithTiesToLowestId) {
  // Sorted: 3 (3.0), 1 (2.0), 4 (2.0, loses the tie to 1), 5 (0.5), 0 (0.1), 2
  // (-1.0).
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 3.0f, 2.0f, 0.5f};
  const std::map<int, std::set<int32_t>> expected = {{2, {3, 1}},
                                                     {3, {3, 1, 4}},
                                                     {5, {3, 1, 4, 5, 0}},
                                                     {6, {0, 1, 2, 3, 4, 5}},
                                                     {100, {0, 1, 2, 3, 4, 5}}};
  for (const auto& [k, want] : expected) {
    SamplingParams params;
    params.top_k = k;
    params.temperature = 3.0f;  // flatten so every kept token shows up
    Sampler sampler = MakeSampler(params);
    EXPECT_EQ(Support(Histogram(sampler, logits, 20000)), want)
        << "top_k " << k;
  }
}

// Probabilities by id: 0: .05, 1: .5, 2: .1, 3: .2, 4: .15. Descending: 1, 3,
// 4, 2, 0 with cumulative .5, .7, .85, .95, 1.
const std::vector<double> kProbs = {0.05, 0.5, 0.1, 0.2, 0.15};

TEST(SamplerTest, TopPKeepsTheSmallestPrefixReachingP) {
  const std::vector<float> logits = LogitsFor(kProbs);
  const std::map<float, std::set<int32_t>> expected = {
      {0.45f, {1}},         {0.6f, {1, 3}},           {0.8f, {1, 3, 4}},
      {0.9f, {1, 3, 4, 2}}, {0.97f, {0, 1, 2, 3, 4}}, {1.0f, {0, 1, 2, 3, 4}}};
  for (const auto& [top_p, want] : expected) {
    SamplingParams params;
    params.top_p = top_p;
    params.temperature = 5.0f;
    Sampler sampler = MakeSampler(params);
    EXPECT_EQ(Support(Histogram(sampler, logits, 20000)), want)
        << "top_p " << top_p;
  }
}

TEST(SamplerTest, MinPKeepsTokensAtLeastMinPTimesTheTop) {
  const std::vector<float> logits = LogitsFor(kProbs);
  // Threshold = min_p * 0.5.
  const std::map<float, std::set<int32_t>> expected = {
      {0.05f, {0, 1, 2, 3, 4}},  // .025
      {0.25f, {1, 3, 4}},        // .125
      {0.35f, {1, 3}},           // .175
      {0.5f, {1}},               // .25
      {1.0f, {1}}};
  for (const auto& [min_p, want] : expected) {
    SamplingParams params;
    params.min_p = min_p;
    params.temperature = 5.0f;
    Sampler sampler = MakeSampler(params);
    EXPECT_EQ(Support(Histogram(sampler, logits, 20000)), want)
        << "min_p " << min_p;
  }
}

TEST(SamplerTest, FiltersSeeTheDistributionBeforeTemperature) {
  // top_p 0.6 keeps {1, 3} from the raw distribution even though temperature 50
  // then makes the two nearly equal: p(1) = 1 / (1 + (0.2/0.5)^(1/50)).
  const std::vector<float> logits = LogitsFor(kProbs);
  SamplingParams params;
  params.top_p = 0.6f;
  params.top_k = 4;
  params.min_p = 0.3f;
  params.temperature = 50.0f;
  params.seed = 5;
  Sampler sampler = MakeSampler(params);
  constexpr int kDraws = 100000;
  const std::map<int32_t, int> counts = Histogram(sampler, logits, kDraws);
  ASSERT_EQ(Support(counts), (std::set<int32_t>{1, 3}));
  const double p1 = 1.0 / (1.0 + std::pow(0.2 / 0.5, 1.0 / 50.0));
  EXPECT_NEAR(counts.at(1), kDraws * p1, 5 * std::sqrt(kDraws * p1 * (1 - p1)));
}

TEST(PenaltiesTest, WorkedExample) {
  // History counts: token 0 twice, tokens 1 and 2 once; 9 and -1 are out of
  // range. repetition 2, frequency 0.5, presence 0.25:
  //   token 0:  2.0 / 2 - (2 * 0.5 + 0.25) = -0.25
  //   token 1: -1.0 * 2 - (1 * 0.5 + 0.25) = -2.75
  //   token 2:  0.0 * 2 - 0.75             = -0.75   (zero counts as
  //   non-positive) tokens 3, 4 not in the history: unchanged.
  std::vector<float> logits = {2.0f, -1.0f, 0.0f, 1.0f, 3.0f};
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  params.frequency_penalty = 0.5f;
  params.presence_penalty = 0.25f;
  params.repeat_last_n = -1;
  const std::vector<int32_t> history = {0, 1, 0, 2, 9, -1};
  ApplyPenalties(params, history, logits.data(), 5);
  EXPECT_EQ(logits, (std::vector<float>{-0.25f, -2.75f, -0.75f, 1.0f, 3.0f}));
}

TEST(PenaltiesTest, OnlyTheLastRepeatLastNTokensCount) {
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  params.repeat_last_n = 2;
  const std::vector<int32_t> history = {0, 0, 1, 2};
  std::vector<float> logits = {4.0f, 4.0f, -4.0f};
  ApplyPenalties(params, history, logits.data(), 3);
  EXPECT_EQ(logits, (std::vector<float>{4.0f, 2.0f, -8.0f}));

  params.repeat_last_n = 0;
  logits = {4.0f, 4.0f, -4.0f};
  ApplyPenalties(params, history, logits.data(), 3);
  EXPECT_EQ(logits, (std::vector<float>{4.0f, 4.0f, -4.0f}));
}

TEST(PenaltiesTest, AppliedBeforeGreedy) {
  // Token 0 would win, but it was just generated: 2.0 / 1.25 = 1.6 < 1.9.
  const std::vector<float> logits = {2.0f, 1.9f};
  SamplingParams params;
  params.temperature = 0.0f;
  params.repetition_penalty = 1.25f;
  Sampler sampler = MakeSampler(params);
  EXPECT_EQ(sampler.Sample(logits.data(), 2, {}), 0);
  const std::vector<int32_t> history = {0};
  EXPECT_EQ(sampler.Sample(logits.data(), 2, history), 1);
}

TEST(SamplerTest, NanAndInfiniteLogits) {
  SamplingParams params;
  params.seed = 3;
  Sampler sampler = MakeSampler(params);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> with_nan = {nan, 0.0f, -kInf, nan};
  for (int i = 0; i < 1000; ++i)
    ASSERT_EQ(sampler.Sample(with_nan.data(), 4, {}), 1);
  const std::vector<float> with_inf = {0.0f, kInf, 5.0f};
  for (int i = 0; i < 1000; ++i)
    ASSERT_EQ(sampler.Sample(with_inf.data(), 3, {}), 1);
  const std::vector<float> impossible = {-kInf, nan, -kInf};
  EXPECT_EQ(sampler.Sample(impossible.data(), 3, {}), 0);
  EXPECT_EQ(sampler.Sample(impossible.data(), 0, {}), -1);
}

TEST(LogProbsTest, WorkedExample) {
  // softmax(0, ln 3) = (1/4, 3/4); -inf and NaN have probability 0.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> logits = {0.0f, std::log(3.0f), -kInf, nan};
  const LogProbs lp =
      ComputeLogProbs(logits.data(), 4, /*chosen=*/0, /*top_n=*/3);
  EXPECT_EQ(lp.chosen.token, 0);
  EXPECT_NEAR(lp.chosen.logprob, std::log(0.25), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].token, 1);
  EXPECT_NEAR(lp.top[0].logprob, std::log(0.75), 1e-6);
  EXPECT_EQ(lp.top[1].token, 0);
  EXPECT_EQ(lp.top[2].token, 2);
  EXPECT_EQ(lp.top[2].logprob, -kInf);

  const std::vector<float> ties = {1.0f, 1.0f, 1.0f};
  const LogProbs t = ComputeLogProbs(ties.data(), 3, 2, 10);
  ASSERT_EQ(t.top.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(t.top[i].token, i);
    EXPECT_NEAR(t.top[i].logprob, std::log(1.0 / 3.0), 1e-6);
  }
  EXPECT_EQ(ComputeLogProbs(ties.data(), 3, 7, 0).chosen.logprob, -kInf);
}

}  // namespace
}  // namespace kvd::ops
