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
namespace {

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

}  // namespace

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

  std::shared_ptr<grpc::ChannelCredentials> creds =
      options_.ca_cert_pem.empty()
          ? grpc::InsecureChannelCredentials()
          : grpc::SslCredentials({.pem_root_certs = options_.ca_cert_pem});
  std::unique_ptr<v1::Migration::Stub> stub =
      v1::Migration::NewStub(grpc::CreateChannel(peer.grpc_address, creds));
  auto context = [this] {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    ctx->AddMetadata("authorization",
                     absl::StrCat("Bearer ", options_.cluster_token));
    return ctx;
  };

  v1::OpenInboundRequest open_req;
  open_req.set_tenant(tenant);
  open_req.set_session_id(session);
  open_req.set_source_node(options_.node_id);
  open_req.set_epoch(epoch);
  *open_req.mutable_model() = engine_->identity();
  v1::OpenInboundResponse open;
  KVD_RETURN_IF_ERROR(
      FromGrpc(stub->OpenInbound(context().get(), open_req, &open),
               absl::StrCat("node '", target, "' did not open a transfer")));

  bool frozen = false;
  MigrationReport report;
  report.target = target;
  report.transport = open.transport();
  absl::Time freeze_start;
  // Everything up to the directory's move: on error the session stays here.
  auto attempt = [&]() -> absl::Status {
    KVD_ASSIGN_OR_RETURN(std::unique_ptr<transport::ChunkSender> raw,
                         transport_->Connect(open.address()));
    KVD_ASSIGN_OR_RETURN(std::unique_ptr<transport::SecureSender> out,
                         transport::SecureSender::Start(
                             std::move(raw), {open.token(), open.mac_key()}));
    absl::Status sent;
    std::string tagged;
    auto emit = [&](char tag) {
      return [&, tag](absl::string_view piece) {
        tagged.assign(1, tag);
        tagged.append(piece.data(), piece.size());
        sent = out->Send(tagged);
        return sent.ok();
      };
    };
    absl::Status written = storage::WriteSessionPieces(
        *copy, options_.piece_bytes, emit(kSnapshotPiece));
    KVD_RETURN_IF_ERROR(sent);
    KVD_RETURN_IF_ERROR(written);
    KVD_RETURN_IF_ERROR(out->Send(absl::string_view(&kSnapshotEnd, 1)));
    report.snapshot_bytes = out->payload_bytes();
    // The target stores the copy before the session stops: the pause then
    // covers only what the turns since wrote.
    v1::StageInboundRequest stage_req;
    stage_req.set_transfer_id(open.transfer_id());
    v1::StageInboundResponse staged;
    KVD_RETURN_IF_ERROR(
        FromGrpc(stub->StageInbound(context().get(), stage_req, &staged),
                 absl::StrCat("node '", target, "' refused the copy")));

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
    written = storage::WriteTurnUpdatePieces(delta, options_.piece_bytes,
                                             emit(kDeltaPiece));
    KVD_RETURN_IF_ERROR(sent);
    KVD_RETURN_IF_ERROR(written);
    KVD_RETURN_IF_ERROR(out->Finish());
    report.delta_bytes = out->payload_bytes() - report.snapshot_bytes;
    report.wire_bytes = out->wire_bytes();
    report.tokens = now->manifest().token_count();
    report.turns = now->manifest().turn_ends_size();

    v1::CommitInboundRequest commit_req;
    commit_req.set_transfer_id(open.transfer_id());
    commit_req.set_epoch(epoch);
    commit_req.set_token_count(report.tokens);
    commit_req.set_turns(report.turns);
    v1::CommitInboundResponse commit;
    KVD_RETURN_IF_ERROR(
        FromGrpc(stub->CommitInbound(context().get(), commit_req, &commit),
                 absl::StrCat("node '", target, "' refused the transfer")));
    report.restore_path = commit.restore_path();
    KVD_ASSIGN_OR_RETURN(cluster::DirectoryEntry moved,
                         directory_->Move(tenant, session, *entry, target));
    report.epoch = moved.epoch;
    return absl::OkStatus();
  };
  absl::Status moved = attempt();
  if (!moved.ok()) {
    if (frozen) engine_->Unfreeze(tenant, session);
    // The target may hold the transfer still (or have ended it already).
    v1::AbortInboundRequest abort_req;
    abort_req.set_transfer_id(open.transfer_id());
    v1::AbortInboundResponse ignored;
    stub->AbortInbound(context().get(), abort_req, &ignored);
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
