// The eviction baselines (eviction.h). Two kinds of checks:
//  - With a budget that never evicts, every method's logits are bit-identical
//    to the plain forward pass (which never runs the selection path), on tiny
//    models of every family (Gemma 3's sliding windows included), both
//    precisions, over a prefill split across steps and decoding.
//  - With a small budget, the kept set is what the paper's rule prescribes, on
//    cases small enough to check by hand: the scores are fed through
//    OnWeights directly, so the expected sets follow from the rules in the
//    header, not from a model's attention.
// Plus: attention visits exactly the kept positions and the step's own, and
// reports weights that sum to 1; bad selections are refused.
#include "tools/experiments/eviction.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::experiments {
namespace {

using ops::ForwardOutput;
using ops::KeySelection;
using ops::KvCache;
using ops::LoadOptions;
using ops::LogitsMode;
using ops::Model;
using ops::ModelConfig;
using ops::Precision;
using ops::SequenceStep;

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

std::unique_ptr<Model> LoadTiny(const std::string& family,
                                Precision precision) {
  ops::testing::TinyModelSpec spec;
  spec.family = family;
  if (family == "gemma3") spec.n_layers = 6;  // 5 local + 1 global
  absl::StatusOr<std::string> path =
      ops::testing::WriteTinyModel(spec, ::testing::TempDir());
  EXPECT_TRUE(path.ok()) << path.status();
  LoadOptions opts;
  opts.precision = precision;
  opts.num_threads = 2;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(*path, opts);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(*model);
}

using Case = ops::testing::FamilyCase;

class FullBudget : public ::testing::TestWithParam<Case> {};

TEST_P(FullBudget, EveryMethodEqualsTheFullCacheBitForBit) {
  std::unique_ptr<Model> model =
      LoadTiny(GetParam().family, GetParam().precision);
  const ModelConfig& c = model->config();
  // Prefill of 45 + 30 tokens (crossing chunk boundaries and, for gemma3,
  // the window of 8), then 40 greedy tokens: 115 positions.
  std::vector<std::vector<int32_t>> steps = {
      ops::testing::RandomTokens(45, 1, c.vocab_size),
      ops::testing::RandomTokens(30, 2, c.vocab_size)};
  constexpr int kDecode = 40;
  std::vector<std::vector<float>> reference;
  {
    KvCache cache = model->NewCache();
    for (size_t s = 0; s < steps.size(); ++s) {
      SequenceStep step{&cache, steps[s], LogitsMode::kAll, 0};
      ForwardOutput out;
      ASSERT_TRUE(model->Forward({&step, 1}, &out).ok());
      reference.push_back(out.logits);
      if (steps.size() < 2 + kDecode) {
        const float* last = out.Logits(0);
        steps.push_back({static_cast<int32_t>(
            std::max_element(last, last + c.vocab_size) - last)});
      }
    }
  }
  for (const char* name : {"window", "streaming-llm", "h2o", "tova", "snapkv"})
    for (int64_t budget : {EvictionOptions::kUnlimited, int64_t{115}}) {
      SCOPED_TRACE(::testing::Message() << name << " budget " << budget);
      EvictionOptions options;
      options.method = *ParseEvictionMethod(name);
      options.budget = budget;
      absl::StatusOr<EvictionPolicy> policy =
          EvictionPolicy::Create(c, options);
      ASSERT_TRUE(policy.ok()) << policy.status();
      KvCache cache = model->NewCache();
      int64_t differing_steps = 0;
      for (size_t s = 0; s < steps.size(); ++s) {
        ForwardOutput out;
        ASSERT_TRUE(ForwardWithEviction(*model, &cache, steps[s],
                                        LogitsMode::kAll, &*policy, &out)
                        .ok());
        ASSERT_EQ(out.logits.size(), reference[s].size());
        differing_steps += std::memcmp(out.logits.data(), reference[s].data(),
                                       out.logits.size() * sizeof(float)) != 0;
      }
      EXPECT_EQ(differing_steps, 0);
      EXPECT_EQ(policy->Kept(0, 0).size(), 115u);
    }
}

INSTANTIATE_TEST_SUITE_P(Families, FullBudget,
                         ::testing::Values(Case{"llama", Precision::kF32},
                                           Case{"llama", Precision::kBf16},
                                           Case{"qwen2", Precision::kF32},
                                           Case{"gemma3", Precision::kF32},
                                           Case{"gemma3", Precision::kBf16}),
                         ops::testing::FamilyCaseName);

// A config for driving a policy by hand: one layer, `kv_heads` K/V heads of
// `group` query heads each.
ModelConfig HandConfig(int64_t kv_heads, int64_t group) {
  ModelConfig c;
  c.n_layers = 1;
  c.n_kv_heads = kv_heads;
  c.n_heads = kv_heads * group;
  return c;
}

EvictionPolicy Make(const ModelConfig& c, EvictionOptions o) {
  absl::StatusOr<EvictionPolicy> p = EvictionPolicy::Create(c, o);
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

// A step of `n` tokens; the model would call OnWeights for each query, here
// only the queries in `weights` report: {query position, kv head, per query
// head a weight for each of keys 0..position}.
struct Report {
  int64_t position, kv_head;
  std::vector<std::vector<float>> per_head;
};
void Step(EvictionPolicy& p, int64_t n, const std::vector<Report>& reports) {
  p.BeginStep(n);
  for (const Report& r : reports) {
    std::vector<int64_t> keys(p.Kept(0, r.kv_head).begin(),
                              p.Kept(0, r.kv_head).end());
    for (int64_t q = p.length(); q <= r.position; ++q) keys.push_back(q);
    std::vector<float> w;
    for (const std::vector<float>& head : r.per_head) {
      ASSERT_EQ(head.size(), keys.size());
      w.insert(w.end(), head.begin(), head.end());
    }
    p.OnWeights(0, r.kv_head, r.position, keys, w.data());
  }
  p.EndStep();
}

TEST(EvictionRules, WindowKeepsTheLastB) {
  EvictionOptions o;
  o.budget = 5;
  EvictionPolicy p = Make(HandConfig(2, 1), o);
  Step(p, 12, {});
  EXPECT_THAT(p.Kept(0, 0), ElementsAre(7, 8, 9, 10, 11));
  EXPECT_THAT(p.Kept(0, 1), ElementsAre(7, 8, 9, 10, 11));
  Step(p, 1, {});
  EXPECT_THAT(p.Kept(0, 0), ElementsAre(8, 9, 10, 11, 12));
}

TEST(EvictionRules, StreamingLlmKeepsSinksAndRecent) {
  EvictionOptions o;
  o.method = EvictionMethod::kStreamingLlm;
  o.budget = 5;
  o.sink_tokens = 2;
  EvictionPolicy p = Make(HandConfig(1, 1), o);
  Step(p, 12, {});
  EXPECT_THAT(p.Kept(0, 0), ElementsAre(0, 1, 9, 10, 11));
  Step(p, 1, {});
  EXPECT_THAT(p.Kept(0, 0), ElementsAre(0, 1, 10, 11, 12));
}

TEST(EvictionRules, H2oKeepsRecentPlusHeavyHittersPerKvHead) {
  EvictionOptions o;
  o.method = EvictionMethod::kH2o;
  o.budget = 4;  // R = 2 recent + 2 heavy hitters
  EvictionPolicy p = Make(HandConfig(2, 2), o);
  // Prefill of 8: two queries report; head 0 sums its two query heads.
  // Accumulated for kv head 0 (positions 0..7):
  //   0: .5  1: .1  2: .3  3: .05  4: .3  5: 0  6: 1.5  7: 1.15
  // Position 4 ties with 2 and wins as the later one.
  Step(p, 8,
       {{6, 0, {{.2, .05, .1, .05, .1, 0, .5}, {.1, 0, .1, 0, .1, 0, .7}}},
        {7, 0, {{.1, .05, .1, 0, .1, 0, .3, .35}, {.1, 0, 0, 0, 0, 0, 0, .8}}},
        {7, 1, {{0, 0, 0, 0, 0, .9, 0, .1}, {0, .5, 0, 0, 0, 0, 0, .5}}}});
  EXPECT_THAT(p.Kept(0, 0), ElementsAre(0, 4, 6, 7));
  EXPECT_THAT(p.Kept(0, 1), ElementsAre(1, 5, 6, 7));
  // Decode position 8 over kept {0, 4, 6, 7} + 8: 6 leaves the recent
  // window and competes: accumulated 0: .5+.05, 4: .3+.4, 6: 1.5+0.
  Step(p, 1, {{8, 0, {{.05, .2, 0, .2, .55}, {0, .2, 0, .3, .5}}}});
  EXPECT_THAT(p.Kept(0, 0), ElementsAre(4, 6, 7, 8));
}

TEST(EvictionRules, TovaDropsTheLowestCurrentWeightPerLayer) {
  EvictionOptions o;
  o.method = EvictionMethod::kTova;
  o.budget = 3;
  EvictionPolicy p = Make(HandConfig(2, 1), o);
  // Prefill of 6: only the last query (5) counts; summed over both heads:
  //   0: .6  1: .1  2: .2  3: .5  4: .1  5: .5 -> keep 0, 3, 5 (3 and 5 tie:
  //   both kept; 1 and 4 tie below 2).
  Step(p, 6,
       {{4, 0, {{0, 1, 0, 0, 0}}},  // not the last query: ignored
        {5, 0, {{.3, .1, .1, .2, 0, .3}}},
        {5, 1, {{.3, 0, .1, .3, .1, .2}}}});
  EXPECT_THAT(p.Kept(0, 0), ElementsAre(0, 3, 5));
  EXPECT_THAT(p.Kept(0, 1), ElementsAre(0, 3, 5));
  // Decode 6 over {0, 3, 5, 6}: drop the single lowest (3).
  Step(p, 1, {{6, 0, {{.4, .1, .2, .3}}}, {6, 1, {{.4, .1, .3, .2}}}});
  EXPECT_THAT(p.Kept(0, 0), ElementsAre(0, 5, 6));
  EXPECT_THAT(p.Kept(0, 1), ElementsAre(0, 5, 6));
}

TEST(EvictionRules, SnapKvVotesOncePoolsThenMakesRoomByVotes) {
  EvictionOptions o;
  o.method = EvictionMethod::kSnapKv;
  o.budget = 4;
  o.snapkv_window = 2;  // queries 8 and 9 vote; 8 and 9 are kept
  o.snapkv_kernel = 3;  // max over p-1..p+1 within the prefix [0, 8)
  EvictionPolicy p = Make(HandConfig(1, 1), o);
  // Votes on the prefix: 0: 0  1: .1  2: 0  3: 0  4: 0  5: .3  6: 0  7: .25
  // pooled:              .1   .1    .1  0   .3   .3    .3   .25
  // Top 2 of the pooled (ties to the later): 6 (.3), 5 (.3).
  Step(p, 10,
       {{7, 0, {{0, 0, 0, 0, 0, 0, 0, 1}}},  // before the window: ignored
        {8, 0, {{0, .1, 0, 0, 0, .1, 0, .05, .75}}},
        {9, 0, {{0, 0, 0, 0, 0, .2, 0, .2, .1, .5}}}});
  EXPECT_THAT(p.Kept(0, 0), ElementsAre(5, 6, 8, 9));
  EXPECT_FALSE(p.WantsWeights());  // the vote is taken
  // Generated positions push out the least-voted selected one (5 and 6 tie;
  // the earlier goes), then the other, then the oldest.
  Step(p, 1, {});
  EXPECT_THAT(p.Kept(0, 0), ElementsAre(6, 8, 9, 10));
  Step(p, 1, {});
  EXPECT_THAT(p.Kept(0, 0), ElementsAre(8, 9, 10, 11));
  Step(p, 1, {});
  EXPECT_THAT(p.Kept(0, 0), ElementsAre(9, 10, 11, 12));
}

TEST(EvictionRules, SetBudgetCompressesAnObservedPrefill) {
  EvictionOptions o;
  o.method = EvictionMethod::kStreamingLlm;
  o.sink_tokens = 1;
  EvictionPolicy p = Make(HandConfig(1, 1), o);
  Step(p, 10, {});
  EXPECT_EQ(p.Kept(0, 0).size(), 10u);
  EvictionPolicy copy = p;
  copy.SetBudget(3);
  EXPECT_THAT(copy.Kept(0, 0), ElementsAre(0, 8, 9));
  EXPECT_EQ(p.Kept(0, 0).size(), 10u);
}

TEST(EvictionRules, BadOptionsAreRefused) {
  EvictionOptions o;
  o.budget = -5;
  EXPECT_EQ(EvictionPolicy::Create(HandConfig(1, 1), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.budget = 4;
  o.snapkv_kernel = 4;
  EXPECT_EQ(EvictionPolicy::Create(HandConfig(1, 1), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParseEvictionMethod("lru").ok());
}

// A fixed selection that records what attention reports.
class FixedSelection : public KeySelection {
 public:
  explicit FixedSelection(std::vector<int64_t> kept) : kept_(std::move(kept)) {}
  absl::Span<const int64_t> KeptKeys(int64_t, int64_t, int64_t) const override {
    return kept_;
  }
  bool WantsWeights() const override { return true; }
  void OnWeights(int64_t layer, int64_t kv_head, int64_t position,
                 absl::Span<const int64_t> keys,
                 const float* weights) override {
    absl::MutexLock hold(&mu_);
    keys_seen.assign(keys.begin(), keys.end());
    ++calls;
    for (int64_t h = 0; h < group; ++h) {
      double sum = 0;
      for (size_t j = 0; j < keys.size(); ++j)
        sum += weights[h * keys.size() + j];
      max_sum_error = std::max(max_sum_error, std::abs(sum - 1.0));
    }
  }
  std::vector<int64_t> kept_;
  absl::Mutex mu_;
  std::vector<int64_t> keys_seen;
  int64_t calls = 0;
  int64_t group = 2;
  double max_sum_error = 0;
};

TEST(KeySelectionHook, AttentionVisitsKeptAndOwnPositions) {
  std::unique_ptr<Model> model = LoadTiny("llama", Precision::kF32);
  const ModelConfig& c = model->config();
  KvCache cache = model->NewCache();
  std::vector<int32_t> prompt = ops::testing::RandomTokens(40, 3, c.vocab_size);
  SequenceStep pre{&cache, prompt, LogitsMode::kNone, 0};
  ForwardOutput out, full;
  ASSERT_TRUE(model->Forward({&pre, 1}, &out).ok());
  KvCache copy = cache;
  FixedSelection sel({0, 3, 33, 34, 39});
  const std::vector<int32_t> two = {5, 6};
  SequenceStep step{&cache, two, LogitsMode::kLast, 0};
  step.key_selection = &sel;
  ASSERT_TRUE(model->Forward({&step, 1}, &out).ok());
  // 3 layers x 2 K/V heads x 2 queries (positions 40 and 41).
  EXPECT_EQ(sel.calls, c.n_layers * c.n_kv_heads * 2);
  EXPECT_LT(sel.max_sum_error, 1e-5);
  // The last call was one of the two queries, whichever thread came last.
  EXPECT_TRUE(sel.keys_seen == std::vector<int64_t>({0, 3, 33, 34, 39, 40}) ||
              sel.keys_seen ==
                  std::vector<int64_t>({0, 3, 33, 34, 39, 40, 41}));
  // Fewer keys than the cache holds: the output must move.
  SequenceStep plain{&copy, two, LogitsMode::kLast, 0};
  ASSERT_TRUE(model->Forward({&plain, 1}, &full).ok());
  EXPECT_NE(
      std::memcmp(out.Logits(0), full.Logits(0), c.vocab_size * sizeof(float)),
      0);
}

TEST(KeySelectionHook, BadSelectionsAreRefusedBeforeAnyWrite) {
  std::unique_ptr<Model> model = LoadTiny("llama", Precision::kF32);
  KvCache cache = model->NewCache();
  std::vector<int32_t> prompt =
      ops::testing::RandomTokens(10, 4, model->config().vocab_size);
  SequenceStep pre{&cache, prompt, LogitsMode::kNone, 0};
  ForwardOutput out;
  ASSERT_TRUE(model->Forward({&pre, 1}, &out).ok());
  const std::vector<int32_t> one = {7};
  for (std::vector<int64_t> bad :
       {std::vector<int64_t>{3, 2}, std::vector<int64_t>{1, 10},
        std::vector<int64_t>{-1, 4}}) {
    FixedSelection sel(bad);
    SequenceStep step{&cache, one, LogitsMode::kLast, 0};
    step.key_selection = &sel;
    EXPECT_EQ(model->Forward({&step, 1}, &out).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(cache.length(), 10);
  }
}

}  // namespace
}  // namespace kvd::experiments
