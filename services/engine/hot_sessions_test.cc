// The hot tier's rules: least recently used idle sessions are demoted past
// the session and byte limits or when the pool needs blocks, a session in
// a turn never is, and a demoted session's K/V blocks go back to the pool.
#include "services/engine/hot_sessions.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::engine {
namespace {

using Key = HotSessions::Key;

class HotSessionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = ops::testing::LoadTinyModel(ops::testing::TinyModelSpec(),
                                             ops::Precision::kF32);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    auto pool = model_->NewBlockPool({});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
  }

  // A record holding K/V blocks for `positions` positions, as a turn that
  // ran them would leave it (kv_bytes set as the engine sets it).
  std::shared_ptr<SessionRecord> Record(int64_t positions) {
    auto r = std::make_shared<SessionRecord>(
        *model_, pool_.get(), *ops::ParseCheckpointPolicy("kv-direct"),
        ops::ResidualKvSource::kAll);
    EXPECT_TRUE(r->cache.Reserve(positions).ok());
    r->kv_bytes = static_cast<int64_t>(r->cache.allocated_bytes());
    return r;
  }

  // Lists a fresh record under `id` as a finished turn would.
  void KeepNew(HotSessions& hot, const std::string& id, int64_t positions) {
    std::shared_ptr<SessionRecord> r = Record(positions);
    hot.MarkInTurn(*r);
    hot.Keep(Key("t", id), std::move(r));
  }

  std::unique_ptr<ops::Model> model_;
  std::unique_ptr<ops::KvBlockPool> pool_;
};

TEST_F(HotSessionsTest, DemotesTheLeastRecentlyUsedPastTheSessionLimit) {
  HotSessions hot({.max_sessions = 2});
  KeepNew(hot, "a", 10);
  KeepNew(hot, "b", 10);
  // "a" is used again, so "b" is now the least recently used.
  std::shared_ptr<SessionRecord> a = hot.BeginTurn(Key("t", "a"), {});
  ASSERT_NE(a, nullptr);
  hot.Keep(Key("t", "a"), std::move(a));
  KeepNew(hot, "c", 10);
  EXPECT_TRUE(hot.Contains(Key("t", "a")));
  EXPECT_FALSE(hot.Contains(Key("t", "b")));
  EXPECT_TRUE(hot.Contains(Key("t", "c")));
  EXPECT_EQ(hot.stats().sessions, 2);
  EXPECT_EQ(hot.stats().demoted, 1);
  EXPECT_EQ(hot.stats().demoted_for_kv, 0);
}

TEST_F(HotSessionsTest, NeverDemotesASessionInATurn) {
  HotSessions hot({.max_sessions = 1});
  KeepNew(hot, "a", 10);
  std::shared_ptr<SessionRecord> a = hot.BeginTurn(Key("t", "a"), {});
  ASSERT_NE(a, nullptr);
  // "a" is in a turn: a newer session over the limit is the one demoted,
  // and the pool's reclaim finds nothing idle.
  KeepNew(hot, "b", 10);
  EXPECT_TRUE(hot.Contains(Key("t", "a")));
  EXPECT_FALSE(hot.Contains(Key("t", "b")));
  EXPECT_FALSE(hot.DemoteOneIdle());
  EXPECT_EQ(hot.IdleKvBlocks(), 0);
  hot.EndTurn(*a);
  EXPECT_GT(hot.IdleKvBlocks(), 0);
  EXPECT_TRUE(hot.DemoteOneIdle());
  EXPECT_FALSE(hot.Contains(Key("t", "a")));
}

TEST_F(HotSessionsTest, ByteLimitDemotesEvenTheSessionJustKept) {
  const int64_t one = Record(64)->kv_bytes;
  HotSessions hot({.max_sessions = 8, .max_kv_bytes = 2 * one});
  KeepNew(hot, "a", 64);
  KeepNew(hot, "b", 64);
  EXPECT_EQ(hot.stats().sessions, 2);
  EXPECT_EQ(hot.stats().kv_bytes, 2 * one);
  KeepNew(hot, "c", 64);  // "a", the oldest, goes
  EXPECT_FALSE(hot.Contains(Key("t", "a")));
  EXPECT_EQ(hot.stats().kv_bytes, 2 * one);
  KeepNew(hot, "huge", 64 * 8);  // over the limit alone: everything goes
  EXPECT_EQ(hot.stats().sessions, 0);
  EXPECT_EQ(hot.stats().demoted, 4);
}

TEST_F(HotSessionsTest, DemotingReturnsBlocksToThePool) {
  HotSessions hot({.max_sessions = 8});
  KeepNew(hot, "a", 100);
  KeepNew(hot, "b", 100);
  const int64_t held = pool_->stats().blocks_in_use;
  ASSERT_GT(held, 0);
  const int64_t idle = hot.IdleKvBlocks();
  EXPECT_EQ(idle, held);
  ASSERT_TRUE(hot.DemoteOneIdle());
  EXPECT_FALSE(hot.Contains(Key("t", "a")));  // the least recently used
  EXPECT_EQ(pool_->stats().blocks_in_use, held / 2);
  EXPECT_EQ(hot.stats().demoted_for_kv, 1);
  hot.Drop(Key("t", "b"));
  EXPECT_EQ(pool_->stats().blocks_in_use, 0);
  EXPECT_FALSE(hot.DemoteOneIdle());
}

TEST_F(HotSessionsTest, ARecordTheBackendLostIsDroppedNotHandedOut) {
  HotSessions hot({.max_sessions = 8});
  KeepNew(hot, "a", 10);
  EXPECT_EQ(
      hot.BeginTurn(Key("t", "a"), [](const SessionRecord&) { return false; }),
      nullptr);
  EXPECT_FALSE(hot.Contains(Key("t", "a")));
  EXPECT_EQ(hot.BeginTurn(Key("t", "missing"), {}), nullptr);
  EXPECT_EQ(pool_->stats().blocks_in_use, 0);
}

}  // namespace
}  // namespace kvd::engine
