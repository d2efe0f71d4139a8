// CRC32C (Castagnoli, polynomial 0x1EDC6F41 reflected as 0x82F63B78), the
// checksum of every stored chunk (codec.h). Uses the SSE4.2 crc32 instruction
// when the CPU has it (checked once at run time) and a table-driven portable
// loop otherwise; both give the same value for every input.
//
//   uint32_t crc = Crc32c(payload);
//   uint32_t same = Crc32cExtend(Crc32c(a), b);   // == Crc32c(a + b)
//
// Thread-safety: pure functions.
#ifndef KVD_STORAGE_CHECKPOINT_CRC32C_H_
#define KVD_STORAGE_CHECKPOINT_CRC32C_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace kvd::storage {

// CRC of `crc`'s input followed by `data` (crc = 0 starts a new checksum).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(absl::string_view data) {
  return Crc32cExtend(0, data.data(), data.size());
}

namespace internal {
// The two implementations, exposed so tests check each against the vectors.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size);
// Only call when Crc32cHardwareAvailable().
uint32_t Crc32cSse42(uint32_t crc, const void* data, size_t size);
bool Crc32cHardwareAvailable();
}  // namespace internal

}  // namespace kvd::storage

#endif  // KVD_STORAGE_CHECKPOINT_CRC32C_H_
