// The parts of a CUDA backend's Forward (with KV-Direct's cold positions),
// ForwardLayers and RecomputeKvIntoCache that do not depend on how the
// model is laid out over devices, shared by
// CudaBackendModel (one GPU: CudaForward, one CudaPool) and
// TpCudaBackendModel (shards: TpForward, one CudaPool per shard). Both
// forward passes offer the same calls (EnsureWorkspace, PinnedFloats,
// UploadPlan, Upload/DownloadResiduals, RunLayers, ProjectKv, Sync) taking
// their own kind of pools, hence templates; RunStep also needs the
// shard-indexed cold calls (see there).
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
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "kernels/cuda/attention.h"
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

// One Forward step over `batch` (already checked by CheckCudaBackendBatch:
// `rows` new tokens over the batch, every cache in `pools`), on a forward
// pass seen as shards: Forward offers shards(), n_heads(s), n_kv_heads(s),
// EnsureColdBuffers(s, ...), cold_residuals(s), cold_workspace(s),
// cold_workspace_bytes(s), UploadBf16(s, ...) and RunLayers(..., cold) with
// per-shard cold rows, besides the calls above (TpForward as it is; the
// single-GPU backend wraps CudaForward as one shard). Every allocation that
// can fail comes before PrepareStepCaches: the step buffers, each shard's
// cold recompute scratch, the observer's staging. KvSources' cold positions
// are recomputed inside attention by every shard for its own heads, from
// residuals read once per layer and uploaded to each shard; the rows below
// a hot boundary in its chunk are recomputed into the cache first.
// FinishStep ends it; `what` names the step in a CUDA error.
template <typename Forward, typename Pools>
absl::Status RunStep(Forward& f, const Pools& pools, const ModelConfig& c,
                     absl::Span<const SequenceStep> batch, int64_t rows,
                     ResidualObserver* observer, ForwardOutput* out,
                     absl::string_view what) {
  const int64_t d = c.d_model, n_layers = c.n_layers, m = rows;
  const int64_t n_shown = n_layers + 1;
  const int64_t chunk = kernels::cuda::kAttentionChunk;
  ForwardOutput result;
  const std::vector<int64_t> logit_rows =
      SelectLogitRows(batch, c.vocab_size, &result);
  // Cold positions per sequence and layer, from the lengths
  // PrepareStepCaches will see.
  const std::vector<std::vector<ColdSpan>> spans =
      PlanColdSpans(batch, c, chunk);
  bool any_cold = false;
  if (m > 0) {
    KVD_RETURN_IF_ERROR(f.EnsureWorkspace(
        std::max(m, chunk), logit_rows.size(),
        // PatchColdChunks' plans: up to a chunk of rows of one sequence.
        PlannedInts(batch, n_layers, logit_rows.size()) + 3 * chunk));
    for (int s = 0; s < f.shards(); ++s) {
      const ColdSizes sizes =
          SizeColdBuffers(c, spans, m, f.n_heads(s), f.n_kv_heads(s));
      any_cold = any_cold || sizes.any;
      KVD_RETURN_IF_ERROR(
          f.EnsureColdBuffers(s, sizes.workspace_bytes, sizes.residual_values));
    }
  }
  float* pinned = nullptr;
  if (observer != nullptr && m > 0) {
    KVD_ASSIGN_OR_RETURN(pinned, f.PinnedFloats(n_shown * m * d));
  }

  KVD_RETURN_IF_ERROR(PrepareStepCaches(c, Precision::kBf16, batch).status());
  const PreparedStep prepared = DescribePreparedStep(batch);
  const absl::Status st = [&]() -> absl::Status {
    if (m == 0) return absl::OkStatus();
    // Before the step's rows take the buffers: the rows below each hot
    // boundary but in its chunk, which attention reads from the pools.
    KVD_RETURN_IF_ERROR(PatchColdChunks(f, pools, c, batch, spans));
    KVD_ASSIGN_OR_RETURN(const StepPlan plan,
                         PlanCacheRows(prepared.seqs, n_layers, logit_rows));
    // Prepare never lengthens a table beyond PlannedInts' count; grow anyway
    // rather than trust it.
    KVD_RETURN_IF_ERROR(f.EnsureWorkspace(m, plan.n_gather, plan.ints.size()));
    KVD_RETURN_IF_ERROR(f.UploadPlan(plan));
    KVD_RETURN_IF_ERROR(f.Embed(plan));

    // Per shard, the cold recompute's arguments over its own scratch.
    std::vector<std::unique_ptr<ColdLayout>> cold;
    std::vector<absl::Span<const CudaColdRows* const>> cold_of;
    if (any_cold) {
      for (int s = 0; s < f.shards(); ++s) {
        cold.push_back(std::make_unique<ColdLayout>(
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
        // order); from pageable memory, staged before each call returns.
        ReadColdResiduals(c, batch, spans, l, &cold_rows);
        for (int s = 0; s < f.shards(); ++s) {
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
    return f.Sync(what);
  }();
  return FinishStep(st, batch, prepared, observer, pinned, n_shown, d,
                    std::move(result), out);
}

// What a device backend checks before ForwardLayers takes its lock: a
// device cache (CheckDeviceCache) and PrepareLayerRange's checks and cache
// preparation. False: nothing to run.
inline absl::StatusOr<bool> PrepareDeviceLayerRange(
    const ModelConfig& c, KvCache* cache, int64_t position, int64_t n,
    int64_t first_layer, int64_t end_layer, float* h) {
  if (cache != nullptr)
    KVD_RETURN_IF_ERROR(CheckDeviceCache(cache, "ForwardLayers"));
  return PrepareLayerRange(c, Precision::kBf16, cache, position, n, first_layer,
                           end_layer, h);
}

// What a device backend checks before RecomputeKvIntoCache takes its lock:
// a device cache, CheckRecomputeTarget, residuals. False: nothing to do.
inline absl::StatusOr<bool> CheckDeviceRecompute(const ModelConfig& c,
                                                 int64_t layer,
                                                 const float* residuals,
                                                 int64_t position, int64_t n,
                                                 KvCache* cache) {
  if (cache != nullptr)
    KVD_RETURN_IF_ERROR(CheckDeviceCache(cache, "RecomputeKvIntoCache"));
  KVD_RETURN_IF_ERROR(
      CheckRecomputeTarget(c, Precision::kBf16, layer, position, n, cache));
  if (n == 0) return false;
  if (residuals == nullptr) {
    return absl::InvalidArgumentError("RecomputeKvIntoCache: null residuals");
  }
  return true;
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
