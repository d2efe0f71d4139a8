// gRPC server reflection v1 (grpc.reflection.v1.ServerReflection), served
// beside the v1alpha that Debian's gRPC provides: current grpcurl and
// Postman ask v1 first. Answers from the descriptors compiled into the
// binary (the generated pool): the services the server registered, files by
// name, files by symbol or extension, and extension numbers.
//
//   grpc::ServerBuilder builder;
//   AddReflectionV1(builder);  // before BuildAndStart
//
// Thread-safety: each stream runs on one of gRPC's threads; streams share
// only the service list, set as BuildAndStart finishes (under a mutex, since
// the server may already take calls then).
#ifndef KVD_SERVICES_NODE_GRPC_REFLECTION_V1_H_
#define KVD_SERVICES_NODE_GRPC_REFLECTION_V1_H_

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "grpcpp/server_builder.h"
#include "proto/grpc/reflection/v1/reflection.grpc.pb.h"

namespace kvd::node {

class GrpcReflectionV1 final
    : public grpc::reflection::v1::ServerReflection::Service {
 public:
  // The fully qualified names list_services answers with.
  void SetServices(std::vector<std::string> services);

  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                               grpc::reflection::v1::ServerReflectionRequest>*
          stream) override;

 private:
  absl::Mutex mu_;
  std::vector<std::string> services_ ABSL_GUARDED_BY(mu_);
};

// Registers reflection v1 with `builder`; list_services then names every
// service the built server has (itself included).
void AddReflectionV1(grpc::ServerBuilder& builder);

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_GRPC_REFLECTION_V1_H_
