#include "storage/rocksdb/disk_full.h"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvd::storage {

absl::StatusOr<DiskSpace> StatDiskSpace(const std::string& path) {
  struct statvfs st;
  if (::statvfs(path.c_str(), &st) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot read the free space of ", path, ": ", std::strerror(errno)));
  }
  DiskSpace space;
  space.total_bytes = static_cast<int64_t>(st.f_blocks) * st.f_frsize;
  space.available_bytes = static_cast<int64_t>(st.f_bavail) * st.f_frsize;
  return space;
}

std::string ReadableBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30))
    return absl::StrFormat("%.1f GiB", b / (1 << 30));
  if (bytes >= (int64_t{1} << 20))
    return absl::StrFormat("%.1f MiB", b / (1 << 20));
  if (bytes >= (int64_t{1} << 10))
    return absl::StrFormat("%.0f KiB", b / (1 << 10));
  return absl::StrCat(bytes, " bytes");
}

}  // namespace kvd::storage
