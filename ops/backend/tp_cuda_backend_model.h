// The tensor-parallel CUDA implementation of the engine's backend interface
// (ops/model/model_backend.h): TpCudaModel's forward pass (tp_cuda_model.h;
// the same shards, weight slices, launches and all-reduce, shared through
// internal/tp_forward.h) driven by the engine's KvCaches, so the session
// engine, its policies and checkpoints run on S shards unchanged.
//
// K/V layout: each shard keeps only its own K/V heads of every block, in a
// slab on its own device; block b of the engine's KvBlockPool is block b of
// every shard's slab. The pool itself hands out block numbers, not memory
// (internal/block_id_region.h), so its budget and block tables are the CPU
// backend's arithmetic over the whole model's row size, and the slabs
// together hold exactly that many bytes.
//
// A rebuild from residual checkpoints is shard-local: RecomputeKvIntoCache
// gives every shard the replicated residual and each computes only its own
// heads' K/V (RMSNorm, its rows of the K/V projections and biases, RoPE, the
// bf16 write), with a step's own launches, so the rows are the bits a step
// wrote. ForwardLayers (the stride policy) runs the sharded layers.
//
// Numerics: bf16. Bit-identical among runs of the same degree, on one GPU
// or several (every all-reduce adds the partials in shard order), across
// batch composition, chunking, policies and restores; token-identical, not
// bit-identical, to the single-GPU backend (the W_o and W_down sums are
// split). numerics_version() is CudaTpNumericsVersion(degree): a session
// saved at another degree is re-prefilled from its tokens when it is
// restored here.
//
// KV-Direct's bounded hot windows (a KvSource with cold positions) run as
// on the single-GPU backend, shard-locally: every shard gets the cold
// residuals and recomputes its own heads' K/V inside attention
// (PagedAttentionRecompute over its weight slice and bias slice), so the
// logits equal a full cache's bit for bit. Not supported: the residual
// patcher and key selections (UNIMPLEMENTED before any cache changes, as on
// the single-GPU backend).
//
//   TpCudaBackendOptions o;
//   o.degree = 2;  // both shards on device 0: simulated
//   KVD_ASSIGN_OR_RETURN(auto tp, TpCudaBackendModel::Create(*cpu_model, o));
//   KVD_ASSIGN_OR_RETURN(auto pool, tp->NewBlockPool({}));
//   KVD_ASSIGN_OR_RETURN(KvCache cache, tp->NewCache(pool.get()));
//
// Thread-safety: as CudaBackendModel: every call may come from any thread;
// steps serialise on one lock and return once every shard is done; the
// ResidualObserver is called with that lock held. Pools may outlive the
// model (each frees its own slabs).
#ifndef KVD_OPS_BACKEND_TP_CUDA_BACKEND_MODEL_H_
#define KVD_OPS_BACKEND_TP_CUDA_BACKEND_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "ops/backend/all_reduce.h"
#include "ops/model/kv_block_pool.h"
#include "ops/model/kv_cache.h"
#include "ops/model/model.h"
#include "ops/model/model_backend.h"
#include "ops/model/model_config.h"

namespace kvd::ops {
namespace internal {
class TpForward;
struct CudaPool;
struct TpSlabs;
}  // namespace internal

struct TpCudaBackendOptions {
  // Tensor-parallel degree S >= 1; must divide n_kv_heads
  // (TensorParallelPlan::ValidDegrees).
  int degree = 2;
  // devices[s]: CUDA ordinal of shard s. Empty: every shard on `device`
  // (simulated TP: the shards run one after another on one stream, summed
  // by NewSimulatedAllReduce).
  std::vector<int> devices;
  int device = 0;
  // Required when the shards are on several devices (NewNcclAllReduce).
  std::shared_ptr<AllReduce> all_reduce;
  // As CudaBackendOptions::max_pool_blocks: most blocks one pool holds.
  int64_t max_pool_blocks = 0;
};

class TpCudaBackendModel final : public ModelBackend {
 public:
  // Uploads each shard's slice of `cpu_model`'s bf16 weights (the CPU model
  // need not outlive the result). UNIMPLEMENTED for a model the CUDA path
  // cannot run; INVALID_ARGUMENT for bad options or a degree the model does
  // not split into (naming the degrees that work); RESOURCE_EXHAUSTED if
  // the weights do not fit; INTERNAL for other CUDA failures.
  static absl::StatusOr<std::unique_ptr<TpCudaBackendModel>> Create(
      const Model& cpu_model, const TpCudaBackendOptions& options);
  ~TpCudaBackendModel() override;
  TpCudaBackendModel(const TpCudaBackendModel&) = delete;
  TpCudaBackendModel& operator=(const TpCudaBackendModel&) = delete;

  const char* backend_name() const override { return "cuda-tp"; }
  const ModelConfig& config() const override { return config_; }
  Precision precision() const override { return Precision::kBf16; }
  uint32_t numerics_version() const override { return numerics_version_; }
  // OK: bounded hot windows run shard-locally.
  absl::Status BoundedHotWindowSupport() const override;
  int degree() const;

  // A pool of budget_bytes / block_bytes blocks (or max_pool_blocks, or
  // CudaBackendModel's default without a budget), each shard's share of
  // every block in one cudaMalloc'd slab on its device, freed when the
  // pool goes. block_bytes() and budget_bytes() count the whole model's
  // rows (the sum over the shards). RESOURCE_EXHAUSTED if a shard's device
  // cannot hold its slab.
  absl::StatusOr<std::unique_ptr<KvBlockPool>> NewBlockPool(
      const KvBlockPool::Options& options) const override;
  // INVALID_ARGUMENT for a null pool or one not made by this model's
  // NewBlockPool.
  absl::StatusOr<KvCache> NewCache(KvBlockPool* pool) const override;

  // Every shard computes its own heads' rows from the replicated residuals.
  absl::Status RecomputeKvIntoCache(int64_t layer, const float* residuals,
                                    int64_t position, int64_t n,
                                    KvCache* cache) const override;

 protected:
  // As CudaBackendModel's: on an error after PrepareStepCaches every cache
  // is truncated back to its old length.
  absl::Status RunForward(absl::Span<const SequenceStep> batch,
                          ForwardOutput* out, ResidualObserver* observer,
                          ResidualPatcher* patcher) const override;
  absl::Status RunForwardLayers(KvCache* cache, int64_t position, int64_t n,
                                int64_t first_layer, int64_t end_layer,
                                float* h, ResidualObserver* observer,
                                int64_t sequence_id) const override;

 private:
  TpCudaBackendModel() = default;
  // Each shard's share of `blocks` blocks of block_rows positions, a
  // cudaMalloc'd slab on its device, into `slabs`.
  absl::Status AllocateSlabs(int64_t blocks, int64_t block_rows,
                             internal::TpSlabs* slabs) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Each shard's pool for `cache`'s blocks: INVALID_ARGUMENT unless its
  // pool came from this model's NewBlockPool and is still alive.
  absl::StatusOr<std::vector<internal::CudaPool>> ShardPools(
      const KvCache& cache) const ABSL_LOCKS_EXCLUDED(slabs_mu_);

  ModelConfig config_;
  TpCudaBackendOptions options_;
  uint32_t numerics_version_ = 0;
  mutable absl::Mutex mu_;
  // Shards, weights, streams, step buffers; the pointee changes under mu_.
  std::unique_ptr<internal::TpForward> fwd_;
  // The pools this model made, by their block-id region's base; its own
  // lock, so NewCache does not wait for a running step.
  mutable absl::Mutex slabs_mu_;
  mutable absl::flat_hash_map<const uint8_t*, std::weak_ptr<internal::TpSlabs>>
      slabs_ ABSL_GUARDED_BY(slabs_mu_);
};

}  // namespace kvd::ops

#endif  // KVD_OPS_BACKEND_TP_CUDA_BACKEND_MODEL_H_
