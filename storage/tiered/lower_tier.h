// The tier below host DRAM, as the DRAM tier sees it: somewhere to spill a
// whole session and to load one back. TieredStore adapts SessionDb
// (storage/rocksdb) to it; tests use an in-memory double.
//
//   class MyTier : public LowerTier { ... };
//   DramTier dram(options, &my_tier);
//
// Thread-safety: implementations must allow concurrent calls for different
// sessions; DramTier never issues two writes for one session at once.
#ifndef KVD_STORAGE_TIERED_LOWER_TIER_H_
#define KVD_STORAGE_TIERED_LOWER_TIER_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/checkpoint/session_checkpoint.h"

namespace kvd::storage {

class LowerTier {
 public:
  virtual ~LowerTier() = default;
  // Replaces the stored session with `checkpoint` atomically.
  virtual absl::Status Store(const SessionCheckpoint& checkpoint) = 0;
  // NOT_FOUND if the session is not stored. `observer` (may be null) sees
  // the load stream by stream (LoadObserver, session_checkpoint.h).
  virtual absl::StatusOr<SessionCheckpoint> Load(absl::string_view tenant,
                                                 absl::string_view session,
                                                 LoadObserver* observer) = 0;
};

}  // namespace kvd::storage

#endif  // KVD_STORAGE_TIERED_LOWER_TIER_H_
