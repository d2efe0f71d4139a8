#include "storage/checkpoint/session_checkpoint.h"

#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/checkpoint/codec.h"
#include "storage/checkpoint/ownership.h"

namespace kvd::storage {

absl::Status ValidateManifestForWrite(const v1::SessionManifest& manifest) {
  absl::Status s = ValidateManifest(manifest);
  // ValidateManifest speaks about stored data (DATA_LOSS); a manifest handed
  // in by a caller is a bad argument instead.
  if (s.code() == absl::StatusCode::kDataLoss) {
    return absl::InvalidArgumentError(s.message());
  }
  return s;
}

absl::Status SessionCheckpoint::Apply(const TurnUpdate& update) {
  const v1::SessionManifest& m = update.manifest;
  absl::Status valid = ValidateManifestForWrite(m);
  if (!valid.ok()) return valid;
  if (!empty() && (m.tenant() != manifest_.tenant() ||
                   m.session_id() != manifest_.session_id())) {
    return absl::InvalidArgumentError(
        absl::StrCat("turn update for session ", m.tenant(), "/",
                     m.session_id(), " applied to the checkpoint of ",
                     manifest_.tenant(), "/", manifest_.session_id()));
  }
  if (!empty()) KVD_RETURN_IF_ERROR(CheckFence(manifest_, update));
  for (const ChunkId& id : update.erase) {
    auto it = chunks_.find(id);
    if (it == chunks_.end()) continue;
    chunk_bytes_ -= static_cast<int64_t>(it->second.size());
    chunks_.erase(it);
  }
  for (const auto& [id, value] : update.put) {
    std::string& slot = chunks_[id];
    chunk_bytes_ +=
        static_cast<int64_t>(value.size()) - static_cast<int64_t>(slot.size());
    slot = value;
  }
  manifest_ = m;
  return absl::OkStatus();
}

absl::Status CheckFence(const v1::SessionManifest& stored,
                        const TurnUpdate& update) {
  if (update.replica_update) {
    return CheckReplicaUpdate(stored, update.manifest);
  }
  return update.ownership_change ? CheckOwnershipChange(stored, update.manifest)
                                 : CheckTurnFence(stored, update.manifest);
}

absl::StatusOr<SessionCheckpoint> TokensOnly(
    const SessionCheckpoint& checkpoint) {
  v1::SessionManifest m = checkpoint.manifest();
  std::map<ChunkId, std::string> tokens;
  int64_t payload = 0;
  for (const auto& [id, value] : checkpoint.chunks()) {
    if (id.layer != kTokenLayer) continue;
    KVD_ASSIGN_OR_RETURN(
        DecodedChunk chunk,
        DecodeChunk(value, absl::StrCat("token chunk ", id.index, " of ",
                                        m.tenant(), "/", m.session_id())));
    payload += static_cast<int64_t>(chunk.payload.size());
    tokens.emplace(id, value);
  }
  m.set_length(0);
  for (int i = 0; i < m.first_position_size(); ++i) m.set_first_position(i, 0);
  m.set_stored_bytes(payload);
  SessionCheckpoint out;
  out.Reset(std::move(m), std::move(tokens));
  return out;
}

void SessionCheckpoint::Reset(v1::SessionManifest manifest,
                              std::map<ChunkId, std::string> chunks) {
  manifest_ = std::move(manifest);
  chunks_ = std::move(chunks);
  chunk_bytes_ = 0;
  for (const auto& [id, value] : chunks_) {
    chunk_bytes_ += static_cast<int64_t>(value.size());
  }
}

void ReplayLoad(const SessionCheckpoint& checkpoint, LoadObserver* observer) {
  observer->OnManifest(checkpoint.manifest());
  // Every stream handed over stays as it was until OnEnd returns.
  std::deque<std::map<ChunkId, std::string>> streams;
  for (const auto& [id, value] : checkpoint.chunks()) {
    if (!streams.empty() && streams.back().begin()->first.layer != id.layer) {
      observer->OnStream(streams.back().begin()->first.layer, streams.back());
      streams.emplace_back();
    }
    if (streams.empty()) streams.emplace_back();
    streams.back().emplace(id, value);
  }
  if (!streams.empty() && !streams.back().empty()) {
    observer->OnStream(streams.back().begin()->first.layer, streams.back());
  }
  observer->OnEnd(absl::OkStatus());
}

int64_t SessionCheckpoint::bytes() const {
  return chunk_bytes_ + static_cast<int64_t>(manifest_.ByteSizeLong());
}

}  // namespace kvd::storage
