#include "services/migration/inbound.h"

#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "services/transport/secure_stream.h"
#include "storage/checkpoint/codec.h"
#include "storage/checkpoint/ownership.h"
#include "storage/checkpoint/session_checkpoint.h"
#include "storage/checkpoint/session_file.h"

namespace kvd::migration {

struct InboundTransfers::Transfer {
  std::string id;
  v1::OpenInboundRequest request;
  absl::Time opened;
  std::unique_ptr<transport::SecureReceiver> receiver;
  std::thread thread;
  absl::Notification done;
  // Set by the thread before `staged`: the copy stored as a replica.
  absl::Notification staged;
  absl::Status stage_status = absl::UnknownError("not received");
  v1::SessionManifest staged_manifest;
  // Set by the thread before `done`: the delta since the copy.
  absl::StatusOr<storage::TurnUpdate> delta =
      absl::UnknownError("not received");
  std::atomic<int64_t> payload_bytes{0};

  // Ends a Receive in progress; safe against the thread dropping the
  // receiver when it finishes.
  void Cancel() {
    absl::MutexLock lock(&receiver_mu);
    if (receiver != nullptr) receiver->Cancel();
  }
  void DropReceiver() {
    absl::MutexLock lock(&receiver_mu);
    receiver.reset();
  }
  absl::Mutex receiver_mu;
};

InboundTransfers::InboundTransfers(engine::SessionEngine* engine,
                                   transport::Transport* transport,
                                   InboundOptions options)
    : engine_(engine), transport_(transport), options_(options) {}

InboundTransfers::~InboundTransfers() {
  std::map<std::string, std::shared_ptr<Transfer>> open;
  {
    absl::MutexLock lock(&mu_);
    open.swap(open_);
  }
  for (auto& [id, t] : open) {
    t->Cancel();
    t->thread.join();
  }
}

absl::StatusOr<v1::OpenInboundResponse> InboundTransfers::Open(
    const v1::OpenInboundRequest& request) {
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", request.tenant()));
  KVD_RETURN_IF_ERROR(
      storage::ValidateName("session id", request.session_id()));
  KVD_RETURN_IF_ERROR(storage::CheckCompatible(
      request.model(), engine_->identity(), request.session_id()));
  std::vector<std::shared_ptr<Transfer>> stale;
  {
    absl::MutexLock lock(&mu_);
    // Transfers the source never committed or aborted: their stream has
    // ended (idle timeout) and nobody came back for them.
    for (auto it = open_.begin(); it != open_.end();) {
      Transfer& t = *it->second;
      if (t.done.HasBeenNotified() &&
          absl::Now() - t.opened > options_.commit_wait) {
        stale.push_back(it->second);
        it = open_.erase(it);
        stats_.failed++;
      } else {
        ++it;
      }
    }
    if (static_cast<int>(open_.size()) >= options_.max_open) {
      for (auto& t : stale) t->thread.join();
      return absl::ResourceExhaustedError(absl::StrCat(
          "this node is receiving ", open_.size(),
          " sessions already (the most it takes at once); retry shortly or "
          "move the session to another node"));
    }
  }
  for (auto& t : stale) t->thread.join();

  KVD_ASSIGN_OR_RETURN(std::unique_ptr<transport::ChunkReceiver> inner,
                       transport_->Listen({.max_chunk_bytes = 2 << 20}));
  const transport::TransferSecret secret = transport::TransferSecret::New();
  auto t = std::make_shared<Transfer>();
  t->id = absl::BytesToHexString(transport::TransferSecret::New().token)
              .substr(0, 32);
  t->request = request;
  t->opened = absl::Now();
  t->receiver =
      std::make_unique<transport::SecureReceiver>(std::move(inner), secret);
  v1::OpenInboundResponse response;
  response.set_transfer_id(t->id);
  response.set_transport(transport_->name());
  response.set_address(t->receiver->address());
  response.set_token(secret.token);
  response.set_key(secret.key);
  {
    absl::MutexLock lock(&mu_);
    open_[t->id] = t;
    stats_.opened++;
  }
  t->thread = std::thread([this, raw = t.get()] { Receive(raw); });
  return response;
}

void InboundTransfers::Receive(Transfer* t) {
  const std::string where = absl::StrCat(
      "session '", t->request.session_id(), "' of tenant '",
      t->request.tenant(), "' from node '", t->request.source_node(), "'");
  std::string piece;
  bool held = false;   // `piece` is a received chunk not yet consumed
  bool ended = false;  // the stream's verified end
  absl::Status stream;
  int64_t total = 0;
  // A section's pieces, for the session-file readers: false at the first
  // chunk of another section, at the end, or on an error (kept in `stream`;
  // the reader then reports a cut stream, and `stream` says why).
  auto section = [&](char tag) {
    return [&, tag](std::string* out) -> bool {
      if (!held) {
        if (ended || !stream.ok()) return false;
        absl::StatusOr<bool> more =
            t->receiver->Receive(&piece, absl::Now() + options_.idle_timeout);
        if (!more.ok()) {
          stream = more.status();
          return false;
        }
        if (!*more) {
          ended = true;
          return false;
        }
        total += static_cast<int64_t>(piece.size());
        if (total > options_.max_session_bytes) {
          stream = absl::ResourceExhaustedError(
              absl::StrCat(where, " exceeds ", options_.max_session_bytes,
                           " bytes, the most this node accepts"));
          return false;
        }
        if (piece.empty()) {
          stream = absl::DataLossError("an empty migration chunk");
          return false;
        }
        held = true;
      }
      if (piece[0] == kSnapshotEnd && tag == kSnapshotPiece) {
        held = false;  // the copy's end: consumed here
        return false;
      }
      if (piece[0] != tag) return false;
      out->assign(piece, 1, std::string::npos);
      held = false;
      return true;
    };
  };
  absl::StatusOr<storage::SessionCheckpoint> cp =
      t->request.update_only()
          ? absl::StatusOr<storage::SessionCheckpoint>(
                absl::CancelledError("no copy: an update only"))
          : storage::ReadSessionPieces(section(kSnapshotPiece), where);
  absl::Status staged = stream;  // the transport's reason comes first
  if (staged.ok() && !t->request.update_only()) staged = cp.status();
  if (staged.ok() && !t->request.update_only()) {
    const v1::OpenInboundRequest& open = t->request;
    const v1::SessionManifest& m = cp->manifest();
    if (m.tenant() != open.tenant() || m.session_id() != open.session_id()) {
      staged = absl::DataLossError(
          absl::StrCat("the migration stream carried session '", m.session_id(),
                       "' of tenant '", m.tenant(), "', not the one opened"));
    } else if (storage::EpochOf(m) != open.epoch() ||
               m.owner_node() != open.source_node()) {
      staged = absl::AbortedError(absl::StrCat(
          "the migrated copy is at epoch ", storage::EpochOf(m), " owned by ",
          storage::OwnerName(m.owner_node()), "; the move was opened at epoch ",
          open.epoch(), " from node '", open.source_node(), "'"));
    }
  }
  if (staged.ok() && !t->request.update_only()) {
    t->staged_manifest = cp->manifest();
    // Durable here before the source freezes the session.
    staged = engine_->StoreReplica(*std::move(cp), t->id);
  }
  t->payload_bytes.store(total);
  t->stage_status = staged;
  t->staged.Notify();

  absl::StatusOr<storage::TurnUpdate> delta =
      staged.ok() ? storage::ReadTurnUpdatePieces(section(kDeltaPiece), where)
                  : absl::StatusOr<storage::TurnUpdate>(staged);
  if (stream.ok() && delta.ok() && (held || !ended)) {
    // The end must come next.
    std::string extra;
    absl::StatusOr<bool> more =
        held
            ? absl::StatusOr<bool>(true)
            : t->receiver->Receive(&extra, absl::Now() + options_.idle_timeout);
    if (!more.ok()) {
      stream = more.status();
    } else if (*more) {
      stream = absl::DataLossError(absl::StrCat(
          where, ": the migration stream goes on after its delta"));
    }
  }
  t->payload_bytes.store(total);
  t->delta = stream.ok() ? std::move(delta)
                         : absl::StatusOr<storage::TurnUpdate>(stream);
  // Frees the data plane now (a broken sender's endpoint fails at once).
  t->DropReceiver();
  t->done.Notify();
}

absl::StatusOr<std::shared_ptr<InboundTransfers::Transfer>>
InboundTransfers::Take(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(id);
  if (it == open_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "no open transfer '", id,
        "' on this node (it ended, timed out, or the node restarted)"));
  }
  std::shared_ptr<Transfer> t = std::move(it->second);
  open_.erase(it);
  return t;
}

absl::StatusOr<v1::StageInboundResponse> InboundTransfers::Stage(
    const v1::StageInboundRequest& request) {
  std::shared_ptr<Transfer> t;
  {
    absl::MutexLock lock(&mu_);
    auto it = open_.find(request.transfer_id());
    if (it == open_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "no open transfer '", request.transfer_id(), "' on this node"));
    }
    t = it->second;
  }
  if (!t->staged.WaitForNotificationWithTimeout(options_.commit_wait)) {
    return absl::DeadlineExceededError(
        absl::StrCat("the migrated copy did not arrive within ",
                     absl::FormatDuration(options_.commit_wait)));
  }
  if (!t->stage_status.ok()) return t->stage_status;
  v1::StageInboundResponse response;
  response.set_payload_bytes(t->payload_bytes.load());
  return response;
}

absl::StatusOr<v1::CommitInboundResponse> InboundTransfers::Commit(
    const v1::CommitInboundRequest& request) {
  KVD_ASSIGN_OR_RETURN(std::shared_ptr<Transfer> t,
                       Take(request.transfer_id()));
  absl::Status status;
  if (!t->done.WaitForNotificationWithTimeout(options_.commit_wait)) {
    status = absl::DeadlineExceededError(
        absl::StrCat("the migration stream did not end within ",
                     absl::FormatDuration(options_.commit_wait)));
    t->Cancel();
  }
  t->thread.join();
  if (status.ok()) status = t->stage_status;
  if (status.ok()) status = t->delta.status();
  if (status.ok()) {
    const v1::SessionManifest& m = t->delta->manifest;
    if (m.tenant() != t->request.tenant() ||
        m.session_id() != t->request.session_id()) {
      status = absl::DataLossError(
          "the transfer's update is for another session than was opened");
    } else if (storage::EpochOf(m) != request.epoch()) {
      status = absl::AbortedError(
          absl::StrCat("the migrated delta is at epoch ", storage::EpochOf(m),
                       "; the source froze epoch ", request.epoch()));
    } else if (m.token_count() != request.token_count() ||
               m.turn_ends_size() != request.turns()) {
      status = absl::DataLossError(absl::StrCat(
          "the migrated copy holds ", m.token_count(), " tokens in ",
          m.turn_ends_size(), " turns; the source froze ",
          request.token_count(), " in ", request.turns()));
    }
  }
  v1::CommitInboundResponse response;
  if (status.ok()) {
    response.set_restore_path(
        storage::SameNumerics(t->delta->manifest.model(), engine_->identity())
                .ok()
            ? "residuals"
            : "tokens");
    response.set_payload_bytes(t->payload_bytes.load());
    response.set_chunks(static_cast<int64_t>(t->delta->put.size()));
    status = engine_->ApplyReplicaUpdate(*std::move(t->delta));
  }
  if (!status.ok() && t->stage_status.ok()) {
    // The staged copy is not the session's: nothing of it stays.
    DropStaged(*t);
  }
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    stats_.failed++;
    return status;
  }
  stats_.committed++;
  stats_.bytes_committed += t->payload_bytes.load();
  return response;
}

absl::Status InboundTransfers::Abort(const std::string& transfer_id) {
  KVD_ASSIGN_OR_RETURN(std::shared_ptr<Transfer> t, Take(transfer_id));
  t->Cancel();
  t->thread.join();
  if (t->stage_status.ok()) DropStaged(*t);
  absl::MutexLock lock(&mu_);
  stats_.failed++;
  return absl::OkStatus();
}

void InboundTransfers::DropStaged(const Transfer& t) {
  // A copy is dropped only while it is still the one this transfer stored:
  // another move of the session may have stored or committed its own since
  // (SessionEngine::DropReplica). An update that failed leaves the replica
  // it could not update out of step, so that goes whoever stored it.
  engine_
      ->DropReplica(t.request.tenant(), t.request.session_id(),
                    t.request.update_only() ? std::string() : t.id)
      .IgnoreError();
}

InboundStats InboundTransfers::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace kvd::migration
