// The engine drives its model only through ops::ModelBackend, the interface a
// CUDA backend implements: a conversation over CountingBackendForTest (a
// counting double around the CPU Model, testing/counting_backend.h), demoted
// to its checkpoint before every turn and restored by a rebuild (kv-direct:
// RecomputeKvIntoCache; stride:2: ForwardLayers) or a re-prefill (tokens:
// Forward), generates the same tokens, logits and logprobs, bit for bit, as
// the same conversation over the Model itself that never goes cold. The
// double's counters show the restores and steps really went through the
// interface, with caches made through it.
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"
#include "services/engine/session_engine.h"
#include "services/engine/testing/counting_backend.h"
#include "services/engine/testing/engine_fixture.h"

namespace kvd::engine {
namespace {

using testing::CountingBackendForTest;

constexpr int kTurns = 4;
constexpr int kLayers = 4;

struct Transcript {
  std::vector<std::vector<float>> logits;  // one entry per generated step
  std::vector<int32_t> tokens;             // every generated token
  std::vector<ops::LogProbs> logprobs;     // one per generated token
  std::vector<StatePath> paths;            // per turn
};

// Success if both hold the same tokens and the same logprobs: ids equal and
// every float with the same bits.
::testing::AssertionResult LogProbsBitIdentical(
    const std::vector<ops::LogProbs>& want,
    const std::vector<ops::LogProbs>& got) {
  if (want.size() != got.size()) {
    return ::testing::AssertionFailure()
           << got.size() << " logprobs, want " << want.size();
  }
  auto same = [](const ops::TokenLogProb& a, const ops::TokenLogProb& b) {
    return a.token == b.token &&
           std::memcmp(&a.logprob, &b.logprob, sizeof(float)) == 0;
  };
  for (size_t i = 0; i < want.size(); ++i) {
    bool ok = same(want[i].chosen, got[i].chosen) &&
              want[i].top.size() == got[i].top.size();
    for (size_t j = 0; ok && j < want[i].top.size(); ++j)
      ok = same(want[i].top[j], got[i].top[j]);
    if (!ok)
      return ::testing::AssertionFailure() << "token " << i << " differs";
  }
  return ::testing::AssertionSuccess();
}

struct Variant {
  std::string policy;
  int64_t hot_budget;
  StatePath restore_path;  // how a demoted session comes back
};

const Variant kVariants[] = {
    {"kv", ops::ResidualKvSource::kAll, StatePath::kDram},
    {"kv-direct", ops::ResidualKvSource::kAll, StatePath::kDram},
    {"kv-direct", 16, StatePath::kDram},
    {"stride:2", ops::ResidualKvSource::kAll, StatePath::kDram},
    {"tokens", ops::ResidualKvSource::kAll, StatePath::kReprefill},
};

class BackendInterfaceTest : public testing::EngineTest {
 protected:
  void SetUp() override {
    ops::testing::TinyModelSpec spec;
    spec.n_layers = kLayers;
    spec.sliding_window = 24;  // gemma3: windows slide within the test
    LoadModel(spec);
  }

  // The engine refers to the backend: it goes first.
  void TearDown() override { engine_.reset(); }

  // Runs the conversation in a new engine of `v` over `backend` (null: the
  // Model itself); with `demote`, the session is sent back to its checkpoint
  // before every turn but the first.
  Transcript Converse(const Variant& v, const ops::ModelBackend* backend,
                      bool demote,
                      const std::function<void(int turn)>& before_turn = {}) {
    SessionEngineOptions o;
    o.policy = *ops::ParseCheckpointPolicy(v.policy);
    o.hot_budget = v.hot_budget;
    o.chunk_tokens = 16;
    OpenEngine(o, backend);
    Transcript t;
    if (engine_ == nullptr) return t;
    EXPECT_TRUE(engine_->CreateSession("acme", "chat-1", {}).ok());
    for (int turn = 0; turn < kTurns; ++turn) {
      if (turn > 0 && demote) {
        engine_->Suspend("acme", "chat-1");
        EXPECT_FALSE(engine_->IsHot("acme", "chat-1"));
      }
      if (before_turn) before_turn(turn);
      TurnRequest r;
      r.tenant = "acme";
      r.session = "chat-1";
      r.tokens = ops::testing::RandomTokens(9 + 7 * turn, 100 + turn,
                                            model_->config().vocab_size);
      r.generate.max_tokens = 11;
      r.generate.ignore_eos = true;
      r.generate.sampling.temperature = 0;
      r.generate.logprobs = true;
      r.generate.top_logprobs = 3;
      r.generate.on_logits = [&t](const float* l, int64_t n) {
        t.logits.emplace_back(l, l + n);
      };
      absl::StatusOr<TurnResult> res =
          engine_->RunTurn(r, *tokenizer_, nullptr);
      EXPECT_TRUE(res.ok()) << res.status();
      if (!res.ok()) break;
      const GenerateResult& g = res->generation;
      t.tokens.insert(t.tokens.end(), g.tokens.begin(), g.tokens.end());
      t.logprobs.insert(t.logprobs.end(), g.logprobs.begin(), g.logprobs.end());
      t.paths.push_back(res->path);
    }
    return t;
  }
};

TEST_P(BackendInterfaceTest, RestoresThroughTheInterfaceAreBitIdentical) {
  using C = CountingBackendForTest;
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.policy + " hot budget " + std::to_string(v.hot_budget));
    const Transcript want = Converse(v, nullptr, /*demote=*/false);
    ASSERT_EQ(want.paths.size(), kTurns);
    for (int i = 1; i < kTurns; ++i) ASSERT_EQ(want.paths[i], StatePath::kHot);

    engine_.reset();
    auto backend = std::make_unique<CountingBackendForTest>(*model_);
    const Transcript got = Converse(v, backend.get(), /*demote=*/true);
    engine_.reset();  // before the backend it drives
    ASSERT_EQ(got.paths.size(), kTurns);
    for (int i = 1; i < kTurns; ++i) EXPECT_EQ(got.paths[i], v.restore_path);

    ASSERT_TRUE(testing::LogitsBitIdentical(want.logits, got.logits));
    EXPECT_EQ(want.tokens, got.tokens);
    ASSERT_EQ(got.logprobs.size(), got.tokens.size());
    EXPECT_TRUE(LogProbsBitIdentical(want.logprobs, got.logprobs));

    // Every step, pool and cache went through the double.
    const std::string calls = backend->Summary();
    EXPECT_EQ(backend->calls(C::kNewBlockPool), 1) << calls;
    EXPECT_GE(backend->calls(C::kNewCache), kTurns) << calls;
    EXPECT_GE(backend->calls(C::kForward), kTurns * 11) << calls;
    EXPECT_EQ(backend->foreign_caches(), 0) << calls;
    // Each restore rebuilds every layer once (a session is shorter than one
    // rebuild block), or runs each stride segment's first layer and
    // recomputes its last one's K/V, or copies every layer's K/V rows back
    // (kv: one write per stored chunk a layer's window reaches, so at least
    // one per layer); tokens re-prefills. kv reads rows at every commit.
    const int64_t restores = kTurns - 1;
    int64_t recomputes = 0, partial_forwards = 0;
    if (v.policy == "kv-direct") recomputes = restores * kLayers;
    if (v.policy == "stride:2") {
      partial_forwards = restores * kLayers / 2;
      recomputes = restores * kLayers / 2;
    }
    EXPECT_EQ(backend->calls(C::kRecomputeKvIntoCache), recomputes) << calls;
    EXPECT_EQ(backend->calls(C::kForwardLayers), partial_forwards) << calls;
    if (v.policy == "kv") {
      EXPECT_GE(backend->calls(C::kWriteKvRows), restores * kLayers) << calls;
      EXPECT_GE(backend->calls(C::kReadKvRows), kTurns * kLayers) << calls;
    } else {
      EXPECT_EQ(backend->calls(C::kWriteKvRows), 0) << calls;
      EXPECT_EQ(backend->calls(C::kReadKvRows), 0) << calls;
    }
  }
}

// A hot session whose K/V the backend loses just as its turn starts (a
// tensor-parallel shard worker died between the engine's check and the first
// step) is rebuilt from its checkpoint within the same turn: the turn
// succeeds, with the bits of a conversation that lost nothing.
TEST_P(BackendInterfaceTest, KvLostAtATurnsFirstStepIsRebuiltWithinTheTurn) {
  const Variant v{"kv-direct", ops::ResidualKvSource::kAll, StatePath::kDram};
  const Transcript want = Converse(v, nullptr, /*demote=*/false);
  ASSERT_EQ(want.paths.size(), kTurns);

  engine_.reset();
  auto backend = std::make_unique<CountingBackendForTest>(*model_);
  const Transcript got =
      Converse(v, backend.get(), /*demote=*/false, [&](int turn) {
        if (turn == 2) backend->LoseKvAtNextForward();
      });
  engine_.reset();  // before the backend it drives
  ASSERT_EQ(got.paths.size(), kTurns);
  EXPECT_EQ(got.paths[1], StatePath::kHot);
  EXPECT_EQ(got.paths[2], v.restore_path);  // rebuilt, not failed
  EXPECT_EQ(got.paths[3], StatePath::kHot);
  ASSERT_TRUE(testing::LogitsBitIdentical(want.logits, got.logits));
  EXPECT_EQ(want.tokens, got.tokens);
  EXPECT_TRUE(LogProbsBitIdentical(want.logprobs, got.logprobs));
  // Its one restore recomputed every layer.
  EXPECT_EQ(backend->calls(CountingBackendForTest::kRecomputeKvIntoCache),
            kLayers)
      << backend->Summary();
}

INSTANTIATE_TEST_SUITE_P(Families, BackendInterfaceTest,
                         ::testing::ValuesIn(ops::testing::AllFamilyCases()),
                         ops::testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::engine
