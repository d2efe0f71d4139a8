// kvd.v1.Migration (proto/kvd/v1/migration.proto) over InboundTransfers:
// the gRPC face a node shows its peers. It writes checkpoints, so only the
// cluster's nodes may call it, judged before a request is read:
//   - under mutual TLS (MigrationAuth::by_certificate), by the caller's
//     certificate: it must name a node ("node:ID", peer_identity.h); a
//     router's certificate is refused whatever token it sends;
//   - without it (plaintext loopback tests, --no-tls clusters), by the
//     cluster's shared secret ("authorization: Bearer <token>", compared in
//     constant time), which routers hold too.
// Anything else is UNAUTHENTICATED or PERMISSION_DENIED.
//
// Thread-safety: gRPC's; `inbound` outlives the service.
#ifndef KVD_SERVICES_MIGRATION_MIGRATION_SERVICE_H_
#define KVD_SERVICES_MIGRATION_MIGRATION_SERVICE_H_

#include <string>

#include "grpcpp/grpcpp.h"
#include "proto/kvd/v1/migration.grpc.pb.h"
#include "services/migration/inbound.h"

namespace kvd::migration {

struct MigrationAuth {
  // Without by_certificate: the secret every call must carry.
  std::string cluster_token;
  // The server verifies client certificates against the cluster CA (mutual
  // TLS): callers are authorized by the identity their certificate names.
  bool by_certificate = false;
};

class MigrationService final : public v1::Migration::Service {
 public:
  MigrationService(InboundTransfers* inbound, MigrationAuth auth)
      : inbound_(inbound), auth_(std::move(auth)) {}

  grpc::Status OpenInbound(grpc::ServerContext* ctx,
                           const v1::OpenInboundRequest* request,
                           v1::OpenInboundResponse* response) override;
  grpc::Status StageInbound(grpc::ServerContext* ctx,
                            const v1::StageInboundRequest* request,
                            v1::StageInboundResponse* response) override;
  grpc::Status CommitInbound(grpc::ServerContext* ctx,
                             const v1::CommitInboundRequest* request,
                             v1::CommitInboundResponse* response) override;
  grpc::Status ReplicaStatus(grpc::ServerContext* ctx,
                             const v1::ReplicaStatusRequest* request,
                             v1::ReplicaStatusResponse* response) override;
  grpc::Status AbortInbound(grpc::ServerContext* ctx,
                            const v1::AbortInboundRequest* request,
                            v1::AbortInboundResponse* response) override;

 private:
  grpc::Status Authorize(const grpc::ServerContext* ctx) const;

  InboundTransfers* const inbound_;
  const MigrationAuth auth_;
};

}  // namespace kvd::migration

#endif  // KVD_SERVICES_MIGRATION_MIGRATION_SERVICE_H_
