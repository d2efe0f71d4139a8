// The standard gRPC health service (grpc.health.v1.Health, which Kubernetes'
// gRPC probes and grpc-health-probe call) for a node: SERVING while the node
// can take turns, NOT_SERVING while it shuts down or its session database
// refuses writes (a damaged file, a full disk), with the same judgement as
// kvd.v1.Health and HTTP's /readyz. Known services: "" (the server) and
// those passed in; any other is NOT_FOUND for Check and SERVICE_UNKNOWN for
// Watch, as the protocol asks.
//
//   GrpcHealthV1 health([&] { return node_ready(); },
//                       {"kvd.v1.Sessions", "kvd.v1.Health"});
//   builder.RegisterService(&health);
//
// Thread-safety: calls run concurrently on gRPC's threads; Shutdown may be
// called from any thread and ends every Watch.
#ifndef KVD_SERVICES_NODE_GRPC_HEALTH_V1_H_
#define KVD_SERVICES_NODE_GRPC_HEALTH_V1_H_

#include <atomic>
#include <functional>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace kvd::node {

class GrpcHealthV1 final : public grpc::health::v1::Health::Service {
 public:
  // `serving` is asked on every Check and every `poll` of a Watch. A Watch
  // holds a server thread while it lasts, and the service is open, so at
  // most `max_watches` run at once (RESOURCE_EXHAUSTED beyond).
  GrpcHealthV1(std::function<bool()> serving, std::set<std::string> services,
               absl::Duration poll = absl::Seconds(1), int max_watches = 16);

  grpc::Status Check(grpc::ServerContext* ctx,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  grpc::Status Watch(grpc::ServerContext* ctx,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>*
                         writer) override;

  // NOT_SERVING from now on; running Watches send it and end.
  void Shutdown() { shut_down_.store(true); }

 private:
  grpc::health::v1::HealthCheckResponse::ServingStatus Status() const;

  const std::function<bool()> serving_;
  const std::set<std::string> services_;
  const absl::Duration poll_;
  const int max_watches_;
  std::atomic<int> watches_{0};
  std::atomic<bool> shut_down_{false};
};

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_GRPC_HEALTH_V1_H_
