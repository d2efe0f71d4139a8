// One session's checkpoint as bytes in memory, and the update one committed
// turn makes to it. This is the unit every tier holds (the DRAM tier keeps
// SessionCheckpoints; the RocksDB tier writes a TurnUpdate as one atomic
// batch and loads a SessionCheckpoint back), and what export/import write.
//
// Storage knows nothing about models: the engine (services/engine) turns a
// session's token ids and residual rows into chunk values with codec.h, and
// back.
//
//   SessionCheckpoint cp;                      // empty
//   KVD_RETURN_IF_ERROR(cp.Apply(turn));       // turn: a TurnUpdate
//   for (const auto& [id, value] : cp.chunks()) ...
//
// Thread-safety: a value type; no internal locking.
#ifndef KVD_STORAGE_CHECKPOINT_SESSION_CHECKPOINT_H_
#define KVD_STORAGE_CHECKPOINT_SESSION_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "proto/kvd/v1/checkpoint.pb.h"
#include "storage/checkpoint/codec.h"

namespace kvd::storage {

// What one committed turn changes: the new manifest, every chunk whose bytes
// are new or changed (a partly filled last chunk is rewritten whole as it
// grows), and chunks that are no longer kept (trimmed below a sliding
// window). Values are encoded chunks (EncodeChunk).
struct TurnUpdate {
  v1::SessionManifest manifest;
  std::vector<std::pair<ChunkId, std::string>> put;
  std::vector<ChunkId> erase;
  // A change of owner or role (SessionEngine::Release / Adopt) rather than a
  // turn: checked with CheckOwnershipChange instead of CheckTurnFence
  // (ownership.h).
  bool ownership_change = false;
  // A turn another node committed, applied to this node's replica copy:
  // checked with CheckReplicaUpdate (ownership.h). Not part of the turn
  // stream: the receiver sets it.
  bool replica_update = false;
};

// The fence a write of `update` over the stored `stored` manifest must pass
// (ownership.h): ABORTED, writing nothing, when it fails.
absl::Status CheckFence(const v1::SessionManifest& stored,
                        const TurnUpdate& update);

// ValidateManifest for a manifest a caller hands in (a turn to apply or
// commit): the same checks, but INVALID_ARGUMENT instead of DATA_LOSS, since
// the bytes are not stored ones.
absl::Status ValidateManifestForWrite(const v1::SessionManifest& manifest);

class SessionCheckpoint {
 public:
  SessionCheckpoint() = default;

  const v1::SessionManifest& manifest() const { return manifest_; }
  // Encoded chunk values by id, ordered by (layer, index): token chunks
  // first, then each layer's chunks by position.
  const std::map<ChunkId, std::string>& chunks() const { return chunks_; }

  // Applies a turn: replaces the manifest, writes `put`, removes `erase`.
  // INVALID_ARGUMENT if the update's manifest fails ValidateManifest or names
  // another tenant/session than a non-empty checkpoint's; ABORTED if it does
  // not pass the checkpoint's fence (CheckFence); nothing changes then.
  absl::Status Apply(const TurnUpdate& update);
  // Replaces everything (a load from a lower tier or an import).
  void Reset(v1::SessionManifest manifest,
             std::map<ChunkId, std::string> chunks);
  // Replaces the manifest and keeps the chunks (an import renamed or
  // re-owned), without copying them.
  void ReplaceManifest(v1::SessionManifest manifest) {
    manifest_ = std::move(manifest);
  }

  bool empty() const { return manifest_.session_id().empty(); }
  // Bytes held: chunk values plus the manifest's serialized size.
  int64_t bytes() const;

 private:
  v1::SessionManifest manifest_;
  std::map<ChunkId, std::string> chunks_;
  int64_t chunk_bytes_ = 0;
};

// Watches a checkpoint while a lower tier reads it, one stream at a time (the
// token ids, then each stored layer in ascending order), so a reader that
// consumes layers in order can start on the first before the last is read:
// a streamed resume (services/engine, StreamedLoad).
//
// Protocol, for one load: OnManifest once, when the manifest is read; then
// OnStream per stream the manifest needs chunks of, once every chunk of it
// has been read and checked as the load checks it; then OnEnd once, with the
// load's result. A load that fails before its manifest is read calls nothing.
// The chunks handed to OnStream stay valid and unchanged until OnEnd returns,
// and the loader lets go of them only then: an observer whose reader is
// still using them blocks in OnEnd until it is done.
//
// Thread-safety: called on the loading thread.
class LoadObserver {
 public:
  virtual ~LoadObserver() = default;
  virtual void OnManifest(const v1::SessionManifest& manifest) = 0;
  // `layer` is kTokenLayer or one of the manifest's layers; `chunks` holds
  // exactly the stream's chunks that the manifest needs.
  virtual void OnStream(int64_t layer,
                        const std::map<ChunkId, std::string>& chunks) = 0;
  virtual void OnEnd(const absl::Status& status) = 0;
};

// Hands a checkpoint already in memory to `observer` as a load would:
// manifest, each stream, then OnEnd(OK). For lower tiers that hold whole
// checkpoints.
void ReplayLoad(const SessionCheckpoint& checkpoint, LoadObserver* observer);

// `checkpoint`'s token ids alone, as a session whose residual rows are all
// pending: the manifest keeps its policy and layers but has length 0 (so no
// residual chunk is needed), first positions 0, and stored_bytes of the
// token chunks. What salvage writes when a session's residuals are damaged
// or gone: resumed, its next turn runs every token through the model again
// and stores the residuals anew. DATA_LOSS if a token chunk is damaged.
absl::StatusOr<SessionCheckpoint> TokensOnly(
    const SessionCheckpoint& checkpoint);

}  // namespace kvd::storage

#endif  // KVD_STORAGE_CHECKPOINT_SESSION_CHECKPOINT_H_
