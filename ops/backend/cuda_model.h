// The CUDA forward pass for the llama family (llama, qwen2-style configs):
// a loaded CPU ops::Model's bf16 weights uploaded to the GPU and run with the
// batch-invariant kernels of kernels/cuda (numerics contract in
// kernels/cuda/README.md, "CUDA model").
//
// Precision: bf16 weights, fp32 accumulation, the residual stream rounded to
// bf16 at layer boundaries (as the CPU's bf16 mode), K/V stored bf16 in a
// paged pool (one block = block_rows positions of one layer) read by
// PagedAttention. Guarantees: a sequence's logits are bit-identical whatever
// else is in the batch and however its prompt is chunked (GPU only);
// greedy tokens agree with the CPU backend (not bits: the GEMM and attention
// orders differ).
//
// Support: RMSNorm, RoPE (both styles), GQA, optional q/k/v bias, SiLU or
// GELU-tanh gated MLP, tied or separate output matrix. Anything else (QK-norm,
// post-attention/FFN norms, the fp32 precision mode) is UNIMPLEMENTED with
// what is missing, checked by CheckCudaModelSupport (cuda_model_support.h),
// which needs no GPU.
//
//   KVD_ASSIGN_OR_RETURN(auto gpu, CudaModel::Create(*cpu_model, {}));
//   KVD_ASSIGN_OR_RETURN(CudaKvCache cache, gpu->NewCache());
//   CudaStep step{&cache, prompt};
//   std::vector<float> logits;  // vocab_size values per step
//   KVD_RETURN_IF_ERROR(gpu->Forward({&step, 1}, &logits));
//
// Thread-safety: Forward serialises on an internal mutex (one stream); caches
// may be created and destroyed from any thread (a cache must not be in a
// running Forward). The CPU model need not outlive the CudaModel: its weights
// are copied at Create.
#ifndef KVD_OPS_BACKEND_CUDA_MODEL_H_
#define KVD_OPS_BACKEND_CUDA_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "ops/backend/internal/cuda_batch.h"
#include "ops/model/model.h"
#include "ops/model/model_config.h"

namespace kvd::ops {
namespace internal {
class CudaForward;
}  // namespace internal

class CudaModel;

// One sequence's K/V on the device (internal/cuda_batch.h). Move-only;
// returns its blocks to the model's pool when destroyed. Must not outlive
// its CudaModel.
using CudaKvCache = internal::DeviceBlockCache<CudaModel>;

struct CudaModelOptions {
  // Positions per pool block; a positive multiple of 32 (the attention
  // chunk). Default 32.
  int64_t block_rows = 32;
  // Pool size in blocks (each 2 * block_rows * kv_dim bf16 values). 0: room
  // for 16 full-context sequences' worth of positions, capped at 16384
  // positions per layer.
  int64_t max_blocks = 0;
  // Device ordinal.
  int device = 0;
};

struct CudaStep {
  CudaKvCache* cache = nullptr;
  absl::Span<const int32_t> tokens;  // at positions cache->length() onwards
};

class CudaModel {
 public:
  // INVALID_ARGUMENT for bad options; UNIMPLEMENTED for a model this path
  // cannot run (CheckCudaModelSupport); RESOURCE_EXHAUSTED if the device
  // memory does not fit; INTERNAL for other CUDA failures (no device, ...).
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(
      const Model& model, const CudaModelOptions& options);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ModelConfig& config() const { return config_; }
  int64_t free_blocks() const;

  absl::StatusOr<CudaKvCache> NewCache();

  // One batched step: every token of every step goes through each projection
  // as one GEMM; attention runs in one launch per layer over the paged pool.
  // Writes batch.size() x vocab_size fp32 logits (each step's last token) to
  // *logits. INVALID_ARGUMENT for an empty step, out-of-range ids, a
  // sequence past the context length, a cache twice in the batch or more
  // than 65535 tokens in the step;
  // RESOURCE_EXHAUSTED if the pool lacks blocks (no cache changes then).
  absl::Status Forward(absl::Span<const CudaStep> batch,
                       std::vector<float>* logits);

  // Greedy decoding of one sequence: the prompt in chunks of `prefill_chunk`
  // tokens (0: one chunk), then `max_new_tokens` single-token steps. Returns
  // the generated ids; `step_logits`, if not null, gets the logits each
  // generated id was chosen from (ties: the lowest id).
  absl::StatusOr<std::vector<int32_t>> Generate(
      absl::Span<const int32_t> prompt, int64_t max_new_tokens,
      int64_t prefill_chunk = 0,
      std::vector<std::vector<float>>* step_logits = nullptr);

 private:
  friend CudaKvCache;
  CudaModel() = default;
  void FreeBlocks(std::vector<std::vector<int32_t>>* blocks);

  ModelConfig config_;
  CudaModelOptions options_;
  // Weights, stream, step buffers and the kernel sequence, shared with
  // CudaBackendModel (internal/cuda_forward.h).
  std::unique_ptr<internal::CudaForward> fwd_;
  uint16_t* pool_ = nullptr;  // max_blocks blocks, bf16
  int64_t max_blocks_ = 0;
  mutable absl::Mutex blocks_mu_;
  std::vector<int32_t> free_blocks_ ABSL_GUARDED_BY(blocks_mu_);
  absl::Mutex forward_mu_;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_BACKEND_CUDA_MODEL_H_
