#include "services/router/router.h"

#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "services/cluster/directory.h"
#include "services/cluster/etcd_client.h"
#include "services/cluster/membership.h"
#include "services/cluster/node_info.h"
#include "services/cluster/prefix_watch.h"
#include "services/node/async_http.h"
#include "services/node/openai_request.h"
#include "services/router/grpc_router.h"
#include "services/router/placement.h"
#include "services/router/routing.h"

namespace kvd::router {
namespace {

using nlohmann::json;

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t)
      .count();
}

std::string NewRequestId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("req-%016x", rng());
}

// What one forwarded request's upstream thread hands the client's thread:
// the node's status and headers, then its body in pieces as they arrive.
struct Pipe {
  absl::Mutex mu;
  bool headers = false;  // status and the headers below are set
  bool done = false;     // the upstream exchange ended (ok or not)
  bool client_gone = false;
  int status = 0;
  std::string content_type, retry_after;
  std::string not_run;  // the node's X-Kvd-Retry: it ran nothing
  std::deque<std::string> chunks;
  httplib::Error error = httplib::Error::Success;
  httplib::Client* client = nullptr;  // while the exchange runs

  // The client left: stop the exchange with the node at once (closing the
  // connection stops the node's generation).
  void Abandon() {
    absl::MutexLock lock(&mu);
    AbandonLocked();
  }

  // Waits until `until` holds; a client that leaves meanwhile abandons the
  // exchange (and `until` should then hold soon: the exchange ends).
  void AwaitWatchingClient(const absl::Condition& until,
                           const node::HttpRequest& req) {
    absl::MutexLock lock(&mu);
    while (!mu.AwaitWithTimeout(until, absl::Milliseconds(100))) {
      if (req.peer_closed() && !client_gone) AbandonLocked();
    }
  }

 private:
  void AbandonLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    client_gone = true;
    if (client != nullptr) client->stop();
  }
};

class RouterImpl : public Router {
 public:
  explicit RouterImpl(RouterOptions options) : options_(std::move(options)) {}
  ~RouterImpl() override { Stop(); }

  absl::Status Init();
  int port() const override { return port_; }
  int grpc_port() const override { return grpc_ ? grpc_->port() : -1; }
  void Stop() override;

 private:
  void Routes();
  void HandleGenerate(const node::HttpRequest& req, node::HttpResponse& res);
  void HandleSession(const node::HttpRequest& req, node::HttpResponse& res,
                     const std::string& suffix);
  void HandleListSessions(const node::HttpRequest& req,
                          node::HttpResponse& res);
  void HandleModels(const node::HttpRequest& req, node::HttpResponse& res);

  absl::StatusOr<std::string> Tenant(const node::HttpRequest& req);
  enum class Forwarded {
    kAnswered,  // res holds the node's answer (or an error about it)
    kNotSent,   // no connection could be opened: try elsewhere
    kNotRun,    // the node ran nothing and says where to look (res holds
                // its 409): resend after a fresh directory lookup
  };
  // Forwards `req` to `target`. `not_run` gets the node's reason with
  // kNotRun ("moving" or "moved").
  Forwarded Forward(const Target& target, const std::string& tenant,
                    const node::HttpRequest& req, node::HttpResponse& res,
                    const std::string& session, std::string* not_run = nullptr);
  // A session's turn: to its owner, resent while the node says it ran
  // nothing because the session is moving or moved (a migration), until
  // options_.moved_retry_budget is spent.
  void ForwardTurn(Target target, const std::string& tenant,
                   const std::string& session, const std::string& model,
                   const node::HttpRequest& req, node::HttpResponse& res,
                   std::string* node_id, std::string* route);
  void SendError(node::HttpResponse& res, const absl::Status& status);
  // `routing_s`: from the request's arrival until it was sent to the node
  // (authentication, parsing, directory and placement): what the router
  // adds before the node sees it.
  void Log(const node::HttpRequest& req, const node::HttpResponse& res,
           const std::string& tenant, const std::string& session,
           const std::string& node, const std::string& route,
           std::chrono::steady_clock::time_point start, double routing_s);

  const RouterOptions options_;
  std::unique_ptr<Routing> routing_;
  std::unique_ptr<node::AsyncHttpServer> server_;
  std::unique_ptr<GrpcRouter> grpc_;
  int port_ = 0;
  absl::Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
};

absl::Status RouterImpl::Init() {
  if (options_.router_token.empty()) {
    return absl::InvalidArgumentError(
        "the router needs --router-token (or $KVD_ROUTER_TOKEN): the secret "
        "its nodes trust");
  }
  absl::StatusOr<std::unique_ptr<Routing>> routing = Routing::Connect(
      cluster::EtcdClientOptions{.endpoint = options_.etcd_endpoint,
                                 .ca_pem = options_.etcd_ca_pem,
                                 .cert_pem = options_.etcd_cert_pem,
                                 .key_pem = options_.etcd_key_pem});
  if (!routing.ok()) return routing.status();
  routing_ = std::move(*routing);
  routing_->LimitCreations(options_.session_creations_per_minute,
                           options_.session_creations_per_minute / 10);
  routing_->LimitMigrations(options_.migrations_per_minute,
                            options_.migrations_per_minute / 10);

  node::AsyncHttpOptions o;
  o.host = options_.host;
  o.port = options_.port;
  o.worker_threads = options_.threads;
  o.max_body_bytes = size_t{16} << 20;
  o.max_connections = options_.max_connections;
  server_ = std::make_unique<node::AsyncHttpServer>(std::move(o));
  Routes();
  if (absl::Status s = server_->Start(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("the router ", s.message()));
  }
  port_ = server_->port();
  if (options_.grpc_port >= 0) {
    GrpcRouterOptions g;
    g.address = absl::StrCat(options_.host, ":", options_.grpc_port);
    g.keys = options_.keys;
    g.router_token = options_.router_token;
    g.ca_cert_path = options_.ca_cert_path;
    g.tls_cert_path = options_.tls_cert_path;
    g.tls_key_path = options_.tls_key_path;
    g.moved_retry_budget = options_.moved_retry_budget;
    absl::StatusOr<std::unique_ptr<GrpcRouter>> grpc =
        GrpcRouter::Start(routing_.get(), std::move(g));
    if (!grpc.ok()) return grpc.status();
    grpc_ = std::move(*grpc);
  }
  return absl::OkStatus();
}

void RouterImpl::Stop() {
  {
    absl::MutexLock lock(&stop_mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (server_) server_->Stop();
  if (grpc_) grpc_->Shutdown();
  routing_.reset();
}

void RouterImpl::Routes() {
  server_->Route(
      "GET", "/healthz",
      [](const node::HttpRequest&, node::HttpResponse& res) {
        res.set_content("ok\n", "text/plain");
      },
      /*on_io_thread=*/true);
  server_->Route(
      "GET", "/readyz",
      [this](const node::HttpRequest&, node::HttpResponse& res) {
        const size_t live = routing_->LiveNodes().size();
        if (!routing_->synced() || live == 0) {
          res.status = 503;
          res.set_content(absl::StrCat(!routing_->synced()
                                           ? "not ready: etcd is unreachable\n"
                                           : "not ready: no live nodes\n"),
                          "text/plain");
          return;
        }
        res.set_content(absl::StrCat("ready: ", live, " nodes\n"),
                        "text/plain");
      },
      /*on_io_thread=*/true);
  server_->Route(
      "GET", "/metrics",
      [this](const node::HttpRequest&, node::HttpResponse& res) {
        node::Metrics& m = routing_->metrics();
        m.Set("kvd_router_live_nodes", {}, routing_->LiveNodes().size());
        m.Set("kvd_router_draining_nodes", {}, routing_->Drained().size());
        m.Set("kvd_router_membership_synced", {}, routing_->synced() ? 1 : 0);
        m.Set("kvd_router_membership_resyncs", {}, routing_->resyncs());
        res.set_content(m.Render(), "text/plain; version=0.0.4");
      },
      /*on_io_thread=*/true);
  server_->Route("GET", "/v1/models",
                 [this](const node::HttpRequest& req, node::HttpResponse& res) {
                   HandleModels(req, res);
                 });
  for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
    server_->Route(
        "POST", path,
        [this](const node::HttpRequest& req, node::HttpResponse& res) {
          HandleGenerate(req, res);
        });
  }
  server_->Route("GET", "/v1/sessions",
                 [this](const node::HttpRequest& req, node::HttpResponse& res) {
                   HandleListSessions(req, res);
                 });
  server_->Route("GET", R"(/v1/sessions/([^/]+))",
                 [this](const node::HttpRequest& req, node::HttpResponse& res) {
                   HandleSession(req, res, "");
                 });
  server_->Route("DELETE", R"(/v1/sessions/([^/]+))",
                 [this](const node::HttpRequest& req, node::HttpResponse& res) {
                   HandleSession(req, res, "");
                 });
  server_->Route("POST", R"(/v1/sessions/([^/]+)/migrate)",
                 [this](const node::HttpRequest& req, node::HttpResponse& res) {
                   HandleSession(req, res, "/migrate");
                 });
  server_->Route("GET", R"(/v1/sessions/([^/]+)/export)",
                 [this](const node::HttpRequest& req, node::HttpResponse& res) {
                   HandleSession(req, res, "/export");
                 });
}

void RouterImpl::SendError(node::HttpResponse& res,
                           const absl::Status& status) {
  const node::ApiError e = node::ApiErrorFromStatus(status);
  res.status = e.http_status;
  if (e.http_status == 503 || e.http_status == 429) {
    const absl::optional<absl::Cord> limited =
        status.GetPayload(kRetryAfterPayload);
    res.set_header("Retry-After", limited.has_value()
                                      ? std::string(*limited)
                                      : absl::StrCat(options_.retry_after_s));
  }
  if (e.http_status == 401) res.set_header("WWW-Authenticate", "Bearer");
  res.set_content(node::ApiErrorJson(e), "application/json");
}

absl::StatusOr<std::string> RouterImpl::Tenant(const node::HttpRequest& req) {
  return options_.keys.TenantForBearer(req.get_header_value("Authorization"));
}

RouterImpl::Forwarded RouterImpl::Forward(const Target& target,
                                          const std::string& tenant,
                                          const node::HttpRequest& req,
                                          node::HttpResponse& res,
                                          const std::string& session,
                                          std::string* not_run) {
  auto pipe = std::make_shared<Pipe>();
  httplib::Headers headers = {
      {"Authorization", absl::StrCat("Bearer ", options_.router_token)},
      {node::kForwardedTenantHeader, tenant},
  };
  std::string request_id = req.get_header_value("X-Request-Id");
  if (request_id.empty()) request_id = NewRequestId();
  headers.emplace("X-Request-Id", request_id);
  for (const char* h : {"Content-Type", "Accept", "X-Session-Id"}) {
    if (req.has_header(h)) headers.emplace(h, req.get_header_value(h));
  }
  const std::string path = req.target;  // as the client sent it, query too
  const std::string url = target.node.http_url;
  if (!options_.ca_cert_path.empty() && !absl::StartsWith(url, "https://")) {
    // The router token must not travel in the clear, nor to a "node" that
    // merely wrote a plain URL into etcd.
    routing_->metrics().Add("kvd_router_errors_total",
                            {{"kind", "node_without_tls"}});
    SendError(res, absl::UnavailableError(absl::StrCat(
                       "node '", target.node.id, "' advertises ", url,
                       ", not https, while this router requires TLS "
                       "(--ca-cert); start the node with --tls-cert")));
    return Forwarded::kAnswered;
  }
  const std::string method = req.method, body = req.body;
  const RouterOptions& o = options_;
  const auto connect_s = absl::ToInt64Seconds(o.upstream_connect_timeout);
  const auto timeout_s = absl::ToInt64Seconds(o.upstream_timeout);
  const std::string ca = o.ca_cert_path;
  const std::string cert = o.tls_cert_path, key = o.tls_key_path;
  const auto start = std::chrono::steady_clock::now();
  routing_->placement().Started(target.node.id);
  // The exchange with the node runs on its own thread, so that this one
  // can pass the body on as it arrives (SSE) and notice a client that
  // left (its write fails), which then ends the upstream exchange too.
  std::thread([pipe, url, method, path, body, headers, connect_s, timeout_s, ca,
               cert, key] {
    // With a certificate of its own, the router shows it to the node
    // (mutual TLS): the node takes the router token only with it.
    httplib::Client cli(url, cert, key);
    cli.set_connection_timeout(connect_s, 0);
    cli.set_read_timeout(timeout_s, 0);
    cli.set_write_timeout(timeout_s, 0);
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
    if (!ca.empty()) cli.set_ca_cert_path(ca.c_str());
#endif
    httplib::Request up;
    up.method = method;
    up.path = path;
    up.headers = headers;
    up.body = body;
    up.response_handler = [pipe](const httplib::Response& r) {
      absl::MutexLock lock(&pipe->mu);
      pipe->status = r.status;
      pipe->content_type = r.get_header_value("Content-Type");
      pipe->retry_after = r.get_header_value("Retry-After");
      pipe->not_run = r.get_header_value(node::kRetryHeader);
      pipe->headers = true;
      return !pipe->client_gone;
    };
    up.content_receiver = [pipe](const char* data, size_t n, uint64_t,
                                 uint64_t) {
      absl::MutexLock lock(&pipe->mu);
      if (pipe->client_gone) return false;
      pipe->chunks.emplace_back(data, n);
      return true;
    };
    httplib::Response r;
    httplib::Error error = httplib::Error::Canceled;
    bool go = false;
    {
      absl::MutexLock lock(&pipe->mu);
      go = !pipe->client_gone;
      if (go) pipe->client = &cli;
    }
    if (go) cli.send(up, r, error);
    absl::MutexLock lock(&pipe->mu);
    pipe->client = nullptr;
    pipe->error = error;
    pipe->done = true;
  }).detach();

  {
    // A client that leaves while the node has not answered yet ends the
    // upstream exchange too.
    pipe->AwaitWatchingClient(
        absl::Condition(
            +[](Pipe* p) { return p->headers || p->done; }, pipe.get()),
        req);
  }
  routing_->metrics().Observe("kvd_router_upstream_seconds", {},
                              SecondsSince(start));
  bool headers_came, sse;
  httplib::Error error;
  {
    absl::MutexLock lock(&pipe->mu);
    headers_came = pipe->headers;
    error = pipe->error;
    sse = absl::StartsWith(pipe->content_type, "text/event-stream");
    if (headers_came) {
      res.status = pipe->status;
      if (!pipe->retry_after.empty()) {
        res.set_header("Retry-After", pipe->retry_after);
      }
    }
  }
  res.set_header("X-Request-Id", request_id);
  res.set_header("X-Kvd-Node", target.node.id);
  if (!headers_came) {
    routing_->placement().Finished(target.node.id);
    if (error == httplib::Error::Connection) {
      routing_->metrics().Add("kvd_router_errors_total",
                              {{"kind", "upstream_connect"}});
      if (session.empty()) return Forwarded::kNotSent;  // try another node
      SendError(res, absl::UnavailableError(absl::StrCat(
                         "node '", target.node.id, "', which holds session '",
                         session,
                         "', does not accept connections; retry after a "
                         "while")));
      return Forwarded::kAnswered;
    }
    routing_->metrics().Add("kvd_router_errors_total",
                            {{"kind", "upstream_failed"}});
    SendError(res, absl::UnavailableError(absl::StrCat(
                       "node '", target.node.id, "' failed before answering (",
                       httplib::to_string(error), ")",
                       session.empty()
                           ? std::string()
                           : "; the turn may or may not have committed: GET "
                             "the session to see before you send it again")));
    return Forwarded::kAnswered;
  }
  if (sse) {
    const std::string node = target.node.id;
    res.set_chunked_content_provider(
        "text/event-stream", [this, pipe, node](node::ChunkSink& sink) {
          for (bool done = false; !done;) {
            std::deque<std::string> chunks;
            {
              absl::MutexLock lock(&pipe->mu);
              pipe->mu.Await(absl::Condition(
                  +[](Pipe* p) { return !p->chunks.empty() || p->done; },
                  pipe.get()));
              chunks.swap(pipe->chunks);
              done = pipe->done;
            }
            bool gone = false;
            for (const std::string& c : chunks) {
              if (!sink.write(c.data(), c.size())) {
                gone = true;
                break;
              }
            }
            if (gone) break;
          }
          pipe->Abandon();  // if it ended early (the client left)
          routing_->placement().Finished(node);
        });
    return Forwarded::kAnswered;
  }
  std::string content;
  {
    // Nothing goes to the client until the node is done, so its leaving
    // is seen on its connection.
    pipe->AwaitWatchingClient(absl::Condition(&pipe->done), req);
    absl::MutexLock lock(&pipe->mu);
    for (const std::string& c : pipe->chunks) content += c;
    res.set_content(std::move(content), pipe->content_type.empty()
                                            ? "application/json"
                                            : pipe->content_type.c_str());
    if (pipe->status == 409 && !pipe->not_run.empty() && not_run != nullptr) {
      *not_run = pipe->not_run;
      routing_->placement().Finished(target.node.id);
      return Forwarded::kNotRun;
    }
  }
  routing_->placement().Finished(target.node.id);
  return Forwarded::kAnswered;
}

void RouterImpl::HandleGenerate(const node::HttpRequest& req,
                                node::HttpResponse& res) {
  const auto start = std::chrono::steady_clock::now();
  std::string tenant, session, node_id, route;
  double routing_s = -1;
  auto finish = [&](const absl::Status& s) {
    if (!s.ok()) SendError(res, s);
    routing_->metrics().Add("kvd_router_requests_total",
                            {{"route", route.empty() ? "refused" : route},
                             {"code", absl::StrCat(res.status)}});
    Log(req, res, tenant, session, node_id, route, start, routing_s);
  };
  absl::StatusOr<std::string> t = Tenant(req);
  if (!t.ok()) return finish(t.status());
  tenant = *t;
  const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object()) {
    return finish(node::RequestError(
        "",
        "the request body must be a JSON object (Content-Type: "
        "application/json)"));
  }
  if (!body.contains("model") || !body["model"].is_string()) {
    return finish(node::RequestError(
        "model", "'model' is required (see GET /v1/models)"));
  }
  const std::string model = body["model"].get<std::string>();
  if (body.contains("session_id")) {
    if (!body["session_id"].is_string()) {
      return finish(node::RequestError("session_id", "must be a string"));
    }
    session = body["session_id"].get<std::string>();
  } else {
    session = req.get_header_value("X-Session-Id");
  }
  if (!session.empty()) {
    if (absl::Status s = node::ValidateSessionId(session, "session_id");
        !s.ok()) {
      return finish(s);
    }
    absl::StatusOr<Target> target = routing_->Place(tenant, session, model);
    if (!target.ok()) return finish(target.status());
    node_id = target->node.id;
    route = target->route;
    routing_s = SecondsSince(start);
    ForwardTurn(*target, tenant, session, model, req, res, &node_id, &route);
    return finish(absl::OkStatus());
  }
  // Stateless: a node that could not even be connected to got nothing, so
  // another may take the request.
  std::set<std::string> tried;
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<Target> target = routing_->Stateless(model, tried);
    if (!target.ok()) {
      return finish(attempt == 0 ? target.status()
                                 : absl::UnavailableError(absl::StrCat(
                                       "no node serving model '", model,
                                       "' accepts connections; retry later")));
    }
    node_id = target->node.id;
    route = target->route;
    routing_s = SecondsSince(start);
    if (Forward(*target, tenant, req, res, "") != Forwarded::kNotSent) {
      return finish(absl::OkStatus());
    }
    routing_->metrics().Add("kvd_router_retries_total", {});
    tried.insert(target->node.id);
  }
  finish(absl::UnavailableError(absl::StrCat(
      "no node serving model '", model, "' accepts connections; retry later")));
}

void RouterImpl::ForwardTurn(Target target, const std::string& tenant,
                             const std::string& session,
                             const std::string& model,
                             const node::HttpRequest& req,
                             node::HttpResponse& res, std::string* node_id,
                             std::string* route) {
  const absl::Time give_up = absl::Now() + options_.moved_retry_budget;
  absl::Duration pause = absl::Milliseconds(50);
  for (;;) {
    std::string not_run;
    if (Forward(target, tenant, req, res, session, &not_run) !=
            Forwarded::kNotRun ||
        absl::Now() >= give_up) {
      return;  // res holds the answer (or the last refusal)
    }
    // The node ran nothing: the session is being moved (wait a moment for
    // the move to finish) or lives elsewhere now (look again at once).
    routing_->metrics().Add("kvd_router_retries_total", {{"reason", not_run}});
    if (not_run == "moving") {
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Seconds(1));
    }
    absl::StatusOr<Target> next = routing_->Place(tenant, session, model);
    if (!next.ok()) return;  // keep the node's refusal
    target = *std::move(next);
    *node_id = target.node.id;
    *route = target.route;
    res = node::HttpResponse();
  }
}

void RouterImpl::HandleSession(const node::HttpRequest& req,
                               node::HttpResponse& res,
                               const std::string& suffix) {
  const auto start = std::chrono::steady_clock::now();
  std::string tenant, node_id, route;
  const std::string session = req.matches[1];
  auto finish = [&](const absl::Status& s) {
    if (!s.ok()) SendError(res, s);
    routing_->metrics().Add("kvd_router_requests_total",
                            {{"route", route.empty() ? "refused" : route},
                             {"code", absl::StrCat(res.status)}});
    Log(req, res, tenant, session, node_id, route, start, -1);
  };
  absl::StatusOr<std::string> t = Tenant(req);
  if (!t.ok()) return finish(t.status());
  tenant = *t;
  if (absl::Status s = node::ValidateSessionId(session, "session_id");
      !s.ok()) {
    return finish(s);
  }
  if (suffix == "/migrate") {
    if (absl::Status s = routing_->TakeMigration(tenant); !s.ok()) {
      return finish(s);
    }
  }
  cluster::DirectoryEntry entry;
  absl::StatusOr<Target> target = routing_->Owner(tenant, session, "", &entry);
  if (!target.ok()) return finish(target.status());
  node_id = target->node.id;
  route = target->route;
  if (req.method == "DELETE") {
    // The directory forgets the session first (if it did not change since
    // it was read), so no turn can start it again on its node between the
    // node's delete and the directory's.
    routing_->metrics().Add("kvd_router_directory_ops_total",
                            {{"op", "remove"}});
    if (absl::Status removed =
            routing_->directory().Remove(tenant, session, entry);
        !removed.ok()) {
      return finish(removed);
    }
  }
  Forward(*target, tenant, req, res, session);
  finish(absl::OkStatus());
}

void RouterImpl::HandleListSessions(const node::HttpRequest& req,
                                    node::HttpResponse& res) {
  absl::StatusOr<std::string> tenant = Tenant(req);
  if (!tenant.ok()) return SendError(res, tenant.status());
  routing_->metrics().Add("kvd_router_directory_ops_total", {{"op", "list"}});
  auto listed = routing_->directory().List(*tenant);
  if (!listed.ok()) return SendError(res, listed.status());
  json data = json::array();
  for (const auto& [id, e] : *listed) {
    data.push_back({{"id", id},
                    {"object", "session"},
                    {"owner_node", e.owner},
                    {"epoch", e.epoch},
                    {"state", e.state}});
  }
  res.set_content(json{{"object", "list"}, {"data", data}}.dump(),
                  "application/json");
}

void RouterImpl::HandleModels(const node::HttpRequest& req,
                              node::HttpResponse& res) {
  absl::StatusOr<std::string> tenant = Tenant(req);
  if (!tenant.ok()) return SendError(res, tenant.status());
  std::map<std::string, std::vector<std::string>> models;
  for (const cluster::NodeInfo& n : routing_->LiveNodes()) {
    models[n.model_id].push_back(n.id);
  }
  json data = json::array();
  for (const auto& [id, nodes] : models) {
    data.push_back({{"id", id},
                    {"object", "model"},
                    {"owned_by", "kvd"},
                    {"nodes", nodes}});
  }
  res.set_content(json{{"object", "list"}, {"data", data}}.dump(),
                  "application/json");
}

void RouterImpl::Log(const node::HttpRequest& req,
                     const node::HttpResponse& res, const std::string& tenant,
                     const std::string& session, const std::string& node,
                     const std::string& route,
                     std::chrono::steady_clock::time_point start,
                     double routing_s) {
  if (!options_.log_requests) return;
  json line = {{"router", true},
               {"method", req.method},
               {"path", req.path},
               {"status", res.status},
               {"ms", SecondsSince(start) * 1e3}};
  if (routing_s >= 0) line["routing_ms"] = routing_s * 1e3;
  if (!tenant.empty()) line["tenant"] = tenant;
  if (!session.empty()) line["session"] = session;
  if (!node.empty()) line["node"] = node;
  if (!route.empty()) line["route"] = route;
  std::fprintf(
      stderr, "%s\n",
      line.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Router>> StartRouter(RouterOptions options) {
  auto r = std::make_unique<RouterImpl>(std::move(options));
  absl::Status s = r->Init();
  if (!s.ok()) return s;
  return r;
}

}  // namespace kvd::router
