#include "services/node/grpc_service.h"

#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "services/node/grpc_call_log.h"
#include "services/node/grpc_convert.h"
#include "services/node/grpc_reflection_v1.h"
#include "storage/checkpoint/codec.h"
#include "storage/checkpoint/session_file.h"
#include "storage/rocksdb/disk_full.h"

namespace kvd::node {
namespace {

// Unguessable ids: request ids name a running generation to Cancel.
std::string RandomId(absl::string_view prefix) {
  static absl::Mutex mu(absl::kConstInit);
  static std::mt19937_64* rng = nullptr;
  absl::MutexLock lock(&mu);
  if (rng == nullptr) {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
    rng = new std::mt19937_64(seq);
  }
  const uint64_t a = (*rng)(), b = (*rng)();
  return absl::StrFormat("%s%016x%016x", prefix, a, b);
}

bool DeadlinePassed(const grpc::ServerContext* ctx) {
  return ctx->deadline() <= std::chrono::system_clock::now();
}

// The prompt and max_tokens must fit the context together, as over HTTP: an
// unchosen max_tokens shrinks to what is left, a chosen one that does not
// fit is refused before anything runs.
absl::Status FitMaxTokens(int64_t have, int64_t context, bool chosen,
                          int64_t* max_tokens) {
  if (have >= context) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt is ", have, " tokens with the session's; ",
                     "the model's context is ", context, " tokens"));
  }
  if (!chosen) {
    *max_tokens = std::min(*max_tokens, context - have);
  } else if (have + *max_tokens > context) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", have,
                     " tokens, with the session's) + sampling.max_tokens (",
                     *max_tokens, ") exceeds the model's context of ", context,
                     " tokens; lower max_tokens"));
  }
  return absl::OkStatus();
}

}  // namespace

SessionsService::SessionsService(NodeRuntime* runtime, KeyStore keys,
                                 GrpcServerOptions options)
    : runtime_(runtime),
      keys_(std::move(keys)),
      options_(std::move(options)),
      admission_(options_.admission
                     ? options_.admission
                     : std::make_shared<Admission>(options_.max_inflight,
                                                   options_.max_queue)) {}

absl::StatusOr<std::string> SessionsService::Tenant(
    const grpc::ServerContext* ctx) const {
  const auto& md = ctx->client_metadata();
  auto value = [&md](const char* key) {
    auto it = md.find(key);
    return it == md.end()
               ? absl::string_view()
               : absl::string_view(it->second.data(), it->second.size());
  };
  std::string peer;  // the common name of a verified client certificate
  std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& name :
         auth->FindPropertyValues("x509_common_name")) {
      peer.assign(name.data(), name.size());
    }
  }
  return keys_.TenantForRequest(value("authorization"),
                                value(kForwardedTenantHeader), peer);
}

grpc::Status SessionsService::CreateSession(
    grpc::ServerContext* ctx, const v1::CreateSessionRequest* request,
    v1::Session* response) {
  absl::StatusOr<std::string> tenant = Tenant(ctx);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  absl::Status labels = ValidateLabels(request->labels());
  if (!labels.ok()) return ToGrpcStatus(labels);
  const std::string id =
      request->session_id().empty() ? RandomId("s-") : request->session_id();
  std::map<std::string, std::string> label_map(request->labels().begin(),
                                               request->labels().end());
  absl::Status created =
      runtime_->engine().CreateSession(*tenant, id, label_map);
  if (!created.ok()) return ToGrpcStatus(created);
  absl::StatusOr<v1::SessionManifest> m =
      runtime_->engine().GetSession(*tenant, id);
  if (!m.ok()) return ToGrpcStatus(m.status());
  *response = SessionFromManifest(*m);
  return grpc::Status::OK;
}

grpc::Status SessionsService::GetSession(grpc::ServerContext* ctx,
                                         const v1::GetSessionRequest* request,
                                         v1::Session* response) {
  absl::StatusOr<std::string> tenant = Tenant(ctx);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  absl::Status name =
      storage::ValidateName("session id", request->session_id());
  if (!name.ok()) return ToGrpcStatus(name);
  absl::StatusOr<v1::SessionManifest> m =
      runtime_->engine().GetSession(*tenant, request->session_id());
  if (!m.ok()) return ToGrpcStatus(m.status());
  *response = SessionFromManifest(*m);
  return grpc::Status::OK;
}

grpc::Status SessionsService::MigrateSession(
    grpc::ServerContext* ctx, const v1::MigrateSessionRequest* request,
    v1::MigrateSessionResponse* response) {
  absl::StatusOr<std::string> tenant = Tenant(ctx);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  if (absl::Status name =
          storage::ValidateName("session id", request->session_id());
      !name.ok()) {
    return ToGrpcStatus(name);
  }
  if (options_.migrator == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "moving sessions needs a cluster: this node runs "
                        "alone (kvd serve --cluster; see docs/CLUSTER.md)");
  }
  absl::StatusOr<migration::MigrationReport> r = options_.migrator->Migrate(
      *tenant, request->session_id(), request->target_node());
  if (!r.ok()) return ToGrpcStatus(r.status());
  response->set_source_node(options_.migrator->node_id());
  response->set_target_node(r->target);
  response->set_epoch(r->epoch);
  response->set_tokens(r->tokens);
  response->set_turns(r->turns);
  response->set_snapshot_bytes(r->snapshot_bytes);
  response->set_delta_bytes(r->delta_bytes);
  response->set_wire_bytes(r->wire_bytes);
  response->set_freeze_wait_ms(absl::ToDoubleMilliseconds(r->freeze_wait));
  response->set_pause_ms(absl::ToDoubleMilliseconds(r->pause));
  response->set_total_ms(absl::ToDoubleMilliseconds(r->total));
  response->set_restore_path(r->restore_path);
  response->set_transport(r->transport);
  return grpc::Status::OK;
}

grpc::Status SessionsService::ListSessions(
    grpc::ServerContext* ctx, const v1::ListSessionsRequest* request,
    v1::ListSessionsResponse* response) {
  absl::StatusOr<std::string> tenant = Tenant(ctx);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  absl::StatusOr<int> page_size = PageSize(request->page_size());
  if (!page_size.ok()) return ToGrpcStatus(page_size.status());
  absl::StatusOr<storage::SessionListPage> page =
      runtime_->engine().ListSessions(*tenant, request->page_token(),
                                      *page_size);
  if (!page.ok()) return ToGrpcStatus(page.status());
  for (const v1::SessionManifest& m : page->sessions) {
    *response->add_sessions() = SessionFromManifest(m);
  }
  response->set_next_page_token(page->next_page_token);
  return grpc::Status::OK;
}

grpc::Status SessionsService::DeleteSession(
    grpc::ServerContext* ctx, const v1::DeleteSessionRequest* request,
    v1::DeleteSessionResponse* response) {
  absl::StatusOr<std::string> tenant = Tenant(ctx);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  return ToGrpcStatus(
      runtime_->engine().DeleteSession(*tenant, request->session_id()));
}

absl::StatusOr<engine::GenerateRequest> SessionsService::CheckGenerate(
    const v1::GenerateRequest& request) const {
  const int64_t context = runtime_->model().config().context_length;
  KVD_ASSIGN_OR_RETURN(engine::GenerateRequest g,
                       GenerateRequestFromProto(request.sampling(), context));
  KVD_RETURN_IF_ERROR(ValidateInput(request, runtime_->chat_template()));
  if (!request.request_id().empty()) {
    bool printable = request.request_id().size() <= 128;
    for (char c : request.request_id()) printable &= c > ' ' && c < 0x7f;
    if (!printable || request.session_id().empty()) {
      return absl::InvalidArgumentError(
          printable ? "request_id names a turn of a session: it needs "
                      "session_id"
                    : "request_id must be 1..128 printable ASCII characters "
                      "without spaces");
    }
  }
  if (!request.session_id().empty()) {
    KVD_RETURN_IF_ERROR(
        storage::ValidateName("session id", request.session_id()));
    return g;  // its fit to the context is checked under the session's lock
  }
  // A stateless prompt is known in full: tokenized and fitted now.
  KVD_ASSIGN_OR_RETURN(g.prompt, TurnTokens(request, runtime_->tokenizer(),
                                            runtime_->chat_template(), {}));
  KVD_RETURN_IF_ERROR(FitMaxTokens(static_cast<int64_t>(g.prompt.size()),
                                   context, request.sampling().has_max_tokens(),
                                   &g.max_tokens));
  return g;
}

absl::StatusOr<v1::GenerateFinished> SessionsService::RunGenerate(
    grpc::ServerContext* ctx, const std::string& tenant,
    const v1::GenerateRequest& request, engine::GenerateRequest g,
    const Running& running, grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const int64_t context = runtime_->model().config().context_length;

  // Polled between forward steps: a failed Write means the client is gone.
  std::atomic<bool> write_failed{false};
  g.cancelled = [&]() {
    return write_failed.load() || running.cancel.load() || stopping_.load() ||
           ctx->IsCancelled() || DeadlinePassed(ctx);
  };
  const ops::Tokenizer& tokenizer = runtime_->tokenizer();
  auto on_delta = [&](const engine::GenerateDelta& d) {
    v1::GenerateResponse msg;
    v1::GenerateDelta* delta = msg.mutable_delta();
    delta->set_text(ValidUtf8(d.text));
    delta->mutable_token_ids()->Add(d.tokens.begin(), d.tokens.end());
    SetLogprobs(tokenizer, d.logprobs, delta->mutable_logprobs());
    if (!writer->Write(msg)) write_failed.store(true);
  };
  const std::optional<ops::ChatTemplate>& tmpl = runtime_->chat_template();

  const bool max_tokens_given = request.sampling().has_max_tokens();

  v1::GenerateFinished finished;
  engine::GenerateResult result;
  // OpenAI's counting (sessions.proto's Usage): a stateless prompt is all
  // new.
  int64_t prompt_tokens = 0, cached_tokens = 0;
  if (request.session_id().empty()) {
    // Tokenized and fitted to the context by CheckGenerate.
    KVD_ASSIGN_OR_RETURN(result,
                         runtime_->engine().Complete(g, tokenizer, on_delta));
  } else {
    engine::TurnRequest turn;
    turn.tenant = tenant;
    turn.session = request.session_id();
    // As HTTP's 409: a turn waiting for the session would hold its
    // admission slot all the while.
    turn.fail_if_busy = true;
    turn.request_id = request.request_id();
    turn.generate = std::move(g);
    turn.make_tokens = [&](absl::Span<const int32_t> have)
        -> absl::StatusOr<std::vector<int32_t>> {
      KVD_ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                           TurnTokens(request, tokenizer, tmpl, have));
      // Under the session's lock, before the turn runs: the engine reads
      // its generate request after this returns.
      KVD_RETURN_IF_ERROR(
          FitMaxTokens(static_cast<int64_t>(have.size() + tokens.size()),
                       context, max_tokens_given, &turn.generate.max_tokens));
      return tokens;
    };
    absl::StatusOr<engine::TurnResult> r =
        runtime_->engine().RunTurn(turn, tokenizer, on_delta);
    if (!r.ok()) return r.status();
    result = std::move(r->generation);
    prompt_tokens = r->context_tokens;
    cached_tokens = r->cached_tokens;
    finished.set_state_path(engine::StatePathName(r->path));
    finished.set_state_path_detail(r->path_detail);
    finished.set_session_tokens(r->session_tokens);
    finished.set_turn(r->turn);
    finished.set_replayed(r->replayed);
  }
  finished.set_finish_reason(engine::FinishReasonName(result.finish_reason));
  if (request.session_id().empty()) prompt_tokens = result.prompt_tokens;
  finished.mutable_usage()->set_prompt_tokens(prompt_tokens);
  finished.mutable_usage()->set_cached_tokens(cached_tokens);
  finished.mutable_usage()->set_completion_tokens(result.tokens.size());
  finished.mutable_token_ids()->Add(result.tokens.begin(), result.tokens.end());
  SetLogprobs(tokenizer, result.logprobs, finished.mutable_logprobs());
  finished.set_text(ValidUtf8(result.text));
  return finished;
}

grpc::Status SessionsService::FailedGenerate(grpc::ServerContext* ctx,
                                             const absl::Status& status) {
  if (status.code() == absl::StatusCode::kCancelled && stopping_.load()) {
    // Not the client's cancel: tell it to retry elsewhere, as HTTP's 503.
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the node is shutting down; nothing of this "
                        "generation was stored; retry on another node");
  }
  if (status.code() == absl::StatusCode::kCancelled && DeadlinePassed(ctx)) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        "deadline passed; nothing was stored (give a longer "
                        "deadline or fewer max_tokens)");
  }
  if (status.code() == absl::StatusCode::kResourceExhausted &&
      !storage::IsDiskFull(status)) {
    // A full queue, a busy engine, a quota: as HTTP's 429 with Retry-After,
    // gRPC's retry policy and clients read the pause from this trailer. A
    // full disk (HTTP 507) is not worth a quick retry.
    ctx->AddTrailingMetadata("grpc-retry-pushback-ms",
                             absl::StrCat(options_.retry_after_ms));
  }
  // Nothing ran: a router may resend the turn where the session is now.
  if (std::string why = engine::NotRunReason(status); !why.empty()) {
    ctx->AddTrailingMetadata(kRetryHeader, why);
  }
  return ToGrpcStatus(status);
}

grpc::Status SessionsService::Generate(
    grpc::ServerContext* ctx, const v1::GenerateRequest* request,
    grpc::ServerWriter<v1::GenerateResponse>* writer) {
  absl::StatusOr<std::string> tenant = Tenant(ctx);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  if (stopping_.load()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the node is shutting down; retry on another node");
  }
  // Every check before the request queues or anything is sent, as HTTP.
  absl::StatusOr<engine::GenerateRequest> g = CheckGenerate(*request);
  if (!g.ok()) return ToGrpcStatus(g.status());
  if (!request->session_id().empty()) {
    // A session being moved waits here; one that moved to another node is
    // refused before anything is sent (the kvd-retry trailer says so), so a
    // router can send the call on to its new owner.
    if (absl::Status s = runtime_->engine().ReadyForTurn(
            *tenant, request->session_id(), /*check_owner=*/true);
        !s.ok()) {
      return FailedGenerate(ctx, s);
    }
    // A cold session starts loading into the DRAM tier now, overlapping any
    // wait for a slot, the session or the batch; a request refused as busy
    // leaves it warm for the client's retry.
    runtime_->engine().Prefetch(*tenant, request->session_id());
  }
  // A queued call leaves the queue when its client cancels, its deadline
  // passes or the node stops.
  absl::StatusOr<Admission::Permit> permit = admission_->Acquire([&] {
    return ctx->IsCancelled() || DeadlinePassed(ctx) || stopping_.load();
  });
  if (!permit.ok()) return FailedGenerate(ctx, permit.status());

  auto running = std::make_shared<Running>();
  running->tenant = *tenant;
  const std::string request_id = RandomId("r-");
  {
    absl::MutexLock lock(&mu_);
    running_[request_id] = running;
  }
  v1::GenerateResponse started;
  started.mutable_started()->set_request_id(request_id);
  writer->Write(started);

  absl::StatusOr<v1::GenerateFinished> finished =
      RunGenerate(ctx, *tenant, *request, *std::move(g), *running, writer);
  {
    absl::MutexLock lock(&mu_);
    running_.erase(request_id);
  }
  if (!finished.ok()) return FailedGenerate(ctx, finished.status());
  v1::GenerateResponse last;
  *last.mutable_finished() = std::move(*finished);
  writer->Write(last);
  return grpc::Status::OK;
}

grpc::Status SessionsService::Cancel(grpc::ServerContext* ctx,
                                     const v1::CancelRequest* request,
                                     v1::CancelResponse* response) {
  absl::StatusOr<std::string> tenant = Tenant(ctx);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  absl::MutexLock lock(&mu_);
  auto it = running_.find(request->request_id());
  // Another tenant's generation looks exactly like a finished one.
  if (it == running_.end() || it->second->tenant != *tenant) {
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("no running generation '", request->request_id(),
                     "' (it may have finished already)"));
  }
  it->second->cancel.store(true);
  return grpc::Status::OK;
}

grpc::Status SessionsService::ExportSession(
    grpc::ServerContext* ctx, const v1::ExportSessionRequest* request,
    grpc::ServerWriter<v1::ExportSessionResponse>* writer) {
  absl::StatusOr<std::string> tenant = Tenant(ctx);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  absl::Status name =
      storage::ValidateName("session id", request->session_id());
  if (!name.ok()) return ToGrpcStatus(name);
  absl::StatusOr<std::shared_ptr<const storage::SessionCheckpoint>> loaded =
      runtime_->engine().ExportSession(*tenant, request->session_id());
  if (!loaded.ok()) return ToGrpcStatus(loaded.status());
  // Streamed as it is written: beyond the checkpoint (which the tiers hold
  // anyway) only one message's bytes are in memory.
  bool first = true;
  absl::Status sent = storage::WriteSessionPieces(
      **loaded,
      static_cast<size_t>(std::max<int64_t>(1, options_.export_chunk_bytes)),
      [&](absl::string_view piece) {
        if (ctx->IsCancelled()) return false;
        v1::ExportSessionResponse msg;
        if (first)
          *msg.mutable_session() = SessionFromManifest((*loaded)->manifest());
        first = false;
        msg.set_chunk(std::string(piece));
        return writer->Write(msg);
      });
  if (absl::IsCancelled(sent)) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "export cancelled, or the client went away");
  }
  if (!sent.ok()) return ToGrpcStatus(sent);
  return grpc::Status::OK;
}

grpc::Status SessionsService::ImportSession(
    grpc::ServerContext* ctx,
    grpc::ServerReader<v1::ImportSessionRequest>* reader,
    v1::Session* response) {
  absl::StatusOr<std::string> tenant = Tenant(ctx);
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  // Parsed as the messages arrive: beyond the checkpoint being built, only
  // one message is held (a 4 GiB file is never buffered whole).
  std::string name;
  int64_t received = 0;
  bool first = true, over_limit = false;
  v1::ImportSessionRequest msg;
  absl::StatusOr<storage::SessionCheckpoint> cp = storage::ReadSessionPieces(
      [&](std::string* piece) {
        if (!reader->Read(&msg)) return false;
        if (first) name = msg.session_id();
        first = false;
        received += static_cast<int64_t>(msg.chunk().size());
        if (received > options_.max_import_bytes) {
          over_limit = true;
          return false;
        }
        *piece = std::move(*msg.mutable_chunk());
        return true;
      },
      "imported session file");
  if (over_limit) {
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("session file exceeds this node's import limit of ",
                     options_.max_import_bytes, " bytes"));
  }
  if (!cp.ok()) return ToGrpcStatus(cp.status());
  v1::SessionManifest m = cp->manifest();
  m.set_tenant(*tenant);
  if (!name.empty()) m.set_session_id(name);
  absl::Status valid = storage::ValidateName("session id", m.session_id());
  if (!valid.ok()) return ToGrpcStatus(valid);
  absl::Status compatible = storage::CheckCompatible(
      m.model(), runtime_->engine().identity(), m.session_id());
  if (!compatible.ok()) return ToGrpcStatus(compatible);
  cp->ReplaceManifest(m);
  // The engine checks that the name is free under the session's lock, so an
  // import cannot race a first turn that is starting the same session.
  absl::Status put = runtime_->engine().ImportSession(*std::move(cp));
  if (!put.ok()) return ToGrpcStatus(put);
  *response = SessionFromManifest(m);
  return grpc::Status::OK;
}

grpc::Status HealthService::Check(grpc::ServerContext* ctx,
                                  const v1::HealthRequest* request,
                                  v1::HealthResponse* response) {
  // A node whose database refuses writes (a damaged file) cannot commit
  // turns: not serving, so callers go elsewhere.
  const bool writable = runtime_->engine().WriteHealth().ok();
  response->set_status(serving_.load() && writable
                           ? v1::HealthResponse::SERVING
                           : v1::HealthResponse::NOT_SERVING);
  response->set_model(runtime_->model_id());
  response->set_numerics_version(
      runtime_->engine().identity().numerics_version());
  response->set_backend(runtime_->backend().backend_name());
  return grpc::Status::OK;
}

GrpcServer::GrpcServer(std::unique_ptr<SessionsService> sessions,
                       std::unique_ptr<HealthService> health,
                       std::unique_ptr<GrpcHealthV1> health_v1,
                       std::unique_ptr<grpc::Server> server, int port)
    : sessions_(std::move(sessions)),
      health_(std::move(health)),
      health_v1_(std::move(health_v1)),
      server_(std::move(server)),
      port_(port) {}

GrpcServer::~GrpcServer() { Shutdown(); }

void GrpcServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  health_->SetNotServing();
  health_v1_->Shutdown();
  sessions_->StopAll();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

void GrpcServer::Wait() { server_->Wait(); }

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read TLS file ", path, "; check the path"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int64_t Millis(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> StartGrpcServer(
    NodeRuntime* runtime, KeyStore keys, GrpcServerOptions options) {
  if (runtime == nullptr) {
    return absl::InvalidArgumentError("StartGrpcServer needs a NodeRuntime");
  }
  if (options.tls_cert_path.empty() != options.tls_key_path.empty()) {
    return absl::InvalidArgumentError(
        "give both a TLS certificate and key file, or neither");
  }
  if (options.max_receive_bytes <= 0 || options.max_concurrent_streams <= 0 ||
      options.max_import_bytes <= 0 || options.export_chunk_bytes <= 0 ||
      options.max_inflight < 1 || options.max_queue < 0 ||
      options.retry_after_ms < 0) {
    return absl::InvalidArgumentError(
        "gRPC server limits must be positive (max_queue and retry_after_ms "
        "may be 0)");
  }
  if (options.metrics == nullptr) options.metrics = std::make_shared<Metrics>();
  std::shared_ptr<grpc::ServerCredentials> creds =
      grpc::InsecureServerCredentials();
  if (!options.tls_cert_path.empty()) {
    KVD_ASSIGN_OR_RETURN(std::string cert, ReadPem(options.tls_cert_path));
    KVD_ASSIGN_OR_RETURN(std::string key, ReadPem(options.tls_key_path));
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({key, cert});
    if (!options.client_ca_path.empty()) {
      // Requested, and verified when presented: health checks and probes
      // need none, and what needs one (the router token, kvd.v1.Migration)
      // asks for the identity it names.
      KVD_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(options.client_ca_path));
      ssl.client_certificate_request =
          GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    creds = grpc::SslServerCredentials(ssl);
  }

  auto sessions =
      std::make_unique<SessionsService>(runtime, std::move(keys), options);
  auto health = std::make_unique<HealthService>(runtime);
  // The standard health service judges as kvd.v1.Health does.
  auto health_v1 = std::make_unique<GrpcHealthV1>(
      [runtime] { return runtime->engine().WriteHealth().ok(); },
      std::set<std::string>{"kvd.v1.Sessions", "kvd.v1.Health"});
  // Server reflection (grpcurl, grpc_cli, Postman) lists the services and
  // their messages: v1alpha from gRPC (its plugin registers itself with every
  // builder), v1 from kvd.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  AddReflectionV1(builder);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(MakeGrpcCallLog(options.metrics, options.log_calls));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  int port = 0;
  builder.AddListeningPort(options.address, creds, &port);
  builder.SetMaxReceiveMessageSize(options.max_receive_bytes);
  // gRPC listens with SO_REUSEPORT by default: a second node on the same
  // port would start and silently take half of the calls.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             options.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(Millis(options.keepalive_time)));
  builder.AddChannelArgument(
      GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
      static_cast<int>(Millis(options.keepalive_timeout)));
  builder.RegisterService(sessions.get());
  builder.RegisterService(health.get());
  builder.RegisterService(health_v1.get());
  for (grpc::Service* extra : options.extra_services) {
    builder.RegisterService(extra);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options.address,
        " (in use, or not an address of this host); pick another address"));
  }
  return std::make_unique<GrpcServer>(std::move(sessions), std::move(health),
                                      std::move(health_v1), std::move(server),
                                      port);
}

}  // namespace kvd::node
