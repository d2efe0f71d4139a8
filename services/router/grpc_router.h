// The router's gRPC front end: kvd.v1.Sessions as a node serves it
// (proto/kvd/v1/sessions.proto), each call forwarded to the node that
// should serve it (routing.h) with the tenant from the caller's API key and
// the cluster's router token, as the HTTP front end does:
//   - Generate and CreateSession go to the session's owner, placing a new
//     session first; Generate without a session goes to the least-loaded
//     node. The model of a new session: metadata `kvd-model`, else the one
//     model the cluster serves (INVALID_ARGUMENT when it serves several);
//   - GetSession, DeleteSession and ExportSession go to the owner;
//     ImportSession (which must name its session) is placed like a new
//     session and streamed to its node; ListSessions answers from the
//     directory (ids only);
//   - Cancel is UNIMPLEMENTED here: cancel the Generate call itself.
// A call is re-sent only when its node answered that it ran nothing because
// the session is being moved or moved away (the kvd-retry trailer), to the
// owner the directory then names; never once a message came back.
//
// Thread-safety: Shutdown from any thread.
#ifndef KVD_SERVICES_ROUTER_GRPC_ROUTER_H_
#define KVD_SERVICES_ROUTER_GRPC_ROUTER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/node/auth.h"
#include "services/router/routing.h"

namespace kvd::router {

struct GrpcRouterOptions {
  std::string address = "127.0.0.1:0";  // port 0: one the OS picks
  node::KeyStore keys;                  // clients' API keys
  std::string router_token;             // what the nodes trust
  std::string ca_cert_path;             // nodes' CA when they serve TLS
  // The router's certificate and key (PEM files), shown to nodes (mutual
  // TLS); "" = none.
  std::string tls_cert_path;
  std::string tls_key_path;
  // How long a Generate call refused as "moving"/"moved" (nothing ran) is
  // sent on to the session's new owner.
  absl::Duration moved_retry_budget = absl::Seconds(30);
};

class GrpcRouter {
 public:
  // UNAVAILABLE if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<GrpcRouter>> Start(
      Routing* routing, GrpcRouterOptions options);
  virtual ~GrpcRouter() = default;
  virtual int port() const = 0;
  virtual void Shutdown() = 0;  // idempotent
};

}  // namespace kvd::router

#endif  // KVD_SERVICES_ROUTER_GRPC_ROUTER_H_
