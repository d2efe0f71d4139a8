#include "storage/probe/disk_bandwidth.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvd::storage {

namespace {

using Clock = std::chrono::steady_clock;

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnknownError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Pages of an open file resident in the page cache.
int64_t ResidentPages(int fd, int64_t bytes) {
  void* map = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return -1;
  const int64_t page = sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> vec((bytes + page - 1) / page);
  int64_t resident = -1;
  if (mincore(map, bytes, vec.data()) == 0) {
    resident = 0;
    for (unsigned char v : vec) resident += v & 1;
  }
  munmap(map, bytes);
  return resident;
}

}  // namespace

absl::StatusOr<DiskReadBandwidth> MeasureDiskReadBandwidth(
    const std::string& directory, int64_t file_bytes) {
  constexpr int64_t kBuffer = kDiskProbeBufferBytes;
  if (file_bytes < kBuffer) {
    return absl::InvalidArgumentError(
        absl::StrCat("a bandwidth file of ", file_bytes,
                     " bytes is too small to time; use at least ", kBuffer));
  }
  std::string path = directory + "/kvd-calibration-XXXXXX";
  const int fd = mkstemp(path.data());
  if (fd < 0) return Errno("cannot create a file in", directory);
  std::vector<char> buffer(kBuffer);
  for (int64_t i = 0; i < kBuffer; ++i) buffer[i] = static_cast<char>(i * 31);
  absl::Status status;
  for (int64_t done = 0; done < file_bytes && status.ok();) {
    const int64_t n = std::min(kBuffer, file_bytes - done);
    const ssize_t w = write(fd, buffer.data(), n);
    if (w <= 0) status = Errno("cannot write", path);
    done += w;
  }
  DiskReadBandwidth rate;
  rate.file_bytes = file_bytes;
  if (status.ok() && fsync(fd) != 0) status = Errno("cannot sync", path);
  if (status.ok()) {
    posix_fadvise(fd, 0, file_bytes, POSIX_FADV_DONTNEED);
    rate.cache_dropped = ResidentPages(fd, file_bytes) == 0;
    const Clock::time_point t0 = Clock::now();
    int64_t total = 0;
    while (total < file_bytes) {
      const ssize_t r = pread(fd, buffer.data(), kBuffer, total);
      if (r <= 0) {
        status = Errno("cannot read back", path);
        break;
      }
      total += r;
    }
    const double seconds =
        std::chrono::duration<double>(Clock::now() - t0).count();
    rate.bytes_per_s = total / std::max(seconds, 1e-9);
  }
  close(fd);
  unlink(path.c_str());
  if (!status.ok()) return status;
  return rate;
}

}  // namespace kvd::storage
