// Fuzzes the session file reader: any input must be refused cleanly or read
// into a checkpoint that writes back and reads again unchanged, and the string
// and stream readers must agree. Each input is tried twice: as given, and with
// its last 4 bytes replaced by the CRC32C of the rest, so mutations get past
// the file checksum and reach the chunk and manifest checks.
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "storage/checkpoint/crc32c.h"
#include "storage/checkpoint/session_file.h"

namespace {

void Check(const std::string& in) {
  using kvd::storage::ParseSessionFile;
  auto parsed = ParseSessionFile(in, "fuzz");
  std::istringstream stream(in);
  auto streamed = kvd::storage::ReadSessionStream(stream, "fuzz");
  if (parsed.ok() != streamed.ok()) std::abort();
  if (!parsed.ok()) {
    if (parsed.status().code() != streamed.status().code()) std::abort();
    return;
  }
  // What was accepted writes back and reads again to the same checkpoint.
  // (Not necessarily the same bytes: a manifest may arrive in a
  // non-canonical protobuf encoding.)
  auto again = kvd::storage::SerializeSessionFile(*parsed);
  if (!again.ok()) std::abort();
  auto reread = ParseSessionFile(*again, "fuzz");
  if (!reread.ok() || reread->chunks() != parsed->chunks() ||
      reread->manifest().SerializeAsString() !=
          parsed->manifest().SerializeAsString()) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  Check(in);
  if (size >= 4) {
    const uint32_t crc =
        kvd::storage::Crc32c(absl::string_view(in.data(), size - 4));
    for (int i = 0; i < 4; ++i) {
      in[size - 4 + i] = static_cast<char>(crc >> (8 * i));
    }
    Check(in);
  }
  return 0;
}
