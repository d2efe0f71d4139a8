#include "ops/model/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/elementwise.h"

namespace kvd::ops {

using kernels::cpu::WeightType;

KvCache::KvCache(const ModelConfig& config, Precision precision)
    : precision_(precision),
      row_size_(config.kv_dim()),
      elem_bytes_(precision == Precision::kF32 ? 4 : 2),
      keys_(config.n_layers),
      values_(config.n_layers) {}

size_t KvCache::size_bytes() const {
  return 2 * keys_.size() * length_ * row_bytes();
}

void KvCache::Truncate(int64_t length) {
  length_ = std::min(length_, std::max<int64_t>(0, length));
}

void KvCache::Reserve(int64_t length) {
  if (length <= capacity_) return;
  int64_t cap = std::max<int64_t>(capacity_ * 2, 64);
  while (cap < length) cap *= 2;
  for (auto* stores : {&keys_, &values_})
    for (std::vector<uint8_t>& s : *stores) s.resize(cap * row_bytes());
  capacity_ = cap;
}

kernels::cpu::KvRows KvCache::Keys(int64_t layer) const {
  return {precision_ == Precision::kF32 ? WeightType::kF32 : WeightType::kBf16,
          keys_[layer].data(), row_size_};
}

kernels::cpu::KvRows KvCache::Values(int64_t layer) const {
  return {precision_ == Precision::kF32 ? WeightType::kF32 : WeightType::kBf16,
          values_[layer].data(), row_size_};
}

void KvCache::Write(std::vector<uint8_t>& store, int64_t position,
                    const float* row) {
  uint8_t* dst = store.data() + position * row_bytes();
  if (precision_ == Precision::kF32) {
    std::memcpy(dst, row, row_bytes());
  } else {
    kernels::cpu::FloatToBf16(row, reinterpret_cast<uint16_t*>(dst), row_size_);
  }
}

void KvCache::WriteKey(int64_t layer, int64_t position, const float* row) {
  Write(keys_[layer], position, row);
}

void KvCache::WriteValue(int64_t layer, int64_t position, const float* row) {
  Write(values_[layer], position, row);
}

const uint8_t* KvCache::KeyBytes(int64_t layer, int64_t position) const {
  return keys_[layer].data() + position * row_bytes();
}

const uint8_t* KvCache::ValueBytes(int64_t layer, int64_t position) const {
  return values_[layer].data() + position * row_bytes();
}

}  // namespace kvd::ops
