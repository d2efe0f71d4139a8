#include "storage/tiered/dram_tier.h"

#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/tiered/testing/sessions.h"

namespace kvd::storage {
namespace {

using ::kvd::storage::testing::Expected;
using ::kvd::storage::testing::InMemoryLowerTierDouble;
using ::kvd::storage::testing::MakeTurn;
using ::kvd::storage::testing::SameBytes;
using ::testing::HasSubstr;

// Every test session is 16 tokens of 256-byte rows: about 4.4 KB.
SessionCheckpoint Session(const std::string& id) {
  return Expected({MakeTurn("t", id, 0, 16)});
}
const int64_t kSessionBytes = Session("a").bytes();

DramTierOptions Options(int sessions_fit) {
  DramTierOptions o;
  o.budget_bytes = sessions_fit * kSessionBytes + kSessionBytes / 2;
  return o;
}

TEST(DramTierTest, EvictsLeastRecentlyUsedWithinBudget) {
  InMemoryLowerTierDouble lower;
  DramTier dram(Options(2), &lower);
  dram.Put(Session("a"), /*dirty=*/false);
  dram.Put(Session("b"), /*dirty=*/false);
  ASSERT_NE(dram.Get("t", "a"), nullptr);  // a is now more recent than b
  dram.Put(Session("c"), /*dirty=*/false);
  EXPECT_NE(dram.Get("t", "a"), nullptr);
  EXPECT_EQ(dram.Get("t", "b"), nullptr);
  EXPECT_NE(dram.Get("t", "c"), nullptr);
  const DramTierStats s = dram.stats();
  EXPECT_EQ(s.entries, 2);
  EXPECT_LE(s.bytes, Options(2).budget_bytes);
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(s.hits, 3);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(lower.stores(), 0);  // clean entries are dropped, not written
}

TEST(DramTierTest, EvictedDirtyEntryIsSpilledAndLoadsBackIdentical) {
  InMemoryLowerTierDouble lower;
  DramTier dram(Options(1), &lower);
  dram.Put(Session("a"), /*dirty=*/true);
  dram.Put(Session("b"), /*dirty=*/false);  // evicts a
  ASSERT_TRUE(dram.Flush().ok());
  EXPECT_TRUE(lower.Has("t", "a"));
  EXPECT_EQ(dram.stats().spills, 1);
  auto got = dram.GetOrLoad("t", "a");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->from_dram);
  EXPECT_TRUE(SameBytes(*got->checkpoint, Session("a")));
  auto again = dram.GetOrLoad("t", "a");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->from_dram);
}

TEST(DramTierTest, EntryBeingSpilledIsStillFound) {
  InMemoryLowerTierDouble lower;
  lower.BlockStores();
  DramTier dram(Options(1), &lower);
  dram.Put(Session("a"), /*dirty=*/true);
  dram.Put(Session("b"), /*dirty=*/false);
  ASSERT_TRUE(lower.AwaitStoresStarted(1));  // a's write is in progress
  auto a = dram.Get("t", "a");
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(SameBytes(*a, Session("a")));
  EXPECT_EQ(lower.loads(), 0);
  lower.UnblockStores();
  ASSERT_TRUE(dram.Flush().ok());
  EXPECT_TRUE(lower.Has("t", "a"));
  EXPECT_EQ(dram.stats().dirty_entries, 0);
}

TEST(DramTierTest, PrefetchMakesTheNextGetAHit) {
  InMemoryLowerTierDouble lower;
  ASSERT_TRUE(lower.Store(Session("a")).ok());
  DramTier dram(Options(2), &lower);
  dram.Prefetch("t", "a");
  dram.Prefetch("t", "missing");   // ignored, no error
  ASSERT_TRUE(dram.Flush().ok());  // waits for the prefetches
  auto a = dram.Get("t", "a");
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(SameBytes(*a, Session("a")));
  EXPECT_EQ(dram.stats().prefetches, 1);
  EXPECT_EQ(dram.stats().misses, 0);
}

TEST(DramTierTest, ContainsNeitherLoadsNorCountsAHit) {
  InMemoryLowerTierDouble lower;
  ASSERT_TRUE(lower.Store(Session("a")).ok());
  DramTier dram(Options(2), &lower);
  EXPECT_FALSE(dram.Contains("t", "a"));  // only the lower tier has it
  EXPECT_EQ(lower.loads(), 0);
  dram.Put(Session("b"), /*dirty=*/false);
  EXPECT_TRUE(dram.Contains("t", "b"));
  EXPECT_EQ(dram.stats().hits, 0);
  EXPECT_EQ(dram.stats().misses, 0);
  dram.Erase("t", "b");
  EXPECT_FALSE(dram.Contains("t", "b"));
}

TEST(DramTierTest, FullSpillQueueHoldsTheWriterBack) {
  InMemoryLowerTierDouble lower;
  lower.BlockStores();
  DramTierOptions o = Options(1);
  o.spill_queue_bytes = kSessionBytes;  // one session waits at most
  DramTier dram(o, &lower);
  dram.Put(Session("a"), true);
  dram.Put(Session("b"), true);  // a: in flight
  ASSERT_TRUE(lower.AwaitStoresStarted(1));
  dram.Put(Session("c"), true);  // b: queued, the queue is now full
  std::atomic<bool> done{false};
  std::thread writer([&] {
    dram.Put(Session("d"), true);  // must wait to queue c
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(done);
  lower.UnblockStores();
  writer.join();
  ASSERT_TRUE(dram.Flush().ok());
  for (const char* id : {"a", "b", "c", "d"}) {
    EXPECT_TRUE(lower.Has("t", id)) << id;
  }
}

TEST(DramTierTest, FailedSpillKeepsTheDataAndIsReportedByFlush) {
  InMemoryLowerTierDouble lower;
  lower.FailStores(absl::UnavailableError("disk gone"));
  DramTier dram(Options(1), &lower);
  dram.Put(Session("a"), true);
  dram.Put(Session("b"), false);
  absl::Status s = dram.Flush();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("session t/a"));
  EXPECT_THAT(s.message(), HasSubstr("disk gone"));
  EXPECT_GE(dram.stats().spill_failures, 1);
  auto a = dram.Get("t", "a");  // still served from memory
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(SameBytes(*a, Session("a")));
  lower.FailStores(absl::OkStatus());
  ASSERT_TRUE(dram.Flush().ok());
  EXPECT_TRUE(lower.Has("t", "a"));
}

TEST(DramTierTest, ApplyDirtyBuildsOnTheLowerCopyAndLeavesSnapshotsAlone) {
  InMemoryLowerTierDouble lower;
  const TurnUpdate t1 = MakeTurn("t", "s", 0, 6);
  const TurnUpdate t2 = MakeTurn("t", "s", 6, 11);
  ASSERT_TRUE(lower.Store(Expected({t1})).ok());
  DramTier dram(Options(4), &lower);
  ASSERT_TRUE(dram.ApplyDirty(t2).ok());  // loads t1's state first
  auto after_t2 = dram.Get("t", "s");
  ASSERT_NE(after_t2, nullptr);
  EXPECT_TRUE(SameBytes(*after_t2, Expected({t1, t2})));
  const TurnUpdate t3 = MakeTurn("t", "s", 11, 13);
  ASSERT_TRUE(dram.ApplyDirty(t3).ok());
  EXPECT_TRUE(SameBytes(*after_t2, Expected({t1, t2})));  // unchanged
  EXPECT_TRUE(SameBytes(*dram.Get("t", "s"), Expected({t1, t2, t3})));
  EXPECT_FALSE(lower.Has("t", "x"));
  ASSERT_TRUE(dram.Flush().ok());
  auto stored = lower.Load("t", "s", /*observer=*/nullptr);
  ASSERT_TRUE(stored.ok());
  EXPECT_TRUE(SameBytes(*stored, Expected({t1, t2, t3})));
}

TEST(DramTierTest, EraseCancelsAQueuedSpill) {
  InMemoryLowerTierDouble lower;
  lower.BlockStores();
  DramTier dram(Options(1), &lower);
  dram.Put(Session("a"), true);
  dram.Put(Session("b"), true);  // a in flight
  ASSERT_TRUE(lower.AwaitStoresStarted(1));
  dram.Put(Session("c"), false);  // b queued
  EXPECT_TRUE(dram.Erase("t", "b"));
  EXPECT_EQ(dram.Get("t", "b"), nullptr);
  lower.UnblockStores();
  ASSERT_TRUE(dram.Flush().ok());
  EXPECT_TRUE(lower.Has("t", "a"));
  EXPECT_FALSE(lower.Has("t", "b"));
  EXPECT_FALSE(dram.Erase("t", "b"));
}

TEST(DramTierTest, SyncSessionWritesADirtyEntryNow) {
  InMemoryLowerTierDouble lower;
  DramTier dram(Options(4), &lower);
  dram.Put(Session("a"), true);
  EXPECT_FALSE(lower.Has("t", "a"));
  ASSERT_TRUE(dram.SyncSession("t", "a").ok());
  EXPECT_TRUE(lower.Has("t", "a"));
  EXPECT_EQ(dram.stats().dirty_entries, 0);
  EXPECT_NE(dram.Get("t", "a"), nullptr);  // still cached, now clean
}

TEST(DramTierTest, DestructorSpillsDirtyEntries) {
  InMemoryLowerTierDouble lower;
  {
    DramTier dram(Options(4), &lower);
    dram.Put(Session("a"), true);
  }
  EXPECT_TRUE(lower.Has("t", "a"));
}

// MakeTurn's sessions store 260 bytes per token (256-byte row + token id).
constexpr int64_t kStoredPerToken = 260;

// UnspilledStoredBytes counts what the lower tier lacks (the growth over
// its copy), through dirty, spilling, spilled and erased states; a refused
// admission changes nothing.
TEST(DramTierTest, UnspilledStoredBytesFollowDirtyStateAndAdmission) {
  InMemoryLowerTierDouble lower;
  ASSERT_TRUE(lower.Store(Expected({MakeTurn("t", "a", 0, 9)})).ok());
  DramTier dram(Options(4), &lower);
  EXPECT_EQ(dram.UnspilledStoredBytes("t"), 0);

  ASSERT_TRUE(dram.ApplyDirty(MakeTurn("t", "a", 9, 16)).ok());
  EXPECT_EQ(dram.UnspilledStoredBytes("t"), 7 * kStoredPerToken);

  std::vector<std::pair<int64_t, int64_t>> asked;
  auto refuse = [&](int64_t turn_bytes, int64_t after) {
    asked.emplace_back(turn_bytes, after);
    return absl::ResourceExhaustedError("no room");
  };
  absl::Status s = dram.ApplyDirty(MakeTurn("t", "b", 0, 8), refuse);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(dram.Get("t", "b"), nullptr);
  s = dram.ApplyDirty(MakeTurn("t", "a", 16, 20), refuse);  // cached session
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(dram.Get("t", "a")->manifest().token_count(), 16);
  EXPECT_THAT(asked,
              ::testing::ElementsAre(
                  std::make_pair(8 * kStoredPerToken, 15 * kStoredPerToken),
                  std::make_pair(4 * kStoredPerToken, 11 * kStoredPerToken)));
  EXPECT_EQ(dram.UnspilledStoredBytes("t"), 7 * kStoredPerToken);

  auto admit = [](int64_t, int64_t) { return absl::OkStatus(); };
  ASSERT_TRUE(dram.ApplyDirty(MakeTurn("t", "b", 0, 8), admit).ok());
  ASSERT_TRUE(dram.ApplyDirty(MakeTurn("u", "c", 0, 5)).ok());
  EXPECT_EQ(dram.UnspilledStoredBytes("t"), 15 * kStoredPerToken);
  EXPECT_EQ(dram.UnspilledStoredBytes("u"), 5 * kStoredPerToken);

  // Still counted while being written; gone once written.
  lower.BlockStores();
  std::thread flush([&] { EXPECT_TRUE(dram.Flush().ok()); });
  ASSERT_TRUE(lower.AwaitStoresStarted(2));  // 1 store above + the first
  EXPECT_EQ(dram.UnspilledStoredBytes("t"), 15 * kStoredPerToken);
  lower.UnblockStores();
  flush.join();
  EXPECT_EQ(dram.UnspilledStoredBytes("t"), 0);
  EXPECT_EQ(dram.UnspilledStoredBytes("u"), 0);

  // A turn on a spilled session counts its growth only; Erase forgets it.
  ASSERT_TRUE(dram.ApplyDirty(MakeTurn("t", "a", 16, 20)).ok());
  EXPECT_EQ(dram.UnspilledStoredBytes("t"), 4 * kStoredPerToken);
  EXPECT_TRUE(dram.Erase("t", "a"));
  EXPECT_EQ(dram.UnspilledStoredBytes("t"), 0);
}

// A dirty entry evicted to the spill queue stays counted until written.
TEST(DramTierTest, UnspilledStoredBytesCountEvictedSpillsUntilWritten) {
  InMemoryLowerTierDouble lower;
  lower.BlockStores();
  DramTier dram(Options(1), &lower);
  ASSERT_TRUE(dram.ApplyDirty(MakeTurn("t", "a", 0, 16)).ok());
  ASSERT_TRUE(dram.ApplyDirty(MakeTurn("t", "b", 0, 16)).ok());  // evicts a
  ASSERT_TRUE(lower.AwaitStoresStarted(1));
  EXPECT_EQ(dram.stats().entries, 1);
  EXPECT_EQ(dram.UnspilledStoredBytes("t"), 32 * kStoredPerToken);
  lower.UnblockStores();
  ASSERT_TRUE(dram.Flush().ok());
  EXPECT_EQ(dram.UnspilledStoredBytes("t"), 0);
}

}  // namespace
}  // namespace kvd::storage
