#include "storage/tiered/tiered_store.h"

#include <filesystem>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
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
using ::testing::HasSubstr;

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
    db_options.tenant_quota_bytes = quota_bytes_;
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
  absl::flat_hash_map<std::string, int64_t> quota_bytes_;  // per tenant
};

// MakeTurn's sessions store 260 bytes per token (256-byte row + token id).
constexpr int64_t kStoredPerToken = 260;

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

// kMemory sessions are listed before they reach RocksDB, with their latest
// manifest, in id order and across pages, per tenant.
TEST_F(TieredStoreTest, ListIncludesSessionsOnlyInDram) {
  auto store = Open(8, CommitMode::kMemory);
  for (const char* id : {"b", "d"}) {
    ASSERT_TRUE(
        store->CommitTurn(MakeTurn("t", id, 0, 9), CommitMode::kWriteThrough)
            .ok());
  }
  for (const char* id : {"a", "c", "e"}) {
    ASSERT_TRUE(store->CommitTurn(MakeTurn("t", id, 0, 9)).ok());
  }
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "d", 9, 16)).ok());  // newer
  ASSERT_TRUE(store->CommitTurn(MakeTurn("other", "z", 0, 9)).ok());
  ASSERT_EQ(store->dram_stats().spills, 0);

  auto list = [&](int64_t page_size) {
    std::vector<std::pair<std::string, int64_t>> got;
    std::string token;
    for (int pages = 0; pages < 10; ++pages) {
      absl::StatusOr<SessionListPage> page = store->List("t", token, page_size);
      EXPECT_TRUE(page.ok()) << page.status();
      if (!page.ok()) break;
      EXPECT_LE(static_cast<int64_t>(page->sessions.size()), page_size);
      for (const v1::SessionManifest& m : page->sessions) {
        got.emplace_back(m.session_id(), m.token_count());
      }
      token = page->next_page_token;
      if (token.empty()) break;
    }
    return got;
  };
  const std::vector<std::pair<std::string, int64_t>> want = {
      {"a", 9}, {"b", 9}, {"c", 9}, {"d", 16}, {"e", 9}};
  for (int64_t page_size : {1, 2, 3, 5, 100}) {
    EXPECT_EQ(list(page_size), want) << "page size " << page_size;
  }
  // The same once everything is in RocksDB.
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_EQ(list(2), want);
  ASSERT_TRUE(store->Delete("t", "c").ok());
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "f", 0, 9)).ok());
  EXPECT_EQ(list(2), (std::vector<std::pair<std::string, int64_t>>{
                         {"a", 9}, {"b", 9}, {"d", 16}, {"e", 9}, {"f", 9}}));
}

// A kMemory turn that would take the tenant over its quota is refused when
// committed, not when it spills: nothing of it is applied, the session stays
// at its previous turn, and everything acknowledged spills without error.
TEST_F(TieredStoreTest, MemoryTurnsOverQuotaAreRefusedBeforeSpilling) {
  quota_bytes_["t"] = 40 * kStoredPerToken;   // 10400
  auto store = Open(8, CommitMode::kMemory);  // DRAM holds all: no spills
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "a", 0, 16)).ok());
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "b", 0, 16)).ok());
  EXPECT_EQ(store->UnspilledBytes("t"), 32 * kStoredPerToken);
  EXPECT_EQ(store->db().TenantBytes("t"), 0);

  absl::Status s = store->CommitTurn(MakeTurn("t", "c", 0, 9));  // 41 tokens
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("tenant t would store 10660 bytes"));
  EXPECT_THAT(s.message(), HasSubstr("0 in RocksDB, 10660 in memory-mode"));
  EXPECT_THAT(s.message(), HasSubstr("quota of 10400 bytes"));
  EXPECT_THAT(s.message(), HasSubstr("delete sessions or raise"));
  EXPECT_EQ(store->Load("t", "c").status().code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "a", 16, 24)).ok());  // = quota
  s = store->CommitTurn(MakeTurn("t", "a", 24, 25));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(store->Load("t", "a")->checkpoint->manifest().token_count(), 24);
  EXPECT_EQ(store->UnspilledBytes("t"), 40 * kStoredPerToken);
  // Other tenants have no quota here.
  EXPECT_TRUE(store->CommitTurn(MakeTurn("u", "a", 0, 64)).ok());
  EXPECT_EQ(store->dram_stats().spills, 0);

  ASSERT_TRUE(store->Flush().ok());
  EXPECT_EQ(store->dram_stats().spill_failures, 0);
  EXPECT_EQ(store->db().TenantBytes("t"), 40 * kStoredPerToken);
  EXPECT_EQ(store->UnspilledBytes("t"), 0);
  EXPECT_TRUE(SameBytes(
      *store->db().Load("t", "a"),
      Expected({MakeTurn("t", "a", 0, 16), MakeTurn("t", "a", 16, 24)})));
  s = store->CommitTurn(MakeTurn("t", "c", 0, 1));  // full in RocksDB now
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("10400 in RocksDB, 260 in memory-mode"));
}

// Under the quota, kMemory turns succeed and spill (on eviction here); a
// turn on a session RocksDB already holds counts only what it adds.
TEST_F(TieredStoreTest, MemoryTurnsUnderQuotaSpillAndCountOnlyTheirGrowth) {
  quota_bytes_["t"] = 40 * kStoredPerToken;
  auto store = Open(1, CommitMode::kMemory);
  ASSERT_TRUE(
      store->CommitTurn(MakeTurn("t", "a", 0, 16), CommitMode::kWriteThrough)
          .ok());
  EXPECT_EQ(store->db().TenantBytes("t"), 16 * kStoredPerToken);
  // 16 in RocksDB + 8 more for a: 24 <= 40 (not 16 + 24).
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "a", 16, 24)).ok());
  EXPECT_EQ(store->UnspilledBytes("t"), 8 * kStoredPerToken);
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "b", 0, 16)).ok());  // evicts a
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_GE(store->dram_stats().spills, 2);
  EXPECT_EQ(store->dram_stats().spill_failures, 0);
  EXPECT_EQ(store->db().TenantBytes("t"), 40 * kStoredPerToken);
  EXPECT_EQ(store->UnspilledBytes("t"), 0);
  EXPECT_EQ(store->db().GetManifest("t", "a")->token_count(), 24);
  EXPECT_EQ(store->db().GetManifest("t", "b")->token_count(), 16);
}

// Deleting a session frees its quota for kMemory turns, whether its bytes
// were only in DRAM or already in RocksDB.
TEST_F(TieredStoreTest, DeletingASessionFreesQuotaForMemoryTurns) {
  quota_bytes_["t"] = 20 * kStoredPerToken;
  auto store = Open(4, CommitMode::kMemory);
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "a", 0, 16)).ok());
  EXPECT_EQ(store->CommitTurn(MakeTurn("t", "b", 0, 8)).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store->Delete("t", "a").ok());  // never reached RocksDB
  EXPECT_EQ(store->UnspilledBytes("t"), 0);
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "b", 0, 16)).ok());

  ASSERT_TRUE(store->Flush().ok());  // b in RocksDB now
  EXPECT_EQ(store->db().TenantBytes("t"), 16 * kStoredPerToken);
  EXPECT_EQ(store->CommitTurn(MakeTurn("t", "c", 0, 8)).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store->Delete("t", "b").ok());
  EXPECT_EQ(store->db().TenantBytes("t"), 0);
  EXPECT_TRUE(store->CommitTurn(MakeTurn("t", "c", 0, 8)).ok());
}

// After a restart the quota counts what was spilled (the destructor flushes)
// and DRAM counts nothing.
TEST_F(TieredStoreTest, QuotaCountsAreRightAfterReopen) {
  quota_bytes_["t"] = 40 * kStoredPerToken;
  {
    auto store = Open(4, CommitMode::kMemory);
    ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "a", 0, 16)).ok());
    ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "b", 0, 16)).ok());
  }
  auto store = Open(4, CommitMode::kMemory);
  EXPECT_EQ(store->db().TenantBytes("t"), 32 * kStoredPerToken);
  EXPECT_EQ(store->UnspilledBytes("t"), 0);
  EXPECT_EQ(store->CommitTurn(MakeTurn("t", "c", 0, 9)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(store->CommitTurn(MakeTurn("t", "c", 0, 8)).ok());
  EXPECT_EQ(store->CommitTurn(MakeTurn("t", "a", 16, 17)).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_EQ(store->db().TenantBytes("t"), 40 * kStoredPerToken);
}

// Write-through commits and imports leave room for the tenant's unspilled
// kMemory turns, so those still spill.
TEST_F(TieredStoreTest, WriteThroughAndImportCountUnspilledMemoryTurns) {
  quota_bytes_["t"] = 40 * kStoredPerToken;
  auto store = Open(4, CommitMode::kMemory);
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "a", 0, 32)).ok());
  absl::Status s =
      store->CommitTurn(MakeTurn("t", "b", 0, 9), CommitMode::kWriteThrough);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("2340 in RocksDB, 8320 in memory-mode"));
  EXPECT_EQ(store->PutSession(Expected({MakeTurn("t", "b", 0, 9)})).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store->db().GetManifest("t", "b").status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(
      store->CommitTurn(MakeTurn("t", "b", 0, 8), CommitMode::kWriteThrough)
          .ok());
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_EQ(store->dram_stats().spill_failures, 0);
  EXPECT_EQ(store->db().TenantBytes("t"), 40 * kStoredPerToken);
}

// A refused import leaves the session it would replace as it was, its
// unspilled kMemory turns included; the import's own session does not count
// twice.
TEST_F(TieredStoreTest, RefusedImportKeepsTheMemorySession) {
  quota_bytes_["t"] = 40 * kStoredPerToken;
  auto store = Open(4, CommitMode::kMemory);
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "a", 0, 24)).ok());
  ASSERT_TRUE(store->CommitTurn(MakeTurn("t", "b", 0, 8)).ok());
  absl::Status s = store->PutSession(Expected({MakeTurn("t", "b", 0, 17)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(store->Load("t", "b")->checkpoint->manifest().token_count(), 8);
  EXPECT_EQ(store->UnspilledBytes("t"), 32 * kStoredPerToken);
  const SessionCheckpoint imported = Expected({MakeTurn("t", "b", 0, 16)});
  ASSERT_TRUE(store->PutSession(imported).ok());  // 24 + 16 = quota
  EXPECT_EQ(store->UnspilledBytes("t"), 24 * kStoredPerToken);
  ASSERT_TRUE(store->Flush().ok());
  EXPECT_EQ(store->dram_stats().spill_failures, 0);
  EXPECT_EQ(store->db().TenantBytes("t"), 40 * kStoredPerToken);
  EXPECT_TRUE(SameBytes(*store->db().Load("t", "b"), imported));
}

}  // namespace
}  // namespace kvd::storage
