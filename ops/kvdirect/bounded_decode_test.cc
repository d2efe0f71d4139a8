// Bounded-memory decoding (policy kv-direct) gives logits bit-identical to the
// plain K/V cache at every step of a multi-turn conversation, for every hot
// budget B, every family and both precisions. The reference is the plain
// forward pass over a full cache, which never runs the recompute path.
//
// Eviction is real: Forward frees the cache rows below the hot window, so the
// test checks what the cache holds (first_kept) and what it has allocated
// (the blocks its table holds) after every step.
#include <algorithm>
#include <cstring>
#include <iostream>

#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/kvdirect/testing/conversation.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::ops {
namespace {

using Case = testing::FamilyCase;

// Three turns: a user message prefilled in one step (straddling attention
// chunk boundaries), then greedy decoding of 70 tokens; 210 generated.
constexpr int kTurnTokens[] = {40, 25, 33};
constexpr int kReplies[] = {70, 70, 70};
constexpr int kGenerated = 70;

class BoundedDecode : public ::testing::TestWithParam<Case> {};

TEST_P(BoundedDecode, LogitsBitIdenticalToPlainCacheForEveryBudget) {
  testing::TinyModelSpec spec;
  spec.family = GetParam().family;
  if (spec.family == "gemma3") spec.n_layers = 6;  // 5 local + 1 global
  absl::StatusOr<std::unique_ptr<Model>> loaded =
      testing::LoadTinyModel(spec, GetParam().precision);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Model& model = **loaded;
  const ModelConfig& c = model.config();

  // The reference: every step of the conversation, the plain way; its
  // tokens (user tokens + greedy replies) are what the bounded runs replay.
  testing::PlainTranscript plain;
  {
    KvCache cache = model.NewCache();
    for (const testing::ChatTurn& turn :
         testing::RandomTurns(c, kTurnTokens, kReplies, /*first_seed=*/10)) {
      const absl::Status st =
          testing::AppendPlainTurn(model, turn, {}, &cache, &plain);
      ASSERT_TRUE(st.ok()) << st;
    }
  }
  const std::vector<std::vector<int32_t>>& steps = plain.steps;
  ASSERT_EQ(steps.size(), 3u * (kGenerated + 1));

  // Rows a step may need: the hot window and the step's new tokens, in
  // whole blocks of one attention chunk (a private pool's block size): the
  // partly used blocks at both ends of the kept range add up to two chunks.
  int64_t longest_step = 0;
  for (const std::vector<int32_t>& t : steps)
    longest_step = std::max<int64_t>(longest_step, t.size());
  for (int64_t budget : {int64_t{0}, int64_t{16}, int64_t{64}, int64_t{256},
                         ResidualKvSource::kAll}) {
    ResidualStore store(
        c, model.precision(),
        CheckpointLayers(*ParseCheckpointPolicy("kv-direct"), c.n_layers));
    ResidualKvSource source(&store, /*sequence_id=*/3, budget);
    KvCache cache = model.NewCache();
    const size_t bound =
        c.n_layers * 2 * cache.row_bytes() *
        (budget + 2 * kernels::cpu::kAttentionChunk + longest_step);
    int64_t cold_steps = 0, want_cold = 0, over_bound = 0;
    int64_t length = 0;
    for (const std::vector<int32_t>& t : steps) {
      want_cold += budget != ResidualKvSource::kAll && length > budget;
      length += t.size();
    }
    testing::ReplayOptions replay;
    replay.sequence_id = 3;
    replay.kv_source = &source;
    replay.observer = &store;
    replay.after_step = [&](size_t, int64_t before) {
      const int64_t hot = source.HotBegin(0, before);
      cold_steps += hot > 0;
      ASSERT_TRUE(store.status().ok()) << store.status();
      // The rows below this step's hot window are gone at every layer, and
      // a local layer's rows below its window too.
      for (int64_t l = 0; l < c.n_layers; ++l) {
        ASSERT_EQ(
            cache.first_kept(l),
            std::max(hot, WindowStart(c.layers[l].sliding_window, before)))
            << "budget " << budget << " layer " << l;
      }
      if (budget != ResidualKvSource::kAll)
        over_bound += cache.allocated_bytes() > bound;
    };
    const absl::StatusOr<int64_t> mismatches = testing::CountLogitMismatches(
        model, plain, 0, plain.size(), replay, &cache);
    ASSERT_TRUE(mismatches.ok()) << mismatches.status();
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_EQ(*mismatches, 0) << "budget " << budget;
    EXPECT_EQ(over_bound, 0) << "budget " << budget << ": allocated "
                             << cache.allocated_bytes() << " > " << bound;
    // Every step whose cache outgrew B ran with cold chunks.
    EXPECT_EQ(cold_steps, want_cold) << "budget " << budget;
    if (budget != ResidualKvSource::kAll) {
      EXPECT_GT(cold_steps, 40) << "budget " << budget;
    } else {
      EXPECT_GE(cache.allocated_bytes(), cache.size_bytes());
      int64_t global_layers = 0;
      for (const LayerConfig& lc : c.layers)
        global_layers += lc.sliding_window == 0;
      EXPECT_GE(cache.size_bytes(),
                global_layers * 2 * cache.row_bytes() * cache.length());
    }
  }
}

// A 1000-token session: the plain cache grows with the context, the kv-direct
// cache stays at its window while logits stay bit-identical.
TEST_P(BoundedDecode, ThousandTokenSessionKeepsPeakCacheBytesFlat) {
  testing::TinyModelSpec spec;
  spec.family = GetParam().family;
  absl::StatusOr<std::unique_ptr<Model>> loaded =
      testing::LoadTinyModel(spec, GetParam().precision);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Model& model = **loaded;
  const ModelConfig& c = model.config();
  constexpr int64_t kBudget = 64, kTokens = 1000;
  KvCache plain = model.NewCache(), bounded = model.NewCache();
  plain.KeepRowsPastWindows();  // the baseline that grows with the context
  size_t plain_peak = 0, bounded_peak = 0;
  // One token, then greedy replies: kTokens steps of one token each.
  testing::PlainTranscript want;
  testing::PlainTurnOptions reference;
  reference.after_step = [&](size_t) {
    plain_peak = std::max(plain_peak, plain.allocated_bytes());
  };
  const absl::Status st = testing::AppendPlainTurn(
      model, {testing::RandomTokens(1, 5, c.vocab_size), kTokens - 1},
      reference, &plain, &want);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(want.size(), static_cast<size_t>(kTokens));

  ResidualStore store(
      c, model.precision(),
      CheckpointLayers(*ParseCheckpointPolicy("kv-direct"), c.n_layers));
  ResidualKvSource source(&store, 0, kBudget);
  testing::ReplayOptions replay;
  replay.kv_source = &source;
  replay.observer = &store;
  replay.after_step = [&](size_t, int64_t) {
    bounded_peak = std::max(bounded_peak, bounded.allocated_bytes());
  };
  const absl::StatusOr<int64_t> mismatches = testing::CountLogitMismatches(
      model, want, 0, want.size(), replay, &bounded);
  ASSERT_TRUE(mismatches.ok()) << mismatches.status();
  EXPECT_EQ(*mismatches, 0);
  const size_t row_pair = c.n_layers * 2 * plain.row_bytes();
  EXPECT_GE(plain_peak, kTokens * row_pair);
  EXPECT_LE(bounded_peak,
            (kBudget + 1 + kernels::cpu::kAttentionChunk) * row_pair);
  std::cout << GetParam().family << " " << PrecisionName(GetParam().precision)
            << ": peak K/V bytes over " << kTokens << " tokens: plain "
            << plain_peak << ", kv-direct B=" << kBudget << " " << bounded_peak
            << " (residual store " << store.size_bytes() << ")\n";
}

TEST_P(BoundedDecode, StepsThatWouldReadDroppedRowsAreRejected) {
  testing::TinyModelSpec spec;
  spec.family = GetParam().family;
  // Windows wider than the sequence: a plain step then reads every row
  // (window_trim_test covers what narrower windows allow).
  spec.sliding_window = 64;
  absl::StatusOr<std::unique_ptr<Model>> model =
      testing::LoadTinyModel(spec, GetParam().precision);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  const std::vector<int32_t> t = testing::RandomTokens(40, 1, c.vocab_size);
  ResidualStore store(
      c, (*model)->precision(),
      CheckpointLayers(*ParseCheckpointPolicy("kv-direct"), c.n_layers));
  ResidualKvSource small(&store, 0, /*budget=*/8);
  KvCache cache = (*model)->NewCache();
  ForwardOutput out;
  SequenceStep first{&cache, t, LogitsMode::kLast, 0, &small};
  ASSERT_TRUE((*model)->Forward({&first, 1}, &out, &store).ok());
  SequenceStep second{&cache, absl::MakeConstSpan(t).subspan(0, 1),
                      LogitsMode::kLast, 0, &small};
  ASSERT_TRUE((*model)->Forward({&second, 1}, &out, &store).ok());
  ASSERT_EQ(cache.first_kept(0), 32);
  // Without the source, or with a wider window, attention would need rows
  // that are gone: refused before anything is written.
  ResidualKvSource wide(&store, 0, /*budget=*/16);
  SequenceStep plain{&cache, absl::MakeConstSpan(t).subspan(0, 1),
                     LogitsMode::kLast, 0};
  SequenceStep widened{&cache, absl::MakeConstSpan(t).subspan(0, 1),
                       LogitsMode::kLast, 0, &wide};
  for (const SequenceStep* step : {&plain, &widened}) {
    EXPECT_EQ((*model)->Forward({step, 1}, &out, &store).code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(cache.length(), 41);
    EXPECT_EQ(cache.first_kept(0), 32);
  }
}

TEST_P(BoundedDecode, CheckRejectsAStoreThatCannotServeTheColdRange) {
  testing::TinyModelSpec spec;
  spec.family = GetParam().family;
  absl::StatusOr<std::unique_ptr<Model>> model =
      testing::LoadTinyModel(spec, GetParam().precision);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  const std::vector<int32_t> t = testing::RandomTokens(10, 1, c.vocab_size);
  // A stride:2 store lacks layer 1; an unattached store lacks the rows.
  ResidualStore strided(c, (*model)->precision(), {0, 2});
  ResidualStore empty(
      c, (*model)->precision(),
      CheckpointLayers(*ParseCheckpointPolicy("kv-direct"), c.n_layers));
  for (const ResidualStore* store : {&strided, &empty}) {
    KvCache cache = (*model)->NewCache();
    SequenceStep first{&cache, t, LogitsMode::kLast, 0};
    ForwardOutput out;
    ASSERT_TRUE((*model)->Forward({&first, 1}, &out).ok());
    ResidualKvSource source(store, 0, /*budget=*/4);
    SequenceStep next{&cache, absl::MakeConstSpan(t).subspan(0, 1),
                      LogitsMode::kLast, 0, &source};
    EXPECT_EQ((*model)->Forward({&next, 1}, &out).code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(cache.length(), 10);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, BoundedDecode,
                         ::testing::ValuesIn(testing::AllFamilyCases()),
                         testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::ops
