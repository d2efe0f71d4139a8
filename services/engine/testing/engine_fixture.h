// Test-only scaffolding shared by the engine's tests: TinyModelTest
// (model_fixture.h) plus a SessionEngine over a RocksDB + DRAM tiered store
// in a fresh directory.
//
// Thread-safety: set up on the test thread; the engine itself may then be
// called from any thread (session_engine.h).
//
// Usage:
//   class MyTest : public testing::EngineTest {
//    protected:
//     void SetUp() override { LoadModel(ops::testing::TinyModelSpec()); }
//   };
//   TEST_P(MyTest, Works) {
//     OpenEngine(options);  // engine_ over an empty store
//     engine_->Complete(request, *tokenizer_, nullptr);
//   }
#ifndef KVD_SERVICES_ENGINE_TESTING_ENGINE_FIXTURE_H_
#define KVD_SERVICES_ENGINE_TESTING_ENGINE_FIXTURE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/engine/session_engine.h"
#include "services/engine/testing/model_fixture.h"
#include "storage/tiered/tiered_store.h"

namespace kvd::engine::testing {

// A path under the test's temporary directory, "<prefix>-<n>" with n unique
// in this process, removed if it exists (a database opened there starts
// empty).
std::string FreshTestDir(absl::string_view prefix);

// Opens (creating it if missing) the session database at `dir` behind a
// tiered store with a 64 MiB DRAM tier.
absl::StatusOr<std::unique_ptr<storage::TieredStore>> OpenTestStore(
    const std::string& dir);

class EngineTest : public TinyModelTest {
 protected:
  // Replaces engine_ and store_ with an engine of `options` (model identity
  // "sha256:tiny") over an empty store in a fresh directory, driving
  // `backend` (not owned; outlives the engine) or, when null, model_.
  void OpenEngine(const SessionEngineOptions& options,
                  const ops::ModelBackend* backend = nullptr);

  // Declared before engine_, which points into it: destroyed after it.
  std::unique_ptr<storage::TieredStore> store_;
  std::unique_ptr<SessionEngine> engine_;
};

}  // namespace kvd::engine::testing

#endif  // KVD_SERVICES_ENGINE_TESTING_ENGINE_FIXTURE_H_
