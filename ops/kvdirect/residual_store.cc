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
      layer_index_(config.n_layers + 1, -1),
      windows_(config.n_layers + 1, 0) {
  for (int64_t l = 0; l < config.n_layers; ++l)
    windows_[l] = config.layers[l].sliding_window;
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

const ResidualStore::Rows* ResidualStore::Find(int64_t sequence_id,
                                               int64_t layer) const {
  const int64_t li = LayerIndex(layer);
  auto it = rows_.find(sequence_id);
  if (li < 0 || it == rows_.end() || it->second.empty()) return nullptr;
  return &it->second[li];
}

void ResidualStore::OnResidual(int64_t sequence_id, int64_t layer,
                               int64_t position, const float* residual) {
  const int64_t li = LayerIndex(layer);
  if (li < 0) return;
  std::vector<Rows>& seq = rows_[sequence_id];
  if (seq.empty()) seq.resize(layers_.size());
  Rows& rows = seq[li];
  const int64_t end = End(rows);
  if (position < rows.first || position > end) {
    if (status_.ok()) {
      status_ = absl::FailedPreconditionError(absl::StrCat(
          "residual store: sequence ", sequence_id, " layer ", layer,
          " got position ", position, " but holds positions [", rows.first,
          ", ", end,
          "); attach the store before the sequence's first token, and do not "
          "re-run positions its windows already dropped"));
    }
    return;
  }
  if (position == end) rows.bytes.resize(rows.bytes.size() + row_bytes_);
  uint8_t* dst = rows.bytes.data() + (position - rows.begin) * row_bytes_;
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
      if (position == end) rows.bytes.resize(rows.bytes.size() - row_bytes_);
      return;
    }
  }
}

absl::Status ResidualStore::PutRowBytes(int64_t sequence_id, int64_t layer,
                                        int64_t position, int64_t n,
                                        const void* bytes) {
  const int64_t li = LayerIndex(layer);
  if (li < 0) {
    return absl::NotFoundError(
        absl::StrCat("residual store: layer ", layer, " is not checkpointed"));
  }
  std::vector<Rows>& seq = rows_[sequence_id];
  if (seq.empty()) seq.resize(layers_.size());
  Rows& rows = seq[li];
  const int64_t end = End(rows);
  if (n < 0 || position < rows.first || position > end) {
    return absl::FailedPreconditionError(
        absl::StrCat("residual store: sequence ", sequence_id, " layer ", layer,
                     " got positions [", position, ", ", position + n,
                     ") but holds [", rows.first, ", ", end, ")"));
  }
  const int64_t grown = std::max(end, position + n);
  rows.bytes.resize((grown - rows.begin) * row_bytes_);
  std::memcpy(rows.bytes.data() + (position - rows.begin) * row_bytes_, bytes,
              n * row_bytes_);
  return absl::OkStatus();
}

int64_t ResidualStore::length(int64_t sequence_id) const {
  auto it = rows_.find(sequence_id);
  if (it == rows_.end() || it->second.empty()) return 0;
  int64_t n = End(it->second[0]);
  for (const Rows& r : it->second) n = std::min(n, End(r));
  return n;
}

int64_t ResidualStore::first_kept(int64_t sequence_id, int64_t layer) const {
  const Rows* r = Find(sequence_id, layer);
  return r == nullptr ? 0 : r->first;
}

int64_t ResidualStore::size_bytes() const {
  int64_t total = 0;
  for (const auto& [id, seq] : rows_)
    for (const Rows& r : seq) total += (End(r) - r.first) * row_bytes_;
  return total;
}

const uint8_t* ResidualStore::RowBytes(int64_t sequence_id, int64_t layer,
                                       int64_t position) const {
  const Rows* r = Find(sequence_id, layer);
  if (r == nullptr || position < r->first || position >= End(*r))
    return nullptr;
  return r->bytes.data() + (position - r->begin) * row_bytes_;
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
                     ", kept from position ", first_kept(sequence_id, layer),
                     ", stored length ", length(sequence_id), ")"));
  }
  if (precision_ == Precision::kF32) {
    std::memcpy(out, src, n * row_bytes_);
  } else {
    cpu::Bf16ToFloat(reinterpret_cast<const uint16_t*>(src), out, n * d_model_);
  }
  return absl::OkStatus();
}

void ResidualStore::Reserve(int64_t sequence_id, int64_t layer, int64_t end) {
  const int64_t li = LayerIndex(layer);
  if (li < 0) return;
  std::vector<Rows>& seq = rows_[sequence_id];
  if (seq.empty()) seq.resize(layers_.size());
  Rows& r = seq[li];
  if (end > r.begin) r.bytes.reserve((end - r.begin) * row_bytes_);
}

void ResidualStore::DropBelow(int64_t sequence_id, int64_t layer,
                              int64_t position) {
  const int64_t li = LayerIndex(layer);
  if (li < 0) return;
  std::vector<Rows>& seq = rows_[sequence_id];
  if (seq.empty()) seq.resize(layers_.size());
  Rows& r = seq[li];
  if (position <= r.first) return;
  if (position >= End(r)) {
    r.bytes.clear();
    r.begin = r.first = position;
    return;
  }
  r.first = position;
  const int64_t dropped = r.first - r.begin, kept = End(r) - r.first;
  if (dropped >= kept) {
    r.bytes.erase(r.bytes.begin(), r.bytes.begin() + dropped * row_bytes_);
    r.begin = r.first;
  }
}

void ResidualStore::Truncate(int64_t sequence_id, int64_t length) {
  auto it = rows_.find(sequence_id);
  if (it == rows_.end()) return;
  length = std::max<int64_t>(0, length);
  for (Rows& r : it->second) {
    if (r.first >= length) {
      r.bytes.clear();
      r.begin = r.first = std::min(r.first, length);
    } else if (End(r) > length) {
      r.bytes.resize((length - r.begin) * row_bytes_);
    }
  }
}

void ResidualStore::Erase(int64_t sequence_id) { rows_.erase(sequence_id); }

void ResidualStore::Clear() {
  rows_.clear();
  status_ = absl::OkStatus();
}

int64_t ResidualKeepBegin(const ModelConfig& config,
                          const CheckpointPolicy& policy, int64_t layer,
                          int64_t length) {
  auto window = [&](int64_t l) { return config.layers[l].sliding_window; };
  if (layer < 0 || layer >= config.n_layers) return 0;
  switch (policy.kind) {
    case CheckpointPolicy::Kind::kKvDirect:
      return WindowStart(window(layer), length);
    case CheckpointPolicy::Kind::kStride: {
      if (layer % policy.stride != 0) return 0;
      const int64_t end = std::min(layer + policy.stride, config.n_layers);
      // Layer l's outputs from `start` on need its keys from
      // WindowStart(window, start): walk the segment from its last layer.
      int64_t start = length;
      for (int64_t l = end - 1; l >= layer; --l) {
        if (window(l) == 0) return 0;
        start = WindowStart(window(l), start);
      }
      return start;
    }
    case CheckpointPolicy::Kind::kKv:
    case CheckpointPolicy::Kind::kTokens:
      return 0;
  }
  return 0;
}

void TrimToWindows(const ModelConfig& config, const CheckpointPolicy& policy,
                   int64_t sequence_id, int64_t length, ResidualStore* store) {
  for (int64_t l : CheckpointLayers(policy, config.n_layers)) {
    const int64_t keep = ResidualKeepBegin(config, policy, l, length);
    if (keep > 0 && store->first_kept(sequence_id, l) < keep)
      store->DropBelow(sequence_id, l, keep);
  }
}

}  // namespace kvd::ops
