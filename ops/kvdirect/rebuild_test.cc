// The rebuild API resumes a sequence from its checkpoint bit for bit: for
// every policy (kv-direct, stride:k, tokens) and hot budget B, a fresh cache
// rebuilt at a turn boundary holds exactly the rows the uninterrupted run
// cached for the hot positions, and the next turn's logits (a prefill that
// straddles attention chunks, then 64 greedy decode steps) equal the
// uninterrupted plain-kv run's at every step. The reference never rebuilds.
#include "ops/kvdirect/rebuild.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/kvdirect/testing/conversation.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::ops {
namespace {

using Case = testing::FamilyCase;

constexpr int64_t kSeq = 5;
// Two turns before the interruption, one after: user prefill + greedy replies.
constexpr int kTurnTokens[] = {40, 35, 33};
constexpr int kReplies[] = {60, 60, 64};
constexpr int kCutTurns = 2;

class Rebuild : public ::testing::TestWithParam<Case> {
 protected:
  // The parameter's family with segments of stride:2 and stride:4 that do
  // not divide the depth; gemma3 gets 5 local layers and a global one.
  void SetUp() override {
    testing::TinyModelSpec spec;
    spec.family = GetParam().family;
    spec.n_layers = spec.family == "gemma3" ? 6 : 5;
    absl::StatusOr<std::unique_ptr<Model>> loaded =
        testing::LoadTinyModel(spec, GetParam().precision);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = *std::move(loaded);
  }

  // `policy`'s checkpoint of one forward pass over `tokens` (sequence kSeq).
  ResidualStore Checkpoint(const CheckpointPolicy& policy,
                           const std::vector<int32_t>& tokens) const {
    ResidualStore store = testing::NewStore(*model_, policy);
    KvCache cache = model_->NewCache();
    SequenceStep step{&cache, tokens, LogitsMode::kNone, kSeq};
    ForwardOutput out;
    EXPECT_TRUE(model_->Forward({&step, 1}, &out, &store).ok());
    return store;
  }

  std::unique_ptr<Model> model_;
};

// A unit's cost in prompt tokens, by hand for SmolLM2-135M's shape (d 576,
// 9 query heads and 3 K/V heads of 64, d_ff 1536, 30 layers): a layer's
// multiply-adds per token are 2*576*192 (K, V) + 2*576*576 (Q, O) +
// 3*576*1536 (MLP) = 3,538,944, the K/V projection 221,184 of them, so 480
// rows of one layer's K/V are one prompt token of the whole model.
TEST(RebuildUnit, PromptTokensCountsMultiplyAdds) {
  ModelConfig c;
  c.n_layers = 30;
  c.d_model = 576;
  c.n_heads = 9;
  c.n_kv_heads = 3;
  c.head_dim = 64;
  c.d_ff = 1536;
  EXPECT_DOUBLE_EQ((RebuildUnit{.rows = 480, .kv_layers = 1}).PromptTokens(c),
                   1.0);
  EXPECT_DOUBLE_EQ(
      (RebuildUnit{.rows = 256, .full_layers = 30}).PromptTokens(c), 256.0);
  EXPECT_DOUBLE_EQ((RebuildUnit{.rows = 10, .full_layers = 3}).PromptTokens(c),
                   1.0);
  EXPECT_EQ(RebuildUnit{}.PromptTokens(ModelConfig{}), 0);
}

TEST_P(Rebuild, ContinuedDecodingIsBitIdenticalForEveryPolicyAndBudget) {
  const Model& model = *model_;
  const ModelConfig& c = model.config();

  const std::vector<std::string> policies = {"kv-direct", "stride:2",
                                             "stride:4", "tokens"};
  std::vector<ResidualStore> checkpoints;
  for (const std::string& name : policies) {
    checkpoints.push_back(
        testing::NewStore(model, *ParseCheckpointPolicy(name)));
  }
  std::vector<ResidualStore*> store_ptrs;
  for (ResidualStore& s : checkpoints) store_ptrs.push_back(&s);
  testing::FanoutObserver fanout(store_ptrs);

  // The uninterrupted plain run. Checkpoints observe the first two turns.
  KvCache plain = model.NewCache();
  plain.KeepRowsPastWindows();  // every row, to compare the rebuilt ones with
  testing::PlainTranscript want;
  size_t cut_step = 0;  // the first step after the cut
  const std::vector<testing::ChatTurn> turns =
      testing::RandomTurns(c, kTurnTokens, kReplies, /*first_seed=*/20);
  for (int turn = 0; turn < 3; ++turn) {
    testing::PlainTurnOptions o;
    o.sequence_id = kSeq;
    o.observer = turn < kCutTurns ? &fanout : nullptr;
    const absl::Status st =
        testing::AppendPlainTurn(model, turns[turn], o, &plain, &want);
    ASSERT_TRUE(st.ok()) << st;
    if (turn < kCutTurns) cut_step = want.size();
    // The turn's last reply token is fed at the start of the next turn's
    // prefill in a real chat; here it simply ends the turn.
  }
  for (const ResidualStore& s : checkpoints) ASSERT_TRUE(s.status().ok());
  const std::vector<int32_t> history = want.TokensBefore(cut_step);
  const int64_t cut = history.size();
  ASSERT_EQ(cut, 40 + 60 + 35 + 60);
  ASSERT_EQ(want.size() - cut_step, 65u);

  for (size_t pi = 0; pi < policies.size(); ++pi) {
    const CheckpointPolicy policy = *ParseCheckpointPolicy(policies[pi]);
    for (int64_t budget :
         {int64_t{0}, int64_t{16}, int64_t{64}, ResidualKvSource::kAll}) {
      SCOPED_TRACE(policies[pi] + " budget " + std::to_string(budget));
      // The session's kv-direct store for decoding on: the checkpoint itself
      // for kv-direct, the rebuild's output for the others.
      ResidualStore session =
          testing::SessionStoreForRebuild(model, policy, checkpoints[pi]);
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
        differing_rows +=
            testing::CountDifferingRows(cache, plain, l, first, cut);
      }
      EXPECT_EQ(differing_rows, 0);
      if (budget != ResidualKvSource::kAll) {
        EXPECT_LE(cache.allocated_bytes(),
                  c.n_layers * 2 * cache.row_bytes() *
                      (budget + 2 * kernels::cpu::kAttentionChunk));
        ASSERT_EQ(session.length(kSeq), cut);
      }

      const bool bounded = budget != ResidualKvSource::kAll;
      ResidualKvSource source(&session, kSeq, budget);
      testing::ReplayOptions replay;
      replay.sequence_id = kSeq;
      replay.kv_source = bounded ? &source : nullptr;
      replay.observer = bounded ? &session : nullptr;
      const absl::StatusOr<int64_t> mismatches = testing::CountLogitMismatches(
          model, want, cut_step, want.size(), replay, &cache);
      ASSERT_TRUE(mismatches.ok()) << mismatches.status();
      EXPECT_EQ(*mismatches, 0);
    }
  }
}

TEST_P(Rebuild, RejectsWhatCannotBeRebuilt) {
  testing::TinyModelSpec spec;
  spec.family = GetParam().family;
  absl::StatusOr<std::unique_ptr<Model>> model =
      testing::LoadTinyModel(spec, GetParam().precision);
  ASSERT_TRUE(model.ok()) << model.status();
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

// A caller that lets other work use the model between units (the engine's
// batch stepping while a session restores) gets the same bytes: the hook
// runs another sequence's forward pass at every pause, and the rebuilt K/V
// rows and cold residuals equal those of a rebuild without a hook.
TEST_P(Rebuild, PausingBetweenUnitsChangesNoByte) {
  const Model& model = *model_;
  const ModelConfig& c = model.config();
  const std::vector<int32_t> tokens =
      testing::RandomTokens(230, /*seed=*/7, c.vocab_size);
  const int64_t length = tokens.size();
  constexpr int64_t kBlock = 50;
  const int64_t blocks = (length + kBlock - 1) / kBlock;

  for (const std::string name : {"kv-direct", "stride:2", "tokens"}) {
    const CheckpointPolicy policy = *ParseCheckpointPolicy(name);
    ResidualStore checkpoint = Checkpoint(policy, tokens);
    for (int64_t budget : {int64_t{40}, ResidualKvSource::kAll}) {
      SCOPED_TRACE(name + " budget " + std::to_string(budget));
      RebuildSpec rs;
      rs.policy = policy;
      rs.tokens = tokens;
      rs.checkpoint = &checkpoint;
      rs.sequence_id = kSeq;
      rs.budget = budget;
      rs.block = kBlock;

      ResidualStore want_cold =
          testing::SessionStoreForRebuild(model, policy, checkpoint);
      KvCache want = model.NewCache();
      ASSERT_TRUE(RebuildKv(model, rs, &want, &want_cold).ok());

      // Another sequence decodes one token per pause, as the batch would.
      KvCache other = model.NewCache();
      const std::vector<int32_t> other_tokens =
          testing::RandomTokens(64, /*seed=*/8, c.vocab_size);
      int64_t pauses = 0;
      absl::Status other_status;
      rs.between_units = [&](const RebuildUnit&) {
        const SequenceStep s{&other,
                             absl::MakeConstSpan(other_tokens)
                                 .subspan(pauses % other_tokens.size(), 1),
                             LogitsMode::kLast, 0};
        ForwardOutput out;
        other_status.Update(model.Forward({&s, 1}, &out, nullptr));
        ++pauses;
      };
      ResidualStore got_cold =
          testing::SessionStoreForRebuild(model, policy, checkpoint);
      KvCache got = model.NewCache();
      ASSERT_TRUE(RebuildKv(model, rs, &got, &got_cold).ok());
      ASSERT_TRUE(other_status.ok()) << other_status;

      // Pauses between units only: one unit per block (and per layer for
      // kv-direct, per segment for stride:2, where windows allow).
      EXPECT_GE(pauses, blocks - 1);
      if (name == "tokens") {
        EXPECT_EQ(pauses, blocks - 1);
      }
      if (name == "kv-direct" && budget == ResidualKvSource::kAll &&
          GetParam().family != "gemma3") {
        EXPECT_EQ(pauses, c.n_layers * blocks - 1);
      }

      ASSERT_EQ(got.length(), want.length());
      int64_t differing_rows = 0;
      for (int64_t l = 0; l < c.n_layers; ++l) {
        ASSERT_EQ(got.first_kept(l), want.first_kept(l)) << "layer " << l;
        differing_rows += testing::CountDifferingRows(
            got, want, l, want.first_kept(l), length);
      }
      EXPECT_EQ(differing_rows, 0);

      // The cold residuals the rebuild wrote (stride:k and tokens with a
      // bounded budget) are the same bytes too.
      ASSERT_EQ(got_cold.length(kSeq), want_cold.length(kSeq));
      int64_t differing_residual_rows = 0;
      for (int64_t l : want_cold.layers()) {
        const int64_t first = want_cold.first_kept(kSeq, l);
        ASSERT_EQ(got_cold.first_kept(kSeq, l), first) << "layer " << l;
        const int64_t n = want_cold.length(kSeq) - first;
        if (n <= 0) continue;
        std::vector<float> a(n * c.d_model), b(n * c.d_model);
        ASSERT_TRUE(want_cold.ReadRows(kSeq, l, first, n, a.data()).ok());
        ASSERT_TRUE(got_cold.ReadRows(kSeq, l, first, n, b.data()).ok());
        for (int64_t i = 0; i < n; ++i) {
          differing_residual_rows +=
              std::memcmp(a.data() + i * c.d_model, b.data() + i * c.d_model,
                          c.d_model * sizeof(float)) != 0;
        }
      }
      EXPECT_EQ(differing_residual_rows, 0);
    }
  }
}

// A streamed resume: the checkpoint gets each layer only when the rebuild
// asks for it (await_layer), and the rebuilt rows are the same bytes.
TEST_P(Rebuild, ACheckpointFilledLayerByLayerGivesTheSameBytes) {
  const Model& model = *model_;
  const ModelConfig& c = model.config();
  const std::vector<int32_t> tokens =
      testing::RandomTokens(230, /*seed=*/9, c.vocab_size);
  const int64_t length = tokens.size();

  for (const std::string name : {"kv-direct", "stride:2", "stride:4"}) {
    const CheckpointPolicy policy = *ParseCheckpointPolicy(name);
    ResidualStore whole = Checkpoint(policy, tokens);
    TrimToWindows(c, policy, kSeq, length, &whole);
    // The layers a rebuild reads, in order.
    std::vector<int64_t> reads;
    for (int64_t l = 0; l < c.n_layers;
         l +=
         policy.kind == CheckpointPolicy::Kind::kStride ? policy.stride : 1) {
      reads.push_back(l);
    }
    for (int64_t budget : {int64_t{40}, ResidualKvSource::kAll}) {
      SCOPED_TRACE(name + " budget " + std::to_string(budget));
      RebuildSpec rs;
      rs.policy = policy;
      rs.tokens = tokens;
      rs.checkpoint = &whole;
      rs.sequence_id = kSeq;
      rs.budget = budget;
      rs.block = 50;
      ResidualStore want_cold =
          testing::SessionStoreForRebuild(model, policy, whole);
      KvCache want = model.NewCache();
      ASSERT_TRUE(RebuildKv(model, rs, &want, &want_cold).ok());

      ResidualStore streamed = testing::NewStore(model, policy);
      std::vector<int64_t> awaited;
      rs.checkpoint = &streamed;
      rs.await_layer = [&](int64_t layer) -> absl::Status {
        awaited.push_back(layer);
        const int64_t first = whole.first_kept(kSeq, layer);
        streamed.DropBelow(kSeq, layer, first);
        return streamed.PutRowBytes(kSeq, layer, first, length - first,
                                    whole.RowBytes(kSeq, layer, first));
      };
      ResidualStore got_cold =
          testing::SessionStoreForRebuild(model, policy, whole);
      KvCache got = model.NewCache();
      const absl::Status rebuilt = RebuildKv(model, rs, &got, &got_cold);
      ASSERT_TRUE(rebuilt.ok()) << rebuilt;
      EXPECT_EQ(awaited, reads);
      ASSERT_EQ(got.length(), want.length());
      int64_t differing_rows = 0;
      for (int64_t l = 0; l < c.n_layers; ++l) {
        ASSERT_EQ(got.first_kept(l), want.first_kept(l)) << "layer " << l;
        differing_rows += testing::CountDifferingRows(
            got, want, l, want.first_kept(l), length);
      }
      EXPECT_EQ(differing_rows, 0);

      // A layer that does not arrive ends the rebuild with the reason; one
      // that arrives short is refused before anything reads it.
      ResidualStore failing = testing::NewStore(model, policy);
      rs.checkpoint = &failing;
      rs.await_layer = [&](int64_t layer) -> absl::Status {
        if (layer > 0) return absl::DataLossError("layer gone");
        const int64_t first = whole.first_kept(kSeq, layer);
        failing.DropBelow(kSeq, layer, first);
        return failing.PutRowBytes(kSeq, layer, first, length - 1 - first,
                                   whole.RowBytes(kSeq, layer, first));
      };
      KvCache failed = model.NewCache();
      EXPECT_EQ(RebuildKv(model, rs, &failed, &got_cold).code(),
                absl::StatusCode::kFailedPrecondition);
      failing.Erase(kSeq);
      rs.await_layer = [&](int64_t layer) -> absl::Status {
        if (layer > 0) return absl::DataLossError("layer gone");
        const int64_t first = whole.first_kept(kSeq, layer);
        failing.DropBelow(kSeq, layer, first);
        return failing.PutRowBytes(kSeq, layer, first, length - first,
                                   whole.RowBytes(kSeq, layer, first));
      };
      const absl::Status lost = RebuildKv(model, rs, &failed, &got_cold);
      EXPECT_EQ(lost.code(), absl::StatusCode::kDataLoss) << lost;
      EXPECT_EQ(lost.message(), "layer gone");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Rebuild,
                         ::testing::ValuesIn(testing::AllFamilyCases()),
                         testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::ops
