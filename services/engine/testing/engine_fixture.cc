#include "services/engine/testing/engine_fixture.h"

#include <atomic>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "storage/rocksdb/session_db.h"

namespace kvd::engine::testing {

namespace fs = std::filesystem;

std::string FreshTestDir(absl::string_view prefix) {
  static std::atomic<int> counter{0};
  const fs::path dir =
      fs::path(::testing::TempDir()) / absl::StrCat(prefix, "-", counter++);
  fs::remove_all(dir);
  return dir.string();
}

absl::StatusOr<std::unique_ptr<storage::TieredStore>> OpenTestStore(
    const std::string& dir) {
  storage::SessionDbOptions so;
  so.path = dir;
  absl::StatusOr<std::unique_ptr<storage::SessionDb>> db =
      storage::SessionDb::Open(so);
  if (!db.ok()) return db.status();
  storage::TieredStoreOptions to;
  to.dram.budget_bytes = 64 << 20;
  return storage::TieredStore::Create(std::move(*db), to);
}

void EngineTest::OpenEngine(const SessionEngineOptions& options,
                            const ops::ModelBackend* backend) {
  engine_.reset();
  store_.reset();
  absl::StatusOr<std::unique_ptr<storage::TieredStore>> store =
      OpenTestStore(FreshTestDir("engine"));
  ASSERT_TRUE(store.ok()) << store.status();
  store_ = std::move(*store);
  const ops::ModelBackend& b = backend != nullptr ? *backend : *model_;
  engine_ = std::make_unique<SessionEngine>(
      b, ModelIdentityOf(b, "sha256:tiny"), store_.get(), options);
}

}  // namespace kvd::engine::testing
