// The node's gRPC front end: kvd.v1.Sessions (proto/kvd/v1/sessions.proto)
// and kvd.v1.Health over a NodeRuntime, and the server `kvd serve` starts,
// which also offers the standard grpc.health.v1 service and server
// reflection, and logs and counts every call (grpc_call_log.h).
//
// Every Sessions call authenticates its `authorization` metadata against the
// KeyStore and acts as that tenant; the health services are open (load
// balancers probe them). A Generate is checked as HTTP checks a request
// (same bounds), then admitted by the Admission it shares with the HTTP
// front end (RESOURCE_EXHAUSTED with grpc-retry-pushback-ms when full), and
// only then sends its `started` event; a turn on a session that is running
// one is ABORTED at once, as HTTP's 409. It stops at the next decode step
// when the client cancels, its deadline passes, Cancel names it, or the
// server shuts down; the turn then commits nothing.
//
//   GrpcServerOptions options;
//   options.address = "0.0.0.0:7070";
//   KVD_ASSIGN_OR_RETURN(KeyStore keys, KeyStore::Load(keys_file));
//   KVD_ASSIGN_OR_RETURN(std::unique_ptr<GrpcServer> server,
//                        StartGrpcServer(runtime.get(), std::move(keys),
//                                        options));
//   std::printf("listening on port %d\n", server->port());
//   ...
//   server->Shutdown(absl::Seconds(5));
//
// Thread-safety: the server runs calls on gRPC's thread pool; GrpcServer's
// methods may be called from any thread. The runtime must outlive the
// server.
#ifndef KVD_SERVICES_NODE_GRPC_SERVICE_H_
#define KVD_SERVICES_NODE_GRPC_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/kvd/v1/health.grpc.pb.h"
#include "proto/kvd/v1/sessions.grpc.pb.h"
#include "services/migration/migrator.h"
#include "services/node/admission.h"
#include "services/node/auth.h"
#include "services/node/grpc_health_v1.h"
#include "services/node/metrics.h"
#include "services/node/runtime.h"

namespace kvd::node {

struct GrpcServerOptions {
  // host:port to listen on; port 0 picks a free port (GrpcServer::port()).
  std::string address = "127.0.0.1:0";
  // Largest message the server accepts, refused by gRPC before any work
  // (RESOURCE_EXHAUSTED): HTTP's body limit (RequestLimits, 1 MiB) plus room
  // for the fields beside a 1 MiB ImportSession chunk, so sessions of any
  // size still import as a stream of chunks.
  int max_receive_bytes = (1 << 20) + (64 << 10);
  // HTTP/2 streams one client connection may have open at once.
  int max_concurrent_streams = 100;
  // Generations running at once and waiting for a slot: shared with the HTTP
  // front end when `kvd serve` runs both; null: the server makes its own
  // from max_inflight and max_queue.
  std::shared_ptr<Admission> admission;
  int max_inflight = 4;
  int max_queue = 32;
  // A refused Generate's grpc-retry-pushback-ms trailer (HTTP's Retry-After).
  int retry_after_ms = 1000;
  // Where per-method call counts and latencies go; shared with the HTTP
  // front end so one /metrics covers both. Null: the server keeps its own.
  std::shared_ptr<Metrics> metrics;
  bool log_calls = true;  // one JSON line per call on stderr
  // Server pings an idle connection every keepalive_time and drops it if
  // the ping is not answered within keepalive_timeout.
  absl::Duration keepalive_time = absl::Minutes(2);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  // PEM files; both or neither. Neither: plaintext (loopback, tests).
  std::string tls_cert_path;
  std::string tls_key_path;
  // With TLS: PEM of the CA whose client certificates callers may present
  // (mutual TLS). One it did not sign fails the handshake; a verified one
  // names the caller (peer_identity.h), which the router token and
  // kvd.v1.Migration then require. "" = no client certificates.
  std::string client_ca_path;
  // Largest session file ImportSession accepts (RESOURCE_EXHAUSTED beyond).
  int64_t max_import_bytes = int64_t{4} << 30;
  // Bytes per ExportSession message.
  int64_t export_chunk_bytes = 1 << 20;
  // Moves sessions (MigrateSession); null on a node that runs alone.
  std::shared_ptr<migration::Migrator> migrator;
  // More services on the same server (a cluster node's kvd.v1.Migration);
  // not owned, they outlive the server.
  std::vector<grpc::Service*> extra_services;
};

// kvd.v1.Sessions over a NodeRuntime.
class SessionsService final : public v1::Sessions::Service {
 public:
  SessionsService(NodeRuntime* runtime, KeyStore keys,
                  GrpcServerOptions options);

  grpc::Status CreateSession(grpc::ServerContext* ctx,
                             const v1::CreateSessionRequest* request,
                             v1::Session* response) override;
  grpc::Status GetSession(grpc::ServerContext* ctx,
                          const v1::GetSessionRequest* request,
                          v1::Session* response) override;
  grpc::Status ListSessions(grpc::ServerContext* ctx,
                            const v1::ListSessionsRequest* request,
                            v1::ListSessionsResponse* response) override;
  grpc::Status DeleteSession(grpc::ServerContext* ctx,
                             const v1::DeleteSessionRequest* request,
                             v1::DeleteSessionResponse* response) override;
  grpc::Status Generate(
      grpc::ServerContext* ctx, const v1::GenerateRequest* request,
      grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Cancel(grpc::ServerContext* ctx,
                      const v1::CancelRequest* request,
                      v1::CancelResponse* response) override;
  grpc::Status ExportSession(
      grpc::ServerContext* ctx, const v1::ExportSessionRequest* request,
      grpc::ServerWriter<v1::ExportSessionResponse>* writer) override;
  grpc::Status ImportSession(
      grpc::ServerContext* ctx,
      grpc::ServerReader<v1::ImportSessionRequest>* reader,
      v1::Session* response) override;
  grpc::Status MigrateSession(grpc::ServerContext* ctx,
                              const v1::MigrateSessionRequest* request,
                              v1::MigrateSessionResponse* response) override;

  // Makes every running and later Generate stop (server shutdown).
  void StopAll() { stopping_.store(true); }

 private:
  struct Running {
    std::string tenant;
    std::atomic<bool> cancel{false};
  };

  absl::StatusOr<std::string> Tenant(const grpc::ServerContext* ctx) const;
  // The checks HTTP makes before a request queues: sampling bounds, input
  // shape, session id. Returns the engine request for RunGenerate.
  absl::StatusOr<engine::GenerateRequest> CheckGenerate(
      const v1::GenerateRequest& request) const;
  // The status a Generate that did not finish returns: a stop by shutdown
  // is UNAVAILABLE, by the deadline DEADLINE_EXCEEDED, and a retryable
  // RESOURCE_EXHAUSTED carries grpc-retry-pushback-ms.
  grpc::Status FailedGenerate(grpc::ServerContext* ctx,
                              const absl::Status& status);
  absl::StatusOr<v1::GenerateFinished> RunGenerate(
      grpc::ServerContext* ctx, const std::string& tenant,
      const v1::GenerateRequest& request, engine::GenerateRequest g,
      const Running& running, grpc::ServerWriter<v1::GenerateResponse>* writer);

  NodeRuntime* const runtime_;
  const KeyStore keys_;
  const GrpcServerOptions options_;
  std::shared_ptr<Admission> admission_;
  std::atomic<bool> stopping_{false};

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Running>> running_
      ABSL_GUARDED_BY(mu_);
};

// kvd.v1.Health: SERVING once the model is loaded (a runtime exists only
// then), NOT_SERVING while the server shuts down.
class HealthService final : public v1::Health::Service {
 public:
  explicit HealthService(NodeRuntime* runtime) : runtime_(runtime) {}
  grpc::Status Check(grpc::ServerContext* ctx, const v1::HealthRequest* request,
                     v1::HealthResponse* response) override;
  void SetNotServing() { serving_.store(false); }

 private:
  NodeRuntime* const runtime_;
  std::atomic<bool> serving_{true};
};

// A running server; destroying it shuts it down.
class GrpcServer {
 public:
  GrpcServer(std::unique_ptr<SessionsService> sessions,
             std::unique_ptr<HealthService> health,
             std::unique_ptr<GrpcHealthV1> health_v1,
             std::unique_ptr<grpc::Server> server, int port);
  ~GrpcServer();

  // The port bound (the chosen one when the address asked for port 0).
  int port() const { return port_; }
  // Stops accepting calls, stops running generations (nothing of their
  // turns is committed) and waits up to `grace` for calls to finish before
  // cancelling the rest. Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(5));
  // Blocks until the server has shut down.
  void Wait();

 private:
  std::unique_ptr<SessionsService> sessions_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<GrpcHealthV1> health_v1_;
  std::unique_ptr<grpc::Server> server_;
  const int port_;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

// Builds and starts the server. INVALID_ARGUMENT for inconsistent options
// (one TLS file without the other, non-positive limits), NOT_FOUND for an
// unreadable TLS file, UNAVAILABLE if the address cannot be bound.
absl::StatusOr<std::unique_ptr<GrpcServer>> StartGrpcServer(
    NodeRuntime* runtime, KeyStore keys, GrpcServerOptions options);

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_GRPC_SERVICE_H_
