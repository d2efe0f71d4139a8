// The parts of a CUDA backend's Forward (with KV-Direct's cold positions),
// ForwardLayers and RecomputeKvIntoCache that do not depend on how the
// model is laid out over devices, shared by
// CudaBackendModel (one GPU: CudaForward, one CudaPool) and
// TpCudaBackendModel (shards: TpForward, one CudaPool per shard). Both
// forward passes offer the same calls (EnsureWorkspace, PinnedFloats,
// UploadPlan, Upload/DownloadResiduals, RunLayers, ProjectKv, Sync) taking
// their own kind of pools, hence templates.
//
//   absl::MutexLock lock(&mu_);
//   KVD_ASSIGN_OR_RETURN(auto pools, ShardPools(*cache));
//   return RecomputeKvInChunks(*fwd_, pools, config_, layer, residuals,
//                              position, n, cache);
//
// Thread-safety: none; the caller holds its backend's lock.
#ifndef KVD_OPS_BACKEND_INTERNAL_BACKEND_STEPS_H_
#define KVD_OPS_BACKEND_INTERNAL_BACKEND_STEPS_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "ops/backend/internal/cuda_cache_plan.h"
#include "ops/backend/internal/cuda_layer.h"
#include "ops/model/kv_cache.h"
#include "ops/model/model_backend.h"
#include "ops/model/model_config.h"

namespace kvd::ops::internal {

// A step's rows once PrepareStepCaches has made room for them: each
// sequence's new tokens at its cache's length, in batch order, with every
// row's sequence id and position (what the observer is told) and the
// lengths to go back to on failure.
struct PreparedStep {
  std::vector<int64_t> old_length;
  std::vector<CacheRows> seqs;
  std::vector<int64_t> row_seq_id, row_pos;
};

inline PreparedStep DescribePreparedStep(absl::Span<const SequenceStep> batch) {
  PreparedStep p;
  for (const SequenceStep& step : batch) {
    const int64_t length = step.cache->length();
    p.old_length.push_back(length);
    p.seqs.push_back({step.cache, step.tokens, length,
                      static_cast<int64_t>(step.tokens.size())});
    for (size_t i = 0; i < step.tokens.size(); ++i) {
      p.row_seq_id.push_back(step.sequence_id);
      p.row_pos.push_back(length + static_cast<int64_t>(i));
    }
  }
  return p;
}

// Ends a step that ran with status `st`. On error every cache goes back to
// its old length (its rows, and the blocks the step added; rows trimmed
// below local layers' windows stay trimmed, as the CPU backend would have
// trimmed them) and `st` is returned. Otherwise each cache takes its new
// tokens, `observer` (if any) is shown the `staged` residuals entering each
// of n_shown layers (n_shown x rows x d_model, layer-major), and `result`
// becomes *out.
inline absl::Status FinishStep(absl::Status st,
                               absl::Span<const SequenceStep> batch,
                               const PreparedStep& step,
                               ResidualObserver* observer, const float* staged,
                               int64_t n_shown, int64_t d, ForwardOutput result,
                               ForwardOutput* out) {
  if (!st.ok()) {
    for (size_t s = 0; s < batch.size(); ++s)
      batch[s].cache->Truncate(step.old_length[s]);
    return st;
  }
  for (size_t s = 0; s < batch.size(); ++s) {
    batch[s].cache->SetLength(step.old_length[s] + batch[s].tokens.size());
  }
  if (observer != nullptr && staged != nullptr) {
    ShowStagedResiduals(observer, staged, 0, n_shown,
                        static_cast<int64_t>(step.row_pos.size()), d,
                        step.row_seq_id, step.row_pos);
  }
  *out = std::move(result);
  return absl::OkStatus();
}

// Positions recomputed per sequence per fused-recompute group
// (PagedRecomputeArgs::group_rows' default).
inline constexpr int64_t kColdGroupRows = 256;

// What one device needs for a step's cold positions (KvSources' bounded
// hot windows): PagedAttentionRecompute's scratch and the bf16 cold
// residuals, each for the worst layer.
struct ColdSizes {
  bool any = false;
  int64_t workspace_bytes = 0;
  int64_t residual_values = 0;
};

// For `rows` query rows over attention with n_heads / n_kv_heads heads (the
// whole model's, or one shard's).
ColdSizes SizeColdBuffers(const ModelConfig& c,
                          const std::vector<std::vector<ColdSpan>>& spans,
                          int64_t rows, int64_t n_heads, int64_t n_kv_heads);

// Layer `layer`'s cold residuals of each sequence, read from its KvSource
// and rounded to bf16 (exact: bf16-mode residuals are bf16 values):
// out[s] holds spans[s][layer].cold rows of d_model (zeros below the
// window's start, which nothing sees), empty where nothing is cold.
void ReadColdResiduals(const ModelConfig& c,
                       absl::Span<const SequenceStep> batch,
                       const std::vector<std::vector<ColdSpan>>& spans,
                       int64_t layer, std::vector<std::vector<uint16_t>>* out);

// One device's per-layer arguments for the fused recompute of a step's
// cold positions: sequence s's cold residuals of layer l at
// targets(l)[s] in the device's cold residual buffer, and the CudaColdRows
// RunLayers takes (null for a layer where nothing is cold).
class ColdLayout {
 public:
  ColdLayout(const std::vector<std::vector<ColdSpan>>& spans, int64_t n_layers,
             int64_t d_model, uint16_t* residual_buffer, void* workspace,
             int64_t workspace_bytes);
  ColdLayout(const ColdLayout&) = delete;
  ColdLayout& operator=(const ColdLayout&) = delete;

  absl::Span<const CudaColdRows* const> layers() const { return cold_of_; }
  absl::Span<uint16_t* const> targets(int64_t layer) const {
    return targets_[layer];
  }

 private:
  std::vector<std::vector<int64_t>> hot_begin_;
  std::vector<std::vector<const uint16_t*>> residual_;
  std::vector<std::vector<uint16_t*>> targets_;
  std::vector<CudaColdRows> cold_;
  std::vector<const CudaColdRows*> cold_of_;
};

// Recomputes into the cache the rows [boundary, hot) of each cold span:
// below the hot boundary but in its chunk, which the fused recompute reads
// from the pool. Forward's own K/V launches (ProjectKv) on the source's
// residuals, so the rows are the bits Forward wrote for them.
template <typename Forward, typename Pools>
absl::Status PatchColdChunks(Forward& f, const Pools& pools,
                             const ModelConfig& c,
                             absl::Span<const SequenceStep> batch,
                             const std::vector<std::vector<ColdSpan>>& spans) {
  std::vector<float> rows;
  for (size_t s = 0; s < batch.size(); ++s) {
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const ColdSpan& span = spans[s][l];
      const int64_t n = span.hot - span.boundary;
      if (n == 0) continue;
      rows.resize(n * c.d_model);
      batch[s].kv_source->ReadResiduals(l, span.boundary, n, rows.data());
      const CacheRows patch{batch[s].cache, {}, span.boundary, n};
      KVD_ASSIGN_OR_RETURN(const StepPlan plan,
                           PlanCacheRows({&patch, 1}, c.n_layers, {}));
      KVD_RETURN_IF_ERROR(f.EnsureWorkspace(n, 0, plan.ints.size()));
      KVD_RETURN_IF_ERROR(f.UploadPlan(plan));
      KVD_RETURN_IF_ERROR(f.UploadResiduals(rows.data(), n));
      KVD_RETURN_IF_ERROR(f.ProjectKv(plan, pools, l));
    }
  }
  return absl::OkStatus();
}

// Layers [first_layer, end_layer) over positions [position, position + n)
// of `cache` from the residuals in h (n x d_model, replaced by the
// residuals leaving end_layer), kBackendChunkRows rows at a time (rows do not
// depend on their chunking), showing `observer` each chunk's residuals
// entering every layer run (and the final one when end_layer is the last).
// The caller has run PrepareLayerRange.
template <typename Forward, typename Pools>
absl::Status ForwardLayersInChunks(Forward& f, const Pools& pools,
                                   const ModelConfig& c, KvCache* cache,
                                   int64_t position, int64_t n,
                                   int64_t first_layer, int64_t end_layer,
                                   float* h, ResidualObserver* observer,
                                   int64_t sequence_id) {
  const int64_t d = c.d_model;
  // The final residual (layer n_layers) is shown only by a run that ends
  // there, as on the CPU.
  const int64_t n_shown =
      (end_layer == c.n_layers ? end_layer + 1 : end_layer) - first_layer;
  for (int64_t done = 0; done < n; done += kBackendChunkRows) {
    const int64_t m = std::min(kBackendChunkRows, n - done);
    const CacheRows rows{cache, {}, position + done, m};
    KVD_ASSIGN_OR_RETURN(const StepPlan plan,
                         PlanCacheRows({&rows, 1}, c.n_layers, {}));
    KVD_RETURN_IF_ERROR(f.EnsureWorkspace(m, 0, plan.ints.size()));
    float* pinned = nullptr;
    if (observer != nullptr) {
      KVD_ASSIGN_OR_RETURN(pinned, f.PinnedFloats(n_shown * m * d));
    }
    float* chunk = h + done * d;
    KVD_RETURN_IF_ERROR(f.UploadPlan(plan));
    KVD_RETURN_IF_ERROR(f.UploadResiduals(chunk, m));
    std::function<absl::Status(int64_t)> show;
    if (pinned != nullptr) {
      show = [&](int64_t l) {
        return f.DownloadResiduals(pinned + (l - first_layer) * m * d, m);
      };
    }
    KVD_RETURN_IF_ERROR(f.RunLayers(plan, pools, first_layer, end_layer, show));
    if (show && end_layer == c.n_layers) KVD_RETURN_IF_ERROR(show(end_layer));
    KVD_RETURN_IF_ERROR(f.DownloadResiduals(chunk, m));
    KVD_RETURN_IF_ERROR(f.Sync("ForwardLayers: running the layers"));
    if (pinned != nullptr) {
      std::vector<int64_t> ids(m, sequence_id), pos(m);
      for (int64_t i = 0; i < m; ++i) pos[i] = position + done + i;
      ShowStagedResiduals(observer, pinned, first_layer, n_shown, m, d, ids,
                          pos);
    }
  }
  return absl::OkStatus();
}

// Layer `layer`'s K/V rows for positions [position, position + n) of
// `cache` from `residuals` (n x d_model), with the forward pass's own K/V
// launches (ProjectKv), kBackendChunkRows rows at a time. The caller has
// run CheckRecomputeTarget.
template <typename Forward, typename Pools>
absl::Status RecomputeKvInChunks(Forward& f, const Pools& pools,
                                 const ModelConfig& c, int64_t layer,
                                 const float* residuals, int64_t position,
                                 int64_t n, KvCache* cache) {
  for (int64_t done = 0; done < n; done += kBackendChunkRows) {
    const int64_t m = std::min(kBackendChunkRows, n - done);
    const CacheRows rows{cache, {}, position + done, m};
    KVD_ASSIGN_OR_RETURN(const StepPlan plan,
                         PlanCacheRows({&rows, 1}, c.n_layers, {}));
    KVD_RETURN_IF_ERROR(f.EnsureWorkspace(m, 0, plan.ints.size()));
    KVD_RETURN_IF_ERROR(f.UploadPlan(plan));
    KVD_RETURN_IF_ERROR(f.UploadResiduals(residuals + done * c.d_model, m));
    KVD_RETURN_IF_ERROR(f.ProjectKv(plan, pools, layer));
  }
  return f.Sync("RecomputeKvIntoCache: writing K/V rows");
}

}  // namespace kvd::ops::internal

#endif  // KVD_OPS_BACKEND_INTERNAL_BACKEND_STEPS_H_
