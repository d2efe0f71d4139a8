// Sliding-window trimming is exact: on a tiny Gemma-like model (5 local layers
// of window 48 and one global layer), a 3-turn conversation of 308 tokens is
// decoded with the cache dropping local rows past their windows and the
// residual stores trimmed by TrimToWindows after every step. The reference is
// the plain cache that keeps every row (KeepRowsPastWindows), which never
// trims. Checked: logits at every step are bit-identical (plain cache,
// kv-direct B in {0, 16, 64, all}); after every step no cache or store holds
// a row older than its bound; a rebuild from the trimmed checkpoints
// (kv-direct, stride:2, stride:3, tokens) holds exactly the reference's rows
// and the next turn continues bit-identically; and trimming one chunk too far
// is refused rather than computed wrong.
#include <algorithm>
#include <iostream>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/rebuild.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/kvdirect/testing/conversation.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::ops {
namespace {

using kernels::cpu::kAttentionChunk;

constexpr int64_t kWindow = 48;
constexpr int64_t kSeq = 4;
constexpr int kTurnTokens[] = {40, 25, 33};
constexpr int kReplies[] = {70, 70, 70};
constexpr int kCutTurns = 2;  // rebuild after two turns (205 tokens)

CheckpointPolicy Policy(const std::string& name) {
  return *ParseCheckpointPolicy(name);
}

class WindowTrim : public ::testing::TestWithParam<Precision> {
 protected:
  void SetUp() override {
    testing::TinyModelSpec spec;
    spec.family = "gemma3";
    spec.n_layers = 6;  // layers 0-4 local, layer 5 global
    spec.sliding_window = kWindow;
    absl::StatusOr<std::unique_ptr<Model>> model =
        testing::LoadTinyModel(spec, GetParam());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    const ModelConfig& c = model_->config();
    ASSERT_EQ(c.layers[0].sliding_window, kWindow);
    ASSERT_EQ(c.layers[5].sliding_window, 0);

    // The reference: every row kept, never trimmed.
    KvCache cache = model_->NewCache();
    cache.KeepRowsPastWindows();
    const std::vector<testing::ChatTurn> turns =
        testing::RandomTurns(c, kTurnTokens, kReplies, /*first_seed=*/30);
    testing::PlainTurnOptions o;
    o.sequence_id = kSeq;
    for (int turn = 0; turn < 3; ++turn) {
      const absl::Status st =
          testing::AppendPlainTurn(*model_, turns[turn], o, &cache, &want_);
      ASSERT_TRUE(st.ok()) << st;
      if (turn < kCutTurns) cut_step_ = want_.size();
      if (turn == kCutTurns - 1) at_cut_ = std::make_unique<KvCache>(cache);
    }
    ASSERT_EQ(cache.length(), 308);
    reference_ = std::make_unique<KvCache>(std::move(cache));
  }

  int64_t Window(int64_t l) const {
    return model_->config().layers[l].sliding_window;
  }

  std::unique_ptr<Model> model_;
  testing::PlainTranscript want_;
  size_t cut_step_ = 0;
  std::unique_ptr<KvCache> at_cut_, reference_;
};

TEST_P(WindowTrim, PlainCacheDropsLocalRowsAndStaysBitIdentical) {
  const ModelConfig& c = model_->config();
  KvCache cache = model_->NewCache();
  int64_t longest = 0;
  for (const std::vector<int32_t>& t : want_.steps)
    longest = std::max<int64_t>(longest, t.size());
  testing::ReplayOptions replay;
  replay.sequence_id = kSeq;
  replay.after_step = [&](size_t s, int64_t before) {
    for (int64_t l = 0; l < c.n_layers; ++l) {
      ASSERT_EQ(cache.first_kept(l), WindowStart(Window(l), before))
          << "step " << s << " layer " << l;
    }
  };
  const absl::StatusOr<int64_t> mismatches = testing::CountLogitMismatches(
      *model_, want_, 0, want_.size(), replay, &cache);
  ASSERT_TRUE(mismatches.ok()) << mismatches.status();
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(*mismatches, 0);
  // The windows slid: local rows below 308 - 47 - (308 - 47) % 32 are gone.
  EXPECT_EQ(cache.first_kept(0), 256);
  EXPECT_EQ(cache.first_kept(5), 0);
  // Local layers allocate at most window + two chunks + a step, however long
  // the session; the global layer grows with it.
  const size_t pair = 2 * cache.row_bytes();
  EXPECT_LE(cache.allocated_bytes(),
            5 * pair * (kWindow + 2 * kAttentionChunk + longest) +
                pair * 2 * cache.length());
  EXPECT_LT(cache.allocated_bytes(), reference_->allocated_bytes() / 2);
  std::cout << PrecisionName(GetParam()) << " plain K/V allocated: trimmed "
            << cache.allocated_bytes() << " B, untrimmed "
            << reference_->allocated_bytes() << " B at 308 tokens\n";
}

TEST_P(WindowTrim, KvDirectWithTrimmedStoreIsBitIdenticalForEveryBudget) {
  const ModelConfig& c = model_->config();
  const CheckpointPolicy direct = Policy("kv-direct");
  for (int64_t budget :
       {int64_t{0}, int64_t{16}, int64_t{64}, ResidualKvSource::kAll}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    ResidualStore store(c, model_->precision(),
                        CheckpointLayers(direct, c.n_layers));
    ResidualKvSource source(&store, kSeq, budget);
    KvCache cache = model_->NewCache();
    testing::ReplayOptions replay;
    replay.sequence_id = kSeq;
    replay.kv_source = &source;
    replay.observer = &store;
    replay.after_step = [&](size_t s, int64_t before) {
      ASSERT_TRUE(store.status().ok()) << store.status();
      TrimToWindows(c, direct, kSeq, cache.length(), &store);
      const int64_t hot = source.HotBegin(0, before);
      for (int64_t l = 0; l < c.n_layers; ++l) {
        ASSERT_EQ(cache.first_kept(l),
                  std::max(hot, WindowStart(Window(l), before)))
            << "step " << s << " layer " << l;
        // A local layer's residuals reach back to its window's chunk only.
        const int64_t kept = cache.length() - store.first_kept(kSeq, l);
        if (Window(l) > 0) {
          ASSERT_LT(kept, kWindow + kAttentionChunk) << "layer " << l;
        } else {
          ASSERT_EQ(kept, cache.length());
        }
      }
    };
    const absl::StatusOr<int64_t> mismatches = testing::CountLogitMismatches(
        *model_, want_, 0, want_.size(), replay, &cache);
    ASSERT_TRUE(mismatches.ok()) << mismatches.status();
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_EQ(*mismatches, 0);
    const int64_t untrimmed = cache.length() * store.bytes_per_token();
    EXPECT_LT(store.size_bytes(), untrimmed / 2);
    if (budget == 64) {
      std::cout << PrecisionName(GetParam())
                << " kv-direct residual store at 308 tokens: trimmed "
                << store.size_bytes() << " B, untrimmed " << untrimmed
                << " B\n";
    }
  }
}

TEST_P(WindowTrim, RebuildFromTrimmedCheckpointsContinuesBitIdentically) {
  const ModelConfig& c = model_->config();
  const std::vector<std::string> names = {"kv-direct", "stride:2", "stride:3",
                                          "tokens"};
  // Checkpoints of the first two turns, trimmed after every step.
  std::vector<ResidualStore> checkpoints;
  for (const std::string& n : names) {
    checkpoints.emplace_back(c, model_->precision(),
                             CheckpointLayers(Policy(n), c.n_layers));
  }
  std::vector<ResidualStore*> ptrs;
  for (ResidualStore& s : checkpoints) ptrs.push_back(&s);
  testing::FanoutObserver fanout(ptrs);
  KvCache cache = model_->NewCache();
  const std::vector<int32_t> history = want_.TokensBefore(cut_step_);
  for (size_t s = 0; s < cut_step_; ++s) {
    SequenceStep step{&cache, want_.steps[s], LogitsMode::kNone, kSeq};
    ForwardOutput out;
    ASSERT_TRUE(model_->Forward({&step, 1}, &out, &fanout).ok());
    for (size_t p = 0; p < names.size(); ++p) {
      ASSERT_TRUE(checkpoints[p].status().ok());
      TrimToWindows(c, Policy(names[p]), kSeq, cache.length(), &checkpoints[p]);
    }
  }
  const int64_t cut = history.size();
  ASSERT_EQ(cut, 205);
  // What the trimming bought: stride:2's all-local segments start at 64,
  // kv-direct's local layers at 128 (see residual_store_test for the rule).
  EXPECT_EQ(checkpoints[1].first_kept(kSeq, 0), 64);
  EXPECT_EQ(checkpoints[1].first_kept(kSeq, 2), 64);
  EXPECT_EQ(checkpoints[1].first_kept(kSeq, 4), 0);
  EXPECT_EQ(checkpoints[0].first_kept(kSeq, 3), 128);

  for (size_t pi = 0; pi < names.size(); ++pi) {
    const CheckpointPolicy policy = Policy(names[pi]);
    for (int64_t budget :
         {int64_t{0}, int64_t{16}, int64_t{64}, ResidualKvSource::kAll}) {
      SCOPED_TRACE(names[pi] + " budget " + std::to_string(budget));
      ResidualStore session =
          testing::SessionStoreForRebuild(*model_, policy, checkpoints[pi]);
      KvCache rebuilt = model_->NewCache();
      RebuildSpec rs;
      rs.policy = policy;
      rs.tokens = history;
      rs.checkpoint = &checkpoints[pi];
      rs.sequence_id = kSeq;
      rs.budget = budget;
      rs.block = 50;
      ASSERT_TRUE(RebuildKv(*model_, rs, &rebuilt, &session).ok());
      const int64_t hot = budget == ResidualKvSource::kAll
                              ? 0
                              : std::max<int64_t>(0, cut - budget);
      int64_t differing_rows = 0;
      for (int64_t l = 0; l < c.n_layers; ++l) {
        const int64_t first = std::max(hot, WindowStart(Window(l), cut));
        ASSERT_EQ(rebuilt.first_kept(l), first) << "layer " << l;
        differing_rows +=
            testing::CountDifferingRows(rebuilt, *at_cut_, l, first, cut);
        // A rebuilt cold store is trimmed to the windows too.
        if (hot > 0 && policy.kind != CheckpointPolicy::Kind::kKvDirect) {
          EXPECT_EQ(session.first_kept(kSeq, l), WindowStart(Window(l), cut))
              << "layer " << l;
        }
      }
      EXPECT_EQ(differing_rows, 0);

      const bool bounded = budget != ResidualKvSource::kAll;
      ResidualKvSource source(&session, kSeq, budget);
      testing::ReplayOptions replay;
      replay.sequence_id = kSeq;
      replay.kv_source = bounded ? &source : nullptr;
      replay.observer = bounded ? &session : nullptr;
      if (bounded) {
        replay.after_step = [&](size_t, int64_t) {
          TrimToWindows(c, Policy("kv-direct"), kSeq, rebuilt.length(),
                        &session);
        };
      }
      const absl::StatusOr<int64_t> mismatches = testing::CountLogitMismatches(
          *model_, want_, cut_step_, want_.size(), replay, &rebuilt);
      ASSERT_TRUE(mismatches.ok()) << mismatches.status();
      EXPECT_EQ(*mismatches, 0);
    }
  }
}

TEST_P(WindowTrim, TrimmingPastTheBoundIsRefused) {
  const ModelConfig& c = model_->config();
  const CheckpointPolicy direct = Policy("kv-direct");
  ResidualStore store(c, model_->precision(),
                      CheckpointLayers(direct, c.n_layers));
  ResidualKvSource source(&store, kSeq, /*budget=*/16);
  ResidualStore strided(c, model_->precision(),
                        CheckpointLayers(Policy("stride:2"), c.n_layers));
  testing::FanoutObserver fanout({&store, &strided});
  KvCache cache = model_->NewCache();
  const std::vector<int32_t> history = want_.TokensBefore(cut_step_);
  for (size_t s = 0; s < cut_step_; ++s) {
    SequenceStep step{&cache, want_.steps[s], LogitsMode::kNone, kSeq, &source};
    ForwardOutput out;
    ASSERT_TRUE(model_->Forward({&step, 1}, &out, &fanout).ok());
    TrimToWindows(c, direct, kSeq, cache.length(), &store);
  }
  // One chunk more of layer 1's residuals: its window needs them.
  const int64_t bound = store.first_kept(kSeq, 1);
  store.DropBelow(kSeq, 1, bound + kAttentionChunk);
  SequenceStep next{&cache, want_.steps[cut_step_], LogitsMode::kLast, kSeq,
                    &source};
  ForwardOutput out;
  EXPECT_EQ(model_->Forward({&next, 1}, &out, &store).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache.length(), static_cast<int64_t>(history.size()));
  // A local cache row dropped one chunk early: refused, nothing written.
  cache.DropBelow(2, cache.first_kept(2) + kAttentionChunk);
  SequenceStep plain{&cache, want_.steps[cut_step_], LogitsMode::kLast, kSeq};
  EXPECT_EQ(model_->Forward({&plain, 1}, &out).code(),
            absl::StatusCode::kFailedPrecondition);
  // stride:2's segment 0 trimmed to layer 1's own window start only (64 is
  // what the segment needs): the rebuild refuses instead of guessing.
  strided.DropBelow(kSeq, 0, WindowStart(kWindow, history.size()));
  KvCache rebuilt = model_->NewCache();
  ResidualStore cold(c, model_->precision(),
                     CheckpointLayers(direct, c.n_layers));
  RebuildSpec rs;
  rs.policy = Policy("stride:2");
  rs.tokens = history;
  rs.checkpoint = &strided;
  rs.sequence_id = kSeq;
  rs.budget = 16;
  EXPECT_EQ(RebuildKv(*model_, rs, &rebuilt, &cold).code(),
            absl::StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(Precisions, WindowTrim,
                         ::testing::Values(Precision::kF32, Precision::kBf16),
                         [](const ::testing::TestParamInfo<Precision>& info) {
                           return std::string(PrecisionName(info.param));
                         });

}  // namespace
}  // namespace kvd::ops
