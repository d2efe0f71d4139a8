// The HTTP front end of node and router (DESIGN.md section 6): Boost.Beast on
// Asio. Connections are served asynchronously on one I/O thread, so idle
// keep-alive connections and slow clients cost a socket, not a thread;
// handlers run on a pool of worker threads, and only while they run (a
// generation blocks its worker, an idle connection blocks nothing). Cheap
// handlers (/healthz, /metrics) run on the I/O thread and never wait for a
// worker.
//
// Limits, all enforced before the bytes they limit are read:
//   - the request line and headers together: max_header_bytes (431);
//   - the body: max_body_bytes, judged from Content-Length first (413);
//   - a request must arrive whole within read_timeout of its first byte,
//     a kept-alive connection may idle idle_timeout between requests, and
//     a client must take each piece of a response within write_timeout;
//   - at most max_connections open connections; one more is answered 503
//     with Retry-After and closed.
// A client that closes its connection while its handler runs is seen at
// once (HttpRequest::peer_closed), streaming or not, so a generation for
// nobody stops at its next token.
//
//   AsyncHttpServer server(options);
//   server.Route("GET", "/healthz", [](const HttpRequest&, HttpResponse& r) {
//     r.set_content("ok\n", "text/plain");
//   }, /*on_io_thread=*/true);
//   KVD_RETURN_IF_ERROR(server.Start());   // server.port()
//   ...
//   server.Stop();
//
// Thread-safety: Route before Start; Start and Stop from one thread;
// port() and connections() from any.
#ifndef KVD_SERVICES_NODE_ASYNC_HTTP_H_
#define KVD_SERVICES_NODE_ASYNC_HTTP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kvd::node {

class HttpRequest {
 public:
  std::string method;
  std::string path;                                // without the query string
  std::string target;                              // as sent
  std::multimap<std::string, std::string> params;  // the query, decoded
  // The route's regex groups: [0] the whole path, [1] the first group, ...
  std::vector<std::string> matches;
  std::string body;
  std::string remote_addr;
  int remote_port = 0;
  // The common name of the client certificate the TLS handshake verified
  // against AsyncHttpOptions::client_ca_path; "" when none was presented.
  std::string peer_certificate_name;
  // Names lower-cased, in the order received.
  std::vector<std::pair<std::string, std::string>> headers;

  bool has_header(absl::string_view name) const;
  // The first value of header `name` (any case), or "".
  std::string get_header_value(absl::string_view name) const;
  bool has_param(const std::string& name) const;
  std::string get_param_value(const std::string& name) const;
  // True once the client has closed its connection (seen by the server
  // while the handler runs).
  bool peer_closed() const {
    return peer_closed_ != nullptr && peer_closed_->load();
  }

  std::shared_ptr<std::atomic<bool>> peer_closed_;
};

// Where a streamed response's pieces go (chunked transfer encoding).
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  // Sends one piece and waits until it is written; false once the client is
  // gone or did not take it within the write timeout (stop producing).
  virtual bool write(const char* data, size_t size) = 0;
};

class HttpResponse {
 public:
  int status = 200;
  void set_header(std::string name, std::string value);
  void set_content(std::string body, std::string content_type);
  // The body is streamed: after the handler returns, `provider` runs on the
  // same thread and writes the pieces; the response ends when it returns.
  void set_chunked_content_provider(std::string content_type,
                                    std::function<void(ChunkSink&)> provider);

  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string content_type;
  std::function<void(ChunkSink&)> provider;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponse&)>;

struct AsyncHttpOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: the OS picks one (port())
  // Handlers running at once; more wait for a worker (their connections
  // stay open, costing no thread).
  int worker_threads = 128;
  size_t max_header_bytes = 16 << 10;
  size_t max_body_bytes = 1 << 20;
  absl::Duration read_timeout = absl::Seconds(10);
  absl::Duration idle_timeout = absl::Seconds(30);
  absl::Duration write_timeout = absl::Seconds(30);
  int max_connections = 10000;
  // PEM files, both or neither: HTTPS.
  std::string tls_cert_path;
  std::string tls_key_path;
  // With HTTPS: PEM of the CA whose client certificates clients may present
  // (mutual TLS). A certificate it did not sign fails the handshake; one it
  // did names the client to handlers (HttpRequest::peer_certificate_name).
  // Clients without one are served too (health checks, metrics scrapes):
  // handlers decide what needs an identity. "" = no client certificates.
  std::string client_ca_path;
  // Before each routed request's handler, on the thread that runs it (e.g.
  // a per-request log's start).
  std::function<void(const HttpRequest&)> before;
  // After each response was produced (a stream: after it ended), on the
  // same thread, e.g. the request log line.
  std::function<void(const HttpRequest&, const HttpResponse&)> after;
};

class AsyncHttpServer {
 public:
  explicit AsyncHttpServer(AsyncHttpOptions options);
  ~AsyncHttpServer();

  // `pattern`: a regex the whole path must match; its groups become
  // HttpRequest::matches. `on_io_thread`: a cheap handler that must answer
  // even when every worker is busy (health, metrics); it must not block.
  void Route(std::string method, std::string pattern, HttpHandler handler,
             bool on_io_thread = false);

  // Binds (UNAVAILABLE naming the address if it cannot) and serves in the
  // background. INVALID_ARGUMENT for unreadable TLS files.
  absl::Status Start();
  int port() const { return port_.load(); }
  int64_t connections() const;
  // Stops accepting, closes every connection (running handlers see their
  // writes fail and their clients gone) and joins the threads. Idempotent.
  void Stop();

  class Impl;  // the connections' state (async_http.cc)

 private:
  std::unique_ptr<Impl> impl_;
  std::atomic<int> port_{0};
};

// Raises this process's open-file limit to its hard limit: each connection
// is a file descriptor, and the default soft limit (often 1024) is below
// what a server with thousands of idle keep-alive clients needs.
void RaiseOpenFileLimit();

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_ASYNC_HTTP_H_
