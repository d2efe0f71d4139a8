#include "ops/backend/cuda_backend_model.h"

#include <cuda_runtime.h>

#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/internal/cuda_check.h"
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

// CudaForward as the one shard of internal::RunStep's shard-indexed calls.
class OneShard {
 public:
  explicit OneShard(internal::CudaForward& f) : f_(f) {}
  int shards() const { return 1; }
  int64_t n_heads(int) const { return f_.config().n_heads; }
  int64_t n_kv_heads(int) const { return f_.config().n_kv_heads; }
  absl::Status EnsureColdBuffers(int, int64_t bytes, int64_t values) {
    return f_.EnsureColdBuffers(bytes, values);
  }
  uint16_t* cold_residuals(int) const { return f_.cold_residuals(); }
  void* cold_workspace(int) const { return f_.cold_workspace(); }
  int64_t cold_workspace_bytes(int) const { return f_.cold_workspace_bytes(); }
  absl::Status UploadBf16(int, uint16_t* device, const uint16_t* host,
                          int64_t n) {
    return f_.UploadBf16(device, host, n);
  }
  absl::Status RunLayers(
      const internal::StepPlan& plan, const internal::CudaPool& pool,
      int64_t first, int64_t end,
      const std::function<absl::Status(int64_t)>& before_layer,
      absl::Span<const absl::Span<const internal::CudaColdRows* const>> cold) {
    return f_.RunLayers(plan, pool, first, end, before_layer,
                        cold.empty()
                            ? absl::Span<const internal::CudaColdRows* const>()
                            : cold.front());
  }
  // The rest as CudaForward's.
  absl::Status EnsureWorkspace(int64_t rows, int64_t gather, int64_t ints) {
    return f_.EnsureWorkspace(rows, gather, ints);
  }
  absl::StatusOr<float*> PinnedFloats(int64_t floats) {
    return f_.PinnedFloats(floats);
  }
  absl::Status UploadPlan(const internal::StepPlan& plan) {
    return f_.UploadPlan(plan);
  }
  absl::Status Embed(const internal::StepPlan& plan) { return f_.Embed(plan); }
  absl::Status UploadResiduals(const float* h, int64_t m) {
    return f_.UploadResiduals(h, m);
  }
  absl::Status DownloadResiduals(float* h, int64_t m) {
    return f_.DownloadResiduals(h, m);
  }
  absl::Status ProjectKv(const internal::StepPlan& plan,
                         const internal::CudaPool& pool, int64_t layer) {
    return f_.ProjectKv(plan, pool, layer);
  }
  absl::Status Logits(const internal::StepPlan& plan, float* logits) {
    return f_.Logits(plan, logits);
  }
  absl::Status Sync(absl::string_view what) { return f_.Sync(what); }

 private:
  internal::CudaForward& f_;
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
  KVD_ASSIGN_OR_RETURN(
      const internal::CudaBatchCheck check,
      internal::CheckCudaBackendBatch(batch, patcher, config_.n_layers));
  absl::MutexLock lock(&mu_);
  KVD_RETURN_IF_ERROR(fwd_->SetDevice());
  // Every cache draws from check.pool: its memory is checked before any
  // cache changes.
  internal::CudaPool pool;
  if (check.rows > 0) {
    KVD_ASSIGN_OR_RETURN(pool, DevicePool(*batch.front().cache));
  }
  OneShard f(*fwd_);
  return internal::RunStep(f, pool, config_, batch, check.rows, observer, out,
                           "CUDA backend: running the forward step");
}

absl::Status CudaBackendModel::RunForwardLayers(KvCache* cache,
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
  KVD_ASSIGN_OR_RETURN(const bool work,
                       internal::CheckDeviceRecompute(config_, layer, residuals,
                                                      position, n, cache));
  if (!work) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  internal::CudaForward& f = *fwd_;
  KVD_RETURN_IF_ERROR(f.SetDevice());
  KVD_ASSIGN_OR_RETURN(const internal::CudaPool pool, DevicePool(*cache));
  return internal::RecomputeKvInChunks(f, pool, config_, layer, residuals,
                                       position, n, cache);
}

}  // namespace kvd::ops
