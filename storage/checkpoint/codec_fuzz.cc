// libFuzzer entry point: arbitrary bytes as a stored chunk value and as a
// stored manifest. Neither may crash, read out of bounds, or allocate what a
// hostile length asks for; a chunk that decodes must be self-consistent.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "storage/checkpoint/codec.h"
#include "storage/checkpoint/crc32c.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view value(reinterpret_cast<const char*>(data), size);
  auto chunk = kvd::storage::DecodeChunk(value, "fuzz");
  if (chunk.ok()) {
    const auto& h = chunk->header;
    if (static_cast<int64_t>(chunk->payload.size()) !=
            h.rows() * h.row_bytes() ||
        kvd::storage::Crc32c(chunk->payload) != h.crc32c() ||
        chunk->payload.data() + chunk->payload.size() != value.data() + size) {
      std::abort();
    }
    // Re-encoding a decoded chunk gives a value that decodes the same.
    auto again = kvd::storage::DecodeChunk(
        kvd::storage::EncodeChunk(h, chunk->payload), "fuzz re-encode");
    if (!again.ok() || again->payload != chunk->payload) std::abort();
  }
  kvd::v1::SessionManifest manifest;
  if (manifest.ParseFromArray(data, static_cast<int>(size))) {
    (void)kvd::storage::ValidateManifest(manifest);
  }
  return 0;
}
