// The K/V cache of one sequence: per layer, one row of n_kv_heads * head_dim
// values per position, in the precision mode's dtype (fp32 or bf16).
//
// Storage is paged: each layer has a block table indexed by position /
// block_rows, whose blocks (fixed size, K rows then V rows) come from a
// KvBlockPool (ops/model/kv_block_pool.h). A cache made without a pool gets
// a private unlimited one; caches made with Model::NewCache(pool) share that
// pool and its byte budget. Blocks are a multiple of the canonical attention
// chunk, so every chunk attention reads is one run of rows at a fixed stride
// inside one block, exactly the layout a contiguous cache had: paging cannot
// change a bit of any result.
//
// Rows are addressed by absolute position. Each layer keeps the rows from its
// first_kept(layer) up to length(); DropBelow() releases the blocks wholly
// below (KV-Direct's hot window: attention rebuilds them from residual
// checkpoints), so a windowed cache holds about window + a block or two of
// rows however long the session grows, with no copying.
//
// Sliding-window (local) layers never read keys older than their window, so
// by default Model::Forward also drops a local layer's rows below
// WindowStart(window, length) before each step, plain cache or not: Gemma 3's
// local layers then hold about window + one chunk rows. KeepRowsPastWindows()
// turns that off for tests that compare rows at every position.
//
// Rows are appended by Model::Forward; Truncate() rolls back (e.g. to drop an
// unfinished turn) and releases the blocks past the new end. Thread-safety: a
// cache belongs to one sequence and is used by one forward pass at a time;
// its pool is thread-safe, so caches of one pool may run in parallel.
//
//   KvCache cache = model->NewCache();   // Forward appends rows
//   cache.DropBelow(cache.length() - 64);
//   const uint8_t* k = cache.KeyBytes(layer, cache.length() - 1);
#ifndef KVD_OPS_MODEL_KV_CACHE_H_
#define KVD_OPS_MODEL_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cpu/attention.h"
#include "ops/model/kv_block_pool.h"
#include "ops/model/model_config.h"

namespace kvd::ops {

// First position whose K/V a query at position `length` or later can read on
// a layer with `sliding_window` (0: global, every position), rounded down to
// an attention chunk: canonical attention scores whole chunks, so the rows of
// the chunk holding the window's first key must stay addressable.
int64_t WindowStart(int64_t sliding_window, int64_t length);

// One bookkeeping call made on a cache (rows are not in it: only a backend
// writes rows). What a KvCacheMirror is told.
struct KvCacheOp {
  enum Kind : int32_t {
    kTruncate = 1,       // Truncate(value)
    kReset = 2,          // Reset(value)
    kDropBelow = 3,      // DropBelow(layer, value); layer -1: every layer
    kReserve = 4,        // Reserve / ReserveLayer(layer, value), succeeded
    kSetLength = 5,      // SetLength(value)
    kKeepPastWindow = 6  // KeepRowsPastWindows()
  };
  Kind kind;
  int64_t layer = -1;
  int64_t value = 0;
};

// Told of every bookkeeping call made on a cache, so that a backend whose
// caches have twins in other processes (the shard workers of a CPU
// tensor-parallel leader, services/worker/shard_group.h) can make the same
// calls on each twin, in the same order, and the twins hold the same
// positions. Attached by that backend's NewCache; moves with the cache and is
// destroyed with it (which is when a twin is dropped). A copy has none.
class KvCacheMirror {
 public:
  virtual ~KvCacheMirror() = default;
  virtual void Record(const KvCacheOp& op) = 0;
};

class KvCache {
 public:
  // Bytes of one K (or V) row for this model and precision.
  static size_t RowBytes(const ModelConfig& config, Precision precision);

  // A cache with its own unlimited pool of default-size blocks.
  KvCache(const ModelConfig& config, Precision precision);
  // A cache drawing blocks from `pool` (not owned; must outlive the cache).
  // INVALID_ARGUMENT if the pool's rows are not this model's K/V rows.
  static absl::StatusOr<KvCache> InPool(const ModelConfig& config,
                                        Precision precision, KvBlockPool* pool);
  // A deep copy in a private unlimited pool (a snapshot for tests and
  // experiments: it never competes for the original's budget). Host pools
  // only: copying a cache whose blocks are device memory aborts.
  KvCache(const KvCache& other);
  KvCache& operator=(const KvCache& other);
  KvCache(KvCache&& other) noexcept;
  KvCache& operator=(KvCache&& other) noexcept;
  ~KvCache();

  int64_t length() const { return length_; }
  int64_t n_layers() const { return static_cast<int64_t>(layers_.size()); }
  int64_t row_size() const { return row_size_; }  // values per row
  Precision precision() const { return precision_; }
  KvBlockPool* pool() const { return pool_; }
  int64_t block_rows() const { return block_rows_; }
  // Bytes of the K and V rows held (kept positions of every layer).
  size_t size_bytes() const;
  // Bytes of the blocks held: blocks x pool()->block_bytes() (>=
  // size_bytes()).
  size_t allocated_bytes() const;
  int64_t blocks_held() const;

  // First position whose rows `layer` still holds (0 unless rows were
  // dropped; may equal length() when the layer holds none).
  int64_t first_kept(int64_t layer) const { return layers_[layer].first_kept; }
  // Forgets the rows of `layer` (or of every layer) below `position`, clamped
  // to [first_kept, length()], and releases the blocks wholly below it.
  // Dropped rows cannot come back: reading them again takes a rebuild
  // (ops/kvdirect/rebuild.h).
  void DropBelow(int64_t layer, int64_t position);
  void DropBelow(int64_t position);

  // Whether Model::Forward drops local layers' rows below their window
  // (default true). Off keeps every row a KvSource does not drop: for tests
  // and experiments that read old rows back.
  bool trims_past_windows() const { return trims_past_windows_; }
  void KeepRowsPastWindows() {
    trims_past_windows_ = false;
    Tell(KvCacheOp::kKeepPastWindow, -1, 0);
  }

  // Rolls back to `length` tokens, releasing the blocks past it.
  void Truncate(int64_t length);
  // Empties the cache (every block released) and sets its length to `length`
  // with every position below it dropped: where a rebuild starts writing its
  // hot window.
  void Reset(int64_t length);
  // Makes room for positions up to `length` at every layer (all or nothing)
  // or at one layer; existing kept rows stay. RESOURCE_EXHAUSTED when the
  // pool's budget cannot cover it, with the cache unchanged.
  absl::Status Reserve(int64_t length);
  absl::Status ReserveLayer(int64_t layer, int64_t length);

  // Model::Forward's two-phase step preparation, so a step that cannot get
  // its blocks fails before any cache changes: BlocksToPrepare counts the
  // blocks Prepare will take from the pool to drop each layer l's rows below
  // keep[l] and then hold positions up to `length` (blocks it releases are
  // reused first); the caller reserves that many from pool() and then calls
  // Prepare, which cannot fail.
  int64_t BlocksToPrepare(absl::Span<const int64_t> keep, int64_t length) const;
  void Prepare(absl::Span<const int64_t> keep, int64_t length);

  // Host access to the rows (Keys through MutableValueBytes) needs a pool
  // whose blocks the host can touch (KvBlockPool::host_accessible); on any
  // other pool they abort, naming the call: a backend bug, not bad input.
  //
  // Rows of `layer` indexed by absolute position (row p is position p) through
  // the block table, the layout AttendCausalBlock reads; only rows in
  // [first_kept(layer), length()) may be read. Valid until the next call that
  // adds or releases blocks.
  kernels::cpu::KvRows Keys(int64_t layer) const;
  kernels::cpu::KvRows Values(int64_t layer) const;
  // Writes fp32 `row` (row_size values) at `position` (>= first_kept, room
  // reserved), converting to the dtype.
  void WriteKey(int64_t layer, int64_t position, const float* row);
  void WriteValue(int64_t layer, int64_t position, const float* row);
  // Copies `n` rows already in the cache's dtype (row_bytes() each) to
  // positions [position, position + n) of `layer` (room reserved), across
  // block boundaries: where a rebuild stores recomputed rows.
  void WriteRows(int64_t layer, int64_t position, int64_t n,
                 const uint8_t* keys, const uint8_t* values);
  // Raw bytes of one stored row (position in [first_kept(layer), reserved
  // end)). Rows of consecutive positions are consecutive in memory only
  // within a block, hence within one attention chunk.
  const uint8_t* KeyBytes(int64_t layer, int64_t position) const;
  const uint8_t* ValueBytes(int64_t layer, int64_t position) const;
  // The same row, writable.
  uint8_t* MutableKeyBytes(int64_t layer, int64_t position);
  uint8_t* MutableValueBytes(int64_t layer, int64_t position);
  size_t row_bytes() const { return row_size_ * elem_bytes_; }

  // The block table of `layer`: entry i holds positions [i * block_rows,
  // (i + 1) * block_rows), null below first_kept(layer) / block_rows. What a
  // backend whose blocks the host cannot touch (a region pool in device
  // memory) turns into its kernels' block numbers (KvBlockPool::BlockIndex).
  // Valid until the next call that adds or releases blocks.
  absl::Span<uint8_t* const> BlockTable(int64_t layer) const {
    return layers_[layer].blocks;
  }
  // One past the last position whose block `layer` holds.
  int64_t covered_end(int64_t layer) const {
    return static_cast<int64_t>(layers_[layer].blocks.size()) * block_rows_;
  }

  // Called by Model::Forward once every layer holds rows up to `length`.
  void SetLength(int64_t length) {
    length_ = length;
    Tell(KvCacheOp::kSetLength, -1, length);
  }

  // The mirror told of this cache's bookkeeping calls (null: none).
  void AttachMirror(std::unique_ptr<KvCacheMirror> mirror) {
    mirror_ = std::move(mirror);
  }
  KvCacheMirror* mirror() const { return mirror_.get(); }

 private:
  KvCache(const ModelConfig& config, Precision precision, KvBlockPool* pool,
          std::shared_ptr<KvBlockPool> own_pool);
  struct LayerBlocks {
    // blocks[i] holds positions [i * block_rows, (i + 1) * block_rows): non
    // null exactly for first_kept / block_rows <= i < blocks.size().
    std::vector<uint8_t*> blocks;
    int64_t first_kept = 0;
  };
  // Where `position` would be clamped to by DropBelow.
  int64_t ClampDrop(const LayerBlocks& l, int64_t position) const;
  // Blocks DropBelow(l, position) would release / blocks growing to
  // `length` would add after it.
  int64_t BlocksBelow(const LayerBlocks& l, int64_t position) const;
  int64_t BlocksToGrow(const LayerBlocks& l, int64_t first_kept,
                       int64_t length) const;
  // Drops, handing released blocks to `spare` (or the pool when null).
  void Drop(LayerBlocks& l, int64_t position, std::vector<uint8_t*>* spare);
  // Adds the blocks up to `length`, from `spare` first, then the pool's
  // reservation.
  void Grow(LayerBlocks& l, int64_t length, std::vector<uint8_t*>* spare);
  void ReleaseAll();
  uint8_t* Row(const LayerBlocks& l, int64_t position, bool value) const;
  // Aborts unless the host may touch the pool's blocks.
  void CheckHostAccess(const char* what) const;
  void Write(uint8_t* dst, const float* row);
  kernels::cpu::WeightType type() const;
  void Tell(KvCacheOp::Kind kind, int64_t layer, int64_t value) {
    if (mirror_ != nullptr) mirror_->Record({kind, layer, value});
  }

  Precision precision_;
  int64_t row_size_;
  size_t elem_bytes_;
  // A private pool (shared_ptr so a moved cache keeps it alive) or null.
  std::shared_ptr<KvBlockPool> own_pool_;
  KvBlockPool* pool_;
  int64_t block_rows_;
  int64_t length_ = 0;
  bool trims_past_windows_ = true;
  std::vector<LayerBlocks> layers_;
  std::unique_ptr<KvCacheMirror> mirror_;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_MODEL_KV_CACHE_H_
