#include "ops/backend/tp_cuda_backend_model.h"

#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "ops/backend/backend.h"
#include "ops/backend/internal/backend_steps.h"
#include "ops/backend/internal/block_id_region.h"
#include "ops/backend/internal/cuda_batch.h"
#include "ops/backend/internal/cuda_cache_plan.h"
#include "ops/backend/internal/cuda_forward.h"
#include "ops/backend/internal/device_memory.h"
#include "ops/backend/internal/tp_forward.h"

namespace kvd::ops {
namespace internal {

// One pool's memory: each shard's share of its blocks (a slab on the
// shard's device) and the reserved address range its block numbers come
// from. Owned by the pool (its region's owner); the model only keeps a weak
// reference to find the slabs of a cache's pool.
struct TpSlabs {
  std::vector<int> devices;
  std::vector<void*> slabs;
  std::shared_ptr<void> block_ids;

  ~TpSlabs() {
    for (size_t s = 0; s < slabs.size(); ++s)
      FreeOnDevice(devices[s], slabs[s]);
  }
};

}  // namespace internal

namespace {

namespace kc = ::kvd::kernels::cuda;
using kc::internal::CudaStatus;

}  // namespace

absl::StatusOr<std::unique_ptr<TpCudaBackendModel>> TpCudaBackendModel::Create(
    const Model& cpu_model, const TpCudaBackendOptions& options) {
  if (options.max_pool_blocks < 0 ||
      options.max_pool_blocks > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("TpCudaBackendOptions: max_pool_blocks (",
                     options.max_pool_blocks, ") must be in [0, 2^30]"));
  }
  internal::TpForwardOptions fo;
  fo.degree = options.degree;
  fo.devices = options.devices;
  fo.device = options.device;
  fo.all_reduce = options.all_reduce;
  std::unique_ptr<TpCudaBackendModel> m(new TpCudaBackendModel());
  KVD_ASSIGN_OR_RETURN(m->fwd_, internal::TpForward::Create(
                                    cpu_model, fo, "TpCudaBackendOptions"));
  m->config_ = cpu_model.config();
  m->options_ = options;
  // Every all-reduce adds the partials in shard order (all_reduce.h): one
  // version per degree, on one GPU or several.
  m->numerics_version_ = CudaTpNumericsVersion(options.degree);
  return m;
}

TpCudaBackendModel::~TpCudaBackendModel() = default;

int TpCudaBackendModel::degree() const { return options_.degree; }

absl::Status TpCudaBackendModel::BoundedHotWindowSupport() const {
  return absl::OkStatus();
}

absl::Status TpCudaBackendModel::AllocateSlabs(int64_t blocks,
                                               int64_t block_rows,
                                               internal::TpSlabs* slabs) const {
  for (int s = 0; s < fwd_->degree(); ++s) {
    KVD_RETURN_IF_ERROR(fwd_->SetDevice(s));
    // The shard's K/V heads of every block: 2 * block_rows rows of its
    // kv_width bf16 values.
    const size_t bytes = static_cast<size_t>(blocks) * 2 * block_rows *
                         fwd_->kv_width(s) * sizeof(uint16_t);
    void* slab = nullptr;
    KVD_RETURN_IF_ERROR(CudaStatus(
        cudaMalloc(&slab, bytes),
        absl::StrCat("cudaMalloc of shard ", s, "'s share of a K/V pool (",
                     blocks, " blocks, ", bytes, " bytes on device ",
                     fwd_->device(s), ")")));
    slabs->devices.push_back(fwd_->device(s));
    slabs->slabs.push_back(slab);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvBlockPool>> TpCudaBackendModel::NewBlockPool(
    const KvBlockPool::Options& options) const {
  const size_t row_bytes = KvCache::RowBytes(config_, Precision::kBf16);
  // The CPU pool's checks and messages; a heap pool allocates nothing up
  // front.
  KVD_RETURN_IF_ERROR(KvBlockPool::Create(row_bytes, options).status());
  const size_t block_bytes = 2 * options.block_rows * row_bytes;
  const int64_t blocks = internal::BackendPoolBlocks(
      options.budget_bytes, block_bytes, options_.max_pool_blocks,
      config_.n_layers, config_.context_length, options.block_rows);
  auto slabs = std::make_shared<internal::TpSlabs>();
  KVD_ASSIGN_OR_RETURN(KvBlockPool::Region region,
                       internal::ReserveBlockIdRegion(blocks, block_bytes));
  slabs->block_ids = std::move(region.owner);
  {
    absl::MutexLock lock(&mu_);
    KVD_RETURN_IF_ERROR(AllocateSlabs(blocks, options.block_rows, slabs.get()));
  }
  absl::MutexLock lock(&slabs_mu_);
  // Forget pools that are gone before remembering this one.
  for (auto it = slabs_.begin(); it != slabs_.end();) {
    if (it->second.expired()) {
      slabs_.erase(it++);
    } else {
      ++it;
    }
  }
  slabs_[region.base] = slabs;
  region.owner = slabs;
  KvBlockPool::Options pool_options = options;
  // The budget the pool reports and names when full is what the slabs hold.
  pool_options.budget_bytes = static_cast<size_t>(blocks) * block_bytes;
  return KvBlockPool::CreateInRegion(row_bytes, pool_options, region);
}

absl::StatusOr<KvCache> TpCudaBackendModel::NewCache(KvBlockPool* pool) const {
  if (pool == nullptr) {
    return absl::InvalidArgumentError(
        "tensor-parallel CUDA backend: null K/V block pool");
  }
  {
    absl::MutexLock lock(&slabs_mu_);
    auto it = slabs_.find(pool->region_base());
    if (pool->region_base() == nullptr || it == slabs_.end() ||
        it->second.expired()) {
      return absl::InvalidArgumentError(
          "tensor-parallel CUDA backend: the K/V block pool was not made by "
          "this backend's NewBlockPool (its shards keep their K/V heads in "
          "their own slabs)");
    }
  }
  return KvCache::InPool(config_, Precision::kBf16, pool);
}

absl::StatusOr<std::vector<internal::CudaPool>> TpCudaBackendModel::ShardPools(
    const KvCache& cache) const {
  KVD_ASSIGN_OR_RETURN(uint8_t * base, internal::RegionBase(cache));
  absl::MutexLock lock(&slabs_mu_);
  auto it = slabs_.find(base);
  std::shared_ptr<internal::TpSlabs> slabs =
      it == slabs_.end() ? nullptr : it->second.lock();
  if (slabs == nullptr) {
    return absl::InvalidArgumentError(
        "tensor-parallel CUDA backend: the K/V cache's pool was not made by "
        "this backend's NewBlockPool");
  }
  std::vector<internal::CudaPool> pools;
  for (void* slab : slabs->slabs) {
    pools.push_back({static_cast<uint16_t*>(slab), cache.block_rows()});
  }
  return pools;
}

absl::Status TpCudaBackendModel::RunForward(
    absl::Span<const SequenceStep> batch, ForwardOutput* out,
    ResidualObserver* observer, ResidualPatcher* patcher) const {
  KVD_ASSIGN_OR_RETURN(
      const internal::CudaBatchCheck check,
      internal::CheckCudaBackendBatch(batch, patcher, config_.n_layers));
  absl::MutexLock lock(&mu_);
  // Every cache draws from check.pool: its shards' slabs are found before
  // any cache changes.
  std::vector<internal::CudaPool> pools;
  if (check.rows > 0) {
    KVD_ASSIGN_OR_RETURN(pools, ShardPools(*batch.front().cache));
  }
  return internal::RunStep(
      *fwd_, pools, config_, batch, check.rows, observer, out,
      "tensor-parallel CUDA backend: running the forward step");
}

absl::Status TpCudaBackendModel::RunForwardLayers(KvCache* cache,
                                                  int64_t position, int64_t n,
                                                  int64_t first_layer,
                                                  int64_t end_layer, float* h,
                                                  ResidualObserver* observer,
                                                  int64_t sequence_id) const {
  const ModelConfig& c = config_;
  KVD_ASSIGN_OR_RETURN(const bool work,
                       internal::PrepareDeviceLayerRange(
                           c, cache, position, n, first_layer, end_layer, h));
  if (!work) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  KVD_ASSIGN_OR_RETURN(const std::vector<internal::CudaPool> pools,
                       ShardPools(*cache));
  return internal::ForwardLayersInChunks(*fwd_, pools, c, cache, position, n,
                                         first_layer, end_layer, h, observer,
                                         sequence_id);
}

absl::Status TpCudaBackendModel::RecomputeKvIntoCache(int64_t layer,
                                                      const float* residuals,
                                                      int64_t position,
                                                      int64_t n,
                                                      KvCache* cache) const {
  KVD_ASSIGN_OR_RETURN(const bool work,
                       internal::CheckDeviceRecompute(config_, layer, residuals,
                                                      position, n, cache));
  if (!work) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  KVD_ASSIGN_OR_RETURN(const std::vector<internal::CudaPool> pools,
                       ShardPools(*cache));
  // The replicated residual goes to every shard; each computes its own
  // heads (TpForward::ProjectKv).
  return internal::RecomputeKvInChunks(*fwd_, pools, config_, layer, residuals,
                                       position, n, cache);
}

}  // namespace kvd::ops
