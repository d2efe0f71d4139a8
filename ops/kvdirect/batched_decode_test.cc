// Several kv-direct sequences with different budgets and lengths decoded in
// one batched Forward, next to a plain sequence, give logits bit-identical to
// running each sequence alone with the plain K/V cache. Their cold rows
// (about 1,600 per layer and step here) exceed one recompute round
// (Model::kRecomputeRows = 1024), so rounds end inside a sequence's cold
// range; budgets that are not multiples of the attention chunk put a chunk
// across the hot boundary; steps of 1 to 3 tokens vary the queries per
// sequence; Gemma 3's local layers skip chunks outside their window. The
// reference never runs the recompute path.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/model/model.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::ops {
namespace {

using Case = testing::FamilyCase;

struct SeqSpec {
  int prompt;
  int64_t budget;  // -2: plain cache (no KvSource)
};
constexpr int64_t kPlain = -2;
// Budgets: 0 (everything cold), 37 and 45 (a chunk straddles the boundary),
// 64 (chunk-aligned).
const SeqSpec kSeqs[] = {
    {700, 0}, {530, 37}, {300, kPlain}, {450, 64}, {260, 45}};
constexpr int kSteps = 8;

// Tokens of sequence s at step k (k = 0: its prompt).
int TokensAt(int s, int k) {
  if (k == 0) return kSeqs[s].prompt;
  return (k + s) % 3 == 0 ? 3 : 1;
}

class BatchedDecode : public ::testing::TestWithParam<Case> {};

TEST_P(BatchedDecode, MixedBatchBitIdenticalToEachSequenceAloneWithPlainCache) {
  testing::TinyModelSpec spec;
  spec.family = GetParam().family;
  if (spec.family == "gemma3") spec.n_layers = 6;  // 5 local + 1 global
  absl::StatusOr<std::unique_ptr<Model>> loaded =
      testing::LoadTinyModel(spec, GetParam().precision);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Model& model = **loaded;
  const ModelConfig& c = model.config();
  constexpr int n = sizeof(kSeqs) / sizeof(kSeqs[0]);

  std::vector<std::vector<int32_t>> tokens(n);
  for (int s = 0; s < n; ++s) {
    int total = 0;
    for (int k = 0; k <= kSteps; ++k) total += TokensAt(s, k);
    tokens[s] = testing::RandomTokens(total, 50 + s, c.vocab_size);
  }

  // Reference: each sequence alone, plain cache, logits of every row.
  std::vector<std::vector<std::vector<float>>> want(n);
  for (int s = 0; s < n; ++s) {
    KvCache cache = model.NewCache();
    int at = 0;
    for (int k = 0; k <= kSteps; ++k) {
      SequenceStep step{
          &cache, absl::MakeConstSpan(tokens[s]).subspan(at, TokensAt(s, k)),
          LogitsMode::kAll, s};
      ForwardOutput out;
      ASSERT_TRUE(model.Forward({&step, 1}, &out).ok());
      want[s].emplace_back(out.logits.begin(), out.logits.end());
      at += TokensAt(s, k);
    }
  }

  ResidualStore store(
      c, model.precision(),
      CheckpointLayers(*ParseCheckpointPolicy("kv-direct"), c.n_layers));
  std::vector<KvCache> caches;
  std::vector<std::unique_ptr<ResidualKvSource>> sources;
  for (int s = 0; s < n; ++s) {
    caches.push_back(model.NewCache());
    sources.push_back(
        kSeqs[s].budget == kPlain
            ? nullptr
            : std::make_unique<ResidualKvSource>(&store, s, kSeqs[s].budget));
  }
  std::vector<int> at(n, 0);
  int64_t cold_rows = 0;  // layer 0's cold rows at the last step
  for (int k = 0; k <= kSteps; ++k) {
    std::vector<SequenceStep> steps;
    cold_rows = 0;
    for (int s = 0; s < n; ++s) {
      steps.push_back(
          {&caches[s],
           absl::MakeConstSpan(tokens[s]).subspan(at[s], TokensAt(s, k)),
           LogitsMode::kAll, s, sources[s].get()});
      if (sources[s] != nullptr)
        cold_rows += sources[s]->HotBegin(0, caches[s].length());
    }
    ForwardOutput out;
    ASSERT_TRUE(model.Forward(steps, &out, &store).ok()) << "step " << k;
    for (int s = 0; s < n; ++s) {
      const std::vector<float>& w = want[s][k];
      ASSERT_EQ(out.num_rows[s] * c.vocab_size, static_cast<int64_t>(w.size()));
      EXPECT_EQ(std::memcmp(out.Logits(s, 0), w.data(), w.size() * 4), 0)
          << "sequence " << s << " (budget " << kSeqs[s].budget << "), step "
          << k;
      at[s] += TokensAt(s, k);
    }
  }
  // The case this test exists for: more cold rows than one round holds.
  EXPECT_GT(cold_rows, 1024);
}

INSTANTIATE_TEST_SUITE_P(Families, BatchedDecode,
                         ::testing::ValuesIn(testing::AllFamilyCases()),
                         testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::ops
