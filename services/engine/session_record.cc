#include "services/engine/session_record.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "storage/checkpoint/codec.h"
#include "storage/checkpoint/ownership.h"

namespace kvd::engine {

SessionRecord::SessionRecord(const ops::ModelBackend& model,
                             ops::KvBlockPool* pool,
                             const ops::CheckpointPolicy& p, int64_t hot_budget)
    : policy(p),
      hot_budget_value(hot_budget),
      // The engine made the pool for this model: cannot fail.
      cache(model.NewCache(pool).value()),
      store(model.config(), model.precision(),
            ops::CheckpointLayers(p, model.config().n_layers)) {
  if (p.kind == ops::CheckpointPolicy::Kind::kKvDirect &&
      hot_budget != ops::ResidualKvSource::kAll) {
    source = std::make_unique<ops::ResidualKvSource>(&store, 0, hot_budget);
  }
}

int64_t SessionRecord::budget() const {
  return source != nullptr ? hot_budget_value : ops::ResidualKvSource::kAll;
}

std::string SessionName(const std::string& tenant, const std::string& id) {
  return absl::StrCat("session '", id, "' of tenant '", tenant, "'");
}

absl::StatusOr<v1::SessionManifest> NewSessionManifest(
    const ops::ModelBackend& model, const v1::ModelIdentity& identity,
    const NewSessionDefaults& defaults, const std::string& tenant,
    const std::string& session,
    const std::map<std::string, std::string>& labels) {
  const bool kv = defaults.policy.kind == ops::CheckpointPolicy::Kind::kKv;
  if (kv) KVD_RETURN_IF_ERROR(model.KvRowAccess());
  const ops::ModelConfig& c = model.config();
  v1::SessionManifest m;
  m.set_format_version(storage::kCheckpointFormatVersion);
  m.set_tenant(tenant);
  m.set_session_id(session);
  m.set_owner_node(defaults.node_id);
  m.set_epoch(storage::kFirstEpoch);
  m.set_role(v1::SESSION_ROLE_PRIMARY);
  *m.mutable_model() = identity;
  m.set_policy(defaults.policy.Name());
  // Policy kv stores every layer's K row and V row as one row per position
  // (session_chunks.h CacheKvRows); the others the residuals of their layers.
  if (kv) {
    for (int64_t l = 0; l < c.n_layers; ++l) m.add_layers(l);
  } else {
    for (int64_t l : ops::CheckpointLayers(defaults.policy, c.n_layers))
      m.add_layers(l);
  }
  for (int i = 0; i < m.layers_size(); ++i) m.add_first_position(0);
  m.set_chunk_tokens(defaults.chunk_tokens);
  const bool bf16 = model.precision() == ops::Precision::kBf16;
  m.set_dtype(bf16 ? v1::DTYPE_BF16 : v1::DTYPE_F32);
  m.set_row_bytes(kv ? 2 * static_cast<int64_t>(
                               ops::KvCache::RowBytes(c, model.precision()))
                     : c.d_model * (bf16 ? 2 : 4));
  m.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  m.set_updated_unix_ms(m.created_unix_ms());
  for (const auto& [k, v] : labels) (*m.mutable_labels())[k] = v;
  return m;
}

absl::Status CheckNodeMayCommit(const v1::SessionManifest& stored,
                                const std::string& node_id) {
  v1::SessionManifest mine = stored;
  mine.set_owner_node(node_id);
  absl::Status fence = storage::CheckTurnFence(stored, mine);
  if (fence.ok()) return fence;
  return absl::Status(
      fence.code(),
      absl::StrCat(fence.message(), " (this node is ",
                   node_id.empty() ? std::string("standalone")
                                   : absl::StrCat("'", node_id, "'"),
                   ": kvd --node-id)"));
}

}  // namespace kvd::engine
