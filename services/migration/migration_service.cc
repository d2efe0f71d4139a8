#include "services/migration/migration_service.h"

#include <openssl/crypto.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "services/node/peer_identity.h"

namespace kvd::migration {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

}  // namespace

grpc::Status MigrationService::Authorize(const grpc::ServerContext* ctx) const {
  if (auth_.by_certificate) {
    std::shared_ptr<const grpc::AuthContext> context = ctx->auth_context();
    absl::StatusOr<node::PeerIdentity> peer =
        context == nullptr
            ? absl::UnauthenticatedError("the call carries no TLS identity")
            : node::PeerOf(*context);
    if (!peer.ok()) {
      return ToGrpc(absl::Status(
          peer.status().code(),
          absl::StrCat("kvd.v1.Migration is for the cluster's nodes: ",
                       peer.status().message())));
    }
    if (peer->role != node::PeerIdentity::Role::kNode) {
      return grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrCat("kvd.v1.Migration is for the cluster's nodes, and "
                       "the caller's certificate names ",
                       node::Describe(*peer),
                       ": routers may not write checkpoints"));
    }
    return grpc::Status::OK;
  }
  const std::string& token = auth_.cluster_token;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  const std::string want = absl::StrCat("Bearer ", token);
  if (token.empty() || it == md.end() || it->second.size() != want.size() ||
      CRYPTO_memcmp(it->second.data(), want.data(), want.size()) != 0) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "kvd.v1.Migration is for the cluster's nodes: send "
                        "the cluster token (kvd serve --router-token)");
  }
  return grpc::Status::OK;
}

namespace {

// Authorizes, runs `call`, and converts its answer.
template <typename Response, typename Call>
grpc::Status Answer(const grpc::Status& authorized, Response* response,
                    Call call) {
  if (!authorized.ok()) return authorized;
  absl::StatusOr<Response> r = call();
  if (!r.ok()) return ToGrpc(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status MigrationService::OpenInbound(
    grpc::ServerContext* ctx, const v1::OpenInboundRequest* request,
    v1::OpenInboundResponse* response) {
  return Answer(Authorize(ctx), response,
                [&] { return inbound_->Open(*request); });
}

grpc::Status MigrationService::StageInbound(
    grpc::ServerContext* ctx, const v1::StageInboundRequest* request,
    v1::StageInboundResponse* response) {
  return Answer(Authorize(ctx), response,
                [&] { return inbound_->Stage(*request); });
}

grpc::Status MigrationService::CommitInbound(
    grpc::ServerContext* ctx, const v1::CommitInboundRequest* request,
    v1::CommitInboundResponse* response) {
  return Answer(Authorize(ctx), response,
                [&] { return inbound_->Commit(*request); });
}

grpc::Status MigrationService::ReplicaStatus(
    grpc::ServerContext* ctx, const v1::ReplicaStatusRequest* request,
    v1::ReplicaStatusResponse* response) {
  return Answer(Authorize(ctx), response,
                [&]() -> absl::StatusOr<v1::ReplicaStatusResponse> {
                  absl::StatusOr<v1::SessionManifest> m =
                      inbound_->engine()->GetReplica(request->tenant(),
                                                     request->session_id());
                  if (!m.ok()) return m.status();
                  v1::ReplicaStatusResponse out;
                  out.set_owner_node(m->owner_node());
                  out.set_epoch(m->epoch());
                  out.set_turns(m->turn_ends_size());
                  out.set_token_count(m->token_count());
                  return out;
                });
}

grpc::Status MigrationService::AbortInbound(
    grpc::ServerContext* ctx, const v1::AbortInboundRequest* request,
    v1::AbortInboundResponse* response) {
  return Answer(Authorize(ctx), response,
                [&]() -> absl::StatusOr<v1::AbortInboundResponse> {
                  KVD_RETURN_IF_ERROR(inbound_->Abort(request->transfer_id()));
                  return v1::AbortInboundResponse();
                });
}

}  // namespace kvd::migration
