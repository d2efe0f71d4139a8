#include "services/migration/migrator.h"

#include <cstdio>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/kvd/v1/migration.grpc.pb.h"
#include "services/migration/inbound.h"
#include "services/transport/secure_stream.h"
#include "storage/checkpoint/ownership.h"
#include "storage/checkpoint/session_file.h"

namespace kvd::migration {

storage::TurnUpdate CheckpointDelta(const storage::SessionCheckpoint& before,
                                    const storage::SessionCheckpoint& after) {
  storage::TurnUpdate d;
  d.manifest = after.manifest();
  for (const auto& [id, value] : after.chunks()) {
    auto it = before.chunks().find(id);
    if (it == before.chunks().end() || it->second != value) {
      d.put.emplace_back(id, value);
    }
  }
  for (const auto& [id, value] : before.chunks()) {
    if (after.chunks().count(id) == 0) d.erase.push_back(id);
  }
  return d;
}

std::string MigrationReportJson(const MigrationReport& r,
                                const std::string& session,
                                const std::string& from) {
  return nlohmann::json{
      {"object", "session.migration"},
      {"id", session},
      {"from", from},
      {"to", r.target},
      {"epoch", r.epoch},
      {"tokens", r.tokens},
      {"turns", r.turns},
      {"snapshot_bytes", r.snapshot_bytes},
      {"delta_bytes", r.delta_bytes},
      {"delta_chunks", r.delta_chunks},
      {"wire_bytes", r.wire_bytes},
      {"freeze_wait_ms", absl::ToDoubleMilliseconds(r.freeze_wait)},
      {"pause_ms", absl::ToDoubleMilliseconds(r.pause)},
      {"total_ms", absl::ToDoubleMilliseconds(r.total)},
      {"restore_path", r.restore_path},
      {"transport", r.transport},
  }
      .dump();
}

Migrator::Migrator(engine::SessionEngine* engine,
                   cluster::SessionDirectory* directory,
                   transport::Transport* transport, PeerResolver resolve,
                   MigratorOptions options)
    : engine_(engine),
      directory_(directory),
      transport_(transport),
      resolve_(std::move(resolve)),
      options_(std::move(options)) {}

MigratorStats Migrator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::StatusOr<MigrationReport> Migrator::Migrate(const std::string& tenant,
                                                  const std::string& session,
                                                  const std::string& target) {
  const absl::Time start = absl::Now();
  const std::string name =
      absl::StrCat("session '", session, "' of tenant '", tenant, "'");
  if (target == options_.node_id) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is on node '", target, "' already"));
  }
  // One move of a session at a time from this node. Two at once (a drain and
  // an operator's move) could both stage a copy on the same target, and the
  // loser's abort there would drop the copy the winner had just committed,
  // leaving the directory's new owner without the session (seen in
  // tests/cluster:migration_test as a 409 "has no copy of it"). A call after
  // the winner finds the directory moved.
  const std::pair<std::string, std::string> key(tenant, session);
  {
    absl::MutexLock lock(&mu_);
    if (!moving_.insert(key).second) {
      return absl::AbortedError(absl::StrCat(
          name,
          " is being moved by another request already; it stays where "
          "that move leaves it (retry to move it again)"));
    }
  }
  struct Done {
    Migrator* m;
    const std::pair<std::string, std::string>& key;
    ~Done() {
      absl::MutexLock lock(&m->mu_);
      m->moving_.erase(key);
    }
  } done{this, key};
  KVD_ASSIGN_OR_RETURN(PeerNode peer, resolve_(target));
  if (peer.draining) {
    return absl::FailedPreconditionError(
        absl::StrCat("node '", target, "' is draining (kvd cluster undrain ",
                     target, " to let it take sessions)"));
  }
  if (peer.model_fingerprint != engine_->identity().fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node '", target, "' serves another model (fingerprint ",
        peer.model_fingerprint, "); ", name, " can move only to a node of ",
        engine_->identity().fingerprint()));
  }
  KVD_ASSIGN_OR_RETURN(std::optional<cluster::DirectoryEntry> entry,
                       directory_->Lookup(tenant, session));
  if (!entry.has_value() || entry->owner != options_.node_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the cluster directory does not give ", name, " to this node ('",
        options_.node_id, "')",
        entry.has_value() ? absl::StrCat(": its owner is '", entry->owner, "'")
                          : std::string(": it has no entry"),
        "; ask its owner to move it"));
  }
  // A copy moved here that no turn has used yet is still a replica.
  KVD_RETURN_IF_ERROR(engine_->TakeUp(tenant, session));
  KVD_ASSIGN_OR_RETURN(std::shared_ptr<const storage::SessionCheckpoint> copy,
                       engine_->ExportSession(tenant, session));
  const uint64_t epoch = storage::EpochOf(copy->manifest());
  if (epoch != entry->epoch) {
    return absl::AbortedError(absl::StrCat(name, " is at epoch ", epoch,
                                           " here but ", entry->epoch,
                                           " in the directory; not moved"));
  }
  {
    absl::MutexLock lock(&mu_);
    stats_.started++;
  }

  v1::OpenInboundRequest open_req;
  open_req.set_tenant(tenant);
  open_req.set_session_id(session);
  open_req.set_source_node(options_.node_id);
  open_req.set_epoch(epoch);
  *open_req.mutable_model() = engine_->identity();
  const std::string what = absl::StrCat("node '", target, "'");
  absl::StatusOr<std::unique_ptr<PeerTransfer>> opened = PeerTransfer::Open(
      peer, what, transport_,
      PeerOptions{.cluster_token = options_.cluster_token,
                  .ca_cert_pem = options_.ca_cert_pem,
                  .client_cert_pem = options_.client_cert_pem,
                  .client_key_pem = options_.client_key_pem,
                  .piece_bytes = options_.piece_bytes,
                  .rpc_timeout = options_.rpc_timeout},
      open_req);
  if (!opened.ok()) {
    absl::MutexLock lock(&mu_);
    stats_.failed++;
    return opened.status();
  }
  PeerTransfer& t = **opened;
  bool frozen = false;
  MigrationReport report;
  report.target = target;
  report.transport = t.opened().transport();
  absl::Time freeze_start;
  // Everything up to the directory's move: on error the session stays here.
  auto attempt = [&]() -> absl::Status {
    KVD_RETURN_IF_ERROR(t.SendCopy(*copy));
    report.snapshot_bytes = t.payload_bytes();
    // The target stores the copy before the session stops: the pause then
    // covers only what the turns since wrote.
    KVD_RETURN_IF_ERROR(t.Stage());
    const absl::Time freeze_asked = absl::Now();
    KVD_ASSIGN_OR_RETURN(engine::SessionEngine::FrozenSession f,
                         engine_->Freeze(tenant, session));
    frozen = true;
    freeze_start = absl::Now();
    report.freeze_wait = freeze_start - freeze_asked;
    if (f.epoch != epoch) {
      return absl::AbortedError(absl::StrCat(
          name, " changed owner while it was copied (epoch ", f.epoch, ")"));
    }
    KVD_ASSIGN_OR_RETURN(std::shared_ptr<const storage::SessionCheckpoint> now,
                         engine_->ExportSession(tenant, session));
    const storage::TurnUpdate delta = CheckpointDelta(*copy, *now);
    report.delta_chunks = static_cast<int64_t>(delta.put.size());
    KVD_RETURN_IF_ERROR(t.SendDelta(delta));
    report.delta_bytes = t.payload_bytes() - report.snapshot_bytes;
    report.wire_bytes = t.wire_bytes();
    report.tokens = now->manifest().token_count();
    report.turns = now->manifest().turn_ends_size();
    KVD_ASSIGN_OR_RETURN(v1::CommitInboundResponse commit,
                         t.Commit(epoch, report.tokens, report.turns));
    report.restore_path = commit.restore_path();
    KVD_ASSIGN_OR_RETURN(cluster::DirectoryEntry moved,
                         directory_->Move(tenant, session, *entry, target));
    report.epoch = moved.epoch;
    return absl::OkStatus();
  };
  absl::Status moved = attempt();
  if (!moved.ok()) {
    if (frozen) engine_->Unfreeze(tenant, session);
    t.Abort();  // the target may hold the transfer still
    absl::MutexLock lock(&mu_);
    stats_.failed++;
    return absl::Status(
        moved.code(),
        absl::StrCat("moving ", name, " to node '", target,
                     "' failed; it stays on this node: ", moved.message()));
  }
  report.pause = absl::Now() - freeze_start;
  // The directory names the target now: this copy is only a stale one.
  absl::Status released =
      engine_->Release(tenant, session, target, report.epoch);
  if (released.ok()) {
    released = engine_->DeleteSession(tenant, session);
  }
  if (!released.ok()) {
    engine_->Unfreeze(tenant, session);  // waiting turns learn it moved
    // The fence refuses this copy anyway (the directory moved); it only
    // takes space until the session is deleted here by hand.
    std::fprintf(
        stderr, "kvd: moved %s to node '%s' but kept a stale copy: %s\n",
        name.c_str(), target.c_str(), std::string(released.message()).c_str());
  }
  report.total = absl::Now() - start;
  absl::MutexLock lock(&mu_);
  stats_.completed++;
  stats_.bytes_sent += report.wire_bytes;
  return report;
}

}  // namespace kvd::migration
