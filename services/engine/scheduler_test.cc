// Continuous batching changes nothing a sequence computes: the same requests
// run one at a time through Generate (the reference: one sequence per
// Forward, a fixed prefill chunk) and 16 at a time through the engine's
// Scheduler (threads calling Complete / RunTurn together, prompts of
// different lengths so prefill chunks and decode steps share batches, a
// smaller prefill budget so chunks split differently) give bit-identical
// logits at every step, the same tokens and the same streamed text. Also:
// cancelling one sequence mid-batch leaves the others' bits alone and commits
// nothing; the queue bound refuses with RESOURCE_EXHAUSTED; the K/V byte
// budget demotes least recently used sessions; restore jobs run on the
// scheduler thread and let the batch step once per restore budget.
#include "services/engine/scheduler.h"

#include <atomic>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"
#include "services/engine/session_engine.h"
#include "services/engine/testing/engine_fixture.h"

namespace kvd::engine {
namespace {

constexpr int kConcurrent = 16;

struct Transcript {
  std::vector<std::vector<float>> logits;  // one entry per sampled token
  std::vector<int32_t> tokens;
  std::string text;         // as streamed through on_text
  std::string result_text;  // GenerateResult::text
  FinishReason finish = FinishReason::kLength;
};

void ExpectSameBits(const Transcript& want, const Transcript& got,
                    const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(testing::LogitsBitIdentical(want.logits, got.logits));
  EXPECT_EQ(want.tokens, got.tokens);
  EXPECT_EQ(want.text, got.text);
  EXPECT_EQ(want.result_text, got.result_text);
  EXPECT_EQ(got.text, got.result_text);
  EXPECT_EQ(want.finish, got.finish);
}

class SchedulerTest : public testing::EngineTest {
 protected:
  void SetUp() override {
    ops::testing::TinyModelSpec spec;
    spec.n_layers = 3;
    spec.sliding_window = 24;  // gemma3: windows slide within the prompts
    LoadModel(spec);
  }

  // Request i: prompt lengths from 3 to ~300 tokens (some longer than one
  // prefill budget), greedy and seeded sampling, with and without EOG stops.
  GenerateRequest Request(int i) const {
    GenerateRequest r;
    r.prompt = ops::testing::RandomTokens(3 + (i * 53) % 300, 500 + i,
                                          model_->config().vocab_size);
    r.max_tokens = 8 + i % 5;
    r.ignore_eos = i % 3 != 0;
    if (i % 2 == 1) {
      r.sampling.temperature = 0.9f;
      r.sampling.top_k = 40;
      r.sampling.seed = 77 + i;
    } else {
      r.sampling.temperature = 0;
    }
    return r;
  }

  // Hooks `r`'s callbacks up to `t`; `cancel_after` >= 0 cancels the
  // sequence once that many tokens were sampled.
  static std::function<void(std::string_view)> Record(GenerateRequest& r,
                                                      Transcript* t,
                                                      int cancel_after = -1) {
    r.on_logits = [t](const float* l, int64_t n) {
      t->logits.emplace_back(l, l + n);
    };
    if (cancel_after >= 0) {
      r.cancelled = [t, cancel_after] {
        return static_cast<int>(t->logits.size()) >= cancel_after;
      };
    }
    return [t](std::string_view s) { t->text.append(s.data(), s.size()); };
  }

  static void Keep(const GenerateResult& g, Transcript* t) {
    t->tokens = g.tokens;
    t->result_text = g.text;
    t->finish = g.finish_reason;
  }

  // The reference: Generate alone, one request at a time.
  Transcript Reference(GenerateRequest r) {
    Transcript t;
    auto on_text = Record(r, &t);
    ops::KvCache cache = model_->NewCache();
    absl::StatusOr<GenerateResult> g =
        Generate(*model_, *tokenizer_, r, &cache, on_text);
    EXPECT_TRUE(g.ok()) << g.status();
    if (g.ok()) Keep(*g, &t);
    return t;
  }

  static SessionEngineOptions BatchingOptions() {
    SessionEngineOptions o;
    o.policy = *ops::ParseCheckpointPolicy("kv-direct");
    o.hot_budget = 16;  // attention recomputes old K/V from residuals
    o.chunk_tokens = 16;
    o.max_hot_sessions = kConcurrent;
    o.scheduler.max_running = kConcurrent;
    o.scheduler.prefill_tokens_per_step = 96;
    return o;
  }

  static std::string SessionId(int i) { return "chat-" + std::to_string(i); }

  // Turn `turn` of session i: its new tokens and sampling.
  TurnRequest Turn(int i, int turn) const {
    TurnRequest r;
    r.tenant = "acme";
    r.session = SessionId(i);
    r.generate = Request(i + 3 * turn);
    r.tokens = std::move(r.generate.prompt);
    r.generate.prompt.clear();
    return r;
  }

  // Every session's turns, one session and one turn at a time.
  std::vector<std::vector<Transcript>> SequentialTurns(int sessions,
                                                       int turns) {
    OpenEngine(BatchingOptions());
    std::vector<std::vector<Transcript>> out(sessions);
    for (int i = 0; i < sessions; ++i) {
      EXPECT_TRUE(engine_->CreateSession("acme", SessionId(i), {}).ok());
      for (int turn = 0; turn < turns; ++turn) {
        TurnRequest r = Turn(i, turn);
        Transcript t;
        auto on_text = Record(r.generate, &t);
        absl::StatusOr<TurnResult> res =
            engine_->RunTurn(r, *tokenizer_, on_text);
        EXPECT_TRUE(res.ok()) << res.status();
        if (res.ok()) Keep(res->generation, &t);
        out[i].push_back(std::move(t));
      }
    }
    return out;
  }
};

TEST_P(SchedulerTest, ConcurrentCompletionsMatchOneAtATime) {
  std::vector<Transcript> want;
  for (int i = 0; i < kConcurrent; ++i) want.push_back(Reference(Request(i)));

  OpenEngine(BatchingOptions());
  std::vector<Transcript> got(kConcurrent);
  std::vector<absl::Status> status(kConcurrent);
  std::vector<std::thread> threads;
  for (int i = 0; i < kConcurrent; ++i) {
    threads.emplace_back([&, i] {
      GenerateRequest r = Request(i);
      auto on_text = Record(r, &got[i]);
      absl::StatusOr<GenerateResult> g =
          engine_->Complete(r, *tokenizer_, on_text);
      status[i] = g.status();
      if (g.ok()) Keep(*g, &got[i]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kConcurrent; ++i) {
    ASSERT_TRUE(status[i].ok()) << status[i];
    ExpectSameBits(want[i], got[i], "request " + std::to_string(i));
  }
  const SchedulerStats s = engine_->stats().scheduler;
  EXPECT_GT(s.max_batch_sequences, 1) << "nothing was batched";
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
  std::cout << "batches: " << s.steps << ", largest " << s.max_batch_sequences
            << " sequences, " << s.decode_tokens << " decode + "
            << s.prefill_tokens << " prefill tokens\n";
}

TEST_P(SchedulerTest, ConcurrentSessionTurnsMatchOneAtATime) {
  constexpr int kTurns = 2;
  const auto want = SequentialTurns(kConcurrent, kTurns);

  OpenEngine(BatchingOptions());
  std::vector<std::vector<Transcript>> got(kConcurrent);
  std::vector<absl::Status> status(kConcurrent);
  std::vector<std::thread> threads;
  for (int i = 0; i < kConcurrent; ++i) {
    ASSERT_TRUE(engine_->CreateSession("acme", SessionId(i), {}).ok());
    threads.emplace_back([&, i] {
      for (int turn = 0; turn < kTurns && status[i].ok(); ++turn) {
        TurnRequest r = Turn(i, turn);
        Transcript t;
        auto on_text = Record(r.generate, &t);
        absl::StatusOr<TurnResult> res =
            engine_->RunTurn(r, *tokenizer_, on_text);
        status[i] = res.status();
        if (res.ok()) Keep(res->generation, &t);
        got[i].push_back(std::move(t));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kConcurrent; ++i) {
    ASSERT_TRUE(status[i].ok()) << status[i];
    for (int turn = 0; turn < kTurns; ++turn) {
      ExpectSameBits(want[i][turn], got[i][turn],
                     SessionId(i) + " turn " + std::to_string(turn));
    }
  }
  EXPECT_GT(engine_->stats().scheduler.max_batch_sequences, 1);
  EXPECT_EQ(engine_->stats().turns_committed, kConcurrent * kTurns);
}

TEST_P(SchedulerTest, CancellingOneSequenceLeavesTheOthersIntact) {
  constexpr int kSessions = 8, kCancelled = 3;
  const auto want = SequentialTurns(kSessions, 1);

  OpenEngine(BatchingOptions());
  std::vector<Transcript> got(kSessions);
  std::vector<absl::Status> status(kSessions);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(engine_->CreateSession("acme", SessionId(i), {}).ok());
    threads.emplace_back([&, i] {
      TurnRequest r = Turn(i, 0);
      auto on_text = Record(r.generate, &got[i], i == kCancelled ? 2 : -1);
      absl::StatusOr<TurnResult> res =
          engine_->RunTurn(r, *tokenizer_, on_text);
      status[i] = res.status();
      if (res.ok()) Keep(res->generation, &got[i]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kSessions; ++i) {
    if (i == kCancelled) continue;
    ASSERT_TRUE(status[i].ok()) << status[i];
    ExpectSameBits(want[i][0], got[i], SessionId(i));
  }
  EXPECT_EQ(status[kCancelled].code(), absl::StatusCode::kCancelled)
      << status[kCancelled];
  EXPECT_EQ(got[kCancelled].logits.size(), 2u);
  absl::StatusOr<v1::SessionManifest> m =
      engine_->GetSession("acme", SessionId(kCancelled));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->token_count(), 0) << "a cancelled turn committed tokens";
  EXPECT_EQ(m->turn_ends_size(), 0);
  EXPECT_EQ(engine_->stats().turns_failed, 1);

  // The session continues as if the cancelled turn never happened.
  TurnRequest r = Turn(kCancelled, 0);
  Transcript again;
  auto on_text = Record(r.generate, &again);
  absl::StatusOr<TurnResult> res = engine_->RunTurn(r, *tokenizer_, on_text);
  ASSERT_TRUE(res.ok()) << res.status();
  Keep(res->generation, &again);
  ExpectSameBits(want[kCancelled][0], again, "after the cancelled turn");
}

TEST_P(SchedulerTest, FullQueueRefusesWithResourceExhausted) {
  SessionEngineOptions o = BatchingOptions();
  o.scheduler.max_running = 1;
  o.scheduler.max_waiting = 1;
  OpenEngine(o);
  ASSERT_TRUE(engine_->CreateSession("acme", SessionId(0), {}).ok());

  // The first request holds the scheduler inside its first on_logits.
  absl::Notification entered, release;
  GenerateRequest blocker = Request(0);
  blocker.on_logits = [&](const float*, int64_t) {
    if (!entered.HasBeenNotified()) {
      entered.Notify();
      release.WaitForNotification();
    }
  };
  absl::StatusOr<GenerateResult> first, second;
  std::thread t1(
      [&] { first = engine_->Complete(blocker, *tokenizer_, nullptr); });
  entered.WaitForNotification();
  std::thread t2(
      [&] { second = engine_->Complete(Request(1), *tokenizer_, nullptr); });
  while (engine_->stats().scheduler.waiting < 1)
    absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(engine_->stats().scheduler.running, 1);
  EXPECT_TRUE(engine_->Saturated());

  absl::StatusOr<GenerateResult> third =
      engine_->Complete(Request(2), *tokenizer_, nullptr);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted)
      << third.status();
  absl::StatusOr<TurnResult> turn =
      engine_->RunTurn(Turn(0, 0), *tokenizer_, nullptr);
  EXPECT_EQ(turn.status().code(), absl::StatusCode::kResourceExhausted)
      << turn.status();
  EXPECT_EQ(engine_->stats().turns_rejected, 1);
  EXPECT_EQ(engine_->stats().scheduler.rejected, 1);  // Complete's

  release.Notify();
  t1.join();
  t2.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(engine_->Saturated());
  // The refused turn lost nothing: it runs now, as the first turn.
  turn = engine_->RunTurn(Turn(0, 0), *tokenizer_, nullptr);
  ASSERT_TRUE(turn.ok()) << turn.status();
  EXPECT_EQ(turn->turn, 1u);
}

TEST_P(SchedulerTest, KvByteBudgetDemotesLeastRecentlyUsedSessions) {
  // Every session's turn has the same length, so each holds the same bytes.
  auto turn = [this](int i) {
    TurnRequest r = Turn(0, 0);
    r.session = SessionId(i);
    return r;
  };
  OpenEngine(BatchingOptions());
  ASSERT_TRUE(engine_->CreateSession("acme", SessionId(0), {}).ok());
  ASSERT_TRUE(engine_->RunTurn(turn(0), *tokenizer_, nullptr).ok());
  const int64_t one = engine_->stats().hot_kv_bytes;
  ASSERT_GT(one, 0);

  SessionEngineOptions o = BatchingOptions();
  o.max_hot_kv_bytes = 2 * one + one / 2;  // room for two sessions
  OpenEngine(o);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(engine_->CreateSession("acme", SessionId(i), {}).ok());
    absl::StatusOr<TurnResult> r =
        engine_->RunTurn(turn(i), *tokenizer_, nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    const EngineStats s = engine_->stats();
    EXPECT_LE(s.hot_kv_bytes, o.max_hot_kv_bytes);
    EXPECT_EQ(s.hot_sessions, std::min(i + 1, 2));
  }
  EXPECT_EQ(engine_->stats().sessions_demoted, 2);
  // Sessions 0 and 1 were demoted; 3 is still hot.
  TurnRequest next = Turn(0, 1);
  next.session = SessionId(3);
  absl::StatusOr<TurnResult> r = engine_->RunTurn(next, *tokenizer_, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->path, StatePath::kHot);
  next.session = SessionId(0);
  r = engine_->RunTurn(next, *tokenizer_, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->path, StatePath::kDram);
}

// A restore job runs on the scheduler thread, unpaced when nothing else
// runs, and returns its own status.
TEST_P(SchedulerTest, RestoreJobRunsAloneUnpaced) {
  Scheduler scheduler(*model_, {});
  int units = 0;
  absl::Status status =
      scheduler.RunRestore([&](Scheduler::RestoreContext& context) {
        for (int i = 0; i < 10; ++i) {
          if (i > 0) context.BeforeUnit(1000);  // far over the budget
          units++;
        }
        return absl::DataLossError("the job's own error");
      });
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(units, 10);
  const SchedulerStats stats = scheduler.stats();
  EXPECT_EQ(stats.restores, 1);
  EXPECT_EQ(stats.restore_pauses, 0);
  EXPECT_EQ(stats.steps, 0);
  EXPECT_EQ(stats.restore_tokens, 9000);
}

// With a sequence running, a job's units share each iteration's restore
// budget: once a unit would overrun it, the batch takes exactly one step
// first. Budget 10, units of 4 (the first one uncharged): a step before the
// 3rd, 5th, ... charged unit, 14 in 30.
TEST_P(SchedulerTest, RestoreJobLetsTheBatchStepOncePerBudget) {
  SchedulerOptions o;
  o.restore_tokens_per_step = 10;
  Scheduler scheduler(*model_, o);
  std::atomic<bool> stop{false};
  GenerateRequest g = Request(0);
  g.max_tokens = 3000;  // far more steps than the job's pauses
  g.ignore_eos = true;
  g.cancelled = [&] { return stop.load(); };
  ops::KvCache cache = model_->NewCache();
  absl::StatusOr<GenerateResult> result;
  std::thread t([&] {
    result = scheduler.Run(*tokenizer_, g, &cache, [](const GenerateDelta&) {});
  });
  while (scheduler.stats().steps < 1) absl::SleepFor(absl::Milliseconds(1));
  int64_t steps_before = 0, steps_after = 0;
  ASSERT_TRUE(scheduler
                  .RunRestore([&](Scheduler::RestoreContext& context) {
                    steps_before = scheduler.stats().steps;
                    for (int i = 0; i < 30; ++i) context.BeforeUnit(4);
                    steps_after = scheduler.stats().steps;
                    return absl::OkStatus();
                  })
                  .ok());
  stop = true;
  t.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(steps_after - steps_before, 14);
  EXPECT_EQ(scheduler.stats().restore_pauses, 14);
}

// Idle with nothing running waits (up to its bound) instead of spinning;
// with a sequence running it lets the batch step.
TEST_P(SchedulerTest, RestoreJobIdleStepsTheBatchOrWaits) {
  Scheduler scheduler(*model_, {});
  ASSERT_TRUE(scheduler
                  .RunRestore([&](Scheduler::RestoreContext& context) {
                    const absl::Time start = absl::Now();
                    context.Idle(absl::Milliseconds(20));
                    EXPECT_GE(absl::Now() - start, absl::Milliseconds(15));
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_EQ(scheduler.stats().steps, 0);
}

INSTANTIATE_TEST_SUITE_P(Families, SchedulerTest,
                         ::testing::ValuesIn(ops::testing::AllFamilyCases()),
                         ops::testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::engine
