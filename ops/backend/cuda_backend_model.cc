#include "ops/backend/cuda_backend_model.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "kernels/cuda/paged_attention.h"
#include "ops/backend/backend.h"
#include "ops/backend/internal/backend_steps.h"
#include "ops/backend/internal/cuda_batch.h"
#include "ops/backend/internal/cuda_cache_plan.h"
#include "ops/backend/internal/cuda_forward.h"
#include "ops/backend/internal/cuda_step_plan.h"
#include "ops/backend/internal/device_memory.h"

namespace kvd::ops {
namespace {

namespace kc = ::kvd::kernels::cuda;
using kc::internal::CudaStatus;

// Frees a pool's slab on its device (the pool may go on any thread, after
// the model).
struct SlabDeleter {
  int device;
  void operator()(void* p) const { internal::FreeOnDevice(device, p); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackendModel>> CudaBackendModel::Create(
    const Model& cpu_model, const CudaBackendOptions& options) {
  if (options.device < 0 || options.max_pool_blocks < 0 ||
      options.max_pool_blocks > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaBackendOptions: device (", options.device,
                     ") must be >= 0 and max_pool_blocks (",
                     options.max_pool_blocks, ") in [0, 2^30]"));
  }
  std::unique_ptr<CudaBackendModel> m(new CudaBackendModel());
  m->config_ = cpu_model.config();
  m->options_ = options;
  KVD_ASSIGN_OR_RETURN(
      m->fwd_, internal::CudaForward::Create(cpu_model, options.device));
  return m;
}

CudaBackendModel::~CudaBackendModel() = default;

absl::StatusOr<std::unique_ptr<KvBlockPool>> CudaBackendModel::NewBlockPool(
    const KvBlockPool::Options& options) const {
  const size_t row_bytes = KvCache::RowBytes(config_, Precision::kBf16);
  // The CPU pool's checks and messages; a heap pool allocates nothing up
  // front.
  KVD_RETURN_IF_ERROR(KvBlockPool::Create(row_bytes, options).status());
  const size_t block_bytes = 2 * options.block_rows * row_bytes;
  const int64_t blocks = internal::BackendPoolBlocks(
      options.budget_bytes, block_bytes, options_.max_pool_blocks,
      config_.n_layers, config_.context_length, options.block_rows);
  const size_t bytes = static_cast<size_t>(blocks) * block_bytes;
  void* slab = nullptr;
  {
    absl::MutexLock lock(&mu_);
    KVD_RETURN_IF_ERROR(fwd_->SetDevice());
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&slab, bytes),
                   absl::StrCat("cudaMalloc of a K/V block pool (", blocks,
                                " blocks of ", block_bytes, " bytes)")));
  }
  KvBlockPool::Region region;
  region.base = static_cast<uint8_t*>(slab);
  region.blocks = blocks;
  region.owner = std::shared_ptr<void>(slab, SlabDeleter{options_.device});
  region.host_accessible = false;
  KvBlockPool::Options pool_options = options;
  // The budget the pool reports and names when full is the slab it has.
  pool_options.budget_bytes = bytes;
  return KvBlockPool::CreateInRegion(row_bytes, pool_options, region);
}

uint32_t CudaBackendModel::numerics_version() const {
  return kCudaNumericsVersion;
}

absl::Status CudaBackendModel::BoundedHotWindowSupport() const {
  return absl::OkStatus();
}

absl::StatusOr<KvCache> CudaBackendModel::NewCache(KvBlockPool* pool) const {
  if (pool == nullptr) {
    return absl::InvalidArgumentError("CUDA backend: null K/V block pool");
  }
  if (pool->host_accessible()) {
    return absl::InvalidArgumentError(
        "CUDA backend: the K/V block pool is host memory; make it with the "
        "CUDA backend's NewBlockPool");
  }
  return KvCache::InPool(config_, Precision::kBf16, pool);
}

absl::StatusOr<internal::CudaPool> CudaBackendModel::DevicePool(
    const KvCache& cache) const {
  KVD_ASSIGN_OR_RETURN(uint8_t * base, internal::RegionBase(cache));
  cudaPointerAttributes attributes;
  KVD_RETURN_IF_ERROR(
      CudaStatus(cudaPointerGetAttributes(&attributes, base),
                 "CUDA backend: asking where the K/V pool's memory lives"));
  if (attributes.type != cudaMemoryTypeDevice ||
      attributes.device != options_.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA backend: the K/V cache's blocks are not device memory of "
        "device ",
        options_.device, "; make its pool with this backend's NewBlockPool"));
  }
  return internal::CudaPool{reinterpret_cast<uint16_t*>(base),
                            cache.block_rows()};
}

absl::Status CudaBackendModel::RunForward(absl::Span<const SequenceStep> batch,
                                          ForwardOutput* out,
                                          ResidualObserver* observer,
                                          ResidualPatcher* patcher) const {
  const ModelConfig& c = config_;
  const int64_t d = c.d_model, n_layers = c.n_layers;
  KVD_ASSIGN_OR_RETURN(
      const internal::CudaBatchCheck check,
      internal::CheckCudaBackendBatch(batch, patcher, n_layers,
                                      /*cold_supported=*/true));
  ForwardOutput result;
  const std::vector<int64_t> logit_rows =
      SelectLogitRows(batch, c.vocab_size, &result);
  // KvSources' cold positions per sequence and layer, from the lengths
  // PrepareStepCaches will see.
  const std::vector<std::vector<internal::ColdSpan>> spans =
      internal::PlanColdSpans(batch, c, kc::kAttentionChunk);
  const internal::ColdSizes cold_sizes =
      internal::SizeColdBuffers(c, spans, check.rows, c.n_heads, c.n_kv_heads);

  absl::MutexLock lock(&mu_);
  internal::CudaForward& f = *fwd_;
  KVD_RETURN_IF_ERROR(f.SetDevice());
  // Every allocation that can fail comes before the caches change: the step
  // buffers (sized from the caches as Prepare will leave them), the cold
  // recompute's scratch and the observer's staging memory.
  const int64_t m = check.rows;
  const int64_t n_shown = n_layers + 1;
  if (m > 0) {
    KVD_RETURN_IF_ERROR(f.EnsureWorkspace(
        std::max(m, kc::kAttentionChunk), logit_rows.size(),
        // PatchColdChunks' plans: up to a chunk of rows of one sequence.
        internal::PlannedInts(batch, n_layers, logit_rows.size()) +
            3 * kc::kAttentionChunk));
    KVD_RETURN_IF_ERROR(f.EnsureColdBuffers(cold_sizes.workspace_bytes,
                                            cold_sizes.residual_values));
  }
  float* pinned = nullptr;
  if (observer != nullptr && m > 0) {
    KVD_ASSIGN_OR_RETURN(pinned, f.PinnedFloats(n_shown * m * d));
  }

  // Every cache draws from check.pool: its memory is checked before any
  // cache changes.
  internal::CudaPool pool;
  if (m > 0) {
    KVD_ASSIGN_OR_RETURN(pool, DevicePool(*batch.front().cache));
  }

  KVD_RETURN_IF_ERROR(PrepareStepCaches(c, Precision::kBf16, batch).status());
  const internal::PreparedStep prepared = internal::DescribePreparedStep(batch);
  const absl::Status st = [&]() -> absl::Status {
    if (m == 0) return absl::OkStatus();
    // Before the step's rows take the buffers: the rows below each hot
    // boundary but in its chunk, which attention reads from the pool.
    KVD_RETURN_IF_ERROR(internal::PatchColdChunks(f, pool, c, batch, spans));
    KVD_ASSIGN_OR_RETURN(
        const internal::StepPlan plan,
        internal::PlanCacheRows(prepared.seqs, n_layers, logit_rows));
    // Prepare never lengthens a table beyond PlannedInts' count; grow anyway
    // rather than trust it.
    KVD_RETURN_IF_ERROR(f.EnsureWorkspace(m, plan.n_gather, plan.ints.size()));
    KVD_RETURN_IF_ERROR(f.UploadPlan(plan));
    KVD_RETURN_IF_ERROR(f.Embed(plan));

    // Per layer, the cold recompute's arguments (host arrays each launch
    // reads) and where each sequence's cold residuals go.
    const internal::ColdLayout cold(spans, n_layers, d, f.cold_residuals(),
                                    f.cold_workspace(),
                                    f.cold_workspace_bytes());
    std::vector<std::vector<uint16_t>> cold_rows;
    std::function<absl::Status(int64_t)> before_layer;
    if (pinned != nullptr || cold_sizes.any) {
      before_layer = [&](int64_t l) -> absl::Status {
        if (pinned != nullptr)
          KVD_RETURN_IF_ERROR(f.DownloadResiduals(pinned + l * m * d, m));
        if (cold.layers()[l] == nullptr) return absl::OkStatus();
        // The previous layer's attention has read the shared residual
        // buffer by the time this upload runs (stream order).
        internal::ReadColdResiduals(c, batch, spans, l, &cold_rows);
        for (size_t s = 0; s < batch.size(); ++s) {
          if (cold_rows[s].empty()) continue;
          // From pageable memory: staged before the call returns.
          KVD_RETURN_IF_ERROR(f.UploadBf16(
              cold.targets(l)[s], cold_rows[s].data(), cold_rows[s].size()));
        }
        return absl::OkStatus();
      };
    }
    KVD_RETURN_IF_ERROR(
        f.RunLayers(plan, pool, 0, n_layers, before_layer, cold.layers()));
    if (pinned != nullptr)
      KVD_RETURN_IF_ERROR(f.DownloadResiduals(pinned + n_layers * m * d, m));
    result.logits.resize(plan.n_gather * c.vocab_size);
    KVD_RETURN_IF_ERROR(f.Logits(plan, result.logits.data()));
    return f.Sync("CUDA backend: running the forward step");
  }();
  return internal::FinishStep(st, batch, prepared, observer, pinned, n_shown, d,
                              std::move(result), out);
}

absl::Status CudaBackendModel::RunForwardLayers(KvCache* cache,
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
  internal::CudaForward& f = *fwd_;
  KVD_RETURN_IF_ERROR(f.SetDevice());
  KVD_ASSIGN_OR_RETURN(const internal::CudaPool pool, DevicePool(*cache));
  return internal::ForwardLayersInChunks(f, pool, c, cache, position, n,
                                         first_layer, end_layer, h, observer,
                                         sequence_id);
}

absl::Status CudaBackendModel::RecomputeKvIntoCache(int64_t layer,
                                                    const float* residuals,
                                                    int64_t position, int64_t n,
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
  internal::CudaForward& f = *fwd_;
  KVD_RETURN_IF_ERROR(f.SetDevice());
  KVD_ASSIGN_OR_RETURN(const internal::CudaPool pool, DevicePool(*cache));
  return internal::RecomputeKvInChunks(f, pool, config_, layer, residuals,
                                       position, n, cache);
}

}  // namespace kvd::ops
