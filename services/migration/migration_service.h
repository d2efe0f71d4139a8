// kvd.v1.Migration (proto/kvd/v1/migration.proto) over InboundTransfers:
// the gRPC face a node shows its peers. Every call must carry the cluster's
// shared secret ("authorization: Bearer <token>", compared in constant
// time); anything else is PERMISSION_DENIED before it is read.
//
// Thread-safety: gRPC's; `inbound` outlives the service.
#ifndef KVD_SERVICES_MIGRATION_MIGRATION_SERVICE_H_
#define KVD_SERVICES_MIGRATION_MIGRATION_SERVICE_H_

#include <string>

#include "grpcpp/grpcpp.h"
#include "proto/kvd/v1/migration.grpc.pb.h"
#include "services/migration/inbound.h"

namespace kvd::migration {

class MigrationService final : public v1::Migration::Service {
 public:
  MigrationService(InboundTransfers* inbound, std::string cluster_token)
      : inbound_(inbound), token_(std::move(cluster_token)) {}

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
  const std::string token_;
};

}  // namespace kvd::migration

#endif  // KVD_SERVICES_MIGRATION_MIGRATION_SERVICE_H_
