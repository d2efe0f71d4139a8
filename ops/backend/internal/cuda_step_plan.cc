#include "ops/backend/internal/cuda_step_plan.h"

#include <algorithm>

namespace kvd::ops::internal {

StepPlan PlanStep(absl::Span<const StepSequence> seqs, int64_t n_layers) {
  StepPlan p;
  p.n_seqs = seqs.size();
  p.n_gather = p.n_seqs;
  p.table_stride = 1;
  for (const StepSequence& s : seqs) {
    p.rows += s.tokens.size();
    for (const auto& layer : *s.blocks)
      p.table_stride =
          std::max<int64_t>(p.table_stride, static_cast<int64_t>(layer.size()));
  }
  p.ints.assign(p.table_offset(n_layers), 0);
  int64_t r = 0;
  for (int64_t i = 0; i < p.n_seqs; ++i) {
    const StepSequence& s = seqs[i];
    for (size_t j = 0; j < s.tokens.size(); ++j, ++r) {
      p.ints[p.tokens_offset() + r] = s.tokens[j];
      p.ints[p.positions_offset() + r] = static_cast<int32_t>(s.length + j);
      p.ints[p.row_seq_offset() + r] = static_cast<int32_t>(i);
    }
    p.ints[p.last_row_offset() + i] = static_cast<int32_t>(r - 1);
    for (int64_t l = 0; l < n_layers; ++l) {
      const std::vector<int32_t>& b = (*s.blocks)[l];
      std::copy(b.begin(), b.end(),
                p.ints.begin() + p.table_offset(l) + i * p.table_stride);
    }
  }
  return p;
}

}  // namespace kvd::ops::internal
