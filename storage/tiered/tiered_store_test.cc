#include "storage/tiered/tiered_store.h"

#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/rocksdb/session_db.h"
#include "storage/tiered/testing/sessions.h"

namespace kvd::storage {
namespace {

using ::kvd::storage::testing::Expected;
using ::kvd::storage::testing::MakeTurn;
using ::kvd::storage::testing::SameBytes;

const int64_t kSessionBytes = Expected({MakeTurn("t", "a", 0, 16)}).bytes();

class TieredStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = absl::StrCat(
        ::testing::TempDir(), "/",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path_);
  }

  // A store over a SessionDb in path_ whose DRAM holds `sessions_fit`
  // sessions of 16 tokens.
  std::unique_ptr<TieredStore> Open(
      int sessions_fit, CommitMode mode = CommitMode::kWriteThrough) {
    SessionDbOptions db_options;
    db_options.path = path_;
    db_options.durability = Durability::kWal;  // the test never loses power
    auto db = SessionDb::Open(db_options);
    EXPECT_TRUE(db.ok()) << db.status();
    TieredStoreOptions options;
    options.commit_mode = mode;
    options.dram.budget_bytes =
        sessions_fit * kSessionBytes + kSessionBytes / 2;
    auto store = TieredStore::Create(*std::move(db), options);
    EXPECT_TRUE(store.ok()) << store.status();
    return *std::move(store);
  }

  std::string path_;
};

TEST_F(TieredStoreTest, LruAndBudgetAcrossTiers) {
  auto store = Open(2);
  for (const char* id : {"a", "b"}) {
    ASSERT_TRUE(store->CommitTurn(MakeTurn("t", id, 0, 16)).ok());
  }
  // Write-through commits do not fill DRAM; loads do.
  auto a = store->Load("t", "a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->tier, Tier::kRocksDb);
  ASSERT_EQ(store->Load("t", "b")->tier, Tier::kRocksDb);
  EXPECT_EQ(store->Load("t", "a")->tier, Tier::kDram);  // a before b now
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "c", 0, 16)).ok());
  ASSERT_EQ(store->Load("t", "c")->tier, Tier::kRocksDb);  // evicts b
  EXPECT_EQ(store->Load("t", "a")->tier, Tier::kDram);
  EXPECT_EQ(store->Load("t", "b")->tier, Tier::kRocksDb);
  const TierBytes bytes = store->bytes();
  EXPECT_LE(bytes.dram_bytes, 2 * kSessionBytes + kSessionBytes / 2);
  EXPECT_GT(bytes.dram_bytes, 0);
  EXPECT_GT(bytes.rocksdb_disk_bytes, 0);
  EXPECT_EQ(store->dram_stats().entries, 2);
}

TEST_F(TieredStoreTest, EvictedSessionLoadsFromRocksDbWithIdenticalBytes) {
  auto store = Open(1);
  const TurnUpdate t1 = MakeTurn("t", "a", 0, 9);
  const TurnUpdate t2 = MakeTurn("t", "a", 9, 16);
  ASSERT_TRUE(store->CommitTurn(t1).ok());
  ASSERT_EQ(store->Load("t", "a")->tier, Tier::kRocksDb);
  ASSERT_TRUE(store->CommitTurn(t2).ok());  // applied to the DRAM copy too
  auto hot = store->Load("t", "a");
  ASSERT_EQ(hot->tier, Tier::kDram);
  EXPECT_TRUE(SameBytes(*hot->checkpoint, Expected({t1, t2})));
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "b", 0, 16)).ok());
  ASSERT_TRUE(store->Load("t", "b").ok());  // evicts a
  auto cold = store->Load("t", "a");
  ASSERT_TRUE(cold.ok()) << cold.status();
  EXPECT_EQ(cold->tier, Tier::kRocksDb);
  EXPECT_TRUE(SameBytes(*cold->checkpoint, Expected({t1, t2})));
}

TEST_F(TieredStoreTest, PrefetchMakesTheNextLoadADramHit) {
  auto store = Open(2);
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "a", 0, 16)).ok());
  store->Prefetch("t", "a");
  ASSERT_TRUE(store->Flush().ok());  // waits for the prefetch
  auto a = store->Load("t", "a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->tier, Tier::kDram);
  EXPECT_TRUE(SameBytes(*a->checkpoint, Expected({MakeTurn("t", "a", 0, 16)})));
}

TEST_F(TieredStoreTest, MemoryCommitsSurviveEvictionFlushAndReopen) {
  {
    auto store = Open(1, CommitMode::kMemory);
    for (const char* id : {"a", "b", "c"}) {
      ASSERT_TRUE(store->CommitTurn(MakeTurn("t", id, 0, 9)).ok());
      ASSERT_TRUE(store->CommitTurn(MakeTurn("t", id, 9, 16)).ok());
    }
    // a and b were evicted (spilled), c is only in DRAM until the Flush.
    for (const char* id : {"a", "b", "c"}) {
      auto got = store->Load("t", id);
      ASSERT_TRUE(got.ok()) << id << ": " << got.status();
      EXPECT_TRUE(SameBytes(
          *got->checkpoint,
          Expected({MakeTurn("t", id, 0, 9), MakeTurn("t", id, 9, 16)})))
          << id;
    }
    ASSERT_TRUE(store->Flush().ok());
    EXPECT_GE(store->dram_stats().spills, 3);
  }
  auto reopened = Open(1);
  for (const char* id : {"a", "b", "c"}) {
    auto got = reopened->Load("t", id);
    ASSERT_TRUE(got.ok()) << id << ": " << got.status();
    EXPECT_EQ(got->tier, Tier::kRocksDb);
    EXPECT_TRUE(SameBytes(
        *got->checkpoint,
        Expected({MakeTurn("t", id, 0, 9), MakeTurn("t", id, 9, 16)})))
        << id;
  }
}

TEST_F(TieredStoreTest, WriteThroughAfterMemoryTurnsKeepsEveryTurn) {
  auto store = Open(4, CommitMode::kMemory);
  const TurnUpdate t1 = MakeTurn("t", "a", 0, 6);
  const TurnUpdate t2 = MakeTurn("t", "a", 6, 13);
  ASSERT_TRUE(store->CommitTurn(t1).ok());
  ASSERT_TRUE(store->CommitTurn(t2, CommitMode::kWriteThrough).ok());
  auto stored = store->db().Load("t", "a");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(SameBytes(*stored, Expected({t1, t2})));
  EXPECT_TRUE(
      SameBytes(*store->Load("t", "a")->checkpoint, Expected({t1, t2})));
}

TEST_F(TieredStoreTest, ConcurrentCommitsToDifferentSessionsAllLand) {
  auto store = Open(3);
  constexpr int kThreads = 4;
  constexpr int kSessionsPerThread = 4;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int s = 0; s < kSessionsPerThread; ++s) {
        const std::string id = absl::StrCat("s", t, "-", s);
        // Alternate modes so spills, write-through and loads interleave.
        const CommitMode mode =
            s % 2 == 0 ? CommitMode::kMemory : CommitMode::kWriteThrough;
        for (int64_t end : {5, 10, 16}) {
          EXPECT_TRUE(store
                          ->CommitTurn(MakeTurn("t", id,
                                                end == 5    ? 0
                                                : end == 10 ? 5
                                                            : 10,
                                                end),
                                       mode)
                          .ok());
        }
        EXPECT_TRUE(store->Load("t", id).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(store->Flush().ok());
  for (int t = 0; t < kThreads; ++t) {
    for (int s = 0; s < kSessionsPerThread; ++s) {
      const std::string id = absl::StrCat("s", t, "-", s);
      const SessionCheckpoint want =
          Expected({MakeTurn("t", id, 0, 5), MakeTurn("t", id, 5, 10),
                    MakeTurn("t", id, 10, 16)});
      auto loaded = store->Load("t", id);
      ASSERT_TRUE(loaded.ok()) << id << ": " << loaded.status();
      EXPECT_TRUE(SameBytes(*loaded->checkpoint, want)) << id;
      auto stored = store->db().Load("t", id);
      ASSERT_TRUE(stored.ok()) << id << ": " << stored.status();
      EXPECT_TRUE(SameBytes(*stored, want)) << id;
    }
  }
  EXPECT_LE(store->dram_stats().bytes, 3 * kSessionBytes + kSessionBytes / 2);
}

TEST_F(TieredStoreTest, DeleteRemovesBothTiers) {
  auto store = Open(2, CommitMode::kMemory);
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "mem", 0, 16)).ok());
  ASSERT_TRUE(
      store->CommitTurn(MakeTurn("t", "disk", 0, 16), CommitMode::kWriteThrough)
          .ok());
  ASSERT_TRUE(store->Load("t", "disk").ok());
  ASSERT_TRUE(store->Delete("t", "mem").ok());  // never reached RocksDB
  ASSERT_TRUE(store->Delete("t", "disk").ok());
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_EQ(store->Load("t", "mem").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Load("t", "disk").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Delete("t", "disk").code(), absl::StatusCode::kNotFound);
}

TEST_F(TieredStoreTest, PutSessionReplacesBothTiers) {
  auto store = Open(2, CommitMode::kMemory);
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "a", 0, 16)).ok());
  const SessionCheckpoint imported = Expected({MakeTurn("t", "a", 0, 7)});
  ASSERT_TRUE(store->PutSession(imported).ok());
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_TRUE(SameBytes(*store->Load("t", "a")->checkpoint, imported));
  EXPECT_TRUE(SameBytes(*store->db().Load("t", "a"), imported));
}

TEST_F(TieredStoreTest, MalformedNamesAreRefused) {
  auto store = Open(1);
  EXPECT_EQ(store->Load("t", "../x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->CommitTurn(MakeTurn("t/x", "a", 0, 4)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Delete("", "a").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvd::storage
