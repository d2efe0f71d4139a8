// The node's OpenAI-compatible HTTP API (DESIGN.md section 6), on the async
// front end (async_http.h: Boost.Beast):
//   POST   /v1/chat/completions   chat (JSON or SSE), + kvd sessions
//   POST   /v1/completions        raw prompt (JSON or SSE), stateless
//   GET    /v1/models             the served model
//   GET    /v1/sessions           the caller's sessions (?limit=&page_token=)
//   GET    /v1/sessions/{id}      one session
//   DELETE /v1/sessions/{id}
//   GET    /v1/sessions/{id}/export   the session file (session_file.h)
//   GET    /metrics               Prometheus text format
//   GET    /healthz, /readyz      liveness; readiness (503 while the queue
//                                 is full)
//
// Sessions: a chat request with `session_id` (body field or X-Session-Id
// header) continues that stored conversation, creating it on first use (it
// is stored once that first turn commits).
// The first turn renders every message of the request with the model's chat
// template; later turns use only the last message (role user) and append it
// to the session's committed tokens, so a client sends just the new message.
// Sessions belong to the tenant of the request's API key; another tenant's
// session id is simply unknown (404) to the REST endpoints.
//
// Admission: at most max_inflight generations run and max_queue wait; more
// get 429 with Retry-After. Requests are validated (openai_request.h) and
// checked against the context (prompt + max_tokens <= context length)
// before they queue. A client that disconnects, streaming or not, stops its
// generation at the next token (the front end sees the connection close at
// once). The request line and headers together are limited to
// max_header_bytes (431), bodies to limits.max_body_bytes (413, judged from
// Content-Length before the body is read); open connections to
// max_connections (503 beyond).
// logprobs keep each step's logits until the end (max_tokens x vocab x 4
// bytes, at most 256 MiB, else 400); in a stream they come in the last
// chunk.
//
// One JSON log line per request goes to stderr: request id, method, path,
// status, tenant, session, tokens, latency.
//
//   HttpServerOptions options;
//   options.port = 8080;
//   KVD_ASSIGN_OR_RETURN(std::unique_ptr<HttpServer> server,
//                        StartHttpServer(runtime.get(), std::move(options)));
//   std::cout << "listening on " << server->port() << "\n";
//   ... server->Stop();
//
// Thread-safety: Stop() may be called from any thread; the runtime must
// outlive the server.
#ifndef KVD_SERVICES_NODE_HTTP_SERVER_H_
#define KVD_SERVICES_NODE_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/migration/migrator.h"
#include "services/node/admission.h"
#include "services/node/auth.h"
#include "services/node/metrics.h"
#include "services/node/openai_request.h"
#include "services/node/runtime.h"

namespace kvd::node {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: the OS picks one (see HttpServer::port())
  // Generations running at once, and waiting for a slot, before 429.
  int max_inflight = 2;
  int max_queue = 16;
  int retry_after_s = 1;  // the Retry-After header of a 429
  // Handler threads (a request holds one while it is handled, a stream
  // while it streams; idle connections hold none); 0: max(128,
  // max_inflight + max_queue + 8), so requests beyond the queue are
  // answered with 429 at once.
  int threads = 0;
  RequestLimits limits;  // body size (413), messages, stop strings, ...
  size_t max_header_bytes = 16 << 10;  // request line + headers (431)
  int max_connections = 10000;         // open at once (503 beyond)
  // A request must arrive whole within read_timeout of its first byte.
  absl::Duration read_timeout = absl::Seconds(10);
  absl::Duration write_timeout = absl::Seconds(30);
  // How long a kept-alive connection may wait for its next request.
  absl::Duration keep_alive_timeout = absl::Seconds(5);
  // New tokens when a request gives no max_tokens (capped by the context).
  int64_t default_max_tokens = 512;
  KeyStore keys;  // empty: open node, tenant "local"
  // PEM files; both or neither. Neither: plain HTTP (loopback, tests).
  std::string tls_cert_path;
  std::string tls_key_path;
  // With TLS: the CA of the client certificates callers may present
  // (AsyncHttpOptions::client_ca_path); the router token then counts only
  // with a router's or node's certificate (KeyStore::TrustingRouters).
  std::string client_ca_path;
  // Moves sessions to other nodes (POST /v1/sessions/ID/migrate); null on a
  // node that runs alone.
  std::shared_ptr<migration::Migrator> migrator;
  // Sets more gauges right before /metrics renders (a cluster node's moves,
  // replication and failover); null: none.
  std::function<void(Metrics&)> more_metrics;
  // Where metrics go; null: the server keeps its own. Shared with the gRPC
  // front end so one /metrics covers both.
  std::shared_ptr<Metrics> metrics;
  // Admission control shared with the gRPC front end; null: the server
  // makes its own from max_inflight and max_queue.
  std::shared_ptr<Admission> admission;
  // When set, GET /metrics needs "Authorization: Bearer <metrics_key>" (401
  // otherwise); empty: /metrics is open, as Prometheus expects by default.
  std::string metrics_key;
  bool log_requests = true;  // one JSON line per request on stderr
};

class HttpServer {
 public:
  virtual ~HttpServer() = default;
  // The bound port.
  virtual int port() const = 0;
  // Stops accepting, closes connections (running generations stop at their
  // next write) and joins the server threads. Idempotent.
  virtual void Stop() = 0;
  virtual Metrics& metrics() = 0;
};

// Binds and starts serving on background threads. UNAVAILABLE if the
// address cannot be bound; INVALID_ARGUMENT for bad options.
absl::StatusOr<std::unique_ptr<HttpServer>> StartHttpServer(
    NodeRuntime* runtime, HttpServerOptions options);

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_HTTP_SERVER_H_
