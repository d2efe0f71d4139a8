#include "services/migration/outbound.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "services/migration/inbound.h"
#include "storage/checkpoint/session_file.h"

namespace kvd::migration {
namespace {

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

}  // namespace

namespace {

std::unique_ptr<v1::Migration::Stub> StubFor(const PeerNode& peer,
                                             const PeerOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> creds =
      options.ca_cert_pem.empty()
          ? grpc::InsecureChannelCredentials()
          : grpc::SslCredentials({.pem_root_certs = options.ca_cert_pem,
                                  .pem_private_key = options.client_key_pem,
                                  .pem_cert_chain = options.client_cert_pem});
  return v1::Migration::NewStub(grpc::CreateChannel(peer.grpc_address, creds));
}

std::unique_ptr<grpc::ClientContext> ContextFor(const PeerOptions& options) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
  ctx->AddMetadata("authorization",
                   absl::StrCat("Bearer ", options.cluster_token));
  return ctx;
}

}  // namespace

absl::StatusOr<v1::ReplicaStatusResponse> QueryReplica(
    const PeerNode& peer, const PeerOptions& options, const std::string& tenant,
    const std::string& session) {
  v1::ReplicaStatusRequest req;
  req.set_tenant(tenant);
  req.set_session_id(session);
  v1::ReplicaStatusResponse resp;
  KVD_RETURN_IF_ERROR(
      FromGrpc(StubFor(peer, options)
                   ->ReplicaStatus(ContextFor(options).get(), req, &resp),
               "replica status"));
  return resp;
}

std::unique_ptr<grpc::ClientContext> PeerTransfer::Context() const {
  return ContextFor(options_);
}

absl::StatusOr<std::unique_ptr<PeerTransfer>> PeerTransfer::Open(
    const PeerNode& peer, const std::string& what, transport::Transport* plane,
    const PeerOptions& options, const v1::OpenInboundRequest& request) {
  std::unique_ptr<PeerTransfer> t(new PeerTransfer(what, options));
  t->stub_ = StubFor(peer, options);
  KVD_RETURN_IF_ERROR(
      FromGrpc(t->stub_->OpenInbound(t->Context().get(), request, &t->open_),
               absl::StrCat(what, " did not open a transfer")));
  absl::StatusOr<std::unique_ptr<transport::ChunkSender>> raw =
      plane->Connect(t->open_.address());
  absl::StatusOr<std::unique_ptr<transport::SecureSender>> out =
      raw.ok() ? transport::SecureSender::Start(
                     std::move(*raw), {t->open_.token(), t->open_.key()})
               : absl::StatusOr<std::unique_ptr<transport::SecureSender>>(
                     raw.status());
  if (!out.ok()) {
    t->Abort();
    return out.status();
  }
  t->out_ = std::move(*out);
  return t;
}

absl::Status PeerTransfer::SendTagged(char tag, absl::string_view piece) {
  tagged_.assign(1, tag);
  tagged_.append(piece.data(), piece.size());
  return out_->Send(tagged_);
}

absl::Status PeerTransfer::SendPieces(
    char tag, const std::function<absl::Status(const PieceSink&)>& write) {
  absl::Status sent;
  absl::Status written = write([&](absl::string_view piece) {
    sent = SendTagged(tag, piece);
    return sent.ok();
  });
  KVD_RETURN_IF_ERROR(sent);
  return written;
}

absl::Status PeerTransfer::SendCopy(
    const storage::SessionCheckpoint& checkpoint) {
  KVD_RETURN_IF_ERROR(SendPieces(kSnapshotPiece, [&](const PieceSink& emit) {
    return storage::WriteSessionPieces(checkpoint, options_.piece_bytes, emit);
  }));
  return out_->Send(absl::string_view(&kSnapshotEnd, 1));
}

absl::Status PeerTransfer::Stage() {
  v1::StageInboundRequest req;
  req.set_transfer_id(open_.transfer_id());
  v1::StageInboundResponse resp;
  return FromGrpc(stub_->StageInbound(Context().get(), req, &resp),
                  absl::StrCat(what_, " refused the copy"));
}

absl::Status PeerTransfer::SendDelta(const storage::TurnUpdate& update) {
  KVD_RETURN_IF_ERROR(SendPieces(kDeltaPiece, [&](const PieceSink& emit) {
    return storage::WriteTurnUpdatePieces(update, options_.piece_bytes, emit);
  }));
  return out_->Finish();
}

absl::StatusOr<v1::CommitInboundResponse> PeerTransfer::Commit(uint64_t epoch,
                                                               int64_t tokens,
                                                               int64_t turns) {
  v1::CommitInboundRequest req;
  req.set_transfer_id(open_.transfer_id());
  req.set_epoch(epoch);
  req.set_token_count(tokens);
  req.set_turns(turns);
  v1::CommitInboundResponse resp;
  KVD_RETURN_IF_ERROR(
      FromGrpc(stub_->CommitInbound(Context().get(), req, &resp),
               absl::StrCat(what_, " refused the transfer")));
  return resp;
}

void PeerTransfer::Abort() {
  v1::AbortInboundRequest req;
  req.set_transfer_id(open_.transfer_id());
  v1::AbortInboundResponse ignored;
  stub_->AbortInbound(Context().get(), req, &ignored);
}

}  // namespace kvd::migration
