#include "ops/model/kv_block_pool.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu/attention.h"

namespace kvd::ops {

namespace {

// Blocks are read with vector loads; cache-line alignment also keeps two
// blocks from sharing a line between threads.
constexpr std::align_val_t kBlockAlignment{64};

uint8_t* NewBlock(size_t bytes) {
  return static_cast<uint8_t*>(::operator new(bytes, kBlockAlignment));
}

void DeleteBlock(uint8_t* block) { ::operator delete(block, kBlockAlignment); }

}  // namespace

absl::Status KvBlockPool::CheckOptions(size_t row_bytes,
                                       const Options& options) {
  constexpr int64_t kChunk = kernels::cpu::kAttentionChunk;
  if (row_bytes == 0) {
    return absl::InvalidArgumentError("K/V block pool: row_bytes must be > 0");
  }
  if (options.block_rows <= 0 || options.block_rows % kChunk != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("K/V block pool: block_rows ", options.block_rows,
                     " must be a positive multiple of the attention chunk (",
                     kChunk, ") so no chunk straddles two blocks"));
  }
  const size_t block_bytes = 2 * options.block_rows * row_bytes;
  if (options.budget_bytes != 0 && options.budget_bytes < block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("K/V block pool: budget of ", options.budget_bytes,
                     " bytes is below one block (", block_bytes,
                     " bytes); raise it or use 0 for unlimited"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvBlockPool>> KvBlockPool::Create(
    size_t row_bytes, const Options& options) {
  if (absl::Status s = CheckOptions(row_bytes, options); !s.ok()) return s;
  Region heap;  // no region: blocks from operator new
  heap.host_accessible = true;
  return std::unique_ptr<KvBlockPool>(
      new KvBlockPool(row_bytes, options, heap));
}

absl::StatusOr<std::unique_ptr<KvBlockPool>> KvBlockPool::CreateInRegion(
    size_t row_bytes, const Options& options, const Region& region) {
  if (absl::Status s = CheckOptions(row_bytes, options); !s.ok()) return s;
  if (region.base == nullptr || region.blocks <= 0) {
    return absl::InvalidArgumentError(
        "K/V block pool: a region pool needs memory for at least one block");
  }
  return std::unique_ptr<KvBlockPool>(
      new KvBlockPool(row_bytes, options, region));
}

namespace {

int64_t Capacity(size_t budget_bytes, size_t block_bytes,
                 const KvBlockPool::Region& region) {
  const int64_t budget = static_cast<int64_t>(budget_bytes / block_bytes);
  if (region.base == nullptr) return budget;
  return budget == 0 ? region.blocks : std::min(budget, region.blocks);
}

}  // namespace

KvBlockPool::KvBlockPool(size_t row_bytes, const Options& options,
                         const Region& region)
    : row_bytes_(row_bytes),
      block_rows_(options.block_rows),
      block_bytes_(2 * options.block_rows * row_bytes),
      budget_bytes_(options.budget_bytes),
      capacity_blocks_(Capacity(options.budget_bytes, block_bytes_, region)),
      retain_free_blocks_(options.retain_free_blocks || region.base != nullptr),
      region_(region),
      host_accessible_(region.base == nullptr || region.host_accessible) {
  if (region_.base == nullptr) return;
  absl::MutexLock lock(&mu_);
  // Popped from the back: the lowest blocks go out first.
  free_.reserve(capacity_blocks_);
  for (int64_t b = capacity_blocks_ - 1; b >= 0; --b)
    free_.push_back(region_.base + b * block_bytes_);
}

KvBlockPool::~KvBlockPool() {
  if (region_.base != nullptr) return;
  absl::MutexLock lock(&mu_);
  for (uint8_t* b : free_) DeleteBlock(b);
}

int64_t KvBlockPool::BlockIndex(const uint8_t* block) const {
  // Addresses as integers: comparing pointers into different objects is
  // unspecified.
  const uintptr_t base = reinterpret_cast<uintptr_t>(region_.base);
  const uintptr_t at = reinterpret_cast<uintptr_t>(block);
  if (region_.base == nullptr || at < base) return -1;
  const size_t offset = static_cast<size_t>(at - base);
  if (offset % block_bytes_ != 0) return -1;
  const int64_t index = static_cast<int64_t>(offset / block_bytes_);
  return index < region_.blocks ? index : -1;
}

int64_t KvBlockPool::available_blocks() const {
  if (capacity_blocks_ == 0) return std::numeric_limits<int64_t>::max();
  absl::MutexLock lock(&mu_);
  return std::max<int64_t>(0, capacity_blocks_ - in_use_ - reserved_);
}

KvBlockPool::Stats KvBlockPool::stats() const {
  absl::MutexLock lock(&mu_);
  Stats s;
  s.blocks_in_use = in_use_;
  s.blocks_reserved = reserved_;
  s.peak_blocks_in_use = peak_;
  s.capacity_blocks = capacity_blocks_;
  s.free_list_blocks = static_cast<int64_t>(free_.size());
  s.block_bytes = block_bytes_;
  return s;
}

absl::Status KvBlockPool::Exhausted(int64_t n) const {
  return absl::ResourceExhaustedError(absl::StrFormat(
      "K/V block pool of %.4g MiB (%d blocks of %d rows, %d bytes) is full: "
      "%d in use, %d reserved, %d more needed; raise the pool budget or run "
      "fewer or shorter sequences at once",
      budget_bytes_ / (1024.0 * 1024.0), capacity_blocks_, block_rows_,
      block_bytes_, in_use_, reserved_, n));
}

absl::Status KvBlockPool::Reserve(int64_t n) {
  if (n <= 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (capacity_blocks_ != 0 && in_use_ + reserved_ + n > capacity_blocks_)
    return Exhausted(n);
  reserved_ += n;
  return absl::OkStatus();
}

void KvBlockPool::Unreserve(int64_t n) {
  if (n <= 0) return;
  absl::MutexLock lock(&mu_);
  reserved_ = std::max<int64_t>(0, reserved_ - n);
}

uint8_t* KvBlockPool::Take() {
  {
    absl::MutexLock lock(&mu_);
    // Taking without a reservation is a bug in the caller; an unlimited pool
    // tolerates it, a budgeted one still counts the block.
    reserved_ = std::max<int64_t>(0, reserved_ - 1);
    ++in_use_;
    peak_ = std::max(peak_, in_use_);
    if (!free_.empty()) {
      uint8_t* b = free_.back();
      free_.pop_back();
      return b;
    }
  }
  // A region pool's free list holds every block its capacity allows, so it
  // is empty here only if a caller took without reserving: a bug, and a heap
  // block must not enter device memory's bookkeeping.
  if (region_.base != nullptr) {
    std::fprintf(stderr,
                 "kvd: K/V block pool: Take() without a reservation on a "
                 "region pool with no free block\n");
    std::abort();
  }
  return NewBlock(block_bytes_);
}

absl::StatusOr<uint8_t*> KvBlockPool::Allocate() {
  if (absl::Status s = Reserve(1); !s.ok()) return s;
  return Take();
}

void KvBlockPool::Release(uint8_t* block) {
  if (block == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    --in_use_;
    if (retain_free_blocks_) {
      free_.push_back(block);
      return;
    }
  }
  DeleteBlock(block);
}

void KvBlockPool::ReleaseFreeMemory() {
  if (region_.base != nullptr) return;
  std::vector<uint8_t*> blocks;
  {
    absl::MutexLock lock(&mu_);
    blocks.swap(free_);
  }
  for (uint8_t* b : blocks) DeleteBlock(b);
}

}  // namespace kvd::ops
