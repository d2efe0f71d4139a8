// The engine's K/V block pool (SessionEngineOptions::kv_pool_bytes) is a hard
// memory limit that never changes a bit: a pool too small for every idle
// session demotes the least recently used ones (their later turns restore
// from checkpoints and match an engine with an unlimited pool bit for bit),
// and a pool too small for the running sequences stops the youngest with
// RESOURCE_EXHAUSTED while the others finish exactly as they would alone.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"
#include "services/engine/session_engine.h"
#include "services/engine/testing/engine_fixture.h"

namespace kvd::engine {
namespace {

using ::testing::HasSubstr;

struct Transcript {
  std::vector<std::vector<float>> logits;  // per sampled token
  std::vector<int32_t> tokens;
};

::testing::AssertionResult SameBits(const Transcript& a, const Transcript& b) {
  if (a.tokens != b.tokens) return ::testing::AssertionFailure() << "tokens";
  return testing::LogitsBitIdentical(a.logits, b.logits);
}

class KvPoolTest : public testing::EngineTest {
 protected:
  void SetUp() override {
    ops::testing::TinyModelSpec spec;
    spec.n_layers = 3;
    spec.sliding_window = 24;
    LoadModel(spec);
  }

  int64_t BlockBytes() const {
    return 2 * ops::KvBlockPool::kDefaultBlockRows *
           ops::KvCache::RowBytes(model_->config(), model_->precision());
  }

  static SessionEngineOptions Options(int64_t pool_bytes) {
    SessionEngineOptions o;
    o.policy = *ops::ParseCheckpointPolicy("kv-direct");
    o.chunk_tokens = 16;
    o.max_hot_sessions = 8;
    o.kv_pool_bytes = pool_bytes;
    o.scheduler.max_running = 4;
    return o;
  }

  GenerateRequest Request(int i, int max_tokens, Transcript* t) const {
    GenerateRequest r;
    r.prompt = ops::testing::RandomTokens(30 + 7 * i, 100 + i,
                                          model_->config().vocab_size);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    r.on_logits = [t](const float* l, int64_t n) {
      t->logits.emplace_back(l, l + n);
    };
    return r;
  }

  // Two turns of each of four sessions, one at a time; every turn's tokens,
  // logits and restore path.
  std::vector<Transcript> Conversations(std::vector<StatePath>* paths) {
    std::vector<Transcript> out;
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(
          engine_->CreateSession("acme", "s" + std::to_string(i), {}).ok());
    }
    for (int turn = 0; turn < 2; ++turn) {
      for (int i = 0; i < 4; ++i) {
        out.emplace_back();
        TurnRequest r;
        r.tenant = "acme";
        r.session = "s" + std::to_string(i);
        r.generate = Request(i + 4 * turn, 6, &out.back());
        r.tokens = std::move(r.generate.prompt);
        r.generate.prompt.clear();
        absl::StatusOr<TurnResult> res =
            engine_->RunTurn(r, *tokenizer_, nullptr);
        EXPECT_TRUE(res.ok()) << res.status();
        if (!res.ok()) continue;
        out.back().tokens = res->generation.tokens;
        paths->push_back(res->path);
        const EngineStats s = engine_->stats();
        if (s.kv_pool_blocks_total > 0) {
          EXPECT_LE(s.kv_pool_blocks_used, s.kv_pool_blocks_total);
        }
      }
    }
    return out;
  }
};

TEST_P(KvPoolTest, SmallPoolDemotesIdleSessionsAndStaysBitIdentical) {
  std::vector<StatePath> want_paths, got_paths;
  OpenEngine(Options(/*unlimited*/ 0));
  const std::vector<Transcript> want = Conversations(&want_paths);
  EXPECT_EQ(engine_->stats().sessions_demoted, 0);

  // Room for about two sessions' K/V after their first turn: 36-57 prompt
  // tokens + 6 generated hold 2 blocks per layer.
  OpenEngine(Options(5 * model_->config().n_layers * BlockBytes()));
  const std::vector<Transcript> got = Conversations(&got_paths);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(SameBits(want[i], got[i])) << "turn " << i;
  const EngineStats s = engine_->stats();
  EXPECT_GT(s.sessions_demoted_for_kv, 0);
  EXPECT_EQ(s.kv_pool_blocks_total, 5 * model_->config().n_layers);
  EXPECT_LE(s.kv_pool_blocks_peak, s.kv_pool_blocks_total);
  EXPECT_GT(s.kv_pool_blocks_used, 0);
  // With every session hot in the reference, the small pool made some
  // second turns restore from the DRAM tier instead.
  EXPECT_EQ(want_paths[5], StatePath::kHot);
  int restored = 0;
  for (size_t i = 4; i < got_paths.size(); ++i)
    restored += got_paths[i] == StatePath::kDram;
  EXPECT_GT(restored, 0);
}

TEST_P(KvPoolTest, FullPoolStopsTheYoungestAndTheOthersFinishExactly) {
  // The pool holds what A and B need at their peaks alone (measured) plus
  // one block, so C (admitted last) is stopped when the three together
  // outgrow it.
  constexpr int kTokens = 150;
  Transcript ref[2];
  int64_t peaks = 0;
  for (int i = 0; i < 2; ++i) {
    GenerateRequest r = Request(i, kTokens, &ref[i]);
    auto pool = model_->NewBlockPool({});
    ASSERT_TRUE(pool.ok()) << pool.status();
    {
      ops::KvCache cache = *model_->NewCache(pool->get());
      absl::StatusOr<GenerateResult> g =
          Generate(*model_, *tokenizer_, r, &cache, nullptr);
      ASSERT_TRUE(g.ok()) << g.status();
      ref[i].tokens = g->tokens;
    }
    peaks += (*pool)->stats().peak_blocks_in_use;
  }
  OpenEngine(Options((peaks + 1) * BlockBytes()));

  Transcript got[3];
  absl::StatusOr<GenerateResult> res[3];
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    if (i == 2) {
      // C arrives once A and B run, so it is the youngest.
      while (engine_->stats().scheduler.running < 2)
        absl::SleepFor(absl::Milliseconds(1));
    }
    threads.emplace_back([&, i] {
      res[i] =
          engine_->Complete(Request(i, kTokens, &got[i]), *tokenizer_, nullptr);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(res[i].ok()) << i << ": " << res[i].status();
    got[i].tokens = res[i]->tokens;
    EXPECT_TRUE(SameBits(ref[i], got[i])) << "sequence " << i;
  }
  ASSERT_EQ(res[2].status().code(), absl::StatusCode::kResourceExhausted)
      << res[2].status();
  EXPECT_THAT(res[2].status().message(), HasSubstr("K/V pool of"));
  EXPECT_THAT(res[2].status().message(),
              HasSubstr("raise --kv-pool-mb or lower --max-running"));
  EXPECT_LT(got[2].logits.size(), static_cast<size_t>(kTokens));
  EXPECT_EQ(engine_->stats().kv_pool_blocks_used, 0);  // all given back
}

TEST_P(KvPoolTest, PromptThatCannotFitAloneIsRefused) {
  const int64_t layers = model_->config().n_layers;
  OpenEngine(Options(2 * layers * BlockBytes()));  // 64 positions
  Transcript t;
  GenerateRequest r = Request(0, 4, &t);
  r.prompt = ops::testing::RandomTokens(100, 3, model_->config().vocab_size);
  absl::StatusOr<GenerateResult> g = engine_->Complete(r, *tokenizer_, nullptr);
  ASSERT_EQ(g.status().code(), absl::StatusCode::kResourceExhausted)
      << g.status();
  EXPECT_THAT(g.status().message(), HasSubstr("the prompt needs"));
  EXPECT_TRUE(t.logits.empty());
  // A prompt that fits still runs afterwards.
  r.prompt.resize(20);
  EXPECT_TRUE(engine_->Complete(r, *tokenizer_, nullptr).ok());
}

INSTANTIATE_TEST_SUITE_P(Families, KvPoolTest,
                         ::testing::ValuesIn(ops::testing::AllFamilyCases()),
                         ops::testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::engine
