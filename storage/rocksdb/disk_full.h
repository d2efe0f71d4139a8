// Marks a RESOURCE_EXHAUSTED status as "the disk is full", so servers can tell
// it from a tenant's quota (the same code): a quota refusal is the client's
// to fix (HTTP 429), a full disk is the node's (HTTP 507).
#ifndef KVD_STORAGE_ROCKSDB_DISK_FULL_H_
#define KVD_STORAGE_ROCKSDB_DISK_FULL_H_

#include "absl/status/status.h"
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

}  // namespace kvd::storage

#endif  // KVD_STORAGE_ROCKSDB_DISK_FULL_H_
