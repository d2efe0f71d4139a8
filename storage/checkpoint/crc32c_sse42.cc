// The SSE4.2 path of crc32c.h. This file alone is compiled with -msse4.2 so
// the compiler cannot emit SSE4.2 instructions anywhere else; it is only
// called after Crc32cHardwareAvailable() said yes.
#include <cstring>

#include "storage/checkpoint/crc32c.h"

#if defined(__x86_64__) && defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace kvd::storage::internal {

uint32_t Crc32cSse42(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__) && defined(__SSE4_2__)
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  while (size > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --size;
  }
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
  return ~static_cast<uint32_t>(c);
#else
  return Crc32cPortable(crc, data, size);
#endif
}

}  // namespace kvd::storage::internal
