// Crash and disk-full behaviour of the RocksDB tier, through the file-system
// test doubles of fault_file_system_for_test.h:
//  - power loss with Durability::kSync keeps every acknowledged turn intact;
//  - with Durability::kWal, unsynced turns may vanish (this test shows that
//    the double really drops them), but what remains is a consistent turn;
//  - a full disk fails the commit with RESOURCE_EXHAUSTED, keeps what was
//    committed, and commits again once space is back.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/rocksdb/disk_full.h"
#include "storage/rocksdb/fault_file_system_for_test.h"
#include "storage/rocksdb/session_db.h"
#include "storage/rocksdb/session_db_test_util.h"

namespace kvd::storage {
namespace {

using ::kvd::storage::testing::DropUnsyncedFileSystemForTest;
using ::kvd::storage::testing::NoSpaceFileSystemForTest;
using ::kvd::storage::testing::SyntheticSession;
using ::kvd::storage::testing::SyntheticSessionOptions;
using ::testing::HasSubstr;

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
}

void ExpectLoadsAs(SessionDb& db, const SyntheticSession& s) {
  auto cp = db.Load(s.manifest().tenant(), s.manifest().session_id());
  ASSERT_TRUE(cp.ok()) << cp.status();
  EXPECT_EQ(cp->manifest().SerializeAsString(),
            s.manifest().SerializeAsString());
  for (const auto& [id, value] : cp->chunks()) {
    EXPECT_EQ(value, s.ChunkValue(id)) << id.layer << "/" << id.index;
  }
}

std::vector<SyntheticSession> TwoSessions() {
  std::vector<SyntheticSession> sessions;
  for (const char* id : {"a", "b"}) {
    SyntheticSessionOptions o;
    o.session = id;
    o.row_bytes = 1024;  // residual chunks of 4 KiB: blob files
    sessions.emplace_back(o);
  }
  return sessions;
}

TEST(SessionDbPowerLoss, SyncKeepsEveryAcknowledgedTurn) {
  auto fs = std::make_shared<DropUnsyncedFileSystemForTest>();
  SessionDbOptions o;
  o.path = TestDir("sync");
  o.durability = Durability::kSync;
  o.file_system = fs;
  auto db = SessionDb::Open(o);
  ASSERT_TRUE(db.ok()) << db.status();
  std::vector<SyntheticSession> sessions = TwoSessions();
  for (int turn = 0; turn < 10; ++turn) {
    for (SyntheticSession& s : sessions) {
      ASSERT_TRUE((*db)->CommitTurn(s.AppendTurn(1 + turn % 5)).ok());
    }
  }
  fs->SimulatePowerLoss();
  db->reset();  // the dying process; its writes go nowhere
  fs->Revive();
  auto reopened = SessionDb::Open(o);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  for (const SyntheticSession& s : sessions) ExpectLoadsAs(**reopened, s);
}

TEST(SessionDbPowerLoss, WalWithoutSyncMayLoseTurnsButStaysConsistent) {
  auto fs = std::make_shared<DropUnsyncedFileSystemForTest>();
  SessionDbOptions o;
  o.path = TestDir("wal");
  o.durability = Durability::kWal;
  o.file_system = fs;
  auto db = SessionDb::Open(o);
  ASSERT_TRUE(db.ok()) << db.status();
  SyntheticSession s = TwoSessions()[0];
  std::vector<int64_t> acknowledged = {0};
  for (int turn = 0; turn < 10; ++turn) {
    ASSERT_TRUE((*db)->CommitTurn(s.AppendTurn(3)).ok());
    acknowledged.push_back(s.manifest().token_count());
  }
  const int64_t dropped = fs->SimulatePowerLoss();
  db->reset();
  fs->Revive();
  // Without a sync the WAL's bytes were never durable: the double drops
  // them, which is what shows the sync test above could fail.
  EXPECT_GT(dropped, 0);
  auto reopened = SessionDb::Open(o);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  auto cp = (*reopened)->Load("acme", "a");
  if (cp.ok()) {
    // Whatever survived is one whole acknowledged turn, never a torn one.
    EXPECT_THAT(acknowledged,
                ::testing::Contains(cp->manifest().token_count()));
    EXPECT_LT(cp->manifest().token_count(), s.manifest().token_count());
  } else {
    EXPECT_EQ(cp.status().code(), absl::StatusCode::kNotFound) << cp.status();
  }
}

TEST(SessionDbDiskFull, FailsCleanlyAndRecoversWhenSpaceReturns) {
  auto fs = std::make_shared<NoSpaceFileSystemForTest>();
  SessionDbOptions o;
  o.path = TestDir("full");
  o.durability = Durability::kSync;
  o.file_system = fs;
  // A large disk, as the real one may not be: the advice's sizes follow it.
  o.disk_space = [](const std::string&) -> absl::StatusOr<DiskSpace> {
    return DiskSpace{int64_t{100} << 30, int64_t{50} << 30};
  };
  auto opened = SessionDb::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  SessionDb& db = **opened;
  std::vector<SyntheticSession> sessions = TwoSessions();
  SyntheticSession& a = sessions[0];
  SyntheticSession& b = sessions[1];
  ASSERT_TRUE(db.CommitTurn(a.AppendTurn(6)).ok());
  SyntheticSessionOptions c_options;
  c_options.session = "c";
  SyntheticSession c(c_options);
  ASSERT_TRUE(db.CommitTurn(c.AppendTurn(4)).ok());
  const v1::SessionManifest committed = b.manifest();

  fs->SetBudget(100);  // less than one turn's WAL record
  TurnUpdate failed = b.AppendTurn(8);
  absl::Status st = db.CommitTurn(failed);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(st.message(), HasSubstr(o.path));
  // One memtable's flush (half the 64 MiB budget) plus the 64 MiB reserve
  // kvd keeps free on a disk this large.
  EXPECT_THAT(st.message(), HasSubstr("is full: free at least 96.0 MiB"));
  EXPECT_TRUE(IsDiskFull(st)) << "servers tell a full disk from a quota by it";
  EXPECT_GT(fs->no_space_errors(), 0);
  // Readiness says so while RocksDB cannot write.
  EXPECT_TRUE(IsDiskFull(db.WriteHealth())) << db.WriteHealth();
  // A delete needs a write too: while RocksDB is stopped it is refused as a
  // full disk that says how much to free (HTTP 507), not as "retry" (503).
  const absl::Status del = db.DeleteSession("acme", "c");
  EXPECT_EQ(del.code(), absl::StatusCode::kResourceExhausted) << del;
  EXPECT_TRUE(IsDiskFull(del)) << del;
  EXPECT_THAT(del.message(), HasSubstr("free at least"));
  EXPECT_EQ(db.TenantBytes("acme"),
            a.manifest().stored_bytes() + c.manifest().stored_bytes());
  ExpectLoadsAs(db, a);  // reads still work while the disk is full
  EXPECT_EQ(db.GetManifest("acme", "b").status().code(),
            absl::StatusCode::kNotFound);

  fs->SetBudget(-1);  // space freed
  // RocksDB may still be recovering (a full disk still, saying how much to
  // free); it polls the free space every few seconds and resumes by itself.
  absl::Status retry = db.CommitTurn(failed);
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (IsDiskFull(retry) && absl::Now() < deadline) {
    EXPECT_THAT(retry.message(), HasSubstr("free at least"));
    absl::SleepFor(absl::Milliseconds(100));
    retry = db.CommitTurn(failed);
  }
  ASSERT_TRUE(retry.ok()) << retry;
  EXPECT_TRUE(db.WriteHealth().ok()) << db.WriteHealth();
  EXPECT_TRUE(db.DeleteSession("acme", "c").ok());
  ASSERT_TRUE(db.CommitTurn(a.AppendTurn(2)).ok());
  ExpectLoadsAs(db, a);
  ExpectLoadsAs(db, b);
  opened->reset();
  auto reopened = SessionDb::Open(o);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  ExpectLoadsAs(**reopened, a);
  ExpectLoadsAs(**reopened, b);
  EXPECT_EQ((*reopened)->TenantBytes("acme"),
            a.manifest().stored_bytes() + b.manifest().stored_bytes());
  EXPECT_EQ((*reopened)->GetManifest("acme", "c").status().code(),
            absl::StatusCode::kNotFound);
  (void)committed;
}

}  // namespace
}  // namespace kvd::storage
