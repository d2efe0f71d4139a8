#include "ops/backend/internal/backend_steps.h"

#include <algorithm>

#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/paged_attention.h"

namespace kvd::ops::internal {

ColdSizes SizeColdBuffers(const ModelConfig& c,
                          const std::vector<std::vector<ColdSpan>>& spans,
                          int64_t rows, int64_t n_heads, int64_t n_kv_heads) {
  ColdSizes sizes;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    int64_t values = 0, max_cold = 0;
    for (const auto& seq : spans) {
      values += seq[l].cold * c.d_model;
      max_cold = std::max(max_cold, seq[l].cold);
    }
    if (max_cold == 0) continue;
    sizes.any = true;
    sizes.residual_values = std::max(sizes.residual_values, values);
    sizes.workspace_bytes = std::max(
        sizes.workspace_bytes, kernels::cuda::PagedRecomputeWorkspaceBytes(
                                   rows, n_heads, n_kv_heads, c.head_dim,
                                   static_cast<int64_t>(spans.size()),
                                   c.d_model, kColdGroupRows, max_cold));
  }
  return sizes;
}

void ReadColdResiduals(const ModelConfig& c,
                       absl::Span<const SequenceStep> batch,
                       const std::vector<std::vector<ColdSpan>>& spans,
                       int64_t layer, std::vector<std::vector<uint16_t>>* out) {
  const int64_t d = c.d_model;
  out->assign(batch.size(), {});
  std::vector<float> rows;
  for (size_t s = 0; s < batch.size(); ++s) {
    const ColdSpan& span = spans[s][layer];
    if (span.cold == 0) continue;
    // Below the window start nothing is visible (the fold clips it) and the
    // source need not hold it: zeros.
    rows.assign(span.cold * d, 0.0f);
    batch[s].kv_source->ReadResiduals(layer, span.from, span.cold - span.from,
                                      rows.data() + span.from * d);
    (*out)[s].resize(rows.size());
    kernels::cpu::FloatToBf16(rows.data(), (*out)[s].data(), rows.size());
  }
}

ColdLayout::ColdLayout(const std::vector<std::vector<ColdSpan>>& spans,
                       int64_t n_layers, int64_t d_model,
                       uint16_t* residual_buffer, void* workspace,
                       int64_t workspace_bytes)
    : hot_begin_(n_layers),
      residual_(n_layers),
      targets_(n_layers),
      cold_(n_layers),
      cold_of_(n_layers, nullptr) {
  const int64_t n_seqs = spans.size();
  for (int64_t l = 0; l < n_layers; ++l) {
    hot_begin_[l].assign(n_seqs, 0);
    residual_[l].assign(n_seqs, nullptr);
    targets_[l].assign(n_seqs, nullptr);
    int64_t offset = 0;
    for (int64_t s = 0; s < n_seqs; ++s) {
      const int64_t rows = spans[s][l].cold;
      if (rows == 0) continue;
      hot_begin_[l][s] = rows;
      targets_[l][s] = residual_buffer + offset;
      residual_[l][s] = targets_[l][s];
      offset += rows * d_model;
    }
    if (offset == 0) continue;
    cold_[l] = {
        n_seqs,    hot_begin_[l].data(), residual_[l].data(), kColdGroupRows,
        workspace, workspace_bytes};
    cold_of_[l] = &cold_[l];
  }
}

}  // namespace kvd::ops::internal
