#include "ops/kvdirect/residual_store.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/elementwise.h"

namespace kvd::ops {

namespace cpu = kernels::cpu;

ResidualStore::ResidualStore(const ModelConfig& config, Precision precision,
                             std::vector<int64_t> layers)
    : d_model_(config.d_model),
      precision_(precision),
      row_bytes_(config.d_model * (precision == Precision::kF32 ? 4 : 2)),
      layer_index_(config.n_layers + 1, -1) {
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  for (int64_t l : layers) {
    if (l < 0 || l > config.n_layers) continue;
    layer_index_[l] = layers_.size();
    layers_.push_back(l);
  }
}

int64_t ResidualStore::LayerIndex(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(layer_index_.size()))
    return -1;
  return layer_index_[layer];
}

bool ResidualStore::HasLayer(int64_t layer) const {
  return LayerIndex(layer) >= 0;
}

void ResidualStore::OnResidual(int64_t sequence_id, int64_t layer,
                               int64_t position, const float* residual) {
  const int64_t li = LayerIndex(layer);
  if (li < 0) return;
  std::vector<std::vector<uint8_t>>& seq = rows_[sequence_id];
  if (seq.empty()) seq.resize(layers_.size());
  std::vector<uint8_t>& rows = seq[li];
  const int64_t stored = rows.size() / row_bytes_;
  if (position < 0 || position > stored) {
    if (status_.ok()) {
      status_ = absl::FailedPreconditionError(absl::StrCat(
          "residual store: sequence ", sequence_id, " layer ", layer,
          " got position ", position, " but holds ", stored,
          " rows; attach the store before the sequence's first token"));
    }
    return;
  }
  if (position == stored) rows.resize(rows.size() + row_bytes_);
  uint8_t* dst = rows.data() + position * row_bytes_;
  if (precision_ == Precision::kF32) {
    std::memcpy(dst, residual, row_bytes_);
    return;
  }
  uint16_t* out = reinterpret_cast<uint16_t*>(dst);
  cpu::FloatToBf16(residual, out, d_model_);
  for (int64_t i = 0; i < d_model_; ++i) {
    const float back = cpu::Bf16ToFloat(out[i]);
    if (std::memcmp(&back, residual + i, sizeof(float)) != 0) {
      if (status_.ok()) {
        status_ = absl::InternalError(absl::StrCat(
            "residual store: sequence ", sequence_id, " layer ", layer,
            " position ", position, " value ", i, " (", residual[i],
            ") is not bf16-representable in the bf16 mode; storing it as "
            "bf16 would lose bits"));
      }
      if (position == stored) rows.resize(rows.size() - row_bytes_);
      return;
    }
  }
}

int64_t ResidualStore::length(int64_t sequence_id) const {
  auto it = rows_.find(sequence_id);
  if (it == rows_.end() || it->second.empty()) return 0;
  size_t n = it->second[0].size();
  for (const std::vector<uint8_t>& r : it->second) n = std::min(n, r.size());
  return n / row_bytes_;
}

int64_t ResidualStore::size_bytes() const {
  int64_t total = 0;
  for (const auto& [id, seq] : rows_)
    for (const std::vector<uint8_t>& r : seq) total += r.size();
  return total;
}

const uint8_t* ResidualStore::RowBytes(int64_t sequence_id, int64_t layer,
                                       int64_t position) const {
  const int64_t li = LayerIndex(layer);
  auto it = rows_.find(sequence_id);
  if (li < 0 || it == rows_.end() || it->second.empty() || position < 0)
    return nullptr;
  const std::vector<uint8_t>& rows = it->second[li];
  if ((position + 1) * row_bytes_ > static_cast<int64_t>(rows.size()))
    return nullptr;
  return rows.data() + position * row_bytes_;
}

absl::Status ResidualStore::ReadRows(int64_t sequence_id, int64_t layer,
                                     int64_t first, int64_t n,
                                     float* out) const {
  if (n <= 0) return absl::OkStatus();
  const uint8_t* src = RowBytes(sequence_id, layer, first);
  if (src == nullptr ||
      RowBytes(sequence_id, layer, first + n - 1) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("residual store: sequence ", sequence_id, " has no layer-",
                     layer, " residuals for positions [", first, ", ",
                     first + n, ") (checkpointed layers: ", layers_.size(),
                     ", stored length ", length(sequence_id), ")"));
  }
  if (precision_ == Precision::kF32) {
    std::memcpy(out, src, n * row_bytes_);
  } else {
    cpu::Bf16ToFloat(reinterpret_cast<const uint16_t*>(src), out, n * d_model_);
  }
  return absl::OkStatus();
}

void ResidualStore::Truncate(int64_t sequence_id, int64_t length) {
  auto it = rows_.find(sequence_id);
  if (it == rows_.end()) return;
  const size_t keep = std::max<int64_t>(0, length) * row_bytes_;
  for (std::vector<uint8_t>& r : it->second)
    if (r.size() > keep) r.resize(keep);
}

void ResidualStore::Erase(int64_t sequence_id) { rows_.erase(sequence_id); }

void ResidualStore::Clear() {
  rows_.clear();
  status_ = absl::OkStatus();
}

}  // namespace kvd::ops
