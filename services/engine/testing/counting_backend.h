// Test-only: CountingBackendForTest, an ops::ModelBackend (model_backend.h)
// that forwards every call to a real CPU ops::Model and counts the calls per
// method. Handing it to the engine in place of the Model proves the engine
// reaches the model only through the interface a CUDA backend implements:
// a bypass (a cast back to ops::Model) shows up as missing calls, and a cache
// the engine did not make through this backend's NewBlockPool shows up in
// foreign_caches(). Its pools are host memory, so host reads of cache rows
// go unnoticed here; on a device pool they abort (KvCache::CheckHostAccess),
// which services/engine:cuda_engine_test exercises on a GPU. Outputs are the
// Model's, bit for bit, so runs over it compare directly with runs over the
// Model.
//
// Thread-safety: as the Model's; the counters may be read while the engine
// runs (the scheduler thread calls Forward, restores call the rest).
//
//   CountingBackendForTest backend(*model);
//   SessionEngine engine(backend, identity, &store, options);
//   ... turns ...
//   EXPECT_GT(backend.calls(CountingBackendForTest::kForward), 0);
#ifndef KVD_SERVICES_ENGINE_TESTING_COUNTING_BACKEND_H_
#define KVD_SERVICES_ENGINE_TESTING_COUNTING_BACKEND_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "ops/model/model.h"
#include "ops/model/model_backend.h"

namespace kvd::engine::testing {

class CountingBackendForTest final : public ops::ModelBackend {
 public:
  enum Method {
    kBackendName,
    kConfig,
    kPrecision,
    kNewBlockPool,
    kNewCache,
    kForward,
    kForwardLayers,
    kRecomputeKvIntoCache,
    kReadKvRows,
    kWriteKvRows,
    kNumMethods,
  };
  static const char* MethodName(Method m);

  // `model` must outlive the backend.
  explicit CountingBackendForTest(const ops::Model& model) : model_(model) {}

  int64_t calls(Method m) const { return calls_[m].load(); }
  // "Forward=12 ForwardLayers=0 ...", for failure messages.
  std::string Summary() const;
  // Caches passed to Forward, ForwardLayers or RecomputeKvIntoCache whose
  // pool did not come from this backend's NewBlockPool (a backend whose
  // blocks live in device memory could not serve them).
  int64_t foreign_caches() const { return foreign_caches_.load(); }

  // Fault injection, as a tensor-parallel shard worker that died and was
  // restarted: from the next Forward until the next NewCache, every Forward
  // fails UNAVAILABLE and every cache reads as lost (CacheIntact false).
  void LoseKvAtNextForward() { lose_at_next_forward_ = true; }
  bool CacheIntact(const ops::KvCache& cache) const override {
    return !kv_lost_.load();
  }

  const char* backend_name() const override;
  const ops::ModelConfig& config() const override;
  ops::Precision precision() const override;
  uint32_t numerics_version() const override;             // not counted
  absl::Status BoundedHotWindowSupport() const override;  // not counted
  absl::StatusOr<std::unique_ptr<ops::KvBlockPool>> NewBlockPool(
      const ops::KvBlockPool::Options& options) const override;
  absl::StatusOr<ops::KvCache> NewCache(ops::KvBlockPool* pool) const override;
  absl::Status RecomputeKvIntoCache(int64_t layer, const float* residuals,
                                    int64_t position, int64_t n,
                                    ops::KvCache* cache) const override;
  absl::Status KvRowAccess() const override;  // not counted
  absl::Status ReadKvRows(const ops::KvCache& cache, int64_t layer,
                          int64_t position, int64_t n,
                          uint8_t* rows) const override;
  absl::Status WriteKvRows(ops::KvCache* cache, int64_t layer, int64_t position,
                           int64_t n, const uint8_t* rows) const override;

 protected:
  absl::Status RunForward(absl::Span<const ops::SequenceStep> batch,
                          ops::ForwardOutput* out,
                          ops::ResidualObserver* observer,
                          ops::ResidualPatcher* patcher) const override;
  absl::Status RunForwardLayers(ops::KvCache* cache, int64_t position,
                                int64_t n, int64_t first_layer,
                                int64_t end_layer, float* h,
                                ops::ResidualObserver* observer,
                                int64_t sequence_id) const override;

 private:
  void Count(Method m) const { calls_[m]++; }
  // Counts `cache` in foreign_caches() unless its pool is one of ours.
  void CheckOwnCache(const ops::KvCache* cache) const;

  const ops::Model& model_;
  mutable std::array<std::atomic<int64_t>, kNumMethods> calls_{};
  mutable std::atomic<int64_t> foreign_caches_{0};
  mutable std::atomic<bool> lose_at_next_forward_{false};
  mutable std::atomic<bool> kv_lost_{false};
  mutable absl::Mutex mu_;
  // Pools NewBlockPool handed out (compared by address only: a pool may be
  // destroyed while the backend lives).
  mutable absl::flat_hash_set<const ops::KvBlockPool*> pools_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kvd::engine::testing

#endif  // KVD_SERVICES_ENGINE_TESTING_COUNTING_BACKEND_H_
