// A raw disk-read bandwidth probe: writes a scratch file in a directory, drops
// it from the page cache and times reading it back, so callers (the rebuild
// planner's calibration, services/planner/calibration.h) can put a measured
// figure on a storage tier instead of a guess. Storage owns the disks, so the
// file I/O lives here; what to do with the figure is the caller's business.
//
//   KVD_ASSIGN_OR_RETURN(storage::DiskReadBandwidth b,
//                        storage::MeasureDiskReadBandwidth("/var/lib/kvd",
//                                                          256 << 20));
//   if (!b.cache_dropped) ...  // b.bytes_per_s is an upper bound
//
// Thread-safety: a free function; concurrent probes of one directory use
// separate files (mkstemp) but disturb each other's timing.
#ifndef KVD_STORAGE_PROBE_DISK_BANDWIDTH_H_
#define KVD_STORAGE_PROBE_DISK_BANDWIDTH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvd::storage {

// Reads and writes go through buffers of this size; a file must hold at least
// one.
inline constexpr int64_t kDiskProbeBufferBytes = 8 << 20;

struct DiskReadBandwidth {
  int64_t file_bytes = 0;
  double bytes_per_s = 0;
  // Whether the file was out of the page cache when read back
  // (posix_fadvise(DONTNEED), checked with mincore). False: the figure is
  // (partly) a page-cache read, an upper bound for the device.
  bool cache_dropped = false;
};

// Writes a file of `file_bytes` in `directory`, syncs it, asks the kernel to
// drop it from the page cache, reads it back sequentially timing the read,
// and deletes it. INVALID_ARGUMENT if `file_bytes` < kDiskProbeBufferBytes;
// UNKNOWN with the OS error (naming the directory or file) if the directory
// is not writable or the I/O fails. Messages carry no prefix: callers add
// their own context.
absl::StatusOr<DiskReadBandwidth> MeasureDiskReadBandwidth(
    const std::string& directory, int64_t file_bytes);

}  // namespace kvd::storage

#endif  // KVD_STORAGE_PROBE_DISK_BANDWIDTH_H_
