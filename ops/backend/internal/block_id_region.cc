#include "ops/backend/internal/block_id_region.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace kvd::ops::internal {

absl::StatusOr<std::unique_ptr<ReservedRange>> ReservedRange::Reserve(
    size_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("ReservedRange: 0 bytes");
  }
  // PROT_NONE + MAP_NORESERVE: address space only, no memory or swap behind
  // it, and every access faults.
  void* p = mmap(nullptr, bytes, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("reserving ", bytes, " bytes of address space for K/V ",
                     "block numbers: ", std::strerror(errno)));
  }
  return std::unique_ptr<ReservedRange>(
      new ReservedRange(static_cast<uint8_t*>(p), bytes));
}

ReservedRange::~ReservedRange() { munmap(base_, bytes_); }

absl::StatusOr<KvBlockPool::Region> ReserveBlockIdRegion(int64_t blocks,
                                                         size_t block_bytes) {
  if (blocks < 1 || block_bytes == 0 ||
      static_cast<uint64_t>(blocks) >
          std::numeric_limits<size_t>::max() / block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("block-id region: need blocks >= 1 and block_bytes > 0 ",
                     "(got ", blocks, " x ", block_bytes, ")"));
  }
  absl::StatusOr<std::unique_ptr<ReservedRange>> range =
      ReservedRange::Reserve(static_cast<size_t>(blocks) * block_bytes);
  if (!range.ok()) return range.status();
  KvBlockPool::Region region;
  region.base = (*range)->base();
  region.blocks = blocks;
  region.owner = std::shared_ptr<ReservedRange>(std::move(*range));
  region.host_accessible = false;
  return region;
}

}  // namespace kvd::ops::internal
