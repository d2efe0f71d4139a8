// The session engine on the GPU (device test; skips without a CUDA device):
// SessionEngine over ops::CudaBackendModel, with the engine's own KvCaches
// in a device pool. On the random-weight llama and qwen2 cases of the CUDA
// model tests (ops/backend/testing/cuda_model_cases.h):
//   - a conversation demoted to its checkpoint before every turn and
//     restored on the GPU (kv-direct: RecomputeKvIntoCache; stride:2:
//     ForwardLayers; tokens: a re-prefill) gives the same logits, bit for
//     bit, as the same conversation kept hot on the GPU;
//   - a bounded hot window (K/V below it recomputed from residuals inside
//     attention) gives the full cache's bits, on llama and on qwen2 (whose
//     cold recompute adds the k/v bias exactly as the forward pass does);
//   - with two tensor-parallel shards (simulated on the GPU), kv-direct
//     restores (each shard recomputing its own K/V head), stride restores
//     and a bounded hot window are bit-identical to the conversation kept
//     hot; a TP session moves to a single-GPU node by a re-prefill;
//   - greedy tokens agree with the CPU engine's until the first near-tie
//     (the rule of cuda_model_cases.h), and a session checkpointed on the
//     GPU continues on a CPU engine over the same store by a re-prefill,
//     since the two backends' numerics differ.
// Prints "[ <family> engine ] ..." lines that tools/gpu/device_check.sh
// copies into its summary.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ops/backend/cuda_backend_model.h"
#include "ops/backend/cuda_probe.h"
#include "ops/backend/testing/cuda_model_cases.h"
#include "ops/backend/tp_cuda_backend_model.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "services/engine/session_engine.h"
#include "services/engine/testing/engine_fixture.h"

namespace kvd::engine {
namespace {

constexpr int kTurns = 4;
constexpr int kNewTokens = 12;

struct Transcript {
  std::vector<std::vector<float>> logits;  // one per generated token
  std::vector<int32_t> tokens;
  std::vector<StatePath> paths;  // per turn
  std::vector<std::string> details;
  absl::Status status;  // the first failed turn's
};

class CudaEngineTest : public testing::TinyModelTest {
 protected:
  void SetUp() override {
    const ops::DeviceProbe probe = ops::ProbeCudaDevices();
    if (probe.device_count == 0)
      GTEST_SKIP() << "no CUDA device (" << probe.detail << ")";
    LoadModel(ops::testing::CudaCaseSpec(GetParam().family));
    absl::StatusOr<std::unique_ptr<ops::CudaBackendModel>> gpu =
        ops::CudaBackendModel::Create(*model_);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
  }

  void TearDown() override {
    engine_.reset();  // drives the backends and holds the store
    store_.reset();
    tp_.reset();
  }

  // A new engine over `backend` and the store at `dir` (created if missing).
  void Open(const ops::ModelBackend& backend, const std::string& dir,
            const std::string& policy, int64_t hot_budget) {
    engine_.reset();
    store_.reset();
    absl::StatusOr<std::unique_ptr<storage::TieredStore>> store =
        testing::OpenTestStore(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    SessionEngineOptions o;
    o.policy = *ops::ParseCheckpointPolicy(policy);
    o.hot_budget = hot_budget;
    o.chunk_tokens = 16;
    o.kv_pool_bytes = 64 << 20;
    engine_ = std::make_unique<SessionEngine>(
        backend, ModelIdentityOf(backend, "sha256:tiny-cuda-case"),
        store_.get(), o);
  }

  // Turn `turn` of the conversation (its prompt is fixed by the turn).
  void Turn(int turn, Transcript* t) {
    TurnRequest r;
    r.tenant = "acme";
    r.session = "chat-1";
    r.tokens = ops::testing::RandomTokens(9 + 23 * turn, 300 + turn,
                                          model_->config().vocab_size);
    r.generate.max_tokens = kNewTokens;
    r.generate.ignore_eos = true;
    r.generate.sampling.temperature = 0;
    r.generate.on_logits = [t](const float* l, int64_t n) {
      t->logits.emplace_back(l, l + n);
    };
    absl::StatusOr<TurnResult> res = engine_->RunTurn(r, *tokenizer_, nullptr);
    if (!res.ok()) {
      if (t->status.ok()) t->status = res.status();
      return;
    }
    const GenerateResult& g = res->generation;
    t->tokens.insert(t->tokens.end(), g.tokens.begin(), g.tokens.end());
    t->paths.push_back(res->path);
    t->details.push_back(res->path_detail);
  }

  // The whole conversation on `backend` in a fresh store; with `demote`,
  // the session goes back to its checkpoint before every turn but the
  // first.
  Transcript Converse(const ops::ModelBackend& backend,
                      const std::string& policy, int64_t hot_budget,
                      bool demote) {
    Open(backend, testing::FreshTestDir("cuda-engine"), policy, hot_budget);
    Transcript t;
    if (engine_ == nullptr) return t;
    EXPECT_TRUE(engine_->CreateSession("acme", "chat-1", {}).ok());
    for (int turn = 0; turn < kTurns && t.status.ok(); ++turn) {
      if (turn > 0 && demote) engine_->Suspend("acme", "chat-1");
      Turn(turn, &t);
    }
    return t;
  }

  bool bias() const { return model_->config().qkv_bias; }
  const char* family() const { return GetParam().family.c_str(); }

  std::unique_ptr<ops::CudaBackendModel> gpu_;
  std::unique_ptr<ops::TpCudaBackendModel> tp_;
  std::unique_ptr<storage::TieredStore> store_;
  std::unique_ptr<SessionEngine> engine_;
};

TEST_P(CudaEngineTest, RestoredConversationsAreBitIdenticalOnTheGpu) {
  struct Variant {
    std::string policy;
    StatePath restore_path;
  };
  const Variant variants[] = {{"kv-direct", StatePath::kDram},
                              {"stride:2", StatePath::kDram},
                              {"tokens", StatePath::kReprefill}};
  const Transcript hot =
      Converse(*gpu_, "kv-direct", ops::ResidualKvSource::kAll, false);
  ASSERT_TRUE(hot.status.ok()) << hot.status;
  ASSERT_EQ(hot.tokens.size(), static_cast<size_t>(kTurns * kNewTokens));
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.policy);
    const Transcript got =
        Converse(*gpu_, v.policy, ops::ResidualKvSource::kAll, true);
    ASSERT_TRUE(got.status.ok()) << got.status;
    ASSERT_EQ(got.paths.size(), static_cast<size_t>(kTurns));
    for (int i = 1; i < kTurns; ++i) EXPECT_EQ(got.paths[i], v.restore_path);
    const ::testing::AssertionResult same =
        testing::LogitsBitIdentical(hot.logits, got.logits);
    EXPECT_TRUE(same);
    EXPECT_EQ(hot.tokens, got.tokens);
    std::printf("[ %s engine ] %s restores on the GPU: %s\n", family(),
                v.policy.c_str(), same ? "bit-identical" : "DIFFERENT");
  }
}

TEST_P(CudaEngineTest, BoundedHotWindowMatchesTheFullCache) {
  // A node with a bounded --hot-budget starts on the GPU for every family.
  SessionEngineOptions bounded_options;
  bounded_options.hot_budget = 32;
  const absl::Status valid =
      SessionEngine::ValidateOptions(*gpu_, bounded_options);
  EXPECT_TRUE(valid.ok()) << valid;
  const Transcript full =
      Converse(*gpu_, "kv-direct", ops::ResidualKvSource::kAll, false);
  ASSERT_TRUE(full.status.ok()) << full.status;
  // On qwen2 the biases are random (0.1 scale): a cold recompute that
  // dropped the k/v bias would change the logits' bits once K/V below the
  // 32-token window are recomputed, failing the comparison below.
  const Transcript bounded = Converse(*gpu_, "kv-direct", 32, false);
  ASSERT_TRUE(bounded.status.ok()) << bounded.status;
  ASSERT_EQ(bounded.logits.size(), full.logits.size());
  const ::testing::AssertionResult same =
      testing::LogitsBitIdentical(full.logits, bounded.logits);
  EXPECT_TRUE(same);
  EXPECT_EQ(full.tokens, bounded.tokens);
  std::printf("[ %s engine ] hot window 32 vs full cache%s: %s\n", family(),
              bias() ? " (q/k/v bias)" : "",
              same ? "bit-identical" : "DIFFERENT");
}

TEST_P(CudaEngineTest, AgreesWithTheCpuEngineAndMovesToIt) {
  const Transcript gpu =
      Converse(*gpu_, "kv-direct", ops::ResidualKvSource::kAll, false);
  ASSERT_TRUE(gpu.status.ok()) << gpu.status;
  const Transcript cpu =
      Converse(*model_, "kv-direct", ops::ResidualKvSource::kAll, false);
  ASSERT_TRUE(cpu.status.ok()) << cpu.status;
  ASSERT_EQ(gpu.logits.size(), cpu.logits.size());

  // Tokens agree until the first step whose CPU top-2 margin a rounding
  // difference can explain; a divergence anywhere else fails.
  double max_diff = 0;
  size_t agreed = 0;
  bool near_tie_stop = false;
  for (size_t i = 0; i < cpu.tokens.size(); ++i) {
    for (size_t j = 0; j < cpu.logits[i].size(); ++j) {
      max_diff = std::max(
          max_diff,
          std::fabs(static_cast<double>(gpu.logits[i][j]) - cpu.logits[i][j]));
    }
    if (gpu.tokens[i] != cpu.tokens[i]) {
      const float margin = ops::testing::Top2Margin(cpu.logits[i]);
      EXPECT_LT(margin, 2 * max_diff)
          << "token " << i << " differs at a CPU margin of " << margin;
      near_tie_stop = true;
      break;
    }
    ++agreed;
  }
  EXPECT_LT(max_diff, ops::testing::kMaxLogitDiff);
  std::printf(
      "[ %s engine ] GPU vs CPU engine: %zu/%zu greedy tokens agree%s, max "
      "|logit diff| %.4f before\n",
      family(), agreed, cpu.tokens.size(),
      near_tie_stop ? " (then a near-tie)" : "", max_diff);

  // A session the GPU checkpointed continues on a CPU engine over the same
  // store: its residuals are the GPU's numerics, so it is re-prefilled.
  const std::string dir = testing::FreshTestDir("cuda-to-cpu");
  Open(*gpu_, dir, "kv-direct", ops::ResidualKvSource::kAll);
  ASSERT_NE(engine_, nullptr);
  ASSERT_TRUE(engine_->CreateSession("acme", "chat-1", {}).ok());
  Transcript moved;
  Turn(0, &moved);
  Turn(1, &moved);
  Open(*model_, dir, "kv-direct", ops::ResidualKvSource::kAll);
  ASSERT_NE(engine_, nullptr);
  Turn(2, &moved);
  ASSERT_TRUE(moved.status.ok()) << moved.status;
  ASSERT_EQ(moved.paths.size(), 3u);
  EXPECT_EQ(moved.paths[2], StatePath::kReprefill);
  EXPECT_NE(moved.details[2].find("numerics version"), std::string::npos)
      << moved.details[2];
  std::printf("[ %s engine ] GPU session resumed on the CPU: %s (%s)\n",
              family(), StatePathName(moved.paths[2]),
              moved.details[2].c_str());
}

TEST_P(CudaEngineTest, TensorParallelSessionsRestoreBitIdenticallyOnShards) {
  // Two shards simulated on the GPU, each holding one of the two K/V heads:
  // a kv-direct restore has every shard recompute its own head from the
  // replicated residual checkpoint, and a stride restore runs the sharded
  // layers.
  ops::TpCudaBackendOptions o;
  o.degree = 2;
  absl::StatusOr<std::unique_ptr<ops::TpCudaBackendModel>> made =
      ops::TpCudaBackendModel::Create(*model_, o);
  ASSERT_TRUE(made.ok()) << made.status();
  // A fixture member: the engine over it is reset first in TearDown, even
  // when an assertion below ends the test early.
  tp_ = std::move(*made);
  const ops::TpCudaBackendModel& tp = *tp_;
  const Transcript hot =
      Converse(tp, "kv-direct", ops::ResidualKvSource::kAll, false);
  ASSERT_TRUE(hot.status.ok()) << hot.status;
  for (const char* policy : {"kv-direct", "stride:2"}) {
    SCOPED_TRACE(policy);
    const Transcript got =
        Converse(tp, policy, ops::ResidualKvSource::kAll, true);
    ASSERT_TRUE(got.status.ok()) << got.status;
    ASSERT_EQ(got.paths.size(), static_cast<size_t>(kTurns));
    for (int i = 1; i < kTurns; ++i) EXPECT_EQ(got.paths[i], StatePath::kDram);
    const ::testing::AssertionResult same =
        testing::LogitsBitIdentical(hot.logits, got.logits);
    EXPECT_TRUE(same);
    EXPECT_EQ(hot.tokens, got.tokens);
    std::printf("[ %s engine ] TP 2 %s restores on shards: %s\n", family(),
                policy, same ? "bit-identical" : "DIFFERENT");
  }

  // A bounded hot window: each shard recomputes its own heads' cold K/V
  // inside attention, and the logits are the full cache's bits.
  SessionEngineOptions bounded_options;
  bounded_options.hot_budget = 32;
  const absl::Status valid =
      SessionEngine::ValidateOptions(tp, bounded_options);
  EXPECT_TRUE(valid.ok()) << valid;
  const Transcript bounded = Converse(tp, "kv-direct", 32, false);
  ASSERT_TRUE(bounded.status.ok()) << bounded.status;
  ASSERT_EQ(bounded.logits.size(), hot.logits.size());
  const ::testing::AssertionResult same_window =
      testing::LogitsBitIdentical(hot.logits, bounded.logits);
  EXPECT_TRUE(same_window);
  EXPECT_EQ(hot.tokens, bounded.tokens);
  std::printf("[ %s engine ] TP 2 hot window 32 vs full cache: %s\n", family(),
              same_window ? "bit-identical" : "DIFFERENT");

  // A session saved at TP 2 moves to a single-GPU node: other numerics (the
  // W_o and W_down sums differ), so it is re-prefilled from its tokens.
  const std::string dir = testing::FreshTestDir("tp-to-single");
  Open(tp, dir, "kv-direct", ops::ResidualKvSource::kAll);
  ASSERT_NE(engine_, nullptr);
  ASSERT_TRUE(engine_->CreateSession("acme", "chat-1", {}).ok());
  Transcript moved;
  Turn(0, &moved);
  Open(*gpu_, dir, "kv-direct", ops::ResidualKvSource::kAll);
  ASSERT_NE(engine_, nullptr);
  Turn(1, &moved);
  ASSERT_TRUE(moved.status.ok()) << moved.status;
  ASSERT_EQ(moved.paths.size(), 2u);
  EXPECT_EQ(moved.paths[1], StatePath::kReprefill);
  std::printf("[ %s engine ] TP 2 session resumed on one GPU: %s (%s)\n",
              family(), StatePathName(moved.paths[1]),
              moved.details[1].c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Families, CudaEngineTest,
    ::testing::Values(ops::testing::FamilyCase{"llama", ops::Precision::kBf16},
                      ops::testing::FamilyCase{"qwen2", ops::Precision::kBf16}),
    ops::testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::engine
