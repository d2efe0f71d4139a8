// The tensor-parallel CUDA forward pass: CudaModel's llama-family
// layer (cuda_model.h), with attention heads and MLP columns split over S
// shards by a TensorParallelPlan, and the partial outputs of W_o and W_down
// completed by an AllReduce (all_reduce.h).
//
// Each shard holds its slice of the weights (Wq/Wk/Wv rows and biases of its
// heads, W_o's columns of its query heads, W_gate/W_up rows and W_down
// columns of its MLP range) plus the replicated norms, embedding and output
// matrix, and its own paged K/V pool holding only its K/V heads. The
// residual stream is replicated: every shard keeps the full residual, runs
// the norm on it, computes only its own heads' K/V from it (the same
// per-element order as RecomputeKv over those heads, so a rebuild from a
// residual checkpoint reproduces a shard's cache bit for bit), and receives
// the all-reduced sum of the partials. Block ids are shared: block b of
// every shard's pool holds the same positions, so one block table serves all
// shards.
//
// Numerics: TP = 1 runs exactly CudaModel's kernels in CudaModel's order and
// is bit-identical to it. TP > 1 changes the summation order of the W_o and
// W_down reductions (partials summed by the all-reduce), so it is
// token-identical, not bit-identical, to TP = 1; with the single-device
// simulation (shards run one after another on one stream, partials summed in
// shard order) it is bit-reproducible run to run.
//
// Shards: `devices` empty puts every shard on `device` and simulates TP on
// one GPU (the tested path). Shards on several GPUs need an all-reduce
// across them (NewNcclAllReduce in nccl_all_reduce.h); that path is compiled
// but has never run (no multi-GPU machine was lent).
//
//   TpCudaModelOptions o;
//   o.degree = 2;  // simulated on device 0
//   KVD_ASSIGN_OR_RETURN(auto tp, TpCudaModel::Create(*cpu_model, o));
//   KVD_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tp->Generate(prompt, 32));
//
// Thread-safety: as CudaModel (Forward serialises on an internal mutex).
#ifndef KVD_OPS_BACKEND_TP_CUDA_MODEL_H_
#define KVD_OPS_BACKEND_TP_CUDA_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "ops/backend/all_reduce.h"
#include "ops/backend/internal/cuda_batch.h"
#include "ops/backend/internal/device_memory.h"
#include "ops/backend/tensor_parallel_plan.h"
#include "ops/model/model.h"
#include "ops/model/model_config.h"

namespace kvd::ops {
namespace internal {
class TpForward;
struct StepPlan;
}  // namespace internal

class TpCudaModel;

// One sequence's K/V across all shards (internal/cuda_batch.h): the same
// block ids in every shard's pool. Move-only; returns its blocks when
// destroyed. Must not outlive its TpCudaModel.
using TpKvCache = internal::DeviceBlockCache<TpCudaModel>;

struct TpCudaModelOptions {
  // Tensor-parallel degree S; must divide n_kv_heads
  // (TensorParallelPlan::ValidDegrees).
  int degree = 1;
  // As CudaModelOptions: positions per block (a positive multiple of 32) and
  // blocks per shard pool (0: CudaModel's default). A shard's block is
  // 2 * block_rows * (its K/V heads * head_dim) bf16 values.
  int64_t block_rows = 32;
  int64_t max_blocks = 0;
  // devices[s]: CUDA ordinal of shard s. Empty: every shard on `device`.
  std::vector<int> devices;
  int device = 0;
  // Sums the partials. Null: NewSimulatedAllReduce(degree) when all shards
  // share one device; required (degree() == degree) when they do not.
  std::shared_ptr<AllReduce> all_reduce;
};

struct TpStep {
  TpKvCache* cache = nullptr;
  absl::Span<const int32_t> tokens;  // at positions cache->length() onwards
};

class TpCudaModel {
 public:
  // INVALID_ARGUMENT for bad options or a degree the model does not split
  // into (naming the degrees that work); otherwise as CudaModel::Create.
  static absl::StatusOr<std::unique_ptr<TpCudaModel>> Create(
      const Model& model, const TpCudaModelOptions& options);
  ~TpCudaModel();
  TpCudaModel(const TpCudaModel&) = delete;
  TpCudaModel& operator=(const TpCudaModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const TensorParallelPlan& plan() const;
  int64_t free_blocks() const;

  absl::StatusOr<TpKvCache> NewCache();

  // As CudaModel::Forward. `residuals`, if not null, gets per layer l the
  // replicated residual stream entering layer l (rows in batch order, m x
  // d_model fp32 values, each exactly a bf16 value): what a residual
  // checkpoint stores and what each shard's K/V at layer l are computed from.
  // Copying it synchronises per layer (tests and checkpoint capture only).
  absl::Status Forward(absl::Span<const TpStep> batch,
                       std::vector<float>* logits,
                       std::vector<std::vector<float>>* residuals = nullptr);

  // As CudaModel::Generate.
  absl::StatusOr<std::vector<int32_t>> Generate(
      absl::Span<const int32_t> prompt, int64_t max_new_tokens,
      int64_t prefill_chunk = 0,
      std::vector<std::vector<float>>* step_logits = nullptr);

  // Shard `shard`'s K and V at `layer` for positions [0, cache.length()):
  // length x (its K/V heads * head_dim) bf16 bits each, row-major.
  // INVALID_ARGUMENT for a foreign cache or an out-of-range shard/layer.
  absl::Status ReadKv(const TpKvCache& cache, int shard, int64_t layer,
                      std::vector<uint16_t>* k, std::vector<uint16_t>* v);

 private:
  friend TpKvCache;
  TpCudaModel() = default;
  void FreeBlocks(std::vector<std::vector<int32_t>>* blocks);
  absl::Status RunStep(const internal::StepPlan& plan,
                       std::vector<float>* logits,
                       std::vector<std::vector<float>>* residuals);

  ModelConfig config_;
  TpCudaModelOptions options_;
  // Shards, weights, streams and step buffers (internal/tp_forward.h).
  std::unique_ptr<internal::TpForward> fwd_;
  // Shard s's K/V pool: max_blocks_ blocks of its K/V heads, in pools_[s].
  std::vector<std::unique_ptr<internal::DeviceMemory>> pool_memory_;
  std::vector<uint16_t*> pools_;
  int64_t max_blocks_ = 0;
  mutable absl::Mutex blocks_mu_;
  std::vector<int32_t> free_blocks_ ABSL_GUARDED_BY(blocks_mu_);
  absl::Mutex forward_mu_;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_BACKEND_TP_CUDA_MODEL_H_
