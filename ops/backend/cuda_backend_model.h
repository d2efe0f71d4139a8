// The CUDA implementation of the engine's backend interface
// (ops/model/model_backend.h): CudaModel's forward pass (cuda_model.h; the
// same uploaded bf16 weights and the same kernel launches, shared through
// internal/cuda_forward.h) driven by the engine's KvCaches, whose block
// tables are host bookkeeping over a device slab (NewBlockPool), so
// admission, demotion and the budget arithmetic are the CPU backend's.
//
// Numerics (kernels/cuda/README.md, "CUDA backend"): bf16 only. Logits are
// bit-identical to CudaModel::Forward's for the same tokens, and on the GPU
// independent of the batch and of prompt chunking; ForwardLayers'
// rows and residuals, and RecomputeKvIntoCache's rows, are bit-identical to
// Forward's (the same launches on the same inputs). Greedy tokens agree
// with the CPU backend, bits do not (different reduction orders).
//
// Supported: what CheckCudaModelSupport accepts (llama, qwen2-style; bf16);
// Create refuses the rest with UNIMPLEMENTED. A KvSource (KV-Direct's
// bounded hot window) runs attention through PagedAttentionRecompute: the
// positions below the hot boundary's chunk are recomputed from the source's
// residuals inside attention, and the boundary chunk's rows below it are
// recomputed into the cache first; bit-identical to a full cache, with or
// without q/k/v bias (RecomputeKv adds the k/v bias as Forward does).
// Forward refuses with UNIMPLEMENTED, before touching any cache: a
// ResidualPatcher and a KeySelection.
//
//   KVD_ASSIGN_OR_RETURN(auto gpu, CudaBackendModel::Create(*cpu_model, {}));
//   const ModelBackend& backend = *gpu;
//   KVD_ASSIGN_OR_RETURN(auto pool, backend.NewBlockPool({}));
//   KVD_ASSIGN_OR_RETURN(KvCache cache, backend.NewCache(pool.get()));
//   SequenceStep step{&cache, prompt_ids, LogitsMode::kLast};
//   ForwardOutput out;
//   KVD_RETURN_IF_ERROR(backend.Forward({&step, 1}, &out, &observer));
//
// Thread-safety: Forward, ForwardLayers and RecomputeKvIntoCache may be
// called from any thread; they serialise on one lock (one stream) and
// return once the device is done. The ResidualObserver is called, after the
// step completed, with that lock held: it must not call back into the
// backend. Pools may outlive the model (each frees its own slab).
#ifndef KVD_OPS_BACKEND_CUDA_BACKEND_MODEL_H_
#define KVD_OPS_BACKEND_CUDA_BACKEND_MODEL_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "ops/model/kv_block_pool.h"
#include "ops/model/kv_cache.h"
#include "ops/model/model.h"
#include "ops/model/model_backend.h"
#include "ops/model/model_config.h"

namespace kvd::ops {
namespace internal {
class CudaForward;
struct CudaPool;
}  // namespace internal

struct CudaBackendOptions {
  // Device ordinal.
  int device = 0;
  // Most blocks one NewBlockPool slab holds; a smaller budget_bytes gives
  // fewer. 0: as many as the pool's budget_bytes allows, or without a
  // budget CudaModel's default, room for min(16 x context_length, 16384)
  // positions at every layer.
  int64_t max_pool_blocks = 0;
};

class CudaBackendModel final : public ModelBackend {
 public:
  // Uploads `cpu_model`'s bf16 weights (the CPU model need not outlive the
  // result). UNIMPLEMENTED for a model the CUDA path cannot run (naming what
  // it lacks); INVALID_ARGUMENT for bad options; RESOURCE_EXHAUSTED if the
  // weights do not fit; INTERNAL for other CUDA failures (no device, ...).
  static absl::StatusOr<std::unique_ptr<CudaBackendModel>> Create(
      const Model& cpu_model, const CudaBackendOptions& options = {});
  ~CudaBackendModel() override;
  CudaBackendModel(const CudaBackendModel&) = delete;
  CudaBackendModel& operator=(const CudaBackendModel&) = delete;

  const char* backend_name() const override { return "cuda"; }
  const ModelConfig& config() const override { return config_; }
  Precision precision() const override { return Precision::kBf16; }
  // kCudaNumericsVersion (backend.h).
  uint32_t numerics_version() const override;
  // OK: every model Create accepts (q/k/v bias included) can bound its hot
  // window.
  absl::Status BoundedHotWindowSupport() const override;

  // A pool over one cudaMalloc'd slab of budget_bytes / block_bytes blocks
  // (at most max_pool_blocks if set; without a budget, max_pool_blocks or
  // its default), freed when the pool goes. Its
  // budget_bytes() is the slab's size. The pool options' checks and
  // messages are the CPU pool's (INVALID_ARGUMENT); RESOURCE_EXHAUSTED if
  // the device cannot hold the slab.
  absl::StatusOr<std::unique_ptr<KvBlockPool>> NewBlockPool(
      const KvBlockPool::Options& options) const override;
  // INVALID_ARGUMENT for a null pool, a pool in host memory, or one made for
  // other rows.
  absl::StatusOr<KvCache> NewCache(KvBlockPool* pool) const override;

  // With Forward's K/V launches (normalisation, projections and bias, RoPE,
  // the bf16 write), so the rows are Forward's bits. Positions are taken in
  // chunks; the cache's blocks must be device blocks of this device.
  absl::Status RecomputeKvIntoCache(int64_t layer, const float* residuals,
                                    int64_t position, int64_t n,
                                    KvCache* cache) const override;

 protected:
  // On an error after PrepareStepCaches (a CUDA failure; the device is then
  // usually unusable) every cache is truncated back to its old length: its
  // rows and length are as before and the blocks the step added are
  // returned; rows the step trimmed below local layers' windows stay trimmed
  // (no later step reads them), as the CPU backend would have trimmed them.
  absl::Status RunForward(absl::Span<const SequenceStep> batch,
                          ForwardOutput* out, ResidualObserver* observer,
                          ResidualPatcher* patcher) const override;
  // Runs the rows in chunks (rows are independent of their chunking on the
  // GPU), so the observer sees a chunk's layers before the next chunk's.
  absl::Status RunForwardLayers(KvCache* cache, int64_t position, int64_t n,
                                int64_t first_layer, int64_t end_layer,
                                float* h, ResidualObserver* observer,
                                int64_t sequence_id) const override;

 private:
  CudaBackendModel() = default;
  // The device pool `cache` draws from: INVALID_ARGUMENT unless its blocks
  // are device memory of this model's device.
  absl::StatusOr<internal::CudaPool> DevicePool(const KvCache& cache) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ModelConfig config_;
  CudaBackendOptions options_;
  mutable absl::Mutex mu_;
  // Weights, stream, step buffers; the pointee changes under mu_.
  std::unique_ptr<internal::CudaForward> fwd_;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_BACKEND_CUDA_BACKEND_MODEL_H_
