#include "services/node/grpc_health_v1.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvd::node {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

GrpcHealthV1::GrpcHealthV1(std::function<bool()> serving,
                           std::set<std::string> services, absl::Duration poll,
                           int max_watches)
    : serving_(std::move(serving)),
      services_(std::move(services)),
      poll_(poll),
      max_watches_(max_watches) {}

HealthCheckResponse::ServingStatus GrpcHealthV1::Status() const {
  return !shut_down_.load() && serving_() ? HealthCheckResponse::SERVING
                                          : HealthCheckResponse::NOT_SERVING;
}

grpc::Status GrpcHealthV1::Check(grpc::ServerContext* ctx,
                                 const HealthCheckRequest* request,
                                 HealthCheckResponse* response) {
  if (!request->service().empty() && services_.count(request->service()) == 0) {
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("no service '", request->service(),
                     "' here; ask about \"\" (the node) or kvd.v1.Sessions"));
  }
  response->set_status(Status());
  return grpc::Status::OK;
}

grpc::Status GrpcHealthV1::Watch(
    grpc::ServerContext* ctx, const HealthCheckRequest* request,
    grpc::ServerWriter<HealthCheckResponse>* writer) {
  struct Count {
    std::atomic<int>* n;
    ~Count() { n->fetch_sub(1); }
  } count{&watches_};
  if (watches_.fetch_add(1) >= max_watches_) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat(max_watches_,
                                     " health watches are open already; use "
                                     "Check, or watch from fewer clients"));
  }
  const bool known =
      request->service().empty() || services_.count(request->service()) > 0;
  bool first = true;
  HealthCheckResponse::ServingStatus last = HealthCheckResponse::UNKNOWN;
  for (;;) {
    // Read before the status: a shutdown that lands after this read is sent
    // on the next round, so the last message is always NOT_SERVING.
    const bool ending = shut_down_.load() || ctx->IsCancelled();
    const HealthCheckResponse::ServingStatus now =
        known ? Status() : HealthCheckResponse::SERVICE_UNKNOWN;
    if (first || now != last) {
      HealthCheckResponse response;
      response.set_status(now);
      if (!writer->Write(response)) break;
      first = false;
      last = now;
    }
    if (ending) break;
    absl::SleepFor(poll_);
  }
  return grpc::Status::OK;
}

}  // namespace kvd::node
