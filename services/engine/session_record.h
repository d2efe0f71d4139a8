// One session as the engine holds it between the tiers and a turn: its
// committed manifest and token ids, its K/V cache and the residual rows its
// policy keeps. Also the two facts every part of the engine asks of a
// manifest: what a new session's looks like on this node, and whether this
// node may commit turns under a stored one.
//
//   auto record = std::make_shared<SessionRecord>(model, pool, policy, kAll);
//   record->committed = manifest;           // as of the last commit
//   RestoreTokens(checkpoint, &record->tokens);
//
// Thread-safety: a record is used by one turn at a time (the session's turn
// lock, session_locks.h); `in_turn` is HotSessions' (hot_sessions.h) and
// read or written only under its mutex; the byte counts are atomic so
// statistics may read them from any thread.
#ifndef KVD_SERVICES_ENGINE_SESSION_RECORD_H_
#define KVD_SERVICES_ENGINE_SESSION_RECORD_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/model/kv_cache.h"
#include "ops/model/model_backend.h"
#include "proto/kvd/v1/checkpoint.pb.h"

namespace kvd::engine {

// How the engine's parts name a session: (tenant, session id).
using SessionKey = std::pair<std::string, std::string>;

struct SessionRecord {
  // `pool` must be one `model` made (a full pool is the caller's to handle
  // when the cache grows, not here).
  SessionRecord(const ops::ModelBackend& model, ops::KvBlockPool* pool,
                const ops::CheckpointPolicy& policy, int64_t hot_budget);

  // K/V rows kept in memory: the hot budget for a bounded kv-direct
  // session (older rows come from `source`), otherwise all of them.
  int64_t budget() const;

  ops::CheckpointPolicy policy;
  int64_t hot_budget_value = ops::ResidualKvSource::kAll;
  v1::SessionManifest committed;  // as of the last commit
  std::vector<int32_t> tokens;    // committed token ids
  ops::KvCache cache;
  ops::ResidualStore store;
  std::unique_ptr<ops::ResidualKvSource> source;  // bounded kv-direct only
  // After a re-prefill from token ids the stored chunks cannot be trusted:
  // the next commit rewrites every chunk.
  bool rewrite_all = false;
  std::atomic<int64_t> kv_bytes{0}, residual_bytes{0};
  int in_turn = 0;  // turns holding it now; > 0: never demoted
};

// "session 'ID' of tenant 'T'": how every error names a session.
std::string SessionName(const std::string& tenant, const std::string& id);

// What a new session's manifest holds on this node.
struct NewSessionDefaults {
  ops::CheckpointPolicy policy;
  int64_t chunk_tokens = 64;
  std::string node_id;  // "" = standalone
};
// The manifest of a new, empty session (epoch 1, primary of `node_id`).
// The backend's error when the policy is kv and it cannot hand out K/V rows.
absl::StatusOr<v1::SessionManifest> NewSessionManifest(
    const ops::ModelBackend& model, const v1::ModelIdentity& identity,
    const NewSessionDefaults& defaults, const std::string& tenant,
    const std::string& session,
    const std::map<std::string, std::string>& labels);

// OK when node `node_id` may commit turns under `stored`: it is a primary at
// the owner and epoch this node would write. ABORTED otherwise, naming the
// node ("" = standalone).
absl::Status CheckNodeMayCommit(const v1::SessionManifest& stored,
                                const std::string& node_id);

}  // namespace kvd::engine

#endif  // KVD_SERVICES_ENGINE_SESSION_RECORD_H_
