// The tensor-parallel forward pass that TpCudaModel (tp_cuda_model.h) and
// TpCudaBackendModel (tp_cuda_backend_model.h) share, as CudaForward
// (cuda_forward.h) is for one GPU: S shards, each with its slice of the
// weights (TensorParallelPlan), a full copy of the residual stream and its
// own step buffers, the partial outputs of W_o and W_down completed by an
// AllReduce, and the kernel sequences of a step over K/V pools the caller
// owns (one per shard, holding only that shard's K/V heads, all indexed by
// the same block numbers, so one step plan serves every shard).
//
//   TpForwardOptions o;
//   o.degree = 2;  // both shards on device 0: simulated TP
//   KVD_ASSIGN_OR_RETURN(auto fwd, TpForward::Create(cpu_model, o, "who"));
//   KVD_RETURN_IF_ERROR(fwd->EnsureWorkspace(plan.rows, plan.n_gather,
//                                            plan.ints.size()));
//   KVD_RETURN_IF_ERROR(fwd->UploadPlan(plan));
//   KVD_RETURN_IF_ERROR(fwd->Embed(plan));
//   KVD_RETURN_IF_ERROR(fwd->RunLayers(plan, pools, 0, n_layers));
//   KVD_RETURN_IF_ERROR(fwd->Logits(plan, logits.data()));
//   KVD_RETURN_IF_ERROR(fwd->Sync("the forward step"));
//
// Numerics: at degree 1 the kernels and their order are CudaForward's, so
// the bits are. Above 1 the W_o and W_down sums are the all-reduce's
// (token-identical, not bit-identical, to degree 1); a shard's K/V are
// computed from the replicated residual exactly as RecomputeKv over its
// heads, whatever the degree (kernels/cuda/README.md, tensor parallelism).
//
// Thread-safety: none; the owning model serialises its steps. Every call
// enqueues on the shards' streams and may return before the devices are
// done; host memory handed to an asynchronous call must stay valid until
// Sync returns. Each call makes the device it needs current itself.
#ifndef KVD_OPS_BACKEND_INTERNAL_TP_FORWARD_H_
#define KVD_OPS_BACKEND_INTERNAL_TP_FORWARD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ops/backend/all_reduce.h"
#include "ops/backend/internal/cuda_forward.h"
#include "ops/backend/internal/cuda_layer.h"
#include "ops/backend/internal/cuda_step_plan.h"
#include "ops/backend/internal/device_memory.h"
#include "ops/backend/tensor_parallel_plan.h"
#include "ops/model/model.h"
#include "ops/model/model_config.h"

namespace kvd::ops::internal {

struct TpForwardOptions {
  // Tensor-parallel degree S; must divide n_kv_heads
  // (TensorParallelPlan::ValidDegrees).
  int degree = 1;
  // devices[s]: CUDA ordinal of shard s. Empty: every shard on `device`.
  std::vector<int> devices;
  int device = 0;
  // Sums the partials. Null: NewSimulatedAllReduce(degree) when all shards
  // share one device; required (degree() == degree) when they do not.
  std::shared_ptr<AllReduce> all_reduce;
};

class TpForward {
 public:
  // UNIMPLEMENTED for a model the CUDA path cannot run; INVALID_ARGUMENT
  // (messages start with `who`) for a degree the model does not split into,
  // a device list of the wrong length, or several devices without an
  // all-reduce; RESOURCE_EXHAUSTED if the weights do not fit; INTERNAL for
  // other CUDA failures.
  static absl::StatusOr<std::unique_ptr<TpForward>> Create(
      const Model& model, const TpForwardOptions& options,
      absl::string_view who);
  ~TpForward();
  TpForward(const TpForward&) = delete;
  TpForward& operator=(const TpForward&) = delete;

  const ModelConfig& config() const { return config_; }
  const TensorParallelPlan& plan() const { return plan_; }
  int degree() const { return plan_.degree(); }
  int shards() const { return degree(); }
  // Shard s's device, and the width of its pool's rows (its K/V heads x
  // head_dim, bf16 values).
  int device(int shard) const;
  int64_t kv_width(int shard) const;
  absl::Status SetDevice(int shard) const;

  // As CudaForward's, for every shard.
  absl::Status EnsureWorkspace(int64_t rows, int64_t gather_rows, int64_t ints);
  // Page-locked host memory of at least `floats` floats, grown on demand.
  absl::StatusOr<float*> PinnedFloats(int64_t floats);
  // Shard s's attention heads (query, K/V): what its fused cold recompute
  // runs over.
  int64_t n_heads(int shard) const;
  int64_t n_kv_heads(int shard) const;

  // As CudaForward's, per shard: device scratch for attention over
  // recomputed cold chunks (PagedAttentionRecompute workspace bytes and bf16
  // cold residual values), grown on demand, never shrunk; and the upload of
  // `n` bf16 values from pageable host memory into it.
  absl::Status EnsureColdBuffers(int shard, int64_t bytes,
                                 int64_t residual_values);
  void* cold_workspace(int shard) const;
  int64_t cold_workspace_bytes(int shard) const;
  uint16_t* cold_residuals(int shard) const;
  absl::Status UploadBf16(int shard, uint16_t* device, const uint16_t* host,
                          int64_t n);

  absl::Status UploadPlan(const StepPlan& plan);
  absl::Status Embed(const StepPlan& plan);
  // h's first m rows to every shard's copy of the residual stream / from
  // shard 0's (asynchronous, on shard 0's stream).
  absl::Status UploadResiduals(const float* h, int64_t m);
  absl::Status DownloadResiduals(float* h, int64_t m);
  // Layers [first, end) over the plan's rows; pools[s] is shard s's pool.
  // `before_layer(l)`, if set, is called before layer l's launches are
  // enqueued, when shard 0's residual stream holds the residual entering l.
  // `cold`, if not empty, has an entry per shard, each an entry per model
  // layer: where non-null, that shard's attention at that layer recomputes
  // the cold positions it describes for its own heads (CudaColdRows).
  absl::Status RunLayers(
      const StepPlan& plan, absl::Span<const CudaPool> pools, int64_t first,
      int64_t end,
      const std::function<absl::Status(int64_t)>& before_layer = nullptr,
      absl::Span<const absl::Span<const CudaColdRows* const>> cold = {});
  // Layer `layer`'s K and V rows for the plan's rows from the residuals in
  // h: each shard computes its own heads with RunLayers' launches (RMSNorm,
  // its rows of the K/V projections and biases, RoPE, the bf16 write into
  // its pool), so the rows are the bits a step writes.
  absl::Status ProjectKv(const StepPlan& plan, absl::Span<const CudaPool> pools,
                         int64_t layer);
  // The output norm and LM head on shard 0 over the plan's gathered rows;
  // enqueues the download of the logits into `logits` (valid until Sync).
  absl::Status Logits(const StepPlan& plan, float* logits);
  // Waits for every shard's stream; `what` names the step in the error.
  absl::Status Sync(absl::string_view what);

 private:
  struct Shard;
  struct Replicated;
  TpForward() = default;
  absl::Status Upload(const Model& model);
  absl::Status CheckPools(absl::Span<const CudaPool> pools) const;
  // All-reduces every shard's W_o / W_down output buffer (m x d_model).
  absl::Status ReduceOutputs(int64_t count);

  ModelConfig config_;
  TensorParallelPlan plan_;
  std::shared_ptr<AllReduce> all_reduce_;
  std::vector<std::unique_ptr<Replicated>> replicated_;  // one per device
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<void*> owned_streams_;  // cudaStream_t
  PinnedHostFloats pinned_;
};

}  // namespace kvd::ops::internal

#endif  // KVD_OPS_BACKEND_INTERNAL_TP_FORWARD_H_
