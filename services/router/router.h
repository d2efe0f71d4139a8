// `kvd router` (DESIGN.md section 7): one address for a cluster's clients.
// It speaks the node's OpenAI-compatible HTTP API and forwards each request
// to the node that should serve it:
//   - a request with a session_id (body field or X-Session-Id) goes to the
//     session's owner in the etcd directory; a session the directory lacks
//     is placed first (placement.h), by a transaction, so two routers racing
//     to place it agree on one node;
//   - a request without one goes to the least-loaded node serving its model;
//   - a session whose owner is not live gets 503 with Retry-After until the
//     failover controller has promoted a replica (services/migration/
//     failover.h) or the owner is back (docs/CLUSTER.md).
// Routers keep nothing about sessions in memory: membership is followed by
// an etcd watch and the directory is read per request, so any number of
// routers agree and a restarted router has lost nothing.
//
// API keys are checked here; the tenant goes to the node in X-Kvd-Tenant
// with the cluster's router token (node::KeyStore::TrustingRouters). SSE is
// passed through as it streams; a client that disconnects closes the
// upstream connection, which stops the node's generation. A request is
// never re-sent once a node may have received it (a turn may have
// committed); only a connection that could not be opened is tried on
// another node, for requests without a session.
//
//   RouterOptions o;
//   o.etcd_endpoint = "127.0.0.1:2379";
//   o.router_token = token;
//   KVD_ASSIGN_OR_RETURN(std::unique_ptr<Router> r, StartRouter(o));
//
// Thread-safety: Stop() from any thread.
#ifndef KVD_SERVICES_ROUTER_ROUTER_H_
#define KVD_SERVICES_ROUTER_ROUTER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/node/auth.h"

namespace kvd::router {

struct RouterOptions {
  std::string host = "127.0.0.1";
  int port = 0;               // 0: the OS picks (Router::port())
  std::string etcd_endpoint;  // host:port
  // etcd over TLS (an https:// endpoint): its CA, and the router's
  // certificate and key as its etcd user (PEM text; kvd router fills them
  // from --ca-cert, --tls-cert, --tls-key).
  std::string etcd_ca_pem;
  std::string etcd_cert_pem;
  std::string etcd_key_pem;
  node::KeyStore keys;       // clients' API keys; none: tenant "local"
  std::string router_token;  // what the nodes trust (--router-token)
  // Handler threads: each forwarded request holds one while it runs (idle
  // connections hold none).
  int threads = 256;
  int max_connections = 10000;  // open at once; 503 beyond
  int retry_after_s = 2;        // Retry-After of a 503 (owner down, no node)
  // kvd.v1.Sessions (grpc_router.h) on this port of `host`; 0: one the OS
  // picks; -1: none.
  int grpc_port = -1;
  absl::Duration upstream_connect_timeout = absl::Seconds(3);
  absl::Duration upstream_timeout = absl::Minutes(10);  // a whole generation
  // How long a turn whose node ran nothing because its session was moving
  // or had moved (a migration) is resent to where the directory says the
  // session lives; the client sees the last refusal after that.
  absl::Duration moved_retry_budget = absl::Seconds(30);
  // PEM CA that signed the nodes' certificates, for https:// nodes.
  std::string ca_cert_path;
  // The router's own certificate and key (PEM files), presented to nodes
  // that verify client certificates (mutual TLS: "router:ID",
  // make_certs.sh --router ID); "" = none.
  std::string tls_cert_path;
  std::string tls_key_path;
  // Per tenant, per minute (a burst of a tenth of it, at least 1, at once):
  // new sessions (directory entries) and migrations; <= 0: no limit. A
  // request over it gets 429 with Retry-After.
  double session_creations_per_minute = 600;
  double migrations_per_minute = 60;
  bool log_requests = true;  // one JSON line per request on stderr
};

class Router {
 public:
  virtual ~Router() = default;
  virtual int port() const = 0;
  virtual int grpc_port() const = 0;  // -1 when off
  virtual void Stop() = 0;            // idempotent
};

// Connects to etcd, loads membership, binds and serves in the background.
absl::StatusOr<std::unique_ptr<Router>> StartRouter(RouterOptions options);

}  // namespace kvd::router

#endif  // KVD_SERVICES_ROUTER_ROUTER_H_
