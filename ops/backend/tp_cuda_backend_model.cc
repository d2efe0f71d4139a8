#include "ops/backend/tp_cuda_backend_model.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "kernels/cuda/paged_attention.h"
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
  const ModelConfig& c = config_;
  const int64_t d = c.d_model, n_layers = c.n_layers;
  KVD_ASSIGN_OR_RETURN(const internal::CudaBatchCheck check,
                       internal::CheckCudaBackendBatch(
                           batch, patcher, n_layers, /*cold_supported=*/true));
  ForwardOutput result;
  const std::vector<int64_t> logit_rows =
      SelectLogitRows(batch, c.vocab_size, &result);
  // KvSources' cold positions per sequence and layer, from the lengths
  // PrepareStepCaches will see; every shard recomputes them for its heads.
  const std::vector<std::vector<internal::ColdSpan>> spans =
      internal::PlanColdSpans(batch, c, kc::kAttentionChunk);

  absl::MutexLock lock(&mu_);
  internal::TpForward& f = *fwd_;
  const int degree = f.degree();
  // Every allocation that can fail comes before the caches change: the step
  // buffers, each shard's cold recompute scratch, the observer's staging.
  const int64_t m = check.rows;
  const int64_t n_shown = n_layers + 1;
  bool any_cold = false;
  if (m > 0) {
    KVD_RETURN_IF_ERROR(f.EnsureWorkspace(
        std::max(m, kc::kAttentionChunk), logit_rows.size(),
        // PatchColdChunks' plans: up to a chunk of rows of one sequence.
        internal::PlannedInts(batch, n_layers, logit_rows.size()) +
            3 * kc::kAttentionChunk));
    for (int s = 0; s < degree; ++s) {
      const internal::ColdSizes sizes =
          internal::SizeColdBuffers(c, spans, m, f.n_heads(s), f.n_kv_heads(s));
      any_cold = any_cold || sizes.any;
      KVD_RETURN_IF_ERROR(
          f.EnsureColdBuffers(s, sizes.workspace_bytes, sizes.residual_values));
    }
  }
  float* pinned = nullptr;
  if (observer != nullptr && m > 0) {
    KVD_ASSIGN_OR_RETURN(pinned, f.PinnedFloats(n_shown * m * d));
  }
  std::vector<internal::CudaPool> pools;
  if (m > 0) {
    KVD_ASSIGN_OR_RETURN(pools, ShardPools(*batch.front().cache));
  }

  KVD_RETURN_IF_ERROR(PrepareStepCaches(c, Precision::kBf16, batch).status());
  const internal::PreparedStep prepared = internal::DescribePreparedStep(batch);
  const absl::Status st = [&]() -> absl::Status {
    if (m == 0) return absl::OkStatus();
    // Before the step's rows take the buffers: the rows below each hot
    // boundary but in its chunk, which attention reads from the pools.
    KVD_RETURN_IF_ERROR(internal::PatchColdChunks(f, pools, c, batch, spans));
    KVD_ASSIGN_OR_RETURN(
        const internal::StepPlan plan,
        internal::PlanCacheRows(prepared.seqs, n_layers, logit_rows));
    // Prepare never lengthens a table beyond PlannedInts' count; grow anyway
    // rather than trust it.
    KVD_RETURN_IF_ERROR(f.EnsureWorkspace(m, plan.n_gather, plan.ints.size()));
    KVD_RETURN_IF_ERROR(f.UploadPlan(plan));
    KVD_RETURN_IF_ERROR(f.Embed(plan));

    // Per shard, the cold recompute's arguments over its own scratch.
    std::vector<std::unique_ptr<internal::ColdLayout>> cold;
    std::vector<absl::Span<const internal::CudaColdRows* const>> cold_of;
    if (any_cold) {
      for (int s = 0; s < degree; ++s) {
        cold.push_back(std::make_unique<internal::ColdLayout>(
            spans, n_layers, d, f.cold_residuals(s), f.cold_workspace(s),
            f.cold_workspace_bytes(s)));
        cold_of.push_back(cold.back()->layers());
      }
    }
    std::vector<std::vector<uint16_t>> cold_rows;
    std::function<absl::Status(int64_t)> before_layer;
    if (pinned != nullptr || any_cold) {
      before_layer = [&](int64_t l) -> absl::Status {
        if (pinned != nullptr)
          KVD_RETURN_IF_ERROR(f.DownloadResiduals(pinned + l * m * d, m));
        if (!any_cold || cold.front()->layers()[l] == nullptr)
          return absl::OkStatus();
        // Read once, uploaded to every shard (each recomputes its heads
        // from the replicated residual). The previous layer's attention has
        // read each shard's buffer by the time its upload runs (stream
        // order).
        internal::ReadColdResiduals(c, batch, spans, l, &cold_rows);
        for (int s = 0; s < degree; ++s) {
          for (size_t q = 0; q < batch.size(); ++q) {
            if (cold_rows[q].empty()) continue;
            KVD_RETURN_IF_ERROR(f.UploadBf16(s, cold[s]->targets(l)[q],
                                             cold_rows[q].data(),
                                             cold_rows[q].size()));
          }
        }
        return absl::OkStatus();
      };
    }
    KVD_RETURN_IF_ERROR(
        f.RunLayers(plan, pools, 0, n_layers, before_layer, cold_of));
    if (pinned != nullptr)
      KVD_RETURN_IF_ERROR(f.DownloadResiduals(pinned + n_layers * m * d, m));
    result.logits.resize(plan.n_gather * c.vocab_size);
    KVD_RETURN_IF_ERROR(f.Logits(plan, result.logits.data()));
    return f.Sync("tensor-parallel CUDA backend: running the forward step");
  }();
  return internal::FinishStep(st, batch, prepared, observer, pinned, n_shown, d,
                              std::move(result), out);
}

absl::Status TpCudaBackendModel::RunForwardLayers(KvCache* cache,
                                                  int64_t position, int64_t n,
                                                  int64_t first_layer,
                                                  int64_t end_layer, float* h,
                                                  ResidualObserver* observer,
                                                  int64_t sequence_id) const {
  const ModelConfig& c = config_;
  if (cache != nullptr)
    KVD_RETURN_IF_ERROR(internal::CheckDeviceCache(cache, "ForwardLayers"));
  KVD_ASSIGN_OR_RETURN(const bool work,
                       PrepareLayerRange(c, Precision::kBf16, cache, position,
                                         n, first_layer, end_layer, h));
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
  if (cache != nullptr) {
    KVD_RETURN_IF_ERROR(
        internal::CheckDeviceCache(cache, "RecomputeKvIntoCache"));
  }
  KVD_RETURN_IF_ERROR(CheckRecomputeTarget(config_, Precision::kBf16, layer,
                                           position, n, cache));
  if (n == 0) return absl::OkStatus();
  if (residuals == nullptr) {
    return absl::InvalidArgumentError("RecomputeKvIntoCache: null residuals");
  }
  absl::MutexLock lock(&mu_);
  KVD_ASSIGN_OR_RETURN(const std::vector<internal::CudaPool> pools,
                       ShardPools(*cache));
  // The replicated residual goes to every shard; each computes its own
  // heads (TpForward::ProjectKv).
  return internal::RecomputeKvInChunks(*fwd_, pools, config_, layer, residuals,
                                       position, n, cache);
}

}  // namespace kvd::ops
