// The K/V cache of one sequence: per layer, one row of n_kv_heads * head_dim
// values per position, in the precision mode's dtype (fp32 or bf16), stored
// contiguously by position.
//
// Rows are appended by Model::Forward; Truncate() rolls back (e.g. to drop an
// unfinished turn). Thread-safety: a cache belongs to one sequence and is used
// by one forward pass at a time.
#ifndef KVD_OPS_MODEL_KV_CACHE_H_
#define KVD_OPS_MODEL_KV_CACHE_H_

#include <cstdint>
#include <vector>

#include "kernels/cpu/attention.h"
#include "ops/model/model_config.h"

namespace kvd::ops {

class KvCache {
 public:
  KvCache(const ModelConfig& config, Precision precision);

  int64_t length() const { return length_; }
  int64_t n_layers() const { return static_cast<int64_t>(keys_.size()); }
  int64_t row_size() const { return row_size_; }  // values per row
  Precision precision() const { return precision_; }
  // Bytes of K and V held for all layers.
  size_t size_bytes() const;

  void Truncate(int64_t length);
  // Makes room for `length` positions (existing rows are kept).
  void Reserve(int64_t length);

  kernels::cpu::KvRows Keys(int64_t layer) const;
  kernels::cpu::KvRows Values(int64_t layer) const;
  // Writes fp32 `row` (row_size values) at `position` (< capacity), converting
  // to the dtype.
  void WriteKey(int64_t layer, int64_t position, const float* row);
  void WriteValue(int64_t layer, int64_t position, const float* row);
  // Raw bytes of one stored row (for bit-level comparisons and checkpoint
  // tests).
  const uint8_t* KeyBytes(int64_t layer, int64_t position) const;
  const uint8_t* ValueBytes(int64_t layer, int64_t position) const;
  size_t row_bytes() const { return row_size_ * elem_bytes_; }

  // Called by Model::Forward once every layer holds rows up to `length`.
  void SetLength(int64_t length) { length_ = length; }

 private:
  void Write(std::vector<uint8_t>& store, int64_t position, const float* row);

  Precision precision_;
  int64_t row_size_;
  size_t elem_bytes_;
  int64_t length_ = 0;
  int64_t capacity_ = 0;
  std::vector<std::vector<uint8_t>> keys_;
  std::vector<std::vector<uint8_t>> values_;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_MODEL_KV_CACHE_H_
