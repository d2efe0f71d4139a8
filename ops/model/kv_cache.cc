#include "ops/model/kv_cache.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/elementwise.h"

namespace kvd::ops {

using kernels::cpu::kAttentionChunk;
using kernels::cpu::WeightType;

namespace {

// Position 0's row address, computed as an integer: when rows were dropped it
// lies before the allocation, and only kept rows are ever read through it.
const void* RowZero(const std::vector<uint8_t>& store, int64_t begin,
                    size_t row_bytes) {
  return reinterpret_cast<const void*>(
      reinterpret_cast<uintptr_t>(store.data()) - begin * row_bytes);
}

}  // namespace

int64_t WindowStart(int64_t sliding_window, int64_t length) {
  if (sliding_window <= 0) return 0;
  const int64_t first = std::max<int64_t>(0, length - sliding_window + 1);
  return first / kAttentionChunk * kAttentionChunk;
}

KvCache::KvCache(const ModelConfig& config, Precision precision)
    : precision_(precision),
      row_size_(config.kv_dim()),
      elem_bytes_(precision == Precision::kF32 ? 4 : 2),
      layers_(config.n_layers) {}

size_t KvCache::size_bytes() const {
  size_t rows = 0;
  for (const LayerRows& l : layers_) rows += length_ - l.first_kept;
  return 2 * rows * row_bytes();
}

size_t KvCache::allocated_bytes() const {
  size_t bytes = 0;
  for (const LayerRows& l : layers_)
    bytes += l.keys.capacity() + l.values.capacity();
  return bytes;
}

WeightType KvCache::type() const {
  return precision_ == Precision::kF32 ? WeightType::kF32 : WeightType::kBf16;
}

// Moves the kept rows [first_kept, end) to the front of a `capacity`-row
// store, in place when the size does not change.
void KvCache::Resize(LayerRows& l, int64_t capacity) {
  const int64_t n = std::min(
      {l.end - l.first_kept, l.capacity - (l.first_kept - l.begin), capacity});
  const size_t rb = row_bytes();
  const size_t from = (l.first_kept - l.begin) * rb;
  if (capacity == l.capacity) {
    if (n > 0 && from > 0) {
      std::memmove(l.keys.data(), l.keys.data() + from, n * rb);
      std::memmove(l.values.data(), l.values.data() + from, n * rb);
    }
  } else {
    // A fresh allocation, so a shrink really returns memory.
    std::vector<uint8_t> keys(capacity * rb), values(capacity * rb);
    if (n > 0) {
      std::memcpy(keys.data(), l.keys.data() + from, n * rb);
      std::memcpy(values.data(), l.values.data() + from, n * rb);
    }
    l.keys.swap(keys);
    l.values.swap(values);
    l.capacity = capacity;
  }
  l.begin = l.first_kept;
}

void KvCache::DropBelow(int64_t layer, int64_t position) {
  LayerRows& l = layers_[layer];
  position =
      std::min(std::max(position, l.first_kept), std::max(l.end, length_));
  l.first_kept = position;
  l.end = std::max(l.end, position);
  if (l.first_kept >= l.begin + l.capacity) l.begin = l.first_kept;
  // Give memory back once most of the store is dropped rows; keeping a chunk
  // of headroom means the rows move about once per chunk, not every step.
  const int64_t kept = l.end - l.first_kept;
  if (l.capacity > 2 * (kept + kAttentionChunk))
    Resize(l, kept + kAttentionChunk);
}

void KvCache::DropBelow(int64_t position) {
  for (int64_t l = 0; l < n_layers(); ++l) DropBelow(l, position);
}

void KvCache::Truncate(int64_t length) {
  length_ = std::min(length_, std::max<int64_t>(0, length));
  for (LayerRows& l : layers_) {
    l.end = std::min(l.end, length_);
    if (l.first_kept > length_) l.first_kept = l.begin = l.end = length_;
  }
}

void KvCache::Reset(int64_t length) {
  length_ = std::max<int64_t>(0, length);
  for (LayerRows& l : layers_) l.begin = l.first_kept = l.end = length_;
}

void KvCache::Reserve(int64_t length) {
  for (int64_t l = 0; l < n_layers(); ++l)
    ReserveLayer(l, length, Growth::kGeometric);
}

void KvCache::ReserveLayer(int64_t layer, int64_t length, Growth growth) {
  LayerRows& l = layers_[layer];
  if (length - l.begin <= l.capacity) {
    l.end = std::max(l.end, length);
    return;
  }
  const int64_t need = length - l.first_kept;
  int64_t capacity = l.capacity;
  if (need > capacity) {
    capacity = growth == Growth::kWindow
                   ? need + kAttentionChunk
                   : std::max<int64_t>({need, 2 * capacity, 64});
  }
  Resize(l, capacity);
  l.end = std::max(l.end, length);
}

kernels::cpu::KvRows KvCache::Keys(int64_t layer) const {
  const LayerRows& l = layers_[layer];
  return {type(), RowZero(l.keys, l.begin, row_bytes()), row_size_};
}

kernels::cpu::KvRows KvCache::Values(int64_t layer) const {
  const LayerRows& l = layers_[layer];
  return {type(), RowZero(l.values, l.begin, row_bytes()), row_size_};
}

void KvCache::Write(std::vector<uint8_t>& store, int64_t index,
                    const float* row) {
  uint8_t* dst = store.data() + index * row_bytes();
  if (precision_ == Precision::kF32) {
    std::memcpy(dst, row, row_bytes());
  } else {
    kernels::cpu::FloatToBf16(row, reinterpret_cast<uint16_t*>(dst), row_size_);
  }
}

void KvCache::WriteKey(int64_t layer, int64_t position, const float* row) {
  LayerRows& l = layers_[layer];
  Write(l.keys, position - l.begin, row);
}

void KvCache::WriteValue(int64_t layer, int64_t position, const float* row) {
  LayerRows& l = layers_[layer];
  Write(l.values, position - l.begin, row);
}

const uint8_t* KvCache::KeyBytes(int64_t layer, int64_t position) const {
  const LayerRows& l = layers_[layer];
  return l.keys.data() + (position - l.begin) * row_bytes();
}

const uint8_t* KvCache::ValueBytes(int64_t layer, int64_t position) const {
  const LayerRows& l = layers_[layer];
  return l.values.data() + (position - l.begin) * row_bytes();
}

uint8_t* KvCache::MutableKeyBytes(int64_t layer, int64_t position) {
  LayerRows& l = layers_[layer];
  return l.keys.data() + (position - l.begin) * row_bytes();
}

uint8_t* KvCache::MutableValueBytes(int64_t layer, int64_t position) {
  LayerRows& l = layers_[layer];
  return l.values.data() + (position - l.begin) * row_bytes();
}

}  // namespace kvd::ops
