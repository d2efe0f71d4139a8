// Block numbers for a K/V pool whose memory is split over several places: a
// tensor-parallel backend's shards (tp_cuda_backend_model.h) each keep their
// own K/V heads of block b in their own device slab, so the engine's
// KvBlockPool (ops/model/kv_block_pool.h), which hands out one address per
// block, needs addresses that stand for block numbers rather than memory.
//
// A block-id region is a range of reserved, inaccessible host address space
// (mmap PROT_NONE, no memory behind it): the pool hands out its addresses,
// KvBlockPool::BlockIndex turns them back into block numbers, and any host
// read or write of a block faults at once instead of touching some other
// memory. The budget arithmetic, block tables and refusals are then the
// same as for a pool over real memory.
//
//   KVD_ASSIGN_OR_RETURN(KvBlockPool::Region ids,
//                        ReserveBlockIdRegion(blocks, block_bytes));
//   ids.owner = ...;  // may be replaced by an owner that also keeps the
//                     // reservation (ReservedRange) alive
//   KVD_ASSIGN_OR_RETURN(auto pool,
//                        KvBlockPool::CreateInRegion(row_bytes, opts, ids));
//
// Thread-safety: the functions are; a region is immutable.
#ifndef KVD_OPS_BACKEND_INTERNAL_BLOCK_ID_REGION_H_
#define KVD_OPS_BACKEND_INTERNAL_BLOCK_ID_REGION_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "ops/model/kv_block_pool.h"

namespace kvd::ops::internal {

// Reserved address space; released when destroyed.
class ReservedRange {
 public:
  // INVALID_ARGUMENT for 0 bytes; RESOURCE_EXHAUSTED if the address space
  // cannot be reserved.
  static absl::StatusOr<std::unique_ptr<ReservedRange>> Reserve(size_t bytes);
  ~ReservedRange();
  ReservedRange(const ReservedRange&) = delete;
  ReservedRange& operator=(const ReservedRange&) = delete;

  uint8_t* base() const { return base_; }
  size_t bytes() const { return bytes_; }

 private:
  ReservedRange(uint8_t* base, size_t bytes) : base_(base), bytes_(bytes) {}
  uint8_t* const base_;
  const size_t bytes_;
};

// A region of `blocks` blocks of `block_bytes` over reserved address space,
// not host-accessible, its owner the reservation. INVALID_ARGUMENT for
// blocks < 1 or block_bytes 0 (or a product that overflows).
absl::StatusOr<KvBlockPool::Region> ReserveBlockIdRegion(int64_t blocks,
                                                         size_t block_bytes);

}  // namespace kvd::ops::internal

#endif  // KVD_OPS_BACKEND_INTERNAL_BLOCK_ID_REGION_H_
