#include "ops/backend/internal/cuda_batch.h"

#include "absl/container/flat_hash_set.h"

namespace kvd::ops::internal {

absl::Status CheckPoolOptions(absl::string_view options_name,
                              int64_t block_rows, int64_t max_blocks,
                              int64_t chunk) {
  if (block_rows <= 0 || block_rows % chunk != 0 || max_blocks < 0 ||
      max_blocks > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat(options_name, ": block_rows (", block_rows,
                     ") must be a positive multiple of ", chunk,
                     " and max_blocks (", max_blocks, ") in [0, 2^30]"));
  }
  return absl::OkStatus();
}

int64_t PoolBlocks(int64_t max_blocks, int64_t n_layers, int64_t context_length,
                   int64_t block_rows) {
  if (max_blocks != 0) return max_blocks;
  const int64_t positions = std::min<int64_t>(16 * context_length, 16384);
  return n_layers * ((positions + block_rows - 1) / block_rows);
}

int64_t BackendPoolBlocks(size_t budget_bytes, size_t block_bytes,
                          int64_t max_blocks, int64_t n_layers,
                          int64_t context_length, int64_t block_rows) {
  if (budget_bytes == 0) {
    return PoolBlocks(max_blocks, n_layers, context_length, block_rows);
  }
  const int64_t by_budget = static_cast<int64_t>(budget_bytes / block_bytes);
  return max_blocks == 0 ? by_budget : std::min(max_blocks, by_budget);
}

absl::StatusOr<int64_t> CheckBatch(absl::Span<const StepView> steps,
                                   const BatchLimits& limits,
                                   absl::string_view who) {
  int64_t m = 0;
  absl::flat_hash_set<const void*> seen;
  for (int64_t i = 0; i < static_cast<int64_t>(steps.size()); ++i) {
    const StepView& st = steps[i];
    if (!st.ours) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": step ", i, " has no cache of this model"));
    }
    if (!seen.insert(st.cache).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": step ", i, "'s cache appears twice in the batch"));
    }
    if (st.tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": step ", i, " has no tokens"));
    }
    for (int32_t t : st.tokens) {
      if (t < 0 || t >= limits.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": step ", i, " has token id ", t,
            " outside the vocabulary [0, ", limits.vocab_size, ")"));
      }
    }
    const int64_t end = st.length + st.tokens.size();
    if (end > limits.context_length) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": step ", i, " would reach position ", end,
                       " past the context length ", limits.context_length));
    }
    m += st.tokens.size();
  }
  // PagedAttention's grid limit (one grid row per query).
  if (m > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": ", m,
        " tokens in one step; at most 65535 (split the prefill into chunks)"));
  }
  return m;
}

absl::StatusOr<std::vector<int64_t>> ReserveBlocks(
    absl::Span<const StepView> steps, int64_t n_layers, int64_t block_rows,
    const BlockPool& pool, absl::string_view who,
    absl::string_view options_name) {
  const int64_t n_seqs = steps.size();
  std::vector<int64_t> added(n_seqs, 0);
  int64_t need = 0;
  for (int64_t i = 0; i < n_seqs; ++i) {
    added[i] = BlocksFor(steps[i].length + steps[i].tokens.size(), block_rows) -
               static_cast<int64_t>((*steps[i].blocks)[0].size());
    need += added[i] * n_layers;
  }
  absl::MutexLock lock(pool.mu);
  std::vector<int32_t>& free_blocks = *pool.free_blocks;
  if (need > static_cast<int64_t>(free_blocks.size())) {
    return absl::ResourceExhaustedError(
        absl::StrCat(who, ": the step needs ", need, " more blocks, ",
                     free_blocks.size(), " of ", pool.max_blocks,
                     " are free; finish or drop sequences, or raise ",
                     options_name, "::max_blocks"));
  }
  for (int64_t i = 0; i < n_seqs; ++i) {
    for (int64_t l = 0; l < n_layers; ++l) {
      for (int64_t b = 0; b < added[i]; ++b) {
        (*steps[i].blocks)[l].push_back(free_blocks.back());
        free_blocks.pop_back();
      }
    }
  }
  return added;
}

void ReleaseBlocks(absl::Span<const StepView> steps,
                   absl::Span<const int64_t> added, const BlockPool& pool) {
  absl::MutexLock lock(pool.mu);
  for (size_t i = 0; i < steps.size(); ++i) {
    for (auto& layer : *steps[i].blocks) {
      for (int64_t b = 0; b < added[i]; ++b) {
        pool.free_blocks->push_back(layer.back());
        layer.pop_back();
      }
    }
  }
}

StepPlan PlanViews(absl::Span<const StepView> steps, int64_t n_layers) {
  std::vector<StepSequence> seqs(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    seqs[i] = {steps[i].tokens, steps[i].length, steps[i].blocks};
  }
  return PlanStep(seqs, n_layers);
}

}  // namespace kvd::ops::internal
