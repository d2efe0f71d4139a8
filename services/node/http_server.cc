#include "services/node/http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/node/admission.h"
#include "services/node/async_http.h"
#include "services/node/node_metrics.h"
#include "services/node/openai_generation.h"
#include "services/node/openai_response.h"
#include "storage/checkpoint/session_file.h"

namespace kvd::node {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string RandomHex(int bytes) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::string out;
  for (int i = 0; i < bytes; ++i) {
    absl::StrAppendFormat(&out, "%02x", static_cast<unsigned>(rng() & 0xff));
  }
  return out;
}

// What the request log line says. The handler, a stream's content provider
// and the logger all run on the connection's thread, one request at a time,
// so a thread-local carries it from one to the next.
struct RequestLog {
  std::string request_id;
  std::string tenant;
  std::string session;
  std::string finish;
  std::string state_path;  // session turns: hot, dram, rocksdb, ...
  double restore_ms = -1;
  int64_t prompt_tokens = -1;
  int64_t cached_tokens = -1;
  int64_t completion_tokens = -1;
  Clock::time_point start = Clock::now();
};
thread_local RequestLog t_log;

// Metric label for a path: session ids are not labels (unbounded).
std::string EndpointLabel(const std::string& path) {
  static const char* const kKnown[] = {"/v1/chat/completions",
                                       "/v1/completions",
                                       "/v1/models",
                                       "/v1/sessions",
                                       "/metrics",
                                       "/healthz",
                                       "/readyz"};
  for (const char* k : kKnown) {
    if (path == k) return k;
  }
  if (absl::string_view(path).substr(0, 13) == "/v1/sessions/") {
    return absl::string_view(path).substr(path.size() - 7) == "/export"
               ? "/v1/sessions/{id}/export"
               : "/v1/sessions/{id}";
  }
  return "other";
}

const char* FinishName(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::kStop:
      return "stop";
    case engine::FinishReason::kLength:
      return "length";
    case engine::FinishReason::kCancelled:
      return "cancelled";
  }
  return "stop";
}

Usage UsageOf(const GenerationOutcome& out) {
  Usage u{out.prompt_tokens, static_cast<int64_t>(out.gen.tokens.size()),
          out.cached_tokens};
  if (out.state_path.has_value()) {
    u.session_state = engine::StatePathName(*out.state_path);
    u.restore_ms = out.restore_seconds * 1e3;
  }
  return u;
}

absl::Status ValidateRequestId(absl::string_view id) {
  bool printable = !id.empty() && id.size() <= 128;
  for (char c : id) printable &= c > ' ' && c < 0x7f;
  if (printable) return absl::OkStatus();
  return RequestError("X-Request-Id",
                      "the X-Request-Id header must be 1..128 printable "
                      "ASCII characters without spaces");
}

class HttpServerImpl : public HttpServer {
 public:
  HttpServerImpl(NodeRuntime* runtime, HttpServerOptions options)
      : runtime_(runtime),
        options_(std::move(options)),
        metrics_(options_.metrics ? options_.metrics
                                  : std::make_shared<Metrics>()),
        admission_(options_.admission
                       ? options_.admission
                       : std::make_shared<Admission>(options_.max_inflight,
                                                     options_.max_queue)),
        created_unix_s_(absl::ToUnixSeconds(absl::Now())) {}

  ~HttpServerImpl() override { Stop(); }

  absl::Status Start();
  int port() const override { return port_; }
  void Stop() override;
  Metrics& metrics() override { return *metrics_; }

 private:
  void DeclareMetrics();
  void Routes();
  void Log(const HttpRequest& req, const HttpResponse& res);
  void SendError(HttpResponse& res, const absl::Status& status);
  absl::StatusOr<std::string> Tenant(const HttpRequest& req) const;
  // For /v1/sessions/{id}/...: the tenant, once the id (req.matches[1]) is
  // valid; notes the id in the request log.
  absl::StatusOr<std::string> SessionRequest(const HttpRequest& req);

  void HandleChat(const HttpRequest& req, HttpResponse& res);
  void HandleCompletion(const HttpRequest& req, HttpResponse& res);
  void HandleSessions(const HttpRequest& req, HttpResponse& res);
  void HandleSession(const HttpRequest& req, HttpResponse& res);
  void HandleExport(const HttpRequest& req, HttpResponse& res);
  void HandleMigrate(const HttpRequest& req, HttpResponse& res);
  void HandleMetrics(HttpResponse& res);

  // Answers `job` (admitted with `permit`) as JSON or as an SSE stream.
  void Respond(const HttpRequest& req, std::shared_ptr<GenerationJob> job,
               Admission::Permit permit, HttpResponse& res);
  void Stream(const GenerationJob& job, const HttpRequest& req,
              ChunkSink& sink);
  // A generation that ended with an error: a cancellation (client gone,
  // server stopping) counts as cancelled, anything else as an error by code.
  void CountFailure(const absl::Status& status);
  // A cancelled generation's status as the client should see it: 503 while
  // the server stops (retry elsewhere), else the status itself (499).
  absl::Status StoppedStatus(const absl::Status& status) const;
  void RecordOutcome(const GenerationOutcome& out, double first_token_s);

  NodeRuntime* const runtime_;
  const HttpServerOptions options_;
  std::shared_ptr<Metrics> metrics_;
  std::shared_ptr<Admission> admission_;
  KeyStore metrics_keys_;  // empty (open) unless options_.metrics_key is set
  const int64_t created_unix_s_;
  std::unique_ptr<AsyncHttpServer> server_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::once_flag stop_once_;
};

absl::Status HttpServerImpl::Start() {
  if (options_.max_inflight < 1 || options_.max_queue < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HTTP server: max_inflight must be >= 1 and max_queue >= 0 (got ",
        options_.max_inflight, " and ", options_.max_queue, ")"));
  }
  if (!options_.metrics_key.empty()) {
    absl::StatusOr<KeyStore> keys =
        KeyStore::FromPairs({{options_.metrics_key, "metrics"}});
    if (!keys.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("HTTP server: metrics key: ", keys.status().message()));
    }
    metrics_keys_ = *std::move(keys);
  }
  DeclareMetrics();
  AsyncHttpOptions o;
  o.host = options_.host;
  o.port = options_.port;
  o.worker_threads =
      options_.threads > 0
          ? options_.threads
          : std::max(128, options_.max_inflight + options_.max_queue + 8);
  o.max_header_bytes = options_.max_header_bytes;
  o.max_body_bytes = options_.limits.max_body_bytes;
  o.read_timeout = options_.read_timeout;
  o.idle_timeout = options_.keep_alive_timeout;
  o.write_timeout = options_.write_timeout;
  o.max_connections = options_.max_connections;
  o.tls_cert_path = options_.tls_cert_path;
  o.tls_key_path = options_.tls_key_path;
  o.client_ca_path = options_.client_ca_path;
  o.before = [](const HttpRequest& req) {
    t_log = RequestLog();
    t_log.request_id = "req-" + RandomHex(8);
    // The client's (or its router's) id, when it sent a usable one: one id
    // in every log line of a request's path through the cluster.
    if (std::string id = req.get_header_value("X-Request-Id");
        ValidateRequestId(id).ok()) {
      t_log.request_id = std::move(id);
    }
  };
  o.after = [this](const HttpRequest& req, const HttpResponse& res) {
    Log(req, res);
  };
  server_ = std::make_unique<AsyncHttpServer>(std::move(o));
  Routes();
  if (absl::Status s = server_->Start(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("HTTP server: ", s.message()));
  }
  port_ = server_->port();
  return absl::OkStatus();
}

void HttpServerImpl::Stop() {
  std::call_once(stop_once_, [this] {
    stopping_ = true;
    if (server_) server_->Stop();
  });
}

void HttpServerImpl::DeclareMetrics() {
  Metrics& m = *metrics_;
  m.DeclareCounter("kvd_http_requests_total",
                   "HTTP requests by endpoint and status code.");
  const std::vector<double> latency = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                       0.5,   1,    2.5,   5,    10,  30};
  m.DeclareHistogram("kvd_http_time_to_first_token_seconds",
                     "From request arrival to the first generated text.",
                     latency);
  m.DeclareHistogram(
      "kvd_http_time_per_output_token_seconds",
      "Decode time per generated token after the first.",
      {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1});
  m.DeclareCounter("kvd_http_generated_tokens_total", "Tokens generated.");
  m.DeclareCounter("kvd_http_prompt_tokens_total",
                   "Prompt tokens, as usage.prompt_tokens counts them (a "
                   "session's stored context included).");
  m.DeclareCounter("kvd_http_cached_prompt_tokens_total",
                   "Of those, tokens reused from a session's stored state "
                   "(usage.prompt_tokens_details.cached_tokens).");
  m.DeclareCounter("kvd_http_generations_cancelled_total",
                   "Generations stopped before their end: the client went "
                   "away or the server is shutting down.");
  m.DeclareCounter("kvd_http_client_disconnects_total",
                   "Generations whose client hung up before the response "
                   "was complete (streaming or not).");
  m.DeclareCounter("kvd_http_rejected_total",
                   "Requests refused by admission control (429).");
  m.DeclareCounter("kvd_http_errors_total",
                   "Generations that failed after admission, by code.");
  m.DeclareGauge("kvd_http_queue_depth",
                 "Generations waiting for a slot (HTTP and gRPC, which share "
                 "admission control).");
  m.DeclareGauge("kvd_http_inflight_generations",
                 "Generations running (HTTP and gRPC).");
  DeclareNodeMetrics(m);
}

void HttpServerImpl::Routes() {
  server_->Route("POST", "/v1/chat/completions",
                 [this](const HttpRequest& req, HttpResponse& res) {
                   HandleChat(req, res);
                 });
  server_->Route("POST", "/v1/completions",
                 [this](const HttpRequest& req, HttpResponse& res) {
                   HandleCompletion(req, res);
                 });
  server_->Route(
      "GET", "/v1/models", [this](const HttpRequest& req, HttpResponse& res) {
        if (absl::StatusOr<std::string> t = Tenant(req); !t.ok()) {
          return SendError(res, t.status());
        }
        res.set_content(ModelsJson(runtime_->model_id(), created_unix_s_),
                        "application/json");
      });
  server_->Route("GET", "/v1/sessions",
                 [this](const HttpRequest& req, HttpResponse& res) {
                   HandleSessions(req, res);
                 });
  server_->Route("GET", R"(/v1/sessions/([^/]+)/export)",
                 [this](const HttpRequest& req, HttpResponse& res) {
                   HandleExport(req, res);
                 });
  auto session = [this](const HttpRequest& req, HttpResponse& res) {
    HandleSession(req, res);
  };
  server_->Route("POST", R"(/v1/sessions/([^/]+)/migrate)",
                 [this](const HttpRequest& req, HttpResponse& res) {
                   HandleMigrate(req, res);
                 });
  server_->Route("GET", R"(/v1/sessions/([^/]+))", session);
  server_->Route("DELETE", R"(/v1/sessions/([^/]+))", session);
  server_->Route(
      "GET", "/metrics",
      [this](const HttpRequest& req, HttpResponse& res) {
        absl::StatusOr<std::string> allowed = metrics_keys_.TenantForBearer(
            req.get_header_value("Authorization"));
        if (!allowed.ok()) {
          return SendError(res, absl::UnauthenticatedError(absl::StrCat(
                                    "/metrics needs the metrics key (kvd serve "
                                    "--metrics-key): ",
                                    allowed.status().message())));
        }
        HandleMetrics(res);
      },
      /*on_io_thread=*/true);
  // Cheap, and answered on the I/O thread: they answer even when every
  // worker is busy.
  server_->Route(
      "GET", "/healthz",
      [](const HttpRequest&, HttpResponse& res) {
        res.set_content("ok\n", "text/plain");
      },
      /*on_io_thread=*/true);
  server_->Route(
      "GET", "/readyz",
      [this](const HttpRequest&, HttpResponse& res) {
        const bool full = admission_->full();
        if (stopping_ || full) {
          res.status = 503;
          res.set_content(stopping_ ? "stopping\n" : "queue full\n",
                          "text/plain");
          return;
        }
        // Turns cannot commit while the database refuses writes (a damaged
        // file, a full disk): not ready, with the reason and what to do.
        if (absl::Status w = runtime_->engine().WriteHealth(); !w.ok()) {
          res.status = 503;
          res.set_content(absl::StrCat("not ready: ", w.message(), "\n"),
                          "text/plain");
          return;
        }
        res.set_content("ready\n", "text/plain");
      },
      /*on_io_thread=*/true);
}

void HttpServerImpl::Log(const HttpRequest& req, const HttpResponse& res) {
  metrics_->Add("kvd_http_requests_total",
                {{"endpoint", EndpointLabel(req.path)},
                 {"code", absl::StrCat(res.status)}});
  if (!options_.log_requests) return;
  json line = {{"ts", absl::FormatTime(absl::Now())},
               {"request_id", t_log.request_id},
               {"method", req.method},
               {"path", req.path},
               {"status", res.status},
               {"latency_ms", SecondsSince(t_log.start) * 1e3}};
  if (!t_log.tenant.empty()) line["tenant"] = t_log.tenant;
  if (!t_log.session.empty()) line["session"] = t_log.session;
  if (t_log.prompt_tokens >= 0) line["prompt_tokens"] = t_log.prompt_tokens;
  if (t_log.cached_tokens > 0) line["cached_tokens"] = t_log.cached_tokens;
  if (t_log.completion_tokens >= 0) {
    line["completion_tokens"] = t_log.completion_tokens;
  }
  if (!t_log.finish.empty()) line["finish"] = t_log.finish;
  if (!t_log.state_path.empty()) line["state"] = t_log.state_path;
  if (t_log.restore_ms >= 0) line["restore_ms"] = t_log.restore_ms;
  const std::string text =
      line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  std::fwrite(text.data(), 1, text.size(), stderr);
}

void HttpServerImpl::SendError(HttpResponse& res, const absl::Status& status) {
  const ApiError e = ApiErrorFromStatus(status);
  res.status = e.http_status;
  if (e.http_status == 429) {
    res.set_header("Retry-After", absl::StrCat(options_.retry_after_s));
  }
  if (e.http_status == 401) {
    res.set_header("WWW-Authenticate", "Bearer");
  }
  // Nothing ran: a router may resend the turn where the session is now.
  if (std::string why = engine::NotRunReason(status); !why.empty()) {
    res.set_header(kRetryHeader, why);
  }
  res.set_content(ApiErrorJson(e), "application/json");
}

absl::StatusOr<std::string> HttpServerImpl::SessionRequest(
    const HttpRequest& req) {
  absl::StatusOr<std::string> tenant = Tenant(req);
  if (!tenant.ok()) return tenant;
  const std::string id = req.matches[1];
  t_log.session = id;
  KVD_RETURN_IF_ERROR(ValidateSessionId(id, "session_id"));
  return tenant;
}

absl::StatusOr<std::string> HttpServerImpl::Tenant(
    const HttpRequest& req) const {
  absl::StatusOr<std::string> tenant = options_.keys.TenantForRequest(
      req.get_header_value("Authorization"),
      req.get_header_value(kForwardedTenantHeader), req.peer_certificate_name);
  if (tenant.ok()) t_log.tenant = *tenant;
  return tenant;
}

void HttpServerImpl::RecordOutcome(const GenerationOutcome& out,
                                   double first_token_s) {
  const int64_t generated = static_cast<int64_t>(out.gen.tokens.size());
  t_log.prompt_tokens = out.prompt_tokens;
  t_log.cached_tokens = out.cached_tokens;
  t_log.completion_tokens = generated;
  t_log.finish = FinishName(out.gen.finish_reason);
  if (out.replayed) {
    // Nothing ran: the counters below count generated work.
    t_log.state_path = "replayed";
    return;
  }
  if (out.state_path.has_value()) {
    const char* path = engine::StatePathName(*out.state_path);
    t_log.state_path = path;
    t_log.restore_ms = out.restore_seconds * 1e3;
    metrics_->Observe("kvd_session_restore_seconds", {{"path", path}},
                      out.restore_seconds);
  }
  metrics_->Add("kvd_http_generated_tokens_total", {},
                static_cast<double>(generated));
  metrics_->Add("kvd_http_prompt_tokens_total", {},
                static_cast<double>(out.prompt_tokens));
  metrics_->Add("kvd_http_cached_prompt_tokens_total", {},
                static_cast<double>(out.cached_tokens));
  if (first_token_s >= 0) {
    metrics_->Observe("kvd_http_time_to_first_token_seconds", {},
                      first_token_s);
  }
  if (generated > 1) {
    metrics_->Observe(
        "kvd_http_time_per_output_token_seconds", {},
        out.gen.decode_seconds / static_cast<double>(generated - 1));
  }
}

void HttpServerImpl::HandleChat(const HttpRequest& req, HttpResponse& res) {
  absl::StatusOr<std::string> tenant = Tenant(req);
  if (!tenant.ok()) return SendError(res, tenant.status());
  absl::StatusOr<ChatRequest> parsed = ParseChatRequest(
      req.body, req.get_header_value("X-Session-Id"), options_.limits);
  if (!parsed.ok()) return SendError(res, parsed.status());
  auto job = std::make_shared<GenerationJob>();
  job->chat = true;
  job->tenant = *tenant;
  job->session = parsed->session_id;
  if (req.has_header("X-Request-Id")) {
    job->request_id = req.get_header_value("X-Request-Id");
    if (absl::Status s = ValidateRequestId(job->request_id); !s.ok()) {
      return SendError(res, s);
    }
  }
  job->common = std::move(parsed->common);
  job->messages = std::move(parsed->messages);
  job->meta = {"chatcmpl-" + RandomHex(12), absl::ToUnixSeconds(absl::Now()),
               runtime_->model_id(), job->session};
  t_log.session = job->session;
  if (absl::Status s =
          PrepareGeneration(*runtime_, options_.default_max_tokens, *job);
      !s.ok())
    return SendError(res, s);
  if (!job->session.empty()) {
    // A session being moved waits here, not in a generation slot; one that
    // moved to another node is refused before a stream starts, so a router
    // can send the turn on to its new owner (X-Kvd-Retry).
    if (absl::Status s = runtime_->engine().ReadyForTurn(
            job->tenant, job->session, /*check_owner=*/job->common.stream);
        !s.ok()) {
      return SendError(res, s);
    }
    // A cold session starts loading into the DRAM tier now, while the
    // request may still wait for a slot; its turn then restores from memory.
    runtime_->engine().Prefetch(job->tenant, job->session);
  }
  absl::StatusOr<Admission::Permit> permit =
      admission_->Acquire([this] { return stopping_.load(); });
  if (!permit.ok()) {
    metrics_->Add("kvd_http_rejected_total", {});
    return SendError(res, StoppedStatus(permit.status()));
  }
  Respond(req, std::move(job), *std::move(permit), res);
}

void HttpServerImpl::HandleCompletion(const HttpRequest& req,
                                      HttpResponse& res) {
  absl::StatusOr<std::string> tenant = Tenant(req);
  if (!tenant.ok()) return SendError(res, tenant.status());
  absl::StatusOr<CompletionRequest> parsed =
      ParseCompletionRequest(req.body, options_.limits);
  if (!parsed.ok()) return SendError(res, parsed.status());
  auto job = std::make_shared<GenerationJob>();
  job->tenant = *tenant;
  job->common = std::move(parsed->common);
  job->prompt =
      runtime_->tokenizer().EncodePrompt(parsed->prompt, /*first=*/true);
  job->meta = {"cmpl-" + RandomHex(12), absl::ToUnixSeconds(absl::Now()),
               runtime_->model_id(), ""};
  if (absl::Status s =
          PrepareGeneration(*runtime_, options_.default_max_tokens, *job);
      !s.ok())
    return SendError(res, s);
  absl::StatusOr<Admission::Permit> permit =
      admission_->Acquire([this] { return stopping_.load(); });
  if (!permit.ok()) {
    metrics_->Add("kvd_http_rejected_total", {});
    return SendError(res, StoppedStatus(permit.status()));
  }
  Respond(req, std::move(job), *std::move(permit), res);
}

void HttpServerImpl::Respond(const HttpRequest& req,
                             std::shared_ptr<GenerationJob> job,
                             Admission::Permit permit, HttpResponse& res) {
  if (!job->common.stream) {
    const Clock::time_point start = t_log.start;
    double first_token_s = -1;
    // Nothing is written until the end, so a client that hangs up is seen
    // only on its socket (the front end watches it): stop generating for
    // nobody.
    std::atomic<bool> peer_gone{false};
    absl::StatusOr<GenerationOutcome> out = RunGeneration(
        *runtime_, *job,
        [&](const engine::GenerateDelta& d) {
          if (first_token_s < 0 && !d.tokens.empty()) {
            first_token_s = SecondsSince(start);
          }
        },
        [this, &req, &peer_gone] {
          if (req.peer_closed()) peer_gone.store(true);
          return peer_gone.load() || stopping_.load();
        });
    permit = Admission::Permit();
    if (peer_gone.load()) {
      metrics_->Add("kvd_http_client_disconnects_total", {});
    }
    if (!out.ok()) {
      CountFailure(out.status());
      return SendError(res, StoppedStatus(out.status()));
    }
    RecordOutcome(*out, first_token_s);
    const ChoiceOutput choice{out->gen.text, FinishName(out->gen.finish_reason),
                              out->logprobs};
    const Usage usage = UsageOf(*out);
    res.set_content(job->chat ? ChatCompletionJson(job->meta, choice, usage)
                              : CompletionJson(job->meta, choice, usage),
                    "application/json");
    return;
  }
  // The permit travels with the provider and is released when the stream
  // ends (or the response is dropped unsent).
  auto held = std::make_shared<Admission::Permit>(std::move(permit));
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // The provider runs after this handler, on the same thread, while the
  // request is still alive.
  const HttpRequest* request = &req;
  res.set_chunked_content_provider("text/event-stream",
                                   [this, job, held, request](ChunkSink& sink) {
                                     Stream(*job, *request, sink);
                                     *held = Admission::Permit();
                                   });
}

void HttpServerImpl::Stream(const GenerationJob& job, const HttpRequest& req,
                            ChunkSink& sink) {
  const Clock::time_point start = t_log.start;
  // Written only on this (the handler's) thread; `cancelled` below runs on
  // the scheduler's and only reads flags and polls the socket, so a slow
  // client never blocks the batch and writes never interleave.
  std::atomic<bool> broken{false};
  std::atomic<bool> peer_gone{false};
  auto write = [&](const std::string& s) {
    if (broken.load()) return;
    if (!sink.write(s.data(), s.size())) broken.store(true);
  };
  const std::string* no_finish = nullptr;
  if (job.chat) {
    write(SseEvent(ChatChunkJson(job.meta, "", /*first=*/true, no_finish,
                                 nullptr, nullptr)));
  }
  double first_token_s = -1;
  int64_t logprob_bytes = 0;  // token bytes of the logprobs sent so far
  // Each chunk carries its delta's text and, when asked, the logprobs of
  // the tokens that produced it (as OpenAI streams them).
  auto on_delta = [&](const engine::GenerateDelta& d) {
    if (first_token_s < 0 && !d.tokens.empty()) {
      first_token_s = SecondsSince(start);
    }
    std::vector<TokenLogProbText> lps;
    if (job.common.logprobs) {
      lps = LogprobsText(runtime_->tokenizer(), job, d.tokens, d.logprobs);
    }
    if (d.text.empty() && lps.empty()) return;  // e.g. only an EOG token
    const absl::string_view piece(d.text.data(), d.text.size());
    const std::vector<TokenLogProbText>* lp =
        job.common.logprobs ? &lps : nullptr;
    write(SseEvent(
        job.chat ? ChatChunkJson(job.meta, piece, false, no_finish, nullptr, lp)
                 : CompletionChunkJson(job.meta, piece, no_finish, nullptr, lp,
                                       logprob_bytes)));
    for (const TokenLogProbText& t : lps) logprob_bytes += t.token.size();
  };
  // A client that hangs up while its request waits or prefills (nothing
  // written yet) is seen on its socket, as for non-streaming requests.
  auto cancelled = [&] {
    if (req.peer_closed()) peer_gone.store(true);
    return broken.load() || peer_gone.load() || stopping_.load();
  };
  absl::StatusOr<GenerationOutcome> out =
      RunGeneration(*runtime_, job, on_delta, cancelled);
  const bool disconnected = broken.load() || peer_gone.load();
  if (disconnected) metrics_->Add("kvd_http_client_disconnects_total", {});
  if (!out.ok()) {
    CountFailure(out.status());
    const ApiError e = ApiErrorFromStatus(StoppedStatus(out.status()));
    t_log.finish = absl::StrCat("error ", e.http_status);
    write(SseEvent(ApiErrorJson(e)));
    return;
  }
  RecordOutcome(*out, first_token_s);
  if (disconnected) return;
  // The logprobs went out with the deltas.
  const std::string finish = FinishName(out->gen.finish_reason);
  write(SseEvent(
      job.chat ? ChatChunkJson(job.meta, "", false, &finish, nullptr, nullptr)
               : CompletionChunkJson(job.meta, "", &finish, nullptr, nullptr)));
  if (job.common.include_usage) {
    const Usage usage = UsageOf(*out);
    write(SseEvent(
        job.chat
            ? ChatChunkJson(job.meta, "", false, nullptr, &usage, nullptr)
            : CompletionChunkJson(job.meta, "", nullptr, &usage, nullptr)));
  }
  write(kSseDone);
}

void HttpServerImpl::CountFailure(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kCancelled) {
    metrics_->Add("kvd_http_generations_cancelled_total", {});
    return;
  }
  metrics_->Add("kvd_http_errors_total",
                {{"code", absl::StatusCodeToString(status.code())}});
}

absl::Status HttpServerImpl::StoppedStatus(const absl::Status& status) const {
  if (status.code() == absl::StatusCode::kCancelled && stopping_.load()) {
    return absl::UnavailableError(absl::StrCat("the server is shutting down (",
                                               status.message(),
                                               "); retry on another node"));
  }
  return status;
}

void HttpServerImpl::HandleSessions(const HttpRequest& req, HttpResponse& res) {
  absl::StatusOr<std::string> tenant = Tenant(req);
  if (!tenant.ok()) return SendError(res, tenant.status());
  int64_t limit = 100;
  if (req.has_param("limit")) {
    if (!absl::SimpleAtoi(req.get_param_value("limit"), &limit) || limit < 1 ||
        limit > 1000) {
      return SendError(res, RequestError("limit",
                                         "'limit' must be an integer in "
                                         "[1, 1000]"));
    }
  }
  absl::StatusOr<storage::SessionListPage> page =
      runtime_->engine().ListSessions(*tenant,
                                      req.get_param_value("page_token"), limit);
  if (!page.ok()) return SendError(res, page.status());
  res.set_content(SessionListJson(page->sessions, page->next_page_token),
                  "application/json");
}

void HttpServerImpl::HandleSession(const HttpRequest& req, HttpResponse& res) {
  absl::StatusOr<std::string> tenant = SessionRequest(req);
  if (!tenant.ok()) return SendError(res, tenant.status());
  const std::string id = req.matches[1];
  if (req.method == "DELETE") {
    if (absl::Status s = runtime_->engine().DeleteSession(*tenant, id);
        !s.ok()) {
      return SendError(res, s);
    }
    res.set_content(
        json{{"id", id}, {"object", "session.deleted"}, {"deleted", true}}
            .dump(),
        "application/json");
    return;
  }
  absl::StatusOr<v1::SessionManifest> m =
      runtime_->engine().GetSession(*tenant, id);
  if (!m.ok()) return SendError(res, m.status());
  res.set_content(
      SessionJson(*m, engine::StatePathName(
                          runtime_->engine().ResidentTier(*tenant, id))),
      "application/json");
}

void HttpServerImpl::HandleMigrate(const HttpRequest& req, HttpResponse& res) {
  absl::StatusOr<std::string> tenant = SessionRequest(req);
  if (!tenant.ok()) return SendError(res, tenant.status());
  const std::string id = req.matches[1];
  if (options_.migrator == nullptr) {
    return SendError(
        res, absl::FailedPreconditionError(
                 "moving sessions needs a cluster: this node runs alone "
                 "(kvd serve --cluster; see docs/CLUSTER.md)"));
  }
  const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object() || !body.contains("to") || !body["to"].is_string() ||
      body["to"].get<std::string>().empty()) {
    return SendError(res, RequestError("to",
                                       "the body must be a JSON object "
                                       "naming the target node: {\"to\": "
                                       "\"NODE\"} (kvd cluster status lists "
                                       "them)"));
  }
  absl::StatusOr<migration::MigrationReport> r =
      options_.migrator->Migrate(*tenant, id, body["to"].get<std::string>());
  if (!r.ok()) return SendError(res, r.status());
  res.set_content(
      migration::MigrationReportJson(*r, id, options_.migrator->node_id()),
      "application/json");
}

void HttpServerImpl::HandleExport(const HttpRequest& req, HttpResponse& res) {
  absl::StatusOr<std::string> tenant = SessionRequest(req);
  if (!tenant.ok()) return SendError(res, tenant.status());
  const std::string id = req.matches[1];
  absl::StatusOr<std::shared_ptr<const storage::SessionCheckpoint>> loaded =
      runtime_->engine().ExportSession(*tenant, id);
  if (!loaded.ok()) return SendError(res, loaded.status());
  // Checked before the first byte goes out (a status can still be sent),
  // then streamed in 1 MiB pieces without building the whole file.
  if (absl::Status s = storage::ValidateCheckpointContents(**loaded, id);
      !s.ok()) {
    return SendError(res, s);
  }
  res.set_header("Content-Disposition",
                 absl::StrCat("attachment; filename=\"", id, ".kvds\""));
  std::shared_ptr<const storage::SessionCheckpoint> cp = *std::move(loaded);
  res.set_chunked_content_provider(
      "application/octet-stream", [cp](ChunkSink& sink) {
        (void)storage::WriteSessionPieces(
            *cp, 1 << 20, [&sink](absl::string_view piece) {
              return sink.write(piece.data(), piece.size());
            });
      });
}

void HttpServerImpl::HandleMetrics(HttpResponse& res) {
  Metrics& m = *metrics_;
  m.Set("kvd_http_queue_depth", {}, admission_->queued());
  m.Set("kvd_http_inflight_generations", {}, admission_->inflight());
  UpdateNodeGauges(*runtime_, m);
  if (options_.more_metrics) options_.more_metrics(m);
  res.set_content(m.Render(), "text/plain; version=0.0.4");
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> StartHttpServer(
    NodeRuntime* runtime, HttpServerOptions options) {
  if (runtime == nullptr) {
    return absl::InvalidArgumentError("StartHttpServer: runtime is null");
  }
  auto server = std::make_unique<HttpServerImpl>(runtime, std::move(options));
  KVD_RETURN_IF_ERROR(server->Start());
  return server;
}

}  // namespace kvd::node
