// The rebuild API resumes a sequence from its checkpoint bit for bit: for
// every policy (kv-direct, stride:k, tokens) and hot budget B, a fresh cache
// rebuilt at a turn boundary holds exactly the rows the uninterrupted run
// cached for the hot positions, and the next turn's logits (a prefill that
// straddles attention chunks, then 64 greedy decode steps) equal the
// uninterrupted plain-kv run's at every step. The reference never rebuilds.
#include "ops/kvdirect/rebuild.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::ops {
namespace {

int32_t Argmax(const float* logits, int64_t n) {
  return std::max_element(logits, logits + n) - logits;
}

// Fans the residuals out to several stores (one per policy).
class Fanout : public ResidualObserver {
 public:
  explicit Fanout(std::vector<ResidualStore*> stores)
      : stores_(std::move(stores)) {}
  void OnResidual(int64_t seq, int64_t layer, int64_t position,
                  const float* residual) override {
    for (ResidualStore* s : stores_)
      s->OnResidual(seq, layer, position, residual);
  }

 private:
  std::vector<ResidualStore*> stores_;
};

using Case = testing::FamilyCase;

constexpr int64_t kSeq = 5;
// Two turns before the interruption, one after: user prefill + greedy replies.
constexpr int kTurnTokens[] = {40, 35, 33};
constexpr int kReplies[] = {60, 60, 64};

class Rebuild : public ::testing::TestWithParam<Case> {};

TEST_P(Rebuild, ContinuedDecodingIsBitIdenticalForEveryPolicyAndBudget) {
  testing::TinyModelSpec spec;
  spec.family = GetParam().family;
  // Segments of stride:2 and stride:4 that do not divide the depth; gemma3
  // gets 5 local layers and a global one.
  spec.n_layers = spec.family == "gemma3" ? 6 : 5;
  absl::StatusOr<std::string> path =
      testing::WriteTinyModel(spec, ::testing::TempDir());
  ASSERT_TRUE(path.ok()) << path.status();
  LoadOptions opts;
  opts.precision = GetParam().precision;
  opts.num_threads = 2;
  absl::StatusOr<std::unique_ptr<Model>> loaded = Model::Load(*path, opts);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Model& model = **loaded;
  const ModelConfig& c = model.config();

  const std::vector<std::string> policies = {"kv-direct", "stride:2",
                                             "stride:4", "tokens"};
  std::vector<ResidualStore> checkpoints;
  for (const std::string& name : policies) {
    checkpoints.emplace_back(
        c, model.precision(),
        CheckpointLayers(*ParseCheckpointPolicy(name), c.n_layers));
  }
  std::vector<ResidualStore*> store_ptrs;
  for (ResidualStore& s : checkpoints) store_ptrs.push_back(&s);
  Fanout fanout(store_ptrs);

  // The uninterrupted plain run. Checkpoints observe the first two turns.
  KvCache plain = model.NewCache();
  plain.KeepRowsPastWindows();   // every row, to compare the rebuilt ones with
  std::vector<int32_t> history;  // tokens up to the cut
  std::vector<std::vector<int32_t>> after;  // steps after the cut
  std::vector<std::vector<float>> after_logits;
  for (int turn = 0; turn < 3; ++turn) {
    std::vector<int32_t> next =
        testing::RandomTokens(kTurnTokens[turn], 20 + turn, c.vocab_size);
    for (int g = 0; g <= kReplies[turn]; ++g) {
      SequenceStep step{&plain, next, LogitsMode::kLast, kSeq};
      ForwardOutput out;
      ASSERT_TRUE(
          model.Forward({&step, 1}, &out, turn < 2 ? &fanout : nullptr).ok());
      if (turn < 2) {
        history.insert(history.end(), next.begin(), next.end());
      } else {
        after.push_back(next);
        after_logits.emplace_back(out.Logits(0), out.Logits(0) + c.vocab_size);
      }
      if (g == kReplies[turn]) break;
      next = {Argmax(out.Logits(0), c.vocab_size)};
    }
    // The turn's last reply token is fed at the start of the next turn's
    // prefill in a real chat; here it simply ends the turn.
  }
  for (const ResidualStore& s : checkpoints) ASSERT_TRUE(s.status().ok());
  const int64_t cut = history.size();
  ASSERT_EQ(cut, 40 + 60 + 35 + 60);
  ASSERT_EQ(after.size(), 65u);

  for (size_t pi = 0; pi < policies.size(); ++pi) {
    const CheckpointPolicy policy = *ParseCheckpointPolicy(policies[pi]);
    for (int64_t budget :
         {int64_t{0}, int64_t{16}, int64_t{64}, ResidualKvSource::kAll}) {
      SCOPED_TRACE(policies[pi] + " budget " + std::to_string(budget));
      // The session's kv-direct store for decoding on: the checkpoint itself
      // for kv-direct, the rebuild's output for the others.
      ResidualStore session =
          policy.kind == CheckpointPolicy::Kind::kKvDirect
              ? checkpoints[pi]
              : ResidualStore(
                    c, model.precision(),
                    CheckpointLayers(*ParseCheckpointPolicy("kv-direct"),
                                     c.n_layers));
      KvCache cache = model.NewCache();
      RebuildSpec rs;
      rs.policy = policy;
      rs.tokens = history;
      rs.checkpoint = &checkpoints[pi];
      rs.sequence_id = kSeq;
      rs.budget = budget;
      rs.block = 50;  // blocks that straddle attention chunks
      ASSERT_TRUE(RebuildKv(model, rs, &cache, &session).ok());
      ASSERT_EQ(cache.length(), cut);
      const int64_t hot = budget == ResidualKvSource::kAll
                              ? 0
                              : std::max<int64_t>(0, cut - budget);
      // The rebuilt rows equal the plain run's, zero differing bytes.
      int64_t differing_rows = 0;
      // Local layers keep (and rebuild) only what their window can reach.
      for (int64_t l = 0; l < c.n_layers; ++l) {
        const int64_t first =
            std::max(hot, WindowStart(c.layers[l].sliding_window, cut));
        ASSERT_EQ(cache.first_kept(l), first) << "layer " << l;
        for (int64_t p = first; p < cut; ++p) {
          differing_rows +=
              std::memcmp(cache.KeyBytes(l, p), plain.KeyBytes(l, p),
                          cache.row_bytes()) != 0 ||
              std::memcmp(cache.ValueBytes(l, p), plain.ValueBytes(l, p),
                          cache.row_bytes()) != 0;
        }
      }
      EXPECT_EQ(differing_rows, 0);
      if (budget != ResidualKvSource::kAll) {
        EXPECT_LE(cache.allocated_bytes(),
                  c.n_layers * 2 * cache.row_bytes() *
                      (budget + 2 * kernels::cpu::kAttentionChunk));
        ASSERT_EQ(session.length(kSeq), cut);
      }

      ResidualKvSource source(&session, kSeq, budget);
      int64_t mismatches = 0;
      for (size_t s = 0; s < after.size(); ++s) {
        SequenceStep step{&cache, after[s], LogitsMode::kLast, kSeq,
                          budget == ResidualKvSource::kAll ? nullptr : &source};
        ForwardOutput out;
        ASSERT_TRUE(
            model
                .Forward({&step, 1}, &out,
                         budget == ResidualKvSource::kAll ? nullptr : &session)
                .ok());
        mismatches += std::memcmp(out.Logits(0), after_logits[s].data(),
                                  c.vocab_size * sizeof(float)) != 0;
      }
      EXPECT_EQ(mismatches, 0);
    }
  }
}

TEST_P(Rebuild, RejectsWhatCannotBeRebuilt) {
  testing::TinyModelSpec spec;
  spec.family = GetParam().family;
  absl::StatusOr<std::string> path =
      testing::WriteTinyModel(spec, ::testing::TempDir());
  ASSERT_TRUE(path.ok());
  LoadOptions opts;
  opts.precision = GetParam().precision;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(*path, opts);
  ASSERT_TRUE(model.ok());
  const ModelConfig& c = (*model)->config();
  const std::vector<int32_t> t = testing::RandomTokens(20, 3, c.vocab_size);
  ResidualStore strided(c, (*model)->precision(), {0, 2});
  KvCache cache = (*model)->NewCache();
  SequenceStep step{&cache, t, LogitsMode::kNone, 0};
  ForwardOutput out;
  ASSERT_TRUE((*model)->Forward({&step, 1}, &out, &strided).ok());

  KvCache fresh = (*model)->NewCache();
  RebuildSpec rs;
  rs.tokens = t;
  rs.checkpoint = &strided;
  rs.policy = *ParseCheckpointPolicy("kv");
  EXPECT_EQ(RebuildKv(**model, rs, &fresh, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  // A stride:2 checkpoint cannot serve kv-direct (layer 1 is missing).
  rs.policy = *ParseCheckpointPolicy("kv-direct");
  EXPECT_EQ(RebuildKv(**model, rs, &fresh, nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
  // More tokens than the checkpoint holds.
  const std::vector<int32_t> longer =
      testing::RandomTokens(21, 3, c.vocab_size);
  rs.policy = *ParseCheckpointPolicy("stride:2");
  rs.tokens = longer;
  EXPECT_EQ(RebuildKv(**model, rs, &fresh, nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
  // A bounded stride rebuild needs somewhere to put the cold residuals.
  rs.tokens = t;
  rs.budget = 4;
  EXPECT_EQ(RebuildKv(**model, rs, &fresh, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  rs.budget = ResidualKvSource::kAll;
  EXPECT_TRUE(RebuildKv(**model, rs, &fresh, nullptr).ok());
  EXPECT_EQ(fresh.length(), 20);
}

INSTANTIATE_TEST_SUITE_P(Families, Rebuild,
                         ::testing::ValuesIn(testing::AllFamilyCases()),
                         testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::ops
