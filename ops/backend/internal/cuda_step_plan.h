// The host side of one CudaModel step (cuda_model.h), without CUDA: the
// flattened rows (token, position, sequence), each sequence's last row, and
// the per-layer block tables PagedAttention and WriteKvPaged read, packed as
// the one int32 array the step uploads. Pure functions, so the layout is
// tested on the CPU (cuda_step_plan_test) against the kernels' own paged
// index arithmetic (kernels/cuda/internal/attention_index.h).
//
//   StepPlan plan = PlanStep(seqs, n_layers);
//   cudaMemcpyAsync(dev, plan.ints.data(), plan.ints.size() * 4, ...);
//   const int32_t* table_l = dev + plan.table_offset(l);
//
// Thread-safety: pure functions.
#ifndef KVD_OPS_BACKEND_INTERNAL_CUDA_STEP_PLAN_H_
#define KVD_OPS_BACKEND_INTERNAL_CUDA_STEP_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace kvd::ops::internal {

struct StepSequence {
  absl::Span<const int32_t> tokens;  // new tokens, at positions length...
  int64_t length = 0;                // cached positions before the step
  // blocks[l][i]: pool block of layer l holding positions
  // [i * block_rows, (i + 1) * block_rows); already covers length + tokens.
  const std::vector<std::vector<int32_t>>* blocks = nullptr;
};

// Blocks a sequence holds per layer once it has `positions` positions.
inline int64_t BlocksFor(int64_t positions, int64_t block_rows) {
  return (positions + block_rows - 1) / block_rows;
}

struct StepPlan {
  int64_t rows = 0;  // m: new tokens over all sequences
  int64_t n_seqs = 0;
  // Rows the LM head gathers: each sequence's last row for PlanStep; the
  // rows that want logits for CudaBackendModel (cuda_cache_plan.h).
  int64_t n_gather = 0;
  int64_t table_stride = 0;  // entries per sequence in a layer's table
  // tokens[m], positions[m], row_seq[m], gathered rows[n_gather], then one
  // n_seqs x table_stride table per layer (unused entries 0).
  std::vector<int32_t> ints;

  int64_t tokens_offset() const { return 0; }
  int64_t positions_offset() const { return rows; }
  int64_t row_seq_offset() const { return 2 * rows; }
  int64_t last_row_offset() const { return 3 * rows; }
  int64_t table_offset(int64_t layer) const {
    return 3 * rows + n_gather + layer * n_seqs * table_stride;
  }
};

// Rows in batch order (sequence 0's tokens, then sequence 1's, ...).
StepPlan PlanStep(absl::Span<const StepSequence> seqs, int64_t n_layers);

}  // namespace kvd::ops::internal

#endif  // KVD_OPS_BACKEND_INTERNAL_CUDA_STEP_PLAN_H_
