// Who may commit a session's turns (DESIGN.md section 7): the manifest's
// owner node, its fencing epoch and its role (checkpoint.proto, format 2).
//
// Every write of a session is checked against the manifest stored before it
// (SessionDb for RocksDB, SessionCheckpoint::Apply for the DRAM tier):
//   - a turn commits only under the stored epoch and owner, onto a primary;
//   - an ownership change (Release, Adopt) only raises the epoch, or, at the
//     same epoch, makes the node the stored copy names its primary.
// Anything else is ABORTED, saying where the session lives now, and writes
// nothing. An unowned session ("" owner: a standalone node's, or any
// format-1 manifest, which reads as epoch 1) is taken at its epoch by
// whichever node commits to it.
//
//   KVD_RETURN_IF_ERROR(CheckTurnFence(stored, next));
//
// Thread-safety: free functions.
#ifndef KVD_STORAGE_CHECKPOINT_OWNERSHIP_H_
#define KVD_STORAGE_CHECKPOINT_OWNERSHIP_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "proto/kvd/v1/checkpoint.pb.h"

namespace kvd::storage {

inline constexpr uint64_t kFirstEpoch = 1;

// The manifest's epoch; 0 (format 1) reads as kFirstEpoch.
uint64_t EpochOf(const v1::SessionManifest& m);
// A replica copy: never listed as live, never serves a turn.
bool IsReplica(const v1::SessionManifest& m);
// The owner named for people: "node 'ID'", or "a standalone node" for "".
std::string OwnerName(const std::string& node);

// OK if a turn committing `next` may replace `stored`.
absl::Status CheckTurnFence(const v1::SessionManifest& stored,
                            const v1::SessionManifest& next);
// OK if an ownership change writing `next` may replace `stored`.
absl::Status CheckOwnershipChange(const v1::SessionManifest& stored,
                                  const v1::SessionManifest& next);

// OK if `next`, a later committed state of a session another node owns,
// may replace this node's replica copy `stored`: both replicas of the same
// owner at the same epoch, and `next` no shorter (turns and tokens).
absl::Status CheckReplicaUpdate(const v1::SessionManifest& stored,
                                const v1::SessionManifest& next);

// `m` as a session imported on `node`: a new primary there, one epoch past
// the exported copy (an import is a change of owner), in the current format.
v1::SessionManifest ImportedBy(const v1::SessionManifest& m,
                               const std::string& node);

}  // namespace kvd::storage

#endif  // KVD_STORAGE_CHECKPOINT_OWNERSHIP_H_
