// The K/V cache of one sequence: per layer, one row of n_kv_heads * head_dim
// values per position, in the precision mode's dtype (fp32 or bf16).
//
// Rows are addressed by absolute position. Each layer keeps the rows from its
// first_kept(layer) up to length(); DropBelow() frees older ones (KV-Direct's
// hot window: attention rebuilds them from residual checkpoints), so a
// windowed cache holds about window + one attention chunk rows however long
// the session grows. Kept rows are contiguous in memory, so a canonical
// attention chunk is always one block of rows; dropped prefixes are reclaimed
// by moving the kept rows to the front when room runs out.
//
// Sliding-window (local) layers never read keys older than their window, so
// by default Model::Forward also drops a local layer's rows below
// WindowStart(window, length) before each step, plain cache or not: Gemma 3's
// local layers then hold about window + one chunk rows. KeepRowsPastWindows()
// turns that off for tests that compare rows at every position.
//
// Rows are appended by Model::Forward; Truncate() rolls back (e.g. to drop an
// unfinished turn). Thread-safety: a cache belongs to one sequence and is used
// by one forward pass at a time.
//
//   KvCache cache = model->NewCache();   // Forward appends rows
//   cache.DropBelow(cache.length() - 64);
//   const uint8_t* k = cache.KeyBytes(layer, cache.length() - 1);
#ifndef KVD_OPS_MODEL_KV_CACHE_H_
#define KVD_OPS_MODEL_KV_CACHE_H_

#include <cstdint>
#include <vector>

#include "kernels/cpu/attention.h"
#include "ops/model/model_config.h"

namespace kvd::ops {

// First position whose K/V a query at position `length` or later can read on
// a layer with `sliding_window` (0: global, every position), rounded down to
// an attention chunk: canonical attention scores whole chunks, so the rows of
// the chunk holding the window's first key must stay addressable.
int64_t WindowStart(int64_t sliding_window, int64_t length);

class KvCache {
 public:
  KvCache(const ModelConfig& config, Precision precision);

  int64_t length() const { return length_; }
  int64_t n_layers() const { return static_cast<int64_t>(layers_.size()); }
  int64_t row_size() const { return row_size_; }  // values per row
  Precision precision() const { return precision_; }
  // Bytes of the K and V rows held (kept positions of every layer).
  size_t size_bytes() const;
  // Bytes of K and V storage allocated for all layers (>= size_bytes()).
  size_t allocated_bytes() const;

  // First position whose rows `layer` still holds (0 unless rows were
  // dropped; may equal length() when the layer holds none).
  int64_t first_kept(int64_t layer) const { return layers_[layer].first_kept; }
  // Frees the rows of `layer` (or of every layer) below `position`, clamped
  // to [first_kept, length()]. Dropped rows cannot come back: reading them
  // again takes a rebuild (ops/kvdirect/rebuild.h).
  void DropBelow(int64_t layer, int64_t position);
  void DropBelow(int64_t position);

  // Whether Model::Forward drops local layers' rows below their window
  // (default true). Off keeps every row a KvSource does not drop: for tests
  // and experiments that read old rows back.
  bool trims_past_windows() const { return trims_past_windows_; }
  void KeepRowsPastWindows() { trims_past_windows_ = false; }

  void Truncate(int64_t length);
  // Empties the cache and sets its length to `length` with every position
  // below it dropped: where a rebuild starts writing its hot window.
  void Reset(int64_t length);
  // How a layer's storage grows when positions up to `length` do not fit.
  enum class Growth {
    kGeometric,  // doubles: a cache that keeps every row
    kWindow,     // exactly the kept rows + one attention chunk: rows below
                 // keep being dropped, so the kept range stays bounded
  };
  // Makes room for positions up to `length` at every layer (kGeometric) or at
  // one layer; existing kept rows are kept.
  void Reserve(int64_t length);
  void ReserveLayer(int64_t layer, int64_t length, Growth growth);

  // Rows of `layer` indexed by absolute position (row p is position p), the
  // layout AttendCausalBlock reads; only rows in [first_kept(layer), length())
  // may be read. With dropped rows, `data` points before the allocation and is
  // valid only offset into the kept range.
  kernels::cpu::KvRows Keys(int64_t layer) const;
  kernels::cpu::KvRows Values(int64_t layer) const;
  // Writes fp32 `row` (row_size values) at `position` (>= first_kept, room
  // reserved), converting to the dtype.
  void WriteKey(int64_t layer, int64_t position, const float* row);
  void WriteValue(int64_t layer, int64_t position, const float* row);
  // Raw bytes of one stored row (position in [first_kept(layer), reserved
  // end)); rows of consecutive positions are consecutive in memory.
  const uint8_t* KeyBytes(int64_t layer, int64_t position) const;
  const uint8_t* ValueBytes(int64_t layer, int64_t position) const;
  // The same rows, writable: where a rebuild recomputes rows in place.
  uint8_t* MutableKeyBytes(int64_t layer, int64_t position);
  uint8_t* MutableValueBytes(int64_t layer, int64_t position);
  size_t row_bytes() const { return row_size_ * elem_bytes_; }

  // Called by Model::Forward once every layer holds rows up to `length`.
  void SetLength(int64_t length) { length_ = length; }

 private:
  struct LayerRows {
    std::vector<uint8_t> keys, values;  // `capacity` rows each
    int64_t begin = 0;                  // position of storage row 0
    int64_t first_kept = 0;             // >= begin
    int64_t end = 0;                    // one past the last position reserved
    int64_t capacity = 0;               // rows allocated
  };
  void Resize(LayerRows& rows, int64_t capacity);
  void Write(std::vector<uint8_t>& store, int64_t index, const float* row);
  kernels::cpu::WeightType type() const;

  Precision precision_;
  int64_t row_size_;
  size_t elem_bytes_;
  int64_t length_ = 0;
  bool trims_past_windows_ = true;
  std::vector<LayerRows> layers_;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_MODEL_KV_CACHE_H_
