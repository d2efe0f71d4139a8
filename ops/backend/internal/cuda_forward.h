// The single-GPU forward pass that CudaModel (cuda_model.h) and
// CudaBackendModel (cuda_backend_model.h) share: a loaded CPU model's bf16
// weights uploaded once, one stream, step buffers grown on demand, and the
// kernel sequences of a step (embedding, the layer loop, the LM head, a
// layer's K/V projection) over a paged K/V pool that the caller owns. Each
// model keeps only its own bookkeeping (CudaModel its block free list,
// CudaBackendModel the KvCaches' block tables), so both run the same
// launches and their rows and logits are the same bits.
//
//   KVD_ASSIGN_OR_RETURN(auto fwd, CudaForward::Create(cpu_model, 0));
//   StepPlan plan = PlanStep(...);  // cuda_step_plan.h
//   KVD_RETURN_IF_ERROR(fwd->EnsureWorkspace(plan.rows, plan.n_gather,
//                                            plan.ints.size()));
//   KVD_RETURN_IF_ERROR(fwd->UploadPlan(plan));
//   KVD_RETURN_IF_ERROR(fwd->Embed(plan));
//   KVD_RETURN_IF_ERROR(fwd->RunLayers(plan, pool, 0, n_layers));
//   KVD_RETURN_IF_ERROR(fwd->Logits(plan, logits.data()));
//   KVD_RETURN_IF_ERROR(fwd->Sync("the forward step"));
//
// Thread-safety: none; the owning model serialises its steps. Every call
// enqueues on the one stream; host memory handed to an asynchronous call
// must stay valid until Sync returns.
#ifndef KVD_OPS_BACKEND_INTERNAL_CUDA_FORWARD_H_
#define KVD_OPS_BACKEND_INTERNAL_CUDA_FORWARD_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ops/backend/internal/cuda_layer.h"
#include "ops/backend/internal/cuda_step_plan.h"
#include "ops/backend/internal/device_memory.h"
#include "ops/model/model.h"
#include "ops/model/model_config.h"

namespace kvd::ops::internal {

// The paged K/V pool a step's block tables index (kernels/cuda
// paged_attention.h's layout: block b is 2 * block_rows rows of kv_dim bf16
// values at base + b * 2 * block_rows * kv_dim, K rows then V rows).
struct CudaPool {
  uint16_t* base = nullptr;
  int64_t block_rows = 0;
};

class CudaForward {
 public:
  // UNIMPLEMENTED for a model the CUDA path cannot run
  // (CheckCudaModelSupport, or weights that are not bf16); RESOURCE_EXHAUSTED
  // if the weights do not fit; INTERNAL for other CUDA failures.
  static absl::StatusOr<std::unique_ptr<CudaForward>> Create(const Model& model,
                                                             int device);
  ~CudaForward();
  CudaForward(const CudaForward&) = delete;
  CudaForward& operator=(const CudaForward&) = delete;

  const ModelConfig& config() const { return config_; }
  int device() const { return device_; }
  // Makes the model's device current on the calling thread (the current
  // device is per thread, and steps may come from any thread).
  absl::Status SetDevice() const;

  // Step buffers for `rows` rows, `gather_rows` rows of logits and `ints`
  // plan entries; grown (at least doubled) on demand, never shrunk, so a
  // steady decode loop does not allocate. RESOURCE_EXHAUSTED when the device
  // is out of memory.
  absl::Status EnsureWorkspace(int64_t rows, int64_t gather_rows, int64_t ints);
  // Page-locked host memory of at least `floats` floats, grown on demand and
  // reused: the target of asynchronous downloads.
  absl::StatusOr<float*> PinnedFloats(int64_t floats);

  // Device scratch for attention over recomputed cold chunks: `bytes` of
  // PagedAttentionRecompute workspace and `residual_values` bf16 values of
  // cold residuals; grown on demand (after a Sync), never shrunk.
  absl::Status EnsureColdBuffers(int64_t bytes, int64_t residual_values);
  void* cold_workspace() const { return cold_ws_; }
  int64_t cold_workspace_bytes() const { return cold_ws_bytes_; }
  uint16_t* cold_residuals() const { return cold_res_; }
  // Enqueues the upload of `n` bf16 values to `device` from pageable host
  // memory (staged before this returns, so `host` may go).
  absl::Status UploadBf16(uint16_t* device, const uint16_t* host, int64_t n);

  // Enqueues the plan's int32 array (the host copy may go once this
  // returns).
  absl::Status UploadPlan(const StepPlan& plan);
  // h = the embedding rows of the plan's tokens, times the embedding scale,
  // rounded to bf16 (the bf16 mode's residual entering layer 0).
  absl::Status Embed(const StepPlan& plan);
  // h's first m rows from / to the host (m x d_model fp32). The download is
  // asynchronous: `h` must stay valid until Sync (pinned memory, from
  // PinnedFloats, for a real overlap).
  absl::Status UploadResiduals(const float* h, int64_t m);
  absl::Status DownloadResiduals(float* h, int64_t m);
  // Layers [first, end) over the plan's rows: writes their K/V into `pool`
  // and leaves the residual entering `end` in h (rounded to bf16 at every
  // layer boundary). `before_layer(l)`, if set, is called before layer l's
  // launches are enqueued (e.g. to enqueue a download of the residual
  // entering it). `cold`, if not empty, has an entry per model layer: where
  // non-null, that layer's attention recomputes the cold positions it
  // describes (CudaColdRows in cuda_layer.h).
  absl::Status RunLayers(
      const StepPlan& plan, const CudaPool& pool, int64_t first, int64_t end,
      const std::function<absl::Status(int64_t)>& before_layer = nullptr,
      absl::Span<const CudaColdRows* const> cold = {});
  // Layer `layer`'s K and V rows for the plan's rows from the residuals in h,
  // written into `pool`: exactly RunLayers' launches for them (RMSNorm, K/V
  // projections and bias, RoPE, the bf16 write), so the rows are the same
  // bits.
  absl::Status ProjectKv(const StepPlan& plan, const CudaPool& pool,
                         int64_t layer);
  // The output norm and LM head over the plan's gathered rows of h; enqueues
  // the download of their n_gather x vocab_size fp32 logits into `logits`
  // (valid until Sync).
  absl::Status Logits(const StepPlan& plan, float* logits);
  // Waits for everything enqueued; `what` names the step in the error.
  absl::Status Sync(absl::string_view what);

 private:
  struct DeviceWeights;
  struct Workspace;
  CudaForward() = default;
  absl::Status Upload(const Model& model);

  ModelConfig config_;
  int device_ = 0;
  void* stream_ = nullptr;  // cudaStream_t
  std::unique_ptr<DeviceWeights> weights_;
  std::unique_ptr<Workspace> ws_;
  PinnedHostFloats pinned_;
  void* cold_ws_ = nullptr;
  int64_t cold_ws_bytes_ = 0;
  uint16_t* cold_res_ = nullptr;
  int64_t cold_res_values_ = 0;
};

}  // namespace kvd::ops::internal

#endif  // KVD_OPS_BACKEND_INTERNAL_CUDA_FORWARD_H_
