// What the node records of every gRPC call, in one server interceptor: a JSON
// log line on stderr (as the HTTP front end writes one per request), and in
// /metrics per method: calls by status code and a latency histogram. It also
// gives a request that does not parse (protobuf refuses a string field with
// invalid UTF-8, and gRPC then answers an empty INTERNAL) the code and
// message it deserves: INVALID_ARGUMENT, saying what is wrong.
//
//   std::vector<std::unique_ptr<
//       grpc::experimental::ServerInterceptorFactoryInterface>> creators;
//   creators.push_back(MakeGrpcCallLog(metrics, /*log_calls=*/true));
//   builder.experimental().SetInterceptorCreators(std::move(creators));
//
// Thread-safety: one interceptor per call; Metrics is thread-safe.
#ifndef KVD_SERVICES_NODE_GRPC_CALL_LOG_H_
#define KVD_SERVICES_NODE_GRPC_CALL_LOG_H_

#include <memory>

#include "grpcpp/support/server_interceptor.h"
#include "services/node/metrics.h"

namespace kvd::node {

// Declares kvd_grpc_requests_total and kvd_grpc_request_seconds in `metrics`
// and returns the interceptor factory that fills them.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeGrpcCallLog(std::shared_ptr<Metrics> metrics, bool log_calls);

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_GRPC_CALL_LOG_H_
