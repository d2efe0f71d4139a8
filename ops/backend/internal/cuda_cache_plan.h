// The host side of a CudaBackendModel step (cuda_backend_model.h), without
// CUDA: what the CUDA backend refuses before it touches any cache, and the
// step plan (cuda_step_plan.h's int32 array) built from the engine's
// KvCaches, whose block tables hold device addresses in one region pool
// (KvBlockPool::CreateInRegion) that the kernels address by block number
// (KvBlockPool::BlockIndex). Pure functions, tested on the CPU
// (cuda_cache_plan_test) with region pools over host memory.
//
//   KVD_ASSIGN_OR_RETURN(CudaBatchCheck check,
//                        CheckCudaBackendBatch(batch, patcher, n_layers));
//   ... PrepareStepCaches(...) ...
//   std::vector<CacheRows> seqs = ...;  // one per sequence
//   KVD_ASSIGN_OR_RETURN(StepPlan plan, PlanCacheRows(seqs, n_layers,
//                                                     logit_rows));
//
// Thread-safety: pure functions; the caches must not change meanwhile.
#ifndef KVD_OPS_BACKEND_INTERNAL_CUDA_CACHE_PLAN_H_
#define KVD_OPS_BACKEND_INTERNAL_CUDA_CACHE_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ops/backend/internal/cuda_step_plan.h"
#include "ops/model/kv_block_pool.h"
#include "ops/model/kv_cache.h"
#include "ops/model/model_backend.h"
#include "ops/model/model_config.h"

namespace kvd::ops::internal {

// PagedAttention's grid limit: one grid row per query.
inline constexpr int64_t kMaxCudaStepRows = 65535;

// INVALID_ARGUMENT unless `cache` draws from a pool whose blocks the host
// cannot touch (a CUDA backend's NewBlockPool): a cache made by the CPU
// backend, or with a private pool, cannot be read by the kernels. `who`
// starts the message.
absl::Status CheckDeviceCache(const KvCache* cache, absl::string_view who);

struct CudaBatchCheck {
  KvBlockPool* pool = nullptr;  // the one pool every cache draws from
  int64_t rows = 0;             // new tokens over the batch
};

// What the CUDA backend refuses before PrepareStepCaches, nothing changed:
// UNIMPLEMENTED for a ResidualPatcher or a KeySelection (each message names
// the feature; a KvSource's cold positions every CUDA backend recomputes);
// FAILED_PRECONDITION for a cache of another model or precision (not bf16);
// INVALID_ARGUMENT for a null cache, a cache twice in the batch, caches of
// host or of different pools (one launch reads one pool), or more than
// kMaxCudaStepRows tokens.
absl::StatusOr<CudaBatchCheck> CheckCudaBackendBatch(
    absl::Span<const SequenceStep> batch, const ResidualPatcher* patcher,
    int64_t n_layers);

// The kernels' block table of `layer` of `cache`: entry i is the pool block
// number of positions [i * block_rows, (i + 1) * block_rows) (BlockIndex);
// entries the cache dropped (below first_kept, never read) are 0. At most
// `stride` entries are written to `out`; the rest of `out` is left.
// INVALID_ARGUMENT for a block outside the pool's region or a table longer
// than `stride`.
absl::Status FillBlockTable(const KvCache& cache, int64_t layer, int32_t* out,
                            int64_t stride);

// One sequence's rows in a step: `n` rows at positions [position,
// position + n) of `cache` (whose blocks already cover them), with `tokens`
// (n ids, or empty when the rows start from uploaded residuals: tokens 0).
struct CacheRows {
  const KvCache* cache = nullptr;
  absl::Span<const int32_t> tokens;
  int64_t position = 0;
  int64_t n = 0;
};

// The step plan of `seqs` (rows in order), gathering `gather_rows` (row
// numbers of the flattened step) for the LM head, with every layer's table;
// table_stride is the longest table over the sequences and layers.
// FillBlockTable's errors; INVALID_ARGUMENT for a gather row out of range
// or tokens of the wrong count.
absl::StatusOr<StepPlan> PlanCacheRows(absl::Span<const CacheRows> seqs,
                                       int64_t n_layers,
                                       absl::Span<const int64_t> gather_rows);

// Where a sequence's attention at one layer reads K/V below its KvSource's
// hot boundary `hot` on the device. The fused recompute switches between
// residuals and the pool only at attention chunks: positions [0, cold) are
// recomputed inside attention from residuals read from `from` on (the
// layer's window start; nothing below it is visible, zeros are uploaded
// there), and the rows [boundary, hot) (below the boundary, in its chunk)
// are first recomputed into the cache block holding that chunk (kept: it
// holds the boundary). boundary is hot rounded down to a chunk; cold is
// boundary, or 0 when no position below it is visible. All 0: nothing
// cold (no source, or the window starts at or above the boundary).
struct ColdSpan {
  int64_t from = 0;
  int64_t cold = 0;
  int64_t boundary = 0;
  int64_t hot = 0;
};

// [sequence][layer], from the caches' lengths before PrepareStepCaches (what
// it calls HotBegin with). `chunk`: the attention chunk.
std::vector<std::vector<ColdSpan>> PlanColdSpans(
    absl::Span<const SequenceStep> batch, const ModelConfig& config,
    int64_t chunk);

// The base of the region `cache`'s pool carves its blocks from (the address
// of block 0), whether or not the cache holds blocks yet. INVALID_ARGUMENT
// for a pool without a region.
absl::StatusOr<uint8_t*> RegionBase(const KvCache& cache);

// The plan's int32 count for a batch about to be prepared to hold its new
// tokens (before PrepareStepCaches: what the step buffers must hold, so
// they can be grown before any cache changes).
int64_t PlannedInts(absl::Span<const SequenceStep> batch, int64_t n_layers,
                    int64_t n_gather);

// Rows per launch sequence for ForwardLayers and RecomputeKvIntoCache: bounds
// the step buffers (rows x d_ff floats) whatever the segment length; rows do
// not depend on how they are chunked.
inline constexpr int64_t kBackendChunkRows = 4096;
static_assert(kBackendChunkRows <= kMaxCudaStepRows);

// Shows `observer` each row's residual entering each of `n_shown` layers
// from `first_layer` on: `staged` holds n_shown x m x d_model floats,
// layer-major, rows in step order (row r is sequence row_seq_id[r]'s
// position row_pos[r]).
void ShowStagedResiduals(ResidualObserver* observer, const float* staged,
                         int64_t first_layer, int64_t n_shown, int64_t m,
                         int64_t d, absl::Span<const int64_t> row_seq_id,
                         absl::Span<const int64_t> row_pos);

}  // namespace kvd::ops::internal

#endif  // KVD_OPS_BACKEND_INTERNAL_CUDA_CACHE_PLAN_H_
