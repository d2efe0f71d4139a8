#include "services/engine/testing/counting_backend.h"

#include "absl/strings/str_cat.h"

namespace kvd::engine::testing {

const char* CountingBackendForTest::MethodName(Method m) {
  switch (m) {
    case kBackendName:
      return "backend_name";
    case kConfig:
      return "config";
    case kPrecision:
      return "precision";
    case kNewBlockPool:
      return "NewBlockPool";
    case kNewCache:
      return "NewCache";
    case kForward:
      return "Forward";
    case kForwardLayers:
      return "ForwardLayers";
    case kRecomputeKvIntoCache:
      return "RecomputeKvIntoCache";
    case kReadKvRows:
      return "ReadKvRows";
    case kWriteKvRows:
      return "WriteKvRows";
    case kNumMethods:
      break;
  }
  return "unknown";
}

std::string CountingBackendForTest::Summary() const {
  std::string s;
  for (int m = 0; m < kNumMethods; ++m) {
    absl::StrAppend(&s, m == 0 ? "" : " ", MethodName(static_cast<Method>(m)),
                    "=", calls_[m].load());
  }
  absl::StrAppend(&s, " foreign_caches=", foreign_caches_.load());
  return s;
}

const char* CountingBackendForTest::backend_name() const {
  Count(kBackendName);
  return model_.backend_name();
}

const ops::ModelConfig& CountingBackendForTest::config() const {
  Count(kConfig);
  return model_.config();
}

ops::Precision CountingBackendForTest::precision() const {
  Count(kPrecision);
  return model_.precision();
}

uint32_t CountingBackendForTest::numerics_version() const {
  return model_.numerics_version();
}

absl::Status CountingBackendForTest::BoundedHotWindowSupport() const {
  return model_.BoundedHotWindowSupport();
}

absl::StatusOr<std::unique_ptr<ops::KvBlockPool>>
CountingBackendForTest::NewBlockPool(
    const ops::KvBlockPool::Options& options) const {
  Count(kNewBlockPool);
  absl::StatusOr<std::unique_ptr<ops::KvBlockPool>> pool =
      model_.NewBlockPool(options);
  if (pool.ok()) {
    absl::MutexLock lock(&mu_);
    pools_.insert(pool->get());
  }
  return pool;
}

absl::StatusOr<ops::KvCache> CountingBackendForTest::NewCache(
    ops::KvBlockPool* pool) const {
  Count(kNewCache);
  kv_lost_ = false;
  return model_.NewCache(pool);
}

absl::Status CountingBackendForTest::RecomputeKvIntoCache(
    int64_t layer, const float* residuals, int64_t position, int64_t n,
    ops::KvCache* cache) const {
  Count(kRecomputeKvIntoCache);
  CheckOwnCache(cache);
  return model_.RecomputeKvIntoCache(layer, residuals, position, n, cache);
}

absl::Status CountingBackendForTest::KvRowAccess() const {
  return model_.KvRowAccess();
}

absl::Status CountingBackendForTest::ReadKvRows(const ops::KvCache& cache,
                                                int64_t layer, int64_t position,
                                                int64_t n,
                                                uint8_t* rows) const {
  Count(kReadKvRows);
  CheckOwnCache(&cache);
  return model_.ReadKvRows(cache, layer, position, n, rows);
}

absl::Status CountingBackendForTest::WriteKvRows(ops::KvCache* cache,
                                                 int64_t layer,
                                                 int64_t position, int64_t n,
                                                 const uint8_t* rows) const {
  Count(kWriteKvRows);
  CheckOwnCache(cache);
  return model_.WriteKvRows(cache, layer, position, n, rows);
}

absl::Status CountingBackendForTest::RunForward(
    absl::Span<const ops::SequenceStep> batch, ops::ForwardOutput* out,
    ops::ResidualObserver* observer, ops::ResidualPatcher* patcher) const {
  Count(kForward);
  for (const ops::SequenceStep& step : batch) CheckOwnCache(step.cache);
  if (lose_at_next_forward_.exchange(false)) kv_lost_ = true;
  if (kv_lost_) {  // as a shard group's steps on caches whose twins died
    return absl::UnavailableError(
        "injected by CountingBackendForTest: the backend lost every cache's "
        "K/V");
  }
  return model_.Forward(batch, out, observer, patcher);
}

absl::Status CountingBackendForTest::RunForwardLayers(
    ops::KvCache* cache, int64_t position, int64_t n, int64_t first_layer,
    int64_t end_layer, float* h, ops::ResidualObserver* observer,
    int64_t sequence_id) const {
  Count(kForwardLayers);
  CheckOwnCache(cache);
  return model_.ForwardLayers(cache, position, n, first_layer, end_layer, h,
                              observer, sequence_id);
}

void CountingBackendForTest::CheckOwnCache(const ops::KvCache* cache) const {
  if (cache != nullptr) {
    absl::MutexLock lock(&mu_);
    if (pools_.contains(cache->pool())) return;
  }
  foreign_caches_++;
}

}  // namespace kvd::engine::testing
