// A long session's restore is scheduler work that must not pause the batch:
// while another request decodes in the engine's batch, a demoted session
// with hundreds of tokens comes back (rebuild from DRAM, or a re-prefill for
// policy tokens). With a restore budget of 0 the batch takes a step between
// every two units of the restore. No clock is read: every step of the
// running request records how many times the restore has paused so far, and
// each pause must have been seen by a step that ran before the restore went
// on. With the default budget a K/V recompute runs several units per step.
// Either way the restored session's turn is compared bit for bit with the
// same conversation in a session that never went cold.
#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"
#include "services/engine/session_engine.h"
#include "services/engine/testing/engine_fixture.h"

namespace kvd::engine {
namespace {

struct Variant {
  std::string policy;
  int64_t hot_budget;
};

const Variant kVariants[] = {
    {"kv-direct", ops::ResidualKvSource::kAll},
    {"kv-direct", 16},
    {"stride:2", ops::ResidualKvSource::kAll},
    {"tokens", ops::ResidualKvSource::kAll},
};

// Rows per rebuild / re-prefill unit in the engine (RebuildSpec::block and
// the re-prefill block): a 610-token session is 3 of them.
constexpr int64_t kUnitTokens = 256;
constexpr int kHistoryTokens = 600;
constexpr int kReplyTokens = 11;

class RestoreInterleavingTest : public testing::EngineTest {
 protected:
  void SetUp() override {
    ops::testing::TinyModelSpec spec;
    // gemma3: five local layers that keep a window only, and a global one
    // that keeps (and restores) every position.
    spec.n_layers = GetParam().family == "gemma3" ? 6 : 4;
    spec.sliding_window = 24;
    LoadModel(spec);
  }

  // One greedy turn of `session`; appends each step's logits to `logits`.
  absl::StatusOr<TurnResult> Turn(const std::string& session,
                                  std::vector<int32_t> tokens,
                                  std::vector<std::vector<float>>* logits,
                                  std::function<void()> on_restored = {}) {
    TurnRequest r;
    r.tenant = "acme";
    r.session = session;
    r.make_tokens = [tokens, on_restored](absl::Span<const int32_t>) {
      // Called right after the session's state is back.
      if (on_restored) on_restored();
      return absl::StatusOr<std::vector<int32_t>>(tokens);
    };
    r.generate.max_tokens = kReplyTokens;
    r.generate.ignore_eos = true;
    r.generate.sampling.temperature = 0;
    r.generate.on_logits = [logits](const float* l, int64_t n) {
      logits->emplace_back(l, l + n);
    };
    return engine_->RunTurn(r, *tokenizer_, nullptr);
  }
};

TEST_P(RestoreInterleavingTest, BatchKeepsSteppingWhileALongSessionRestores) {
  const int64_t vocab = model_->config().vocab_size;
  const std::vector<int32_t> history =
      ops::testing::RandomTokens(kHistoryTokens, 3, vocab);
  const std::vector<int32_t> next = ops::testing::RandomTokens(20, 4, vocab);
  // Budget 0: a step between every two units; 256: the default.
  std::vector<std::pair<int64_t, Variant>> cases;
  for (const int64_t restore_budget : {int64_t{0}, int64_t{256}})
    for (const Variant& v : kVariants) cases.emplace_back(restore_budget, v);
  for (const auto& [restore_budget, v] : cases) {
    SCOPED_TRACE(v.policy + " hot budget " + std::to_string(v.hot_budget) +
                 " restore budget " + std::to_string(restore_budget));
    SessionEngineOptions o;
    o.scheduler.restore_tokens_per_step = restore_budget;
    o.policy = *ops::ParseCheckpointPolicy(v.policy);
    o.hot_budget = v.hot_budget;
    o.chunk_tokens = 64;
    OpenEngine(o);

    // The reference: a session that stays hot for both turns.
    std::vector<std::vector<float>> want, scratch;
    ASSERT_TRUE(engine_->CreateSession("acme", "ref", {}).ok());
    ASSERT_TRUE(Turn("ref", history, &scratch).ok());
    absl::StatusOr<TurnResult> ref = Turn("ref", next, &want);
    ASSERT_TRUE(ref.ok()) << ref.status();
    ASSERT_EQ(ref->path, StatePath::kHot);

    // The same first turn in "long", then demoted to its checkpoint.
    ASSERT_TRUE(engine_->CreateSession("acme", "long", {}).ok());
    ASSERT_TRUE(Turn("long", history, &scratch).ok());
    engine_->Suspend("acme", "long");
    ASSERT_FALSE(engine_->IsHot("acme", "long"));

    // A long generation in the batch, stopped once the restored turn ended.
    std::atomic<bool> restored{false}, stop{false}, gen_done{false};
    std::atomic<int64_t> gen_steps{0};
    absl::Mutex seen_mu;
    std::set<int64_t> pauses_seen;  // restore_pauses seen by batch steps
    int64_t steps_during_restore = 0;
    GenerateRequest g;
    g.prompt = ops::testing::RandomTokens(8, 5, vocab);
    g.max_tokens = 3000;  // far more steps than the restore has units
    g.ignore_eos = true;
    g.sampling.temperature = 0;
    g.on_logits = [&](const float*, int64_t) {
      // Before the restore finished (make_tokens runs right after it).
      if (!restored.load()) {
        const int64_t pauses = engine_->stats().restore_pauses;
        absl::MutexLock lock(&seen_mu);
        if (pauses > 0) {
          pauses_seen.insert(pauses);
          steps_during_restore++;
        }
      }
      gen_steps++;
    };
    g.cancelled = [&] { return stop.load(); };
    absl::StatusOr<GenerateResult> gen;
    std::thread gen_thread([&] {
      gen = engine_->Complete(g, *tokenizer_, nullptr);
      gen_done = true;
    });
    while (gen_steps.load() < 2 && !gen_done.load())
      absl::SleepFor(absl::Milliseconds(1));
    ASSERT_EQ(engine_->stats().restore_pauses, 0);

    std::vector<std::vector<float>> got;
    absl::StatusOr<TurnResult> r =
        Turn("long", next, &got, [&] { restored = true; });
    stop = true;
    gen_thread.join();
    ASSERT_TRUE(r.ok()) << r.status();
    // Still running when the restored turn ended (so stopped, CANCELLED): it
    // ran through the restore.
    ASSERT_EQ(gen.status().code(), absl::StatusCode::kCancelled)
        << gen.status();

    EXPECT_EQ(r->path,
              v.policy == "tokens" ? StatePath::kReprefill : StatePath::kDram);
    const int64_t pauses = engine_->stats().restore_pauses;
    const int64_t blocks =
        (kHistoryTokens + kReplyTokens + kUnitTokens - 1) / kUnitTokens;
    if (restore_budget == 0) {
      // At least one pause between any two of the session's blocks.
      EXPECT_GE(pauses, blocks - 1);
    } else if (v.policy == "kv-direct" &&
               v.hot_budget == ops::ResidualKvSource::kAll) {
      // Projections of a few hundred rows: far fewer pauses than units.
      EXPECT_LT(pauses, blocks * model_->config().n_layers - 1);
    }
    // Every pause let a batch step run before the restore went on.
    for (int64_t k = 1; k <= pauses; ++k)
      EXPECT_EQ(pauses_seen.count(k), 1u) << "pause " << k;
    EXPECT_GE(steps_during_restore, pauses);

    // The restored session continues bit-identically.
    EXPECT_TRUE(testing::LogitsBitIdentical(want, got));
    EXPECT_EQ(r->generation.tokens, ref->generation.tokens);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, RestoreInterleavingTest,
                         ::testing::ValuesIn(ops::testing::AllFamilyCases()),
                         ops::testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::engine
