#include "services/migration/migration_service.h"

#include <openssl/crypto.h>

#include "absl/strings/str_cat.h"

namespace kvd::migration {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

}  // namespace

grpc::Status MigrationService::Authorize(const grpc::ServerContext* ctx) const {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  const std::string want = absl::StrCat("Bearer ", token_);
  if (token_.empty() || it == md.end() || it->second.size() != want.size() ||
      CRYPTO_memcmp(it->second.data(), want.data(), want.size()) != 0) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "kvd.v1.Migration is for the cluster's nodes: send "
                        "the cluster token (kvd serve --router-token)");
  }
  return grpc::Status::OK;
}

grpc::Status MigrationService::OpenInbound(
    grpc::ServerContext* ctx, const v1::OpenInboundRequest* request,
    v1::OpenInboundResponse* response) {
  if (grpc::Status ok = Authorize(ctx); !ok.ok()) return ok;
  absl::StatusOr<v1::OpenInboundResponse> r = inbound_->Open(*request);
  if (!r.ok()) return ToGrpc(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status MigrationService::StageInbound(
    grpc::ServerContext* ctx, const v1::StageInboundRequest* request,
    v1::StageInboundResponse* response) {
  if (grpc::Status ok = Authorize(ctx); !ok.ok()) return ok;
  absl::StatusOr<v1::StageInboundResponse> r = inbound_->Stage(*request);
  if (!r.ok()) return ToGrpc(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status MigrationService::CommitInbound(
    grpc::ServerContext* ctx, const v1::CommitInboundRequest* request,
    v1::CommitInboundResponse* response) {
  if (grpc::Status ok = Authorize(ctx); !ok.ok()) return ok;
  absl::StatusOr<v1::CommitInboundResponse> r = inbound_->Commit(*request);
  if (!r.ok()) return ToGrpc(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status MigrationService::ReplicaStatus(
    grpc::ServerContext* ctx, const v1::ReplicaStatusRequest* request,
    v1::ReplicaStatusResponse* response) {
  if (grpc::Status ok = Authorize(ctx); !ok.ok()) return ok;
  absl::StatusOr<v1::SessionManifest> m =
      inbound_->engine()->GetReplica(request->tenant(), request->session_id());
  if (!m.ok()) return ToGrpc(m.status());
  response->set_owner_node(m->owner_node());
  response->set_epoch(m->epoch());
  response->set_turns(m->turn_ends_size());
  response->set_token_count(m->token_count());
  return grpc::Status::OK;
}

grpc::Status MigrationService::AbortInbound(
    grpc::ServerContext* ctx, const v1::AbortInboundRequest* request,
    v1::AbortInboundResponse*) {
  if (grpc::Status ok = Authorize(ctx); !ok.ok()) return ok;
  return ToGrpc(inbound_->Abort(request->transfer_id()));
}

}  // namespace kvd::migration
