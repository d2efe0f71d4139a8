// The engine's K/V block pool (SessionEngineOptions::kv_pool_bytes) is a hard
// memory limit that never changes a bit: a pool too small for every idle
// session demotes the least recently used ones (their later turns restore
// from checkpoints and match an engine with an unlimited pool bit for bit),
// and a pool too small for the running sequences stops the youngest with
// RESOURCE_EXHAUSTED while the others finish exactly as they would alone.
// Also: a waiting prompt demotes idle sessions only
// when that can make room; a re-prefill restore demotes them like a rebuild;
// a prompt larger than the pool is OUT_OF_RANGE, not a retryable 429; a
// foreign pool's exhaustion is not blamed on the engine's pool; bad pool
// options are named by ValidateOptions.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
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
using ::testing::Not;
using LogitsFn = std::function<void(const float*, int64_t)>;

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

  // An on_logits that blocks (on the scheduler thread, so the whole batch
  // waits) until `gate` is notified, then runs `then`.
  static LogitsFn Gated(absl::Notification* gate, LogitsFn then) {
    return [gate, then = std::move(then)](const float* l, int64_t n) {
      gate->WaitForNotification();
      then(l, n);
    };
  }

  // Until `n` sequences are running or queued in the scheduler.
  void WaitForQueued(int64_t n) const {
    while (true) {
      const SchedulerStats s = engine_->stats().scheduler;
      if (s.running + s.waiting >= n) return;
      absl::SleepFor(absl::Milliseconds(1));
    }
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
  // A and B cannot get past their first token (their on_logits holds the
  // scheduler thread) until C is queued behind them: C is admitted while A
  // and B hold little more than their prompts, and is the youngest.
  absl::Notification c_queued;
  for (int i = 0; i < 3; ++i) {
    if (i == 2) {
      WaitForQueued(2);  // A and B running or waiting, in that order
    }
    threads.emplace_back([&, i] {
      GenerateRequest r = Request(i, kTokens, &got[i]);
      if (i < 2) r.on_logits = Gated(&c_queued, std::move(r.on_logits));
      res[i] = engine_->Complete(r, *tokenizer_, nullptr);
    });
  }
  WaitForQueued(3);
  c_queued.Notify();
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
              HasSubstr("raise --kv-pool-mb, or lower --max-inflight"));
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
  // Not RESOURCE_EXHAUSTED (HTTP 429: clients would retry it forever): no
  // amount of waiting makes the pool larger.
  ASSERT_EQ(g.status().code(), absl::StatusCode::kOutOfRange) << g.status();
  EXPECT_THAT(g.status().message(), HasSubstr("the prompt needs"));
  EXPECT_THAT(g.status().message(),
              HasSubstr(absl::StrCat("has ", 2 * layers)));  // pool blocks
  EXPECT_THAT(g.status().message(), HasSubstr("--kv-pool-mb"));
  EXPECT_TRUE(t.logits.empty());
  // A prompt that fits still runs afterwards.
  r.prompt.resize(20);
  EXPECT_TRUE(engine_->Complete(r, *tokenizer_, nullptr).ok());
}

// Review finding: with the head prompt waiting for blocks that running
// sequences hold, Admit used to demote every idle session on every loop
// iteration although that could never make room.
TEST_P(KvPoolTest, WaitingPromptDoesNotDemoteIdleSessionsForNothing) {
  // Windows wider than any sequence here: A's blocks never shrink, so B can
  // fit only once A finishes. (With windows sliding, A soon holds so little
  // that demoting the idle sessions does make room for B, rightly.)
  ops::testing::TinyModelSpec spec;
  spec.n_layers = 3;
  spec.sliding_window = 1024;
  LoadModel(spec);
  const int64_t layers = model_->config().n_layers;
  const int64_t rows = ops::KvBlockPool::kDefaultBlockRows;
  constexpr int kLongPrompt = 200;
  // Measured alone in unlimited pools: A's peak, B's peak; B's admission
  // need is every block of its prompt (nothing dropped yet).
  auto peak_of = [&](const GenerateRequest& r) -> int64_t {
    auto pool = model_->NewBlockPool({});
    EXPECT_TRUE(pool.ok()) << pool.status();
    if (!pool.ok()) return 0;
    {
      ops::KvCache cache = *model_->NewCache(pool->get());
      EXPECT_TRUE(Generate(*model_, *tokenizer_, r, &cache, nullptr).ok());
    }
    return (*pool)->stats().peak_blocks_in_use;
  };
  Transcript scratch;
  GenerateRequest a = Request(0, 40, &scratch);
  a.prompt =
      ops::testing::RandomTokens(kLongPrompt, 7, model_->config().vocab_size);
  GenerateRequest b = Request(1, 4, &scratch);
  b.prompt =
      ops::testing::RandomTokens(kLongPrompt, 8, model_->config().vocab_size);
  const int64_t a_peak = peak_of(a);
  const int64_t b_peak = peak_of(b);
  const int64_t b_need = (kLongPrompt + rows - 1) / rows * layers;

  // Two idle sessions with short turns, measured in an unlimited engine.
  auto make_idle_sessions = [&] {
    for (int i = 0; i < 2; ++i) {
      const std::string id = "idle" + std::to_string(i);
      ASSERT_TRUE(engine_->CreateSession("acme", id, {}).ok());
      TurnRequest r;
      r.tenant = "acme";
      r.session = id;
      r.tokens =
          ops::testing::RandomTokens(8, 20 + i, model_->config().vocab_size);
      r.generate.max_tokens = 2;
      r.generate.ignore_eos = true;
      r.generate.sampling.temperature = 0;
      ASSERT_TRUE(engine_->RunTurn(r, *tokenizer_, nullptr).ok());
    }
  };
  OpenEngine(Options(0));
  make_idle_sessions();
  const int64_t idle = engine_->stats().kv_pool_blocks_used;

  // Room for the idle sessions plus A or B, never A and B together. (The
  // batch prefills a prompt in one step, so a windowed layer holds all of
  // it for a moment, unlike Generate's chunks: b_need bounds that.)
  const int64_t pool_blocks = idle + std::max({a_peak, b_peak, b_need});
  OpenEngine(Options(pool_blocks * BlockBytes()));
  make_idle_sessions();
  ASSERT_EQ(engine_->stats().kv_pool_blocks_used, idle);

  absl::Notification a_at_gate, b_queued;
  Transcript got_a, got_b;
  a.on_logits = [&](const float* l, int64_t n) {
    if (!a_at_gate.HasBeenNotified()) a_at_gate.Notify();
    b_queued.WaitForNotification();
    got_a.logits.emplace_back(l, l + n);
  };
  absl::StatusOr<GenerateResult> res_a, res_b;
  std::thread ta([&] { res_a = engine_->Complete(a, *tokenizer_, nullptr); });
  a_at_gate.WaitForNotification();
  std::thread tb([&] { res_b = engine_->Complete(b, *tokenizer_, nullptr); });
  WaitForQueued(2);
  // The premise: with A's blocks in use, B does not fit even if every idle
  // session were demoted.
  const EngineStats before = engine_->stats();
  EXPECT_LT(pool_blocks - (before.kv_pool_blocks_used - idle), b_need);
  b_queued.Notify();
  ta.join();
  tb.join();
  ASSERT_TRUE(res_a.ok()) << res_a.status();
  ASSERT_TRUE(res_b.ok()) << res_b.status();
  const EngineStats after = engine_->stats();
  EXPECT_EQ(after.sessions_demoted_for_kv, 0);
  EXPECT_TRUE(engine_->IsHot("acme", "idle0"));
  EXPECT_TRUE(engine_->IsHot("acme", "idle1"));
  EXPECT_EQ(after.kv_pool_blocks_used, idle);
}

// Review finding: a re-prefill restore (policy "tokens") failed with
// RESOURCE_EXHAUSTED when idle sessions filled the pool, while a rebuild
// demoted them. Now it demotes too, and the turn is bit-identical to one in
// an unlimited pool.
TEST_P(KvPoolTest, TokensRestoreDemotesIdleSessionsWhenThePoolIsFull) {
  const int64_t layers = model_->config().n_layers;
  const int64_t rows = ops::KvBlockPool::kDefaultBlockRows;
  const int vocab = model_->config().vocab_size;
  constexpr int kFirstTurn = 30, kGenerated = 6;
  struct Outcome {
    Transcript second_turn;
    StatePath path = StatePath::kNew;
    int64_t used_by_idle = 0;  // blocks of the three idle sessions
    int64_t peak_before = 0;   // pool peak before t's second turn
    int64_t demoted_before = 0;
  };
  auto turn = [&](const std::string& id, std::vector<int32_t> tokens,
                  Transcript* t) -> absl::StatusOr<TurnResult> {
    TurnRequest r;
    r.tenant = "acme";
    r.session = id;
    r.tokens = std::move(tokens);
    r.generate.max_tokens = kGenerated;
    r.generate.ignore_eos = true;
    r.generate.sampling.temperature = 0;
    if (t != nullptr) {
      r.generate.on_logits = [t](const float* l, int64_t n) {
        t->logits.emplace_back(l, l + n);
      };
    }
    return engine_->RunTurn(r, *tokenizer_, nullptr);
  };
  auto scenario = [&](int64_t pool_bytes, Outcome* out) {
    SessionEngineOptions o = Options(pool_bytes);
    o.policy = *ops::ParseCheckpointPolicy("tokens");
    OpenEngine(o);
    for (const char* id : {"t", "s0", "s1", "s2"})
      ASSERT_TRUE(engine_->CreateSession("acme", id, {}).ok());
    ASSERT_TRUE(
        turn("t", ops::testing::RandomTokens(kFirstTurn, 1, vocab), nullptr)
            .ok());
    engine_->Suspend("acme", "t");  // its next turn re-prefills
    ASSERT_EQ(engine_->stats().kv_pool_blocks_used, 0);
    // 40-token prompts: no block leaves a sliding window, so a turn's peak
    // is what the session keeps.
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(turn("s" + std::to_string(i),
                       ops::testing::RandomTokens(40, 10 + i, vocab), nullptr)
                      .ok());
    }
    const EngineStats s = engine_->stats();
    out->used_by_idle = s.kv_pool_blocks_used;
    out->peak_before = s.kv_pool_blocks_peak;
    out->demoted_before = s.sessions_demoted_for_kv;
    absl::StatusOr<TurnResult> r =
        turn("t", ops::testing::RandomTokens(20, 2, vocab), &out->second_turn);
    ASSERT_TRUE(r.ok()) << r.status();
    out->second_turn.tokens = r->generation.tokens;
    out->path = r->path;
  };
  Outcome want, got;
  scenario(0, &want);
  ASSERT_EQ(want.path, StatePath::kReprefill);
  // The re-prefill runs t's committed positions in one step from an empty
  // cache, so it needs every block of them; the pool leaves one too few
  // once the idle sessions are in.
  const int64_t committed = kFirstTurn + kGenerated - 1;
  const int64_t need = (committed + rows - 1) / rows * layers;
  const int64_t pool_blocks = want.used_by_idle + need - 1;
  ASSERT_LE(want.peak_before, pool_blocks);  // the idle sessions all fit
  scenario(pool_blocks * BlockBytes(), &got);
  EXPECT_EQ(got.demoted_before, 0);
  EXPECT_EQ(got.used_by_idle, want.used_by_idle);
  EXPECT_EQ(got.path, StatePath::kReprefill);
  EXPECT_TRUE(SameBits(want.second_turn, got.second_turn));
  EXPECT_GT(engine_->stats().sessions_demoted_for_kv, 0);
  EXPECT_TRUE(engine_->IsHot("acme", "t"));
}

// Review finding: any RESOURCE_EXHAUSTED from Forward was taken for the
// scheduler's pool being full (reclaiming idle blocks, blaming the pool).
// A cache of another pool that runs out fails with its own error, and the
// scheduler's pool is left alone.
TEST_P(KvPoolTest, ExhaustedForeignPoolIsNotTakenForTheSchedulersPool) {
  auto shared = model_->NewBlockPool(
      {.budget_bytes = static_cast<size_t>(100 * BlockBytes())});
  ASSERT_TRUE(shared.ok()) << shared.status();
  auto tiny = model_->NewBlockPool(
      {.budget_bytes = static_cast<size_t>(BlockBytes())});  // one block
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  int reclaims = 0;
  SchedulerOptions o;
  o.kv_pool = shared->get();
  o.reclaim_kv = [&reclaims] {
    ++reclaims;
    return false;
  };
  absl::StatusOr<GenerateResult> g;
  {
    Scheduler scheduler(*model_, o);
    ops::KvCache cache = *model_->NewCache(tiny->get());
    Transcript t;
    g = scheduler.Run(*tokenizer_, Request(0, 4, &t), &cache,
                      [](const GenerateDelta&) {});
  }
  ASSERT_EQ(g.status().code(), absl::StatusCode::kResourceExhausted)
      << g.status();
  EXPECT_THAT(g.status().message(), HasSubstr("K/V block pool of"));
  EXPECT_THAT(g.status().message(), Not(HasSubstr("K/V pool of")));
  EXPECT_EQ(reclaims, 0);
}

TEST_P(KvPoolTest, ValidateOptionsNamesTheBadOption) {
  SessionEngineOptions o = Options(1 << 20);
  EXPECT_TRUE(SessionEngine::ValidateOptions(*model_, o).ok());
  o.kv_pool_block_rows = 33;  // splits an attention chunk
  absl::Status s = SessionEngine::ValidateOptions(*model_, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("kv_pool_block_rows is 33"));
  o.kv_pool_block_rows = 0;
  EXPECT_EQ(SessionEngine::ValidateOptions(*model_, o).code(),
            absl::StatusCode::kInvalidArgument);
  o = Options(-1);
  s = SessionEngine::ValidateOptions(*model_, o);
  EXPECT_THAT(s.message(), HasSubstr("--kv-pool-mb"));
  // The constructor falls back to defaults instead of aborting.
  o.kv_pool_block_rows = 33;
  OpenEngine(o);
  Transcript t;
  EXPECT_TRUE(engine_->Complete(Request(0, 2, &t), *tokenizer_, nullptr).ok());
  EXPECT_EQ(engine_->stats().kv_pool_block_bytes, BlockBytes());
}

// Create, for options from a user, returns the error the constructor would
// paper over, and builds a working engine from good options.
TEST_P(KvPoolTest, CreateReturnsErrorsInsteadOfFallingBack) {
  auto store = testing::OpenTestStore(testing::FreshTestDir("create"));
  ASSERT_TRUE(store.ok()) << store.status();
  const v1::ModelIdentity id = ModelIdentityOf(*model_, "sha256:tiny");
  SessionEngineOptions o = Options(1 << 20);
  o.kv_pool_block_rows = 33;
  auto bad = SessionEngine::Create(*model_, id, store->get(), o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("kv_pool_block_rows is 33"));
  o = Options(1 << 20);
  auto good = SessionEngine::Create(*model_, id, store->get(), o);
  ASSERT_TRUE(good.ok()) << good.status();
  Transcript t;
  EXPECT_TRUE((*good)->Complete(Request(0, 2, &t), *tokenizer_, nullptr).ok());
  EXPECT_EQ((*good)->stats().kv_pool_block_bytes, BlockBytes());
}

INSTANTIATE_TEST_SUITE_P(Families, KvPoolTest,
                         ::testing::ValuesIn(ops::testing::AllFamilyCases()),
                         ops::testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::engine
