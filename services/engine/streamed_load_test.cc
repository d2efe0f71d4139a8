// StreamedLoad over a real TieredStore (RocksDB in a temporary directory):
// a load from RocksDB hands over the manifest and then each stream, equal to
// what the finished load returns; a DRAM hit and an unknown session stream
// nothing; a StreamedLoad dropped without Finish lets its loader end.
#include "services/engine/streamed_load.h"

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/rocksdb/session_db.h"
#include "storage/tiered/testing/sessions.h"
#include "storage/tiered/tiered_store.h"

namespace kvd::engine {
namespace {

using storage::kTokenLayer;
using storage::testing::MakeTurn;

class StreamedLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = absl::StrCat(
        ::testing::TempDir(), "/",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path);
    storage::SessionDbOptions db_options;
    db_options.path = path;
    db_options.durability = storage::Durability::kWal;
    auto db = storage::SessionDb::Open(db_options);
    ASSERT_TRUE(db.ok()) << db.status();
    auto store = storage::TieredStore::Create(*std::move(db), {});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    // 18 tokens in chunks of 4: five chunks per stream (MakeTurn stores
    // token ids and layer 0). Written through to RocksDB, not kept in DRAM.
    ASSERT_TRUE(store_->CommitTurn(MakeTurn("t", "a", 0, 18)).ok());
  }

  std::unique_ptr<storage::TieredStore> store_;
};

TEST_F(StreamedLoadTest, ALoadFromRocksDbHandsOverEachStreamThenFinishes) {
  ASSERT_EQ(store_->dram_stats().entries, 0);
  StreamedLoad load(store_.get(), "t", "a");
  const v1::SessionManifest* m = load.WaitManifest();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->token_count(), 18);
  std::map<storage::ChunkId, std::string> streamed;
  for (int64_t layer : {kTokenLayer, int64_t{0}}) {
    absl::StatusOr<const StreamedLoad::Chunks*> chunks = load.WaitStream(layer);
    ASSERT_TRUE(chunks.ok()) << chunks.status();
    EXPECT_EQ((*chunks)->size(), 5u) << "layer " << layer;
    for (const auto& [id, value] : **chunks) {
      EXPECT_EQ(id.layer, layer);
      streamed[id] = value;
    }
  }
  // A layer the session does not store: nothing, once the load is over.
  absl::StatusOr<const StreamedLoad::Chunks*> none = load.WaitStream(7);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE((*none)->empty());

  absl::StatusOr<storage::TieredStore::Loaded> loaded = load.Finish();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->tier, storage::Tier::kRocksDb);
  EXPECT_EQ(streamed, loaded->checkpoint->chunks());
  EXPECT_EQ(loaded->checkpoint->manifest().SerializeAsString(),
            m->SerializeAsString());
}

TEST_F(StreamedLoadTest, ADramHitStreamsNothing) {
  ASSERT_TRUE(store_->Load("t", "a").ok());  // now cached
  StreamedLoad load(store_.get(), "t", "a");
  EXPECT_EQ(load.WaitManifest(), nullptr);
  absl::StatusOr<storage::TieredStore::Loaded> loaded = load.Finish();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->tier, storage::Tier::kDram);
  EXPECT_EQ(loaded->checkpoint->manifest().token_count(), 18);
}

TEST_F(StreamedLoadTest, AnUnknownSessionStreamsNothingAndIsNotFound) {
  StreamedLoad load(store_.get(), "t", "nobody");
  EXPECT_EQ(load.WaitManifest(), nullptr);
  EXPECT_EQ(load.WaitStream(0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(load.Finish().status().code(), absl::StatusCode::kNotFound);
}

TEST_F(StreamedLoadTest, DroppedWithoutFinishLetsTheLoaderEnd) {
  {
    StreamedLoad load(store_.get(), "t", "a");
    ASSERT_TRUE(load.WaitStream(0).ok());
    // The loader now waits for Finish; the destructor must release it.
  }
  // The load that ran kept the session in DRAM, as TieredStore::Load does.
  StreamedLoad again(store_.get(), "t", "a");
  EXPECT_EQ(again.WaitManifest(), nullptr);
  EXPECT_TRUE(again.Finish().ok());
}

}  // namespace
}  // namespace kvd::engine
