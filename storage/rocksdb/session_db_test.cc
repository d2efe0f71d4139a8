// The RocksDB tier's contract: turns round-trip, everything survives a
// reopen (the per-tenant index is rebuilt from disk), keys are the documented
// bytes, tenants are isolated, quotas hold, damage is reported by chunk,
// deletes and sweeps leave nothing behind, and Open explains bad paths.
// Raw checks open the same directory with the plain RocksDB API after the
// SessionDb is closed.
#include "storage/rocksdb/session_db.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "storage/checkpoint/codec.h"
#include "storage/checkpoint/ownership.h"
#include "storage/checkpoint/session_file.h"
#include "storage/checkpoint/testing/recording_observer.h"
#include "storage/rocksdb/disk_full.h"
#include "storage/rocksdb/keys.h"
#include "storage/rocksdb/session_db_test_util.h"

namespace kvd::storage {
namespace {

using ::kvd::storage::testing::RecordingObserver;
using ::kvd::storage::testing::SyntheticSession;
using ::kvd::storage::testing::SyntheticSessionOptions;
using ::testing::HasSubstr;

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
}

// The DB directory opened with the plain RocksDB API, for checks and damage
// that must not go through SessionDb.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    std::vector<std::string> names;
    EXPECT_TRUE(
        rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), path, &names)
            .ok());
    std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
    for (const std::string& n : names) {
      rocksdb::ColumnFamilyOptions o;
      o.enable_blob_files = n == "residuals";
      descriptors.emplace_back(n, o);
    }
    rocksdb::DB* db = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(rocksdb::DBOptions(), path,
                                          descriptors, &handles_, &db);
    EXPECT_TRUE(s.ok()) << s.ToString();
    db_.reset(db);
  }
  ~RawDb() {
    for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h);
  }
  rocksdb::ColumnFamilyHandle* cf(const std::string& name) {
    for (auto* h : handles_) {
      if (h->GetName() == name) return h;
    }
    ADD_FAILURE() << "no column family " << name;
    return nullptr;
  }
  // Every key of a family, in order.
  std::vector<std::string> Keys(const std::string& family) {
    std::vector<std::string> keys;
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(rocksdb::ReadOptions(), cf(family)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      keys.push_back(it->key().ToString());
    }
    return keys;
  }
  rocksdb::DB* db() { return db_.get(); }

 private:
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  std::unique_ptr<rocksdb::DB> db_;
};

class SessionDbTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    options_.path = TestDir(info->name());
    options_.durability = Durability::kWal;  // fast; sync has its own test
    Reopen();
  }
  void Reopen() {
    db_.reset();
    auto db = SessionDb::Open(options_);
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
  }
  void ExpectLoadsAsCommitted(const SyntheticSession& s,
                              absl::string_view tenant = "acme") {
    auto cp = db_->Load(tenant, s.manifest().session_id());
    ASSERT_TRUE(cp.ok()) << cp.status();
    EXPECT_EQ(cp->manifest().SerializeAsString(),
              s.manifest().SerializeAsString());
    const int64_t c = s.manifest().chunk_tokens();
    size_t expected = (s.manifest().token_count() + c - 1) / c;
    expected +=
        s.manifest().layers_size() * ((s.manifest().length() + c - 1) / c);
    EXPECT_EQ(cp->chunks().size(), expected);
    for (const auto& [id, value] : cp->chunks()) {
      EXPECT_EQ(value, s.ChunkValue(id)) << id.layer << "/" << id.index;
    }
  }

  // Keys of the token and residual families starting with `prefix`, read
  // with RocksDB directly (the database is reopened afterwards).
  std::vector<std::string> RawKeysWithPrefix(const std::string& prefix) {
    db_.reset();
    std::vector<std::string> found;
    {
      RawDb raw(options_.path);
      for (const char* family : {"tokens", "residuals"}) {
        for (const std::string& k : raw.Keys(family)) {
          if (k.rfind(prefix, 0) == 0) found.push_back(k);
        }
      }
    }
    Reopen();
    return found;
  }

  SessionDbOptions options_;
  std::unique_ptr<SessionDb> db_;
};

TEST_F(SessionDbTest, TurnsRoundTrip) {
  SyntheticSession s;
  for (int64_t n : {5, 3, 6})
    ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(n)).ok());
  ExpectLoadsAsCommitted(s);
  auto m = db_->GetManifest("acme", "chat-1");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->token_count(), 14);
  EXPECT_EQ(db_->TenantBytes("acme"), s.manifest().stored_bytes());
  EXPECT_GT(db_->DiskBytes(), 0);
}

TEST_F(SessionDbTest, CompressedResidualsRoundTrip) {
  options_.compress_residuals = true;
  Reopen();
  SyntheticSessionOptions o;
  o.row_bytes = 2048;  // 8 KiB chunks: above the blob threshold
  SyntheticSession s(o);
  for (int64_t n : {5, 9}) ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(n)).ok());
  Reopen();
  ExpectLoadsAsCommitted(s);
}

// A clean close writes the memtables out, so the next open has no log to
// replay (replaying a large session's chunks cost seconds at startup).
TEST_F(SessionDbTest, CloseLeavesNoLogToReplay) {
  SyntheticSessionOptions o;
  o.row_bytes = 2048;  // 8 KiB chunks: above the blob threshold
  SyntheticSession s(o);
  ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(9)).ok());
  db_.reset();
  int64_t log_bytes = 0, blob_bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(options_.path)) {
    if (e.path().extension() == ".log") log_bytes += e.file_size();
    if (e.path().extension() == ".blob") blob_bytes += e.file_size();
  }
  EXPECT_EQ(log_bytes, 0);
  EXPECT_GE(blob_bytes, 2 * 8 * 2048);  // both layers' full chunks
  Reopen();
  ExpectLoadsAsCommitted(s);
}

TEST_F(SessionDbTest, ReopenListsAndLoadsEverything) {
  std::vector<SyntheticSession> sessions;
  for (const char* tenant : {"acme", "globex"}) {
    for (int i = 0; i < 5; ++i) {
      SyntheticSessionOptions o;
      o.tenant = tenant;
      o.session = "s" + std::to_string(i);
      o.seed = i + 7;
      sessions.emplace_back(o);
      ASSERT_TRUE(db_->CommitTurn(sessions.back().AppendTurn(3 + i)).ok());
      ASSERT_TRUE(db_->CommitTurn(sessions.back().AppendTurn(2)).ok());
    }
  }
  const int64_t acme_bytes = db_->TenantBytes("acme");
  EXPECT_GT(acme_bytes, 0);
  Reopen();  // a new process: nothing in memory survives

  EXPECT_EQ(db_->TenantBytes("acme"), acme_bytes);
  for (const SyntheticSession& s : sessions) {
    ExpectLoadsAsCommitted(s, s.manifest().tenant());
  }
  std::vector<std::string> listed;
  std::string token;
  int pages = 0;
  do {
    auto page = db_->ListSessions("globex", token, 2);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const auto& m : page->sessions) {
      EXPECT_EQ(m.tenant(), "globex");
      listed.push_back(m.session_id());
    }
    token = page->next_page_token;
    ++pages;
  } while (!token.empty());
  EXPECT_EQ(pages, 3);
  EXPECT_THAT(listed, ::testing::ElementsAre("s0", "s1", "s2", "s3", "s4"));
}

TEST_F(SessionDbTest, KeysOnDiskAreTheDocumentedBytes) {
  SyntheticSession s;  // layers {0, 2}, 4 tokens per chunk
  ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(5)).ok());
  db_.reset();
  RawDb raw(options_.path);
  const std::string p = "acme/chat-1/";
  auto id = [](int layer_msb, int layer_lsb, int index) {
    std::string b(16, '\0');
    b[0] = static_cast<char>(layer_msb);
    for (int i = 1; i < 8; ++i) b[i] = static_cast<char>(layer_lsb);
    b[7] = static_cast<char>(layer_msb == 0x7f ? 0xff : layer_lsb);
    b[15] = static_cast<char>(index);
    return b;
  };
  // Token layer -1: 7f ff ff ff ff ff ff ff; layer 2: 80 00 .. 02.
  EXPECT_THAT(
      raw.Keys("tokens"),
      ::testing::ElementsAre(p + id(0x7f, 0xff, 0), p + id(0x7f, 0xff, 1)));
  std::string layer2 = id(0x80, 0, 0);
  layer2[7] = 2;
  std::string layer2b = layer2;
  layer2b[15] = 1;
  EXPECT_THAT(raw.Keys("residuals"),
              ::testing::ElementsAre(p + id(0x80, 0, 0), p + id(0x80, 0, 1),
                                     p + layer2, p + layer2b));
  EXPECT_THAT(raw.Keys("manifests"), ::testing::ElementsAre("acme/chat-1"));
}

TEST_F(SessionDbTest, TenantsAreIsolated) {
  SyntheticSession a;  // tenant acme, session chat-1
  ASSERT_TRUE(db_->CommitTurn(a.AppendTurn(6)).ok());
  EXPECT_EQ(db_->Load("globex", "chat-1").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(db_->GetManifest("globex", "chat-1").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(db_->DeleteSession("globex", "chat-1").code(),
            absl::StatusCode::kNotFound);
  auto page = db_->ListSessions("globex", "", 10);
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->sessions.empty());
  // A tenant whose name extends another's sees nothing of it either.
  EXPECT_TRUE(db_->ListSessions("acm", "", 10)->sessions.empty());
  EXPECT_TRUE(db_->ListSessions("acme-2", "", 10)->sessions.empty());
  // globex's own chat-1 is a different session.
  SyntheticSessionOptions o;
  o.tenant = "globex";
  o.seed = 99;
  SyntheticSession b(o);
  ASSERT_TRUE(db_->CommitTurn(b.AppendTurn(3)).ok());
  ExpectLoadsAsCommitted(a, "acme");
  ExpectLoadsAsCommitted(b, "globex");
  ASSERT_TRUE(db_->DeleteSession("globex", "chat-1").ok());
  ExpectLoadsAsCommitted(a, "acme");
}

TEST_F(SessionDbTest, QuotaIsEnforcedAndSurvivesReopen) {
  SyntheticSession s;  // 36 stored bytes per token
  options_.tenant_quota_bytes["acme"] = 36 * 10;
  Reopen();
  ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(8)).ok());
  const TurnUpdate over = s.AppendTurn(3);  // 11 tokens > 10
  absl::Status st = db_->CommitTurn(over);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(st.message(), HasSubstr("tenant acme"));
  EXPECT_THAT(st.message(), HasSubstr("quota of 360"));
  EXPECT_EQ(db_->GetManifest("acme", "chat-1")->token_count(), 8);  // unchanged
  EXPECT_EQ(db_->TenantBytes("acme"), 36 * 8);

  // Other tenants are not limited by acme's quota.
  SyntheticSessionOptions o;
  o.tenant = "globex";
  SyntheticSession g(o);
  EXPECT_TRUE(db_->CommitTurn(g.AppendTurn(20)).ok());

  Reopen();  // quota accounting rebuilt from disk
  EXPECT_EQ(db_->TenantBytes("acme"), 36 * 8);
  EXPECT_EQ(db_->TenantBytes("globex"), 36 * 20);
  EXPECT_EQ(db_->QuotaBytes("acme"), 360);
  EXPECT_EQ(db_->QuotaBytes("globex"), 0);  // no default: unlimited
  EXPECT_EQ(db_->CommitTurn(over).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(db_->DeleteSession("acme", "chat-1").ok());
  EXPECT_EQ(db_->TenantBytes("acme"), 0);
  SyntheticSessionOptions o2;
  o2.session = "chat-2";
  SyntheticSession s2(o2);
  EXPECT_TRUE(db_->CommitTurn(s2.AppendTurn(10)).ok());
}

TEST_F(SessionDbTest, QuotaBytesFallsBackToTheDefault) {
  options_.tenant_quota_bytes["acme"] = 100;
  options_.default_quota_bytes = 7000;
  Reopen();
  EXPECT_EQ(db_->QuotaBytes("acme"), 100);
  EXPECT_EQ(db_->QuotaBytes("globex"), 7000);
  EXPECT_EQ(db_->TenantBytes("globex"), 0);
}

TEST_F(SessionDbTest, FlippedResidualByteIsReportedByChunk) {
  SyntheticSession s;
  ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(7)).ok());
  db_.reset();
  {
    RawDb raw(options_.path);
    const std::string key = ChunkKey("acme", "chat-1", {2, 1});
    std::string value;
    ASSERT_TRUE(
        raw.db()
            ->Get(rocksdb::ReadOptions(), raw.cf("residuals"), key, &value)
            .ok());
    value[value.size() - 3] ^= 0x04;  // inside the payload
    ASSERT_TRUE(
        raw.db()
            ->Put(rocksdb::WriteOptions(), raw.cf("residuals"), key, value)
            .ok());
  }
  Reopen();
  RecordingObserver seen;
  auto cp = db_->Load("acme", "chat-1", SessionDb::Parts::kAll, &seen);
  ASSERT_FALSE(cp.ok());
  EXPECT_EQ(cp.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(cp.status().message(), HasSubstr("session acme/chat-1"));
  EXPECT_THAT(cp.status().message(), HasSubstr("layer 2 chunk 1"));
  EXPECT_THAT(cp.status().message(), HasSubstr("CRC32C"));
  // An observer got the streams read before the bad chunk, then the error.
  EXPECT_THAT(seen.events,
              ::testing::ElementsAre("manifest chat-1", "stream -1 x2",
                                     "stream 0 x2", "end DATA_LOSS"));
  // Tokens are intact, so the engine can re-prefill.
  RecordingObserver tokens_seen;
  auto tokens = db_->Load("acme", "chat-1",
                          SessionDb::Parts::kManifestAndTokens, &tokens_seen);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->chunks().size(), 2u);
  EXPECT_THAT(
      tokens_seen.events,
      ::testing::ElementsAre("manifest chat-1", "stream -1 x2", "end OK"));
}

TEST_F(SessionDbTest, MissingChunkIsDataLoss) {
  SyntheticSession s;
  ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(7)).ok());
  db_.reset();
  {
    RawDb raw(options_.path);
    auto* res = raw.cf("residuals");
    ASSERT_TRUE(raw.db()
                    ->Delete(rocksdb::WriteOptions(), res,
                             ChunkKey("acme", "chat-1", {0, 1}))
                    .ok());
  }
  Reopen();
  absl::Status st = db_->Load("acme", "chat-1").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), HasSubstr("layer 0 chunk 1 is missing"));
}

TEST_F(SessionDbTest, ObserverSeesEachStreamInOrderThenTheEnd) {
  SyntheticSession s(SyntheticSessionOptions{.layers = {0, 2, 5}});
  ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(7)).ok());
  ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(3)).ok());
  RecordingObserver seen;
  auto cp = db_->Load("acme", "chat-1", SessionDb::Parts::kAll, &seen);
  ASSERT_TRUE(cp.ok()) << cp.status();
  // 10 tokens in chunks of 4: three chunks per stream.
  EXPECT_THAT(seen.events, ::testing::ElementsAre(
                               "manifest chat-1", "stream -1 x3", "stream 0 x3",
                               "stream 2 x3", "stream 5 x3", "end OK"));
  EXPECT_EQ(seen.streamed, cp->chunks());
}

TEST_F(SessionDbTest, ObserverSeesTheStreamsBeforeAMissingChunkThenTheError) {
  SyntheticSession s(SyntheticSessionOptions{.layers = {0, 2, 5}});
  ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(10)).ok());
  db_.reset();
  {
    RawDb raw(options_.path);
    ASSERT_TRUE(raw.db()
                    ->Delete(rocksdb::WriteOptions(), raw.cf("residuals"),
                             ChunkKey("acme", "chat-1", {2, 2}))
                    .ok());
  }
  Reopen();
  RecordingObserver seen;
  absl::Status st =
      db_->Load("acme", "chat-1", SessionDb::Parts::kAll, &seen).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), HasSubstr("layer 2 chunk 2 is missing"));
  // Layer 2's stream never completes, so it is not handed over.
  EXPECT_THAT(seen.events,
              ::testing::ElementsAre("manifest chat-1", "stream -1 x3",
                                     "stream 0 x3", "end DATA_LOSS"));
}

TEST_F(SessionDbTest, ObserverIsToldNothingWhenTheSessionIsUnknown) {
  RecordingObserver seen;
  EXPECT_EQ(db_->Load("acme", "nobody", SessionDb::Parts::kAll, &seen)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(seen.events.empty());
}

TEST_F(SessionDbTest, ChunkUnderWrongKeyIsDataLoss) {
  SyntheticSession s;
  ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(7)).ok());
  db_.reset();
  {
    RawDb raw(options_.path);
    auto* res = raw.cf("residuals");
    std::string v;
    ASSERT_TRUE(raw.db()
                    ->Get(rocksdb::ReadOptions(), res,
                          ChunkKey("acme", "chat-1", {0, 0}), &v)
                    .ok());
    ASSERT_TRUE(raw.db()
                    ->Put(rocksdb::WriteOptions(), res,
                          ChunkKey("acme", "chat-1", {2, 0}), v)
                    .ok());
  }
  Reopen();
  absl::Status st = db_->Load("acme", "chat-1").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), HasSubstr("layer 2 chunk 0: header says layer 0"));
}

TEST_F(SessionDbTest, BadWritesAreRefusedBeforeStoring) {
  SyntheticSession s;
  TurnUpdate t = s.AppendTurn(5);
  TurnUpdate swapped = t;
  std::swap(swapped.put[0].second, swapped.put[1].second);
  absl::Status st = db_->CommitTurn(swapped);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("header says"));
  TurnUpdate bad_manifest = t;
  bad_manifest.manifest.set_tenant("a/b");
  EXPECT_EQ(db_->CommitTurn(bad_manifest).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(db_->GetManifest("acme", "chat-1").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(db_->Load("acme", "../x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(db_->ListSessions("acme", "", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(db_->ListSessions("acme", "no/such", 5).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SessionDbTest, SlidingWindowEraseIsHonoured) {
  SyntheticSession s;
  ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(12)).ok());
  TurnUpdate t = s.AppendTurn(1);
  t.manifest.set_first_position(0, 8);  // layer 0 keeps positions >= 8
  t.erase = {ChunkId{0, 0}, ChunkId{0, 1}};
  ASSERT_TRUE(db_->CommitTurn(t).ok());
  auto cp = db_->Load("acme", "chat-1");
  ASSERT_TRUE(cp.ok()) << cp.status();
  EXPECT_EQ(cp->chunks().count(ChunkId{0, 0}), 0u);
  EXPECT_EQ(cp->chunks().count(ChunkId{0, 2}), 1u);
  EXPECT_EQ(cp->chunks().count(ChunkId{2, 0}), 1u);
}

TEST_F(SessionDbTest, DeleteSessionRemovesEveryKey) {
  SyntheticSession s;
  SyntheticSessionOptions o;
  o.session = "chat-10";  // shares a textual prefix; must survive
  SyntheticSession keep(o);
  ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(9)).ok());
  ASSERT_TRUE(db_->CommitTurn(keep.AppendTurn(9)).ok());
  ASSERT_TRUE(db_->DeleteSession("acme", "chat-1").ok());
  EXPECT_EQ(db_->Load("acme", "chat-1").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(db_->DeleteSession("acme", "chat-1").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(db_->TenantBytes("acme"), keep.manifest().stored_bytes());
  ExpectLoadsAsCommitted(keep);
  db_.reset();
  RawDb raw(options_.path);
  for (const char* family : {"manifests", "tokens", "residuals"}) {
    for (const std::string& k : raw.Keys(family)) {
      EXPECT_FALSE(k == "acme/chat-1" || k.rfind("acme/chat-1/", 0) == 0)
          << family << " still has " << k;
    }
  }
  EXPECT_EQ(raw.Keys("tokens").size(), 3u);  // chat-10's
}

TEST_F(SessionDbTest, SweepRemovesOrphansOnly) {
  SyntheticSession live;
  ASSERT_TRUE(db_->CommitTurn(live.AppendTurn(6)).ok());
  db_.reset();
  {
    RawDb raw(options_.path);
    SyntheticSessionOptions o;
    o.session = "ghost";  // chunks without a manifest
    SyntheticSession ghost(o);
    TurnUpdate g = ghost.AppendTurn(6);
    for (const auto& [id, value] : g.put) {
      ASSERT_TRUE(
          raw.db()
              ->Put(rocksdb::WriteOptions(),
                    raw.cf(id.layer == kTokenLayer ? "tokens" : "residuals"),
                    ChunkKey("acme", "ghost", id), value)
              .ok());
    }
    // Beyond the live manifest (6 tokens = chunks 0, 1): chunk 5.
    ASSERT_TRUE(raw.db()
                    ->Put(rocksdb::WriteOptions(), raw.cf("residuals"),
                          ChunkKey("acme", "chat-1", {0, 5}), "junk")
                    .ok());
    // A layer the live manifest does not checkpoint.
    ASSERT_TRUE(raw.db()
                    ->Put(rocksdb::WriteOptions(), raw.cf("residuals"),
                          ChunkKey("acme", "chat-1", {1, 0}), "junk")
                    .ok());
  }
  Reopen();
  ExpectLoadsAsCommitted(live);  // orphans are ignored by Load
  auto stats = db_->SweepOrphans();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->orphan_chunks_deleted,
            6 + 2);                       // ghost: 2 token + 4 residual
  EXPECT_EQ(stats->sessions_checked, 2);  // chat-1 and ghost
  ExpectLoadsAsCommitted(live);
  EXPECT_EQ(db_->SweepOrphans()->orphan_chunks_deleted, 0);
  db_.reset();
  RawDb raw(options_.path);
  EXPECT_EQ(raw.Keys("tokens").size(), 2u);
  EXPECT_EQ(raw.Keys("residuals").size(), 4u);
}

TEST_F(SessionDbTest, PutSessionReplacesAWholeSession) {
  SyntheticSession s;
  ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(12)).ok());
  SyntheticSessionOptions o;
  o.seed = 5;
  SyntheticSession other(o);
  TurnUpdate t = other.AppendTurn(3);
  SessionCheckpoint cp;
  ASSERT_TRUE(cp.Apply(t).ok());
  ASSERT_TRUE(db_->PutSession(cp).ok());
  ExpectLoadsAsCommitted(other);
  EXPECT_EQ(db_->TenantBytes("acme"), other.manifest().stored_bytes());
  db_.reset();
  RawDb raw(options_.path);
  EXPECT_EQ(raw.Keys("residuals").size(), 2u);  // old chunks 1, 2 are gone
}

// An imported file's manifest must not under- or over-state what its chunks
// store: quotas and per-tenant totals trust stored_bytes.
// A new session larger than one import batch is written in several
// batches, chunks first and the manifest last, and reads back whole.
TEST_F(SessionDbTest, LargeImportOfANewSessionRoundTrips) {
  SyntheticSessionOptions o;
  o.session = "big";
  o.row_bytes = 16384;
  o.chunk_tokens = 64;
  SyntheticSession s(o);
  SessionCheckpoint cp;
  ASSERT_TRUE(cp.Apply(s.AppendTurn(576)).ok());
  ASSERT_GT(cp.bytes(), int64_t{16} << 20);  // two or more batches
  ASSERT_TRUE(db_->PutSession(cp).ok());
  ExpectLoadsAsCommitted(s);
  EXPECT_EQ(db_->TenantBytes("acme"), s.manifest().stored_bytes());
  // A misstated size, and an import over the tenant's quota, are refused
  // before anything is written: no chunk of either lands.
  SyntheticSessionOptions other = o;
  other.session = "bad";
  SyntheticSession b(other);
  SessionCheckpoint bad;
  ASSERT_TRUE(bad.Apply(b.AppendTurn(576)).ok());
  v1::SessionManifest m = bad.manifest();
  m.set_stored_bytes(1);
  bad.ReplaceManifest(m);
  EXPECT_EQ(db_->PutSession(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(RawKeysWithPrefix(ChunkPrefix("acme", "bad")).empty());
  options_.default_quota_bytes = s.manifest().stored_bytes() + 1024;
  Reopen();
  m.set_stored_bytes(b.manifest().stored_bytes());
  bad.ReplaceManifest(m);
  const absl::Status quota = db_->PutSession(bad);
  EXPECT_EQ(quota.code(), absl::StatusCode::kResourceExhausted) << quota;
  EXPECT_TRUE(RawKeysWithPrefix(ChunkPrefix("acme", "bad")).empty());
  EXPECT_EQ(db_->TenantBytes("acme"), s.manifest().stored_bytes());
  EXPECT_EQ(db_->GetManifest("acme", "bad").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(SessionDbTest, PutSessionRefusesAManifestThatMisstatesItsBytes) {
  SyntheticSession s;
  ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(12)).ok());
  SyntheticSessionOptions o;
  o.seed = 5;
  SyntheticSession other(o);
  SessionCheckpoint good;
  ASSERT_TRUE(good.Apply(other.AppendTurn(3)).ok());
  for (int64_t delta : {-1, +1}) {
    v1::SessionManifest m = good.manifest();
    m.set_stored_bytes(m.stored_bytes() + delta);
    SessionCheckpoint edited;
    edited.Reset(m, good.chunks());
    absl::Status st = db_->PutSession(edited);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(st.message(), HasSubstr("stored bytes"));
  }
  ExpectLoadsAsCommitted(s);  // the session stored before is untouched
  EXPECT_EQ(db_->TenantBytes("acme"), s.manifest().stored_bytes());
  ASSERT_TRUE(db_->PutSession(good).ok());
}

// A flush or compaction that reads a damaged table makes RocksDB refuse every
// write until reopened, and the same file stops it again later. The commit
// must say so and what recovers the sessions, and WriteHealth (readiness)
// must report it, not leave operators with a bare checksum error.
TEST_F(SessionDbTest, DamagedTableStopsWritesWithSalvageAdvice) {
  options_.memtable_bytes = 1 << 20;  // flushes every few hundred KiB
  Reopen();
  SyntheticSessionOptions o;
  o.row_bytes = 16384;  // 64 KiB chunks
  SyntheticSession s(o);
  for (int turn = 0; turn < 2; ++turn) {
    ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(64)).ok());
  }
  absl::StatusOr<SessionCheckpoint> whole = db_->Load("acme", "chat-1");
  ASSERT_TRUE(whole.ok()) << whole.status();
  db_.reset();

  // Damage the first data block of every table of the residual family.
  std::vector<std::string> tables;
  {
    RawDb raw(options_.path);
    rocksdb::ColumnFamilyMetaData meta;
    raw.db()->GetColumnFamilyMetaData(raw.cf("residuals"), &meta);
    for (const auto& level : meta.levels) {
      for (const auto& f : level.files) {
        tables.push_back(options_.path + "/" + f.name);
      }
    }
  }
  ASSERT_FALSE(tables.empty());
  for (const std::string& t : tables) {
    std::fstream f(t, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(30);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x5a;
    f.seekp(30);
    f.write(&c, 1);
  }

  Reopen();
  EXPECT_TRUE(db_->WriteHealth().ok());
  // Rewriting the same keys makes the compactions read the damaged tables.
  absl::Status st;
  for (int i = 0; i < 60 && st.ok(); ++i) st = db_->PutSession(*whole);
  ASSERT_FALSE(st.ok()) << "no compaction read a damaged table";
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr("stopped taking writes"));
  EXPECT_THAT(st.message(), HasSubstr("kvd sessions export --all"));
  EXPECT_EQ(db_->WriteHealth().code(), absl::StatusCode::kDataLoss);
  // Every later write is refused the same way, whatever session it is for.
  SyntheticSessionOptions other;
  other.session = "other";
  SyntheticSession fresh(other);
  EXPECT_EQ(db_->CommitTurn(fresh.AppendTurn(3)).code(),
            absl::StatusCode::kDataLoss);
}

// Every commit is conditional on the session's stored epoch and owner
// (ownership.h): after the session moved to another node, a turn from the
// old owner is refused (ABORTED, saying so) and writes nothing; a replica
// copy is not listed and takes no turn.
TEST_F(SessionDbTest, StaleEpochCommitIsRefusedAndWritesNothing) {
  SyntheticSession s;
  ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(5)).ok());
  absl::StatusOr<v1::SessionManifest> stored =
      db_->GetManifest("acme", "chat-1");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(EpochOf(*stored), kFirstEpoch);

  TurnUpdate move;
  move.manifest = *stored;
  move.manifest.set_owner_node("n2");
  move.manifest.set_epoch(2);
  move.ownership_change = true;
  ASSERT_TRUE(db_->CommitTurn(move).ok());

  const absl::Status stale = db_->CommitTurn(s.AppendTurn(3));
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted) << stale;
  EXPECT_THAT(stale.message(), HasSubstr("moved"));
  EXPECT_THAT(stale.message(), HasSubstr("node 'n2'"));
  EXPECT_EQ(db_->GetManifest("acme", "chat-1")->token_count(), 5);
  // An ownership change may not go back either.
  move.manifest.set_owner_node("n1");
  move.manifest.set_epoch(1);
  EXPECT_EQ(db_->CommitTurn(move).code(), absl::StatusCode::kAborted);

  // Released as a replica (to n3 at epoch 3): unlisted, and no turn lands
  // on it, not even from its named owner.
  move.manifest.set_owner_node("n3");
  move.manifest.set_epoch(3);
  move.manifest.set_role(v1::SESSION_ROLE_REPLICA);
  ASSERT_TRUE(db_->CommitTurn(move).ok());
  absl::StatusOr<SessionListPage> page = db_->ListSessions("acme", "", 10);
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->sessions.empty());
  TurnUpdate turn = s.AppendTurn(3);
  turn.manifest.set_owner_node("n3");
  turn.manifest.set_epoch(3);
  const absl::Status replica = db_->CommitTurn(turn);
  EXPECT_EQ(replica.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(replica.message(), HasSubstr("replica"));
  EXPECT_EQ(db_->GetManifest("acme", "chat-1")->token_count(), 5);
}

// A blob file that is gone (deleted by hand, lost with a disk) is damage, not
// a transient I/O error to retry: DATA_LOSS that says a file is missing, and
// the session's token ids still load, so a turn can re-prefill from them.
TEST_F(SessionDbTest, MissingBlobFileIsDataLossAndTokensStillLoad) {
  namespace fs = std::filesystem;
  options_.memtable_bytes = 1 << 20;  // flushes every few hundred KiB
  Reopen();
  SyntheticSessionOptions o;
  o.row_bytes = 16384;  // 64 KiB chunks, in blob files once flushed
  SyntheticSession s(o);
  for (int64_t n : {64, 64}) ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(n)).ok());
  ASSERT_TRUE(db_->Flush().ok());
  db_.reset();
  int removed = 0;
  for (const auto& e : fs::directory_iterator(options_.path)) {
    if (e.path().extension() == ".blob") removed += fs::remove(e.path());
  }
  ASSERT_GT(removed, 0);
  Reopen();
  absl::StatusOr<SessionCheckpoint> all = db_->Load("acme", "chat-1");
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().code(), absl::StatusCode::kDataLoss) << all.status();
  EXPECT_THAT(all.status().message(), HasSubstr("missing"));
  EXPECT_THAT(all.status().message(), HasSubstr("re-prefilling"));
  absl::StatusOr<SessionCheckpoint> tokens =
      db_->Load("acme", "chat-1", SessionDb::Parts::kManifestAndTokens);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->manifest().token_count(), 128);

  // Salvage exports what a turn could still resume from: the token ids, as
  // a valid session file, and says what was lost.
  absl::StatusOr<SessionDb::Salvaged> salvaged =
      db_->LoadForSalvage("acme", "chat-1");
  ASSERT_TRUE(salvaged.ok()) << salvaged.status();
  EXPECT_EQ(salvaged->residuals_lost.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(salvaged->residuals_lost.message(), HasSubstr("missing"));
  const v1::SessionManifest& m = salvaged->checkpoint.manifest();
  EXPECT_EQ(m.token_count(), 128);
  EXPECT_EQ(m.length(), 0);
  EXPECT_EQ(m.layers_size(), s.manifest().layers_size());
  int64_t token_chunks = 0;
  for (const auto& [id, value] : salvaged->checkpoint.chunks()) {
    EXPECT_EQ(id.layer, kTokenLayer);
    EXPECT_EQ(value, s.ChunkValue(id));
    ++token_chunks;
  }
  EXPECT_EQ(token_chunks, (128 + m.chunk_tokens() - 1) / m.chunk_tokens());
  EXPECT_EQ(m.stored_bytes(), 128 * 4);  // int32 token ids
  absl::StatusOr<std::string> file = SerializeSessionFile(salvaged->checkpoint);
  ASSERT_TRUE(file.ok()) << file.status();
  // An intact session comes back whole.
  SyntheticSessionOptions other;
  other.session = "intact";
  SyntheticSession intact(other);
  ASSERT_TRUE(db_->CommitTurn(intact.AppendTurn(5)).ok());
  absl::StatusOr<SessionDb::Salvaged> whole =
      db_->LoadForSalvage("acme", "intact");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(whole->residuals_lost.ok());
  EXPECT_EQ(whole->checkpoint.manifest().SerializeAsString(),
            intact.manifest().SerializeAsString());
}

// The disk counts as full below a reserve sized to the disk: a turn that
// would go below it is refused before RocksDB runs out (nothing written), the
// advice names the disk's own sizes, readiness says so, deleting a session
// still works, and turns resume without a restart once there is room.
TEST_F(SessionDbTest, FullDiskRefusesTurnsNotDeletesAndResumesByItself) {
  constexpr int64_t kTotal = 5 << 20;  // a 5 MiB disk
  auto available = std::make_shared<std::atomic<int64_t>>(4 << 20);
  options_.disk_space =
      [available](const std::string&) -> absl::StatusOr<DiskSpace> {
    return DiskSpace{kTotal, *available};
  };
  Reopen();
  SyntheticSession s, other([] {
    SyntheticSessionOptions o;
    o.session = "other";
    return o;
  }());
  ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(5)).ok());
  ASSERT_TRUE(db_->CommitTurn(other.AppendTurn(5)).ok());
  EXPECT_TRUE(db_->WriteHealth().ok());

  // The reserve is an eighth of this disk (640 KiB), not a fixed 32 MiB.
  *available = 600 << 10;
  const TurnUpdate turn = s.AppendTurn(3);
  const absl::Status refused = db_->CommitTurn(turn);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_TRUE(IsDiskFull(refused));
  EXPECT_THAT(refused.message(), HasSubstr("600 KiB free of 5.0 MiB"));
  EXPECT_THAT(refused.message(), HasSubstr("keeps 640 KiB free"));
  EXPECT_THAT(refused.message(), HasSubstr("Delete sessions"));
  EXPECT_EQ(db_->GetManifest("acme", "chat-1")->token_count(), 5);
  const absl::Status health = db_->WriteHealth();
  EXPECT_EQ(health.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsDiskFull(health));

  // Deleting is how space comes back: it is not refused.
  EXPECT_TRUE(db_->DeleteSession("acme", "other").ok());
  EXPECT_EQ(db_->GetManifest("acme", "other").status().code(),
            absl::StatusCode::kNotFound);

  // Room again: the same turn commits, no restart needed.
  *available = 4 << 20;
  EXPECT_TRUE(db_->WriteHealth().ok());
  EXPECT_TRUE(db_->CommitTurn(turn).ok());
  EXPECT_EQ(db_->GetManifest("acme", "chat-1")->token_count(), 8);
}

// Above the reserve is not ready enough: a node whose next typical turn
// would be refused reports not ready, sized by the turns it has committed,
// and ready again once a typical turn fits.
TEST_F(SessionDbTest, NotReadyWhileATypicalTurnWouldNotFit) {
  constexpr int64_t kTotal = 24 << 20;  // a 24 MiB disk
  auto available = std::make_shared<std::atomic<int64_t>>(20 << 20);
  options_.disk_space =
      [available](const std::string&) -> absl::StatusOr<DiskSpace> {
    return DiskSpace{kTotal, *available};
  };
  options_.reserve_free_bytes = 3 << 20;
  Reopen();
  SyntheticSessionOptions o;
  o.row_bytes = 4096;
  std::vector<TurnUpdate> turns;
  int64_t turn_bytes = 0;
  for (int i = 0; i < 3; ++i) {
    o.session = absl::StrCat("s", i);
    SyntheticSession s(o);
    turns.push_back(s.AppendTurn(64));
    turn_bytes = std::max(turn_bytes, s.manifest().stored_bytes());
    ASSERT_TRUE(db_->CommitTurn(turns.back()).ok());
  }
  EXPECT_TRUE(db_->WriteHealth().ok());

  // Above the reserve, below the reserve and a typical turn: the turn is
  // refused, and readiness says so before the next one is.
  *available = (3 << 20) + turn_bytes / 2;
  const TurnUpdate next = [&] {
    o.session = "next";
    return SyntheticSession(o).AppendTurn(64);
  }();
  const absl::Status refused = db_->CommitTurn(next);
  EXPECT_TRUE(IsDiskFull(refused)) << refused;
  const absl::Status health = db_->WriteHealth();
  EXPECT_EQ(health.code(), absl::StatusCode::kResourceExhausted) << health;
  EXPECT_TRUE(IsDiskFull(health));
  EXPECT_THAT(health.message(), HasSubstr("a typical turn here writes"));

  // Room for a typical turn again: ready, and the turn commits.
  *available = (3 << 20) + 2 * turn_bytes;
  EXPECT_TRUE(db_->WriteHealth().ok());
  EXPECT_TRUE(db_->CommitTurn(next).ok());
}

// RocksDB's create_if_missing would start an empty database in a directory
// whose CURRENT file is gone, and its next open would delete the old tables
// and blob files as obsolete: every committed session lost. Open must refuse,
// leave every file as it was (even when asked twice), and the advice it
// gives must bring the sessions back.
TEST_F(SessionDbTest, LostCurrentFileIsRefusedAndRepairable) {
  namespace fs = std::filesystem;
  SyntheticSessionOptions o;
  o.row_bytes = 2048;  // residual chunks in blob files
  SyntheticSession s(o);
  for (int64_t n : {5, 9}) ASSERT_TRUE(db_->CommitTurn(s.AppendTurn(n)).ok());
  db_.reset();  // the close flushes the memtables into tables and blobs

  const fs::path dir(options_.path);
  std::string current;
  std::getline(std::ifstream(dir / "CURRENT"), current);
  ASSERT_THAT(current, HasSubstr("MANIFEST-"));
  ASSERT_TRUE(fs::remove(dir / "CURRENT"));
  auto listing = [&] {
    std::map<std::string, uintmax_t> files;
    for (const auto& e : fs::directory_iterator(dir)) {
      files[e.path().filename().string()] = e.file_size();
    }
    return files;
  };
  const auto before = listing();
  bool has_data = false;
  for (const auto& [name, size] : before) {
    has_data |= name.find(".sst") != std::string::npos ||
                name.find(".blob") != std::string::npos ||
                name.find(".log") != std::string::npos;
  }
  ASSERT_TRUE(has_data) << "the test needs data files on disk";

  for (int attempt = 0; attempt < 2; ++attempt) {
    auto db = SessionDb::Open(options_);
    ASSERT_FALSE(db.ok());
    EXPECT_EQ(db.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(db.status().message(), HasSubstr("no CURRENT file"));
    EXPECT_THAT(db.status().message(), HasSubstr("MANIFEST-"));
    EXPECT_EQ(listing(), before) << "attempt " << attempt;
  }

  std::ofstream(dir / "CURRENT") << current << "\n";
  Reopen();
  ExpectLoadsAsCommitted(s);
}

TEST(SessionDbOpen, ExplainsBadPaths) {
  const std::string file = TestDir("a_regular_file");
  std::ofstream(file) << "not a directory";
  SessionDbOptions o;
  o.path = file;
  auto db = SessionDb::Open(o);
  ASSERT_FALSE(db.ok());
  EXPECT_EQ(db.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(db.status().message(), HasSubstr(file));
  EXPECT_THAT(db.status().message(), HasSubstr("not a directory"));

  o.path = file + "/db";  // cannot be created under a regular file
  db = SessionDb::Open(o);
  ASSERT_FALSE(db.ok());
  EXPECT_EQ(db.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(db.status().message(), HasSubstr(o.path));

  o.path = "";
  EXPECT_EQ(SessionDb::Open(o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SessionDbOpen, RefusesASecondOpenAndAForeignFormat) {
  SessionDbOptions o;
  o.path = TestDir("locked");
  auto first = SessionDb::Open(o);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = SessionDb::Open(o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("another kvd process"));
  first->reset();
  {
    RawDb raw(o.path);
    ASSERT_TRUE(raw.db()
                    ->Put(rocksdb::WriteOptions(), raw.cf("default"),
                          "kvd.session_db.format", "kvd-session-db/99")
                    .ok());
  }
  auto foreign = SessionDb::Open(o);
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(foreign.status().message(), HasSubstr("kvd-session-db/99"));
}

}  // namespace
}  // namespace kvd::storage
