// A pool of fixed-size K/V blocks with a byte budget: the memory every paged
// KvCache (ops/model/kv_cache.h) that shares it draws its rows from.
//
// A block holds `block_rows` consecutive positions of one layer: first their
// K rows, then their V rows (row_bytes each), so one block table per layer
// serves both. All blocks have the same size, so the pool cannot fragment and
// a cache holds at most one partly used block at each end of its kept range
// per layer instead of a geometrically grown buffer.
//
// block_rows must be a multiple of kernels::cpu::kAttentionChunk: canonical
// attention (kernels/cpu/attention.h) reads K/V a chunk at a time, and a chunk
// that never straddles two blocks is one run of rows at a fixed stride, the
// very layout a contiguous cache gave it, so paging cannot change a bit.
//
// The budget is a hard limit on blocks handed out (in use + reserved). Asking
// beyond it gives RESOURCE_EXHAUSTED naming the budget, never an OOM. Callers
// that must not half-succeed (Model::Forward: nothing is written to any cache
// on error) Reserve() the blocks they will need first and then Take() them,
// which cannot fail.
//
// Released blocks go to a free list that later allocations reuse; a pool made
// with retain_free_blocks = false (a cache's private pool) returns them to the
// allocator instead, so a windowed cache's memory really shrinks.
//
// A pool can also carve its blocks from a region the caller owns
// (CreateInRegion): device memory for a GPU backend, whose kernels read the
// blocks by index. Such a pool never reads, writes, allocates or frees block
// memory; it only hands out addresses, so the caches' bookkeeping and the
// budget arithmetic are the same on every backend.
//
// Thread-safety: every method may be called from any thread at once. The
// pool must outlive the caches that draw from it.
//
//   KVD_ASSIGN_OR_RETURN(auto pool, KvBlockPool::Create(
//       model->NewCache().row_bytes(), {.budget_bytes = 512 << 20}));
//   KVD_ASSIGN_OR_RETURN(KvCache cache, model->NewCache(pool.get()));
//   // Forward returns RESOURCE_EXHAUSTED once the budget is spent.
#ifndef KVD_OPS_MODEL_KV_BLOCK_POOL_H_
#define KVD_OPS_MODEL_KV_BLOCK_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kvd::ops {

class KvBlockPool {
 public:
  // Rows per block unless told otherwise: one attention chunk. The smallest
  // legal size wastes the least (at most a chunk per layer at each end of a
  // cache's kept range, which the windowed caches' memory bounds rely on);
  // larger blocks would save only a table lookup per chunk, which
  // ops/model/README.md measures as noise.
  static constexpr int64_t kDefaultBlockRows = 32;

  struct Options {
    // Positions per block; a positive multiple of kAttentionChunk.
    int64_t block_rows = kDefaultBlockRows;
    // Most bytes of blocks handed out at once (block_bytes() each); 0 means
    // unlimited. A budget smaller than one block is refused.
    size_t budget_bytes = 0;
    // Keep released blocks for reuse (true) or free them (false).
    bool retain_free_blocks = true;
  };

  struct Stats {
    int64_t blocks_in_use = 0;    // held by caches
    int64_t blocks_reserved = 0;  // promised by Reserve, not yet taken
    int64_t peak_blocks_in_use = 0;
    int64_t capacity_blocks = 0;   // budget / block_bytes; 0: unlimited
    int64_t free_list_blocks = 0;  // allocated but idle (reused first)
    size_t block_bytes = 0;
  };

  // INVALID_ARGUMENT for row_bytes 0, a block size that is not a positive
  // multiple of the attention chunk, or a budget below one block.
  static absl::StatusOr<std::unique_ptr<KvBlockPool>> Create(
      size_t row_bytes, const Options& options);

  // Memory for `blocks` consecutive blocks of block_bytes() at `base`, owned
  // by the caller: it must outlive the pool, unless `owner` holds it (the
  // pool keeps `owner` until it is destroyed; e.g. a shared_ptr whose
  // deleter calls cudaFree).
  struct Region {
    uint8_t* base = nullptr;
    int64_t blocks = 0;
    std::shared_ptr<void> owner;
    // Whether the host may read and write the blocks (false for device
    // memory: KvCache then refuses its host-side row accessors).
    bool host_accessible = false;
  };
  // A pool over `region`: capacity min(budget / block_bytes, region.blocks)
  // (the budget 0 means the whole region); blocks are handed out lowest
  // address first and always retained. Create's errors, and INVALID_ARGUMENT
  // for an empty region.
  static absl::StatusOr<std::unique_ptr<KvBlockPool>> CreateInRegion(
      size_t row_bytes, const Options& options, const Region& region);

  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;
  // Every block must have been released (the caches destroyed) by now.
  ~KvBlockPool();

  size_t row_bytes() const { return row_bytes_; }
  int64_t block_rows() const { return block_rows_; }
  // K and V rows of one block: 2 * block_rows * row_bytes.
  size_t block_bytes() const { return block_bytes_; }
  size_t budget_bytes() const { return budget_bytes_; }
  // 0 when unlimited.
  int64_t capacity_blocks() const { return capacity_blocks_; }
  // False for a region pool over memory the host cannot touch.
  bool host_accessible() const { return host_accessible_; }
  // The region's base (block 0) for a region pool; null otherwise.
  const uint8_t* region_base() const { return region_.base; }
  // A region pool's block number of `block` (from Take): its offset from the
  // region's base in blocks. -1 for a block not in the region, and for a
  // pool without one.
  int64_t BlockIndex(const uint8_t* block) const;
  // Blocks that could still be reserved; INT64_MAX when unlimited.
  int64_t available_blocks() const;
  Stats stats() const;

  // Promises `n` blocks to the caller, all or none: RESOURCE_EXHAUSTED (naming
  // the budget) if in-use + reserved + n would exceed the capacity.
  absl::Status Reserve(int64_t n);
  // Gives back promised blocks that will not be taken.
  void Unreserve(int64_t n);
  // One block of block_bytes(), from a reservation the caller holds (a bug
  // otherwise). Its contents are unspecified.
  uint8_t* Take();
  // Reserve(1) + Take().
  absl::StatusOr<uint8_t*> Allocate();
  // Returns a block from Take()/Allocate().
  void Release(uint8_t* block);
  // Frees the free list's memory (blocks in use stay); nothing for a region
  // pool.
  void ReleaseFreeMemory();

 private:
  KvBlockPool(size_t row_bytes, const Options& options, const Region& region);
  static absl::Status CheckOptions(size_t row_bytes, const Options& options);
  absl::Status Exhausted(int64_t n) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t row_bytes_;
  const int64_t block_rows_;
  const size_t block_bytes_;
  const size_t budget_bytes_;
  const int64_t capacity_blocks_;
  const bool retain_free_blocks_;
  const Region region_;  // base null: blocks come from operator new
  const bool host_accessible_;

  mutable absl::Mutex mu_;
  int64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint8_t*> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvd::ops

#endif  // KVD_OPS_MODEL_KV_BLOCK_POOL_H_
