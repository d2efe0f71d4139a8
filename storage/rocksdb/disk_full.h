// A full disk, as the session database sees it.
//
// MarkDiskFull marks a RESOURCE_EXHAUSTED status as "the disk is full", so
// servers can tell it from a tenant's quota (the same code): a quota refusal
// is the client's to fix (HTTP 429), a full disk is the node's (HTTP 507).
//
// DiskSpace / StatDiskSpace read a file system's size and free space
// (statvfs): SessionDb keeps a reserve free with them (session_db.h).
#ifndef KVD_STORAGE_ROCKSDB_DISK_FULL_H_
#define KVD_STORAGE_ROCKSDB_DISK_FULL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"

namespace kvd::storage {

inline constexpr char kDiskFullPayload[] = "kvd.dev/storage_disk_full";

inline absl::Status MarkDiskFull(absl::Status status) {
  status.SetPayload(kDiskFullPayload, absl::Cord("1"));
  return status;
}

inline bool IsDiskFull(const absl::Status& status) {
  return status.GetPayload(kDiskFullPayload).has_value();
}

struct DiskSpace {
  int64_t total_bytes = 0;
  int64_t available_bytes = 0;  // to an unprivileged writer
};

// The file system holding `path`; UNAVAILABLE if statvfs fails.
absl::StatusOr<DiskSpace> StatDiskSpace(const std::string& path);

// "3.2 MiB", "512 KiB", "1.5 GiB": sizes in advice people read.
std::string ReadableBytes(int64_t bytes);

}  // namespace kvd::storage

#endif  // KVD_STORAGE_ROCKSDB_DISK_FULL_H_
