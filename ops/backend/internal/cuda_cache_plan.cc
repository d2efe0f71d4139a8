#include "ops/backend/internal/cuda_cache_plan.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvd::ops::internal {

absl::Status CheckDeviceCache(const KvCache* cache, absl::string_view who) {
  if (cache == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": no K/V cache"));
  }
  if (cache->pool()->host_accessible()) {
    return absl::InvalidArgumentError(absl::StrCat(
        who,
        ": the K/V cache's blocks are host memory (a CPU backend's or a "
        "private pool); the CUDA backend reads caches made by its own "
        "NewCache over its NewBlockPool"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CudaBatchCheck> CheckCudaBackendBatch(
    absl::Span<const SequenceStep> batch, const ResidualPatcher* patcher,
    int64_t n_layers) {
  if (patcher != nullptr) {
    return absl::UnimplementedError(
        "CUDA backend: a ResidualPatcher is not supported (residual patching "
        "runs on the CPU backend)");
  }
  CudaBatchCheck check;
  absl::flat_hash_set<const KvCache*> seen;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceStep& step = batch[s];
    if (step.key_selection != nullptr) {
      return absl::UnimplementedError(absl::StrCat(
          "CUDA backend: sequence ", step.sequence_id,
          " has a KeySelection; the eviction baselines run on the CPU "
          "backend"));
    }
    if (step.cache == nullptr) {
      return absl::InvalidArgumentError("sequence without a K/V cache");
    }
    // PrepareStepCaches' check and message, needed first here: the caller
    // sizes its buffers from the caches' layers before preparing them.
    if (step.cache->precision() != Precision::kBf16 ||
        step.cache->n_layers() != n_layers) {
      return absl::FailedPreconditionError(
          "K/V cache was made for another model or precision");
    }
    KVD_RETURN_IF_ERROR(CheckDeviceCache(
        step.cache, absl::StrCat("CUDA backend: sequence ", step.sequence_id)));
    if (!seen.insert(step.cache).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA backend: sequence ", step.sequence_id,
                       "'s K/V cache appears twice in the batch"));
    }
    if (check.pool == nullptr) {
      check.pool = step.cache->pool();
    } else if (step.cache->pool() != check.pool) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA backend: sequence ", step.sequence_id,
          "'s K/V cache draws from another block pool than sequence ",
          batch[0].sequence_id,
          "'s; one step reads one device pool (share one NewBlockPool)"));
    }
    check.rows += step.tokens.size();
  }
  if (check.rows > kMaxCudaStepRows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA backend: ", check.rows, " tokens in one step; at most ",
        kMaxCudaStepRows, " (split the prefill into chunks)"));
  }
  return check;
}

absl::Status FillBlockTable(const KvCache& cache, int64_t layer, int32_t* out,
                            int64_t stride) {
  const absl::Span<uint8_t* const> table = cache.BlockTable(layer);
  if (static_cast<int64_t>(table.size()) > stride) {
    return absl::InvalidArgumentError(
        absl::StrCat("block table of layer ", layer, " has ", table.size(),
                     " entries, more than the plan's ", stride));
  }
  const KvBlockPool& pool = *cache.pool();
  for (size_t i = 0; i < table.size(); ++i) {
    if (table[i] == nullptr) {
      out[i] = 0;  // dropped: attention never reads it
      continue;
    }
    const int64_t index = pool.BlockIndex(table[i]);
    if (index < 0 || index > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block ", i, " of layer ", layer,
          " is not a block of the cache's pool region (a pool made by the "
          "CUDA backend's NewBlockPool)"));
    }
    out[i] = static_cast<int32_t>(index);
  }
  return absl::OkStatus();
}

absl::StatusOr<StepPlan> PlanCacheRows(absl::Span<const CacheRows> seqs,
                                       int64_t n_layers,
                                       absl::Span<const int64_t> gather_rows) {
  StepPlan p;
  p.n_seqs = seqs.size();
  p.n_gather = gather_rows.size();
  p.table_stride = 1;
  for (const CacheRows& s : seqs) {
    if (!s.tokens.empty() && static_cast<int64_t>(s.tokens.size()) != s.n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step plan: ", s.tokens.size(), " tokens for ", s.n, " rows"));
    }
    p.rows += s.n;
    for (int64_t l = 0; l < n_layers; ++l) {
      p.table_stride = std::max<int64_t>(
          p.table_stride, static_cast<int64_t>(s.cache->BlockTable(l).size()));
    }
  }
  for (int64_t r : gather_rows) {
    if (r < 0 || r >= p.rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step plan: logit row ", r, " outside the step's ", p.rows, " rows"));
    }
  }
  p.ints.assign(p.table_offset(n_layers), 0);
  int64_t r = 0;
  for (int64_t i = 0; i < p.n_seqs; ++i) {
    const CacheRows& s = seqs[i];
    for (int64_t j = 0; j < s.n; ++j, ++r) {
      p.ints[p.tokens_offset() + r] = s.tokens.empty() ? 0 : s.tokens[j];
      p.ints[p.positions_offset() + r] = static_cast<int32_t>(s.position + j);
      p.ints[p.row_seq_offset() + r] = static_cast<int32_t>(i);
    }
    for (int64_t l = 0; l < n_layers; ++l) {
      KVD_RETURN_IF_ERROR(FillBlockTable(
          *s.cache, l, p.ints.data() + p.table_offset(l) + i * p.table_stride,
          p.table_stride));
    }
  }
  for (size_t g = 0; g < gather_rows.size(); ++g)
    p.ints[p.last_row_offset() + g] = static_cast<int32_t>(gather_rows[g]);
  return p;
}

std::vector<std::vector<ColdSpan>> PlanColdSpans(
    absl::Span<const SequenceStep> batch, const ModelConfig& config,
    int64_t chunk) {
  std::vector<std::vector<ColdSpan>> spans(
      batch.size(), std::vector<ColdSpan>(config.n_layers));
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceStep& step = batch[s];
    if (step.kv_source == nullptr) continue;
    const int64_t length = step.cache->length();
    for (int64_t l = 0; l < config.n_layers; ++l) {
      const int64_t hot = std::min(step.kv_source->HotBegin(l, length), length);
      const int64_t from = WindowStart(config.layers[l].sliding_window, length);
      if (hot <= 0 || from >= hot) continue;
      // from is chunk-aligned and below hot, so from <= boundary.
      const int64_t boundary = hot / chunk * chunk;
      spans[s][l] = {from, boundary > from ? boundary : 0, boundary, hot};
    }
  }
  return spans;
}

absl::StatusOr<uint8_t*> RegionBase(const KvCache& cache) {
  const uint8_t* base = cache.pool()->region_base();
  if (base == nullptr) {
    return absl::InvalidArgumentError(
        "the K/V cache's pool has no region (make it with the CUDA "
        "backend's NewBlockPool)");
  }
  // The region is the pool owner's memory; the pool only hands it out.
  return const_cast<uint8_t*>(base);
}

int64_t PlannedInts(absl::Span<const SequenceStep> batch, int64_t n_layers,
                    int64_t n_gather) {
  int64_t rows = 0, stride = 1;
  for (const SequenceStep& step : batch) {
    const KvCache& cache = *step.cache;
    const int64_t end =
        cache.length() + static_cast<int64_t>(step.tokens.size());
    // KvCache::Prepare grows a table to cover `end` and never shortens it.
    const int64_t need = BlocksFor(end, cache.block_rows());
    for (int64_t l = 0; l < n_layers; ++l) {
      stride = std::max<int64_t>(
          stride, std::max<int64_t>(need, cache.BlockTable(l).size()));
    }
    rows += step.tokens.size();
  }
  return 3 * rows + n_gather +
         n_layers * static_cast<int64_t>(batch.size()) * stride;
}

void ShowStagedResiduals(ResidualObserver* observer, const float* staged,
                         int64_t first_layer, int64_t n_shown, int64_t m,
                         int64_t d, absl::Span<const int64_t> row_seq_id,
                         absl::Span<const int64_t> row_pos) {
  for (int64_t i = 0; i < n_shown; ++i) {
    for (int64_t r = 0; r < m; ++r) {
      observer->OnResidual(row_seq_id[r], first_layer + i, row_pos[r],
                           staged + (i * m + r) * d);
    }
  }
}

}  // namespace kvd::ops::internal
