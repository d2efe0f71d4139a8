#include "services/router/grpc_router.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/kvd/v1/sessions.grpc.pb.h"
#include "services/node/openai_request.h"

namespace kvd::router {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

std::string Metadata(const grpc::ServerContext* ctx, const char* key) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(key);
  return it == md.end() ? ""
                        : std::string(it->second.data(), it->second.size());
}

class ForwardingService final : public v1::Sessions::Service {
 public:
  ForwardingService(Routing* routing, GrpcRouterOptions options)
      : routing_(routing), options_(std::move(options)) {
    if (!options_.ca_cert_path.empty()) {
      auto read = [](const std::string& path) {
        if (path.empty()) return std::string();
        std::ifstream in(path);
        std::stringstream pem;
        pem << in.rdbuf();
        return pem.str();
      };
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = read(options_.ca_cert_path);
      ssl.pem_cert_chain = read(options_.tls_cert_path);
      ssl.pem_private_key = read(options_.tls_key_path);
      credentials_ = grpc::SslCredentials(ssl);
    } else {
      credentials_ = grpc::InsecureChannelCredentials();
    }
  }

  grpc::Status CreateSession(grpc::ServerContext* ctx,
                             const v1::CreateSessionRequest* request,
                             v1::Session* response) override {
    if (request->session_id().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "name the session (session_id) when creating it "
                          "through a router: it is placed by its name");
    }
    Call call;
    if (grpc::Status s =
            Resolve(ctx, request->session_id(), How::kPlace, &call);
        !s.ok()) {
      return s;
    }
    return call.stub->CreateSession(call.up.get(), *request, response);
  }

  grpc::Status GetSession(grpc::ServerContext* ctx,
                          const v1::GetSessionRequest* request,
                          v1::Session* response) override {
    Call call;
    if (grpc::Status s =
            Resolve(ctx, request->session_id(), How::kOwner, &call);
        !s.ok()) {
      return s;
    }
    return call.stub->GetSession(call.up.get(), *request, response);
  }

  grpc::Status MigrateSession(grpc::ServerContext* ctx,
                              const v1::MigrateSessionRequest* request,
                              v1::MigrateSessionResponse* response) override {
    Call call;
    if (grpc::Status s =
            Resolve(ctx, request->session_id(), How::kOwner, &call);
        !s.ok()) {
      return s;
    }
    // The HTTP front end's limit too: a move costs a whole session's bytes.
    if (absl::Status s = routing_->TakeMigration(call.tenant); !s.ok()) {
      return ToGrpc(s);
    }
    return call.stub->MigrateSession(call.up.get(), *request, response);
  }

  grpc::Status DeleteSession(grpc::ServerContext* ctx,
                             const v1::DeleteSessionRequest* request,
                             v1::DeleteSessionResponse* response) override {
    Call call;
    if (grpc::Status s =
            Resolve(ctx, request->session_id(), How::kOwner, &call);
        !s.ok()) {
      return s;
    }
    // The directory forgets it first, so no turn starts it again between
    // the node's delete and the directory's.
    if (absl::Status removed = routing_->directory().Remove(
            call.tenant, request->session_id(), call.entry);
        !removed.ok()) {
      return ToGrpc(removed);
    }
    return call.stub->DeleteSession(call.up.get(), *request, response);
  }

  grpc::Status ListSessions(grpc::ServerContext* ctx,
                            const v1::ListSessionsRequest*,
                            v1::ListSessionsResponse* response) override {
    std::string tenant;
    if (grpc::Status s = Begin(ctx, "", &tenant); !s.ok()) return s;
    auto listed = routing_->directory().List(tenant);
    if (!listed.ok()) return ToGrpc(listed.status());
    for (const auto& [id, e] : *listed) {
      response->add_sessions()->set_session_id(id);
    }
    return grpc::Status::OK;
  }

  // A call the node refused without running anything (the session is
  // being moved, or moved away: its kvd-retry trailer) goes to the session's
  // owner as the directory then names it, as the HTTP router resends a turn,
  // until options_.moved_retry_budget is spent.
  grpc::Status Generate(
      grpc::ServerContext* ctx, const v1::GenerateRequest* request,
      grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    const absl::Time give_up = absl::Now() + options_.moved_retry_budget;
    absl::Duration pause = absl::Milliseconds(50);
    for (;;) {
      Call call;
      if (grpc::Status s =
              Resolve(ctx, request->session_id(), How::kPlace, &call);
          !s.ok()) {
        return s;
      }
      routing_->placement().Started(call.target.node.id);
      bool relayed = false;
      grpc::Status s =
          RelayGenerate(call.stub->Generate(call.up.get(), *request), ctx,
                        writer, call, &relayed);
      routing_->placement().Finished(call.target.node.id);
      const std::string not_run =
          s.ok() || relayed ? "" : Trailer(*call.up, node::kRetryHeader);
      if (not_run.empty() || ctx->IsCancelled() || absl::Now() >= give_up) {
        return s;
      }
      routing_->metrics().Add("kvd_router_retries_total",
                              {{"reason", not_run}});
      if (not_run == "moving") {
        absl::SleepFor(pause);
        pause = std::min(pause * 2, absl::Seconds(1));
      }
    }
  }

  grpc::Status ExportSession(
      grpc::ServerContext* ctx, const v1::ExportSessionRequest* request,
      grpc::ServerWriter<v1::ExportSessionResponse>* writer) override {
    Call call;
    if (grpc::Status s =
            Resolve(ctx, request->session_id(), How::kOwner, &call);
        !s.ok()) {
      return s;
    }
    return Relay(call.stub->ExportSession(call.up.get(), *request), ctx, writer,
                 call);
  }

  grpc::Status Cancel(grpc::ServerContext*, const v1::CancelRequest*,
                      v1::CancelResponse*) override {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "Cancel through a router is not built: cancel the "
                        "Generate call itself (the router passes it on)");
  }

  grpc::Status ImportSession(grpc::ServerContext* ctx,
                             grpc::ServerReader<v1::ImportSessionRequest>* in,
                             v1::Session* response) override {
    v1::ImportSessionRequest first;
    if (!in->Read(&first)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "an import needs at least one message");
    }
    if (first.session_id().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "name the session (session_id in the first "
                          "message) when importing through a router: it "
                          "places the session before any byte is sent");
    }
    Call call;
    if (grpc::Status s = Resolve(ctx, first.session_id(), How::kPlace, &call);
        !s.ok()) {
      return s;
    }
    auto out = call.stub->ImportSession(call.up.get(), response);
    bool ok = out->Write(first);
    v1::ImportSessionRequest next;
    while (ok && in->Read(&next)) ok = out->Write(next);
    out->WritesDone();
    // A failed import leaves its placement: the session's first turn would
    // start it there, empty (removing the entry here could race another
    // router's placement of the same name).
    return out->Finish();
  }

 private:
  // Where a call goes: the tenant, the node, its stub and the upstream
  // call's context (deadline, router token, tenant).
  struct Call {
    std::string tenant;
    Target target;
    cluster::DirectoryEntry entry;  // kOwner: the entry read
    v1::Sessions::Stub* stub = nullptr;
    std::unique_ptr<grpc::ClientContext> up;
  };
  // kOwner: the session's owner; kPlace: the owner, placing a session the
  // directory lacks first, or (no session) any node of the call's model.
  enum class How { kOwner, kPlace };

  grpc::Status Resolve(const grpc::ServerContext* ctx,
                       const std::string& session, How how, Call* call) {
    if (grpc::Status s = Begin(ctx, session, &call->tenant); !s.ok()) return s;
    absl::StatusOr<Target> t;
    if (how == How::kOwner) {
      t = routing_->Owner(call->tenant, session, "", &call->entry);
    } else if (!session.empty()) {
      t = OwnerOrPlace(ctx, call->tenant, session);
    } else {
      std::string model;
      if (grpc::Status s = Model(ctx, &model); !s.ok()) return s;
      t = routing_->Stateless(model, {});
    }
    if (!t.ok()) return ToGrpc(t.status());
    call->target = *std::move(t);
    call->stub = Stub(call->target);
    if (call->stub == nullptr) return Unreachable(call->target);
    call->up = Upstream(ctx, call->tenant);
    return grpc::Status::OK;
  }

  // Passes a node's response stream on; a client that leaves cancels the
  // node's call too.
  template <typename Response>
  static grpc::Status Relay(
      std::unique_ptr<grpc::ClientReader<Response>> reader,
      grpc::ServerContext* ctx, grpc::ServerWriter<Response>* writer,
      const Call& call) {
    Response r;
    while (reader->Read(&r)) {
      if (ctx->IsCancelled() || !writer->Write(r)) {
        call.up->TryCancel();
        break;
      }
    }
    return reader->Finish();
  }

  // Relay for Generate: the node's `started` message is held back until
  // something follows it, because a node may still refuse the turn after
  // it without running anything (the session moved between its owner check
  // and the turn's claim; the kvd-retry trailer says so). Such a call has
  // relayed nothing and can be resent; the client sees one `started`, from
  // the node that runs its turn. `relayed`: set once a message went on to
  // the caller.
  static grpc::Status RelayGenerate(
      std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader,
      grpc::ServerContext* ctx,
      grpc::ServerWriter<v1::GenerateResponse>* writer, const Call& call,
      bool* relayed) {
    std::optional<v1::GenerateResponse> held;
    v1::GenerateResponse r;
    auto forward = [&](const v1::GenerateResponse& m) {
      *relayed = true;
      if (ctx->IsCancelled() || !writer->Write(m)) {
        call.up->TryCancel();
        return false;
      }
      return true;
    };
    bool open = true;
    while (open && reader->Read(&r)) {
      if (!*relayed && !held.has_value() && r.has_started()) {
        held = r;
        continue;
      }
      if (held.has_value()) {
        open = forward(*held);
        held.reset();
      }
      if (open) open = forward(r);
    }
    grpc::Status s = reader->Finish();
    const bool resendable =
        !s.ok() && !Trailer(*call.up, node::kRetryHeader).empty();
    if (held.has_value() && !resendable) forward(*held);
    return s;
  }

  // A trailing metadata value of a finished call ("" if absent).
  static std::string Trailer(const grpc::ClientContext& up, const char* key) {
    const auto& md = up.GetServerTrailingMetadata();
    auto it = md.find(key);
    return it == md.end() ? ""
                          : std::string(it->second.data(), it->second.size());
  }

  // The caller's tenant, and a valid session id when one is given.
  grpc::Status Begin(const grpc::ServerContext* ctx, const std::string& session,
                     std::string* tenant) {
    absl::StatusOr<std::string> t =
        options_.keys.TenantForBearer(Metadata(ctx, "authorization"));
    if (!t.ok()) return ToGrpc(t.status());
    *tenant = *t;
    if (!session.empty()) {
      if (absl::Status s = node::ValidateSessionId(session, "session_id");
          !s.ok()) {
        return ToGrpc(s);
      }
    }
    return grpc::Status::OK;
  }

  // The session's owner; a session the directory lacks is placed for the
  // call's model first.
  absl::StatusOr<Target> OwnerOrPlace(const grpc::ServerContext* ctx,
                                      const std::string& tenant,
                                      const std::string& session) {
    absl::StatusOr<Target> owner =
        routing_->Owner(tenant, session, Metadata(ctx, "kvd-model"), nullptr);
    if (owner.status().code() != absl::StatusCode::kNotFound) return owner;
    std::string model;
    if (grpc::Status s = Model(ctx, &model); !s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          s.error_message());
    }
    return routing_->Place(tenant, session, model);
  }

  // The model a new session or stateless call is placed for.
  grpc::Status Model(const grpc::ServerContext* ctx, std::string* model) {
    *model = Metadata(ctx, "kvd-model");
    if (!model->empty()) return grpc::Status::OK;
    std::set<std::string> served;
    for (const cluster::NodeInfo& n : routing_->LiveNodes()) {
      served.insert(n.model_id);
    }
    if (served.size() == 1) {
      *model = *served.begin();
      return grpc::Status::OK;
    }
    return grpc::Status(served.empty() ? grpc::StatusCode::UNAVAILABLE
                                       : grpc::StatusCode::INVALID_ARGUMENT,
                        served.empty()
                            ? "no live nodes; retry later"
                            : "the cluster serves several models: name one in "
                              "the metadata key kvd-model");
  }

  std::unique_ptr<grpc::ClientContext> Upstream(const grpc::ServerContext* ctx,
                                                const std::string& tenant) {
    auto up = std::make_unique<grpc::ClientContext>();
    up->set_deadline(ctx->deadline());
    up->AddMetadata("authorization",
                    absl::StrCat("Bearer ", options_.router_token));
    up->AddMetadata(node::kForwardedTenantHeader, tenant);
    return up;
  }

  // Null when the node serves no gRPC (Unreachable says so).
  v1::Sessions::Stub* Stub(const Target& t) {
    if (t.node.grpc_address.empty()) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    auto& stub = stubs_[t.node.grpc_address];
    if (stub == nullptr) {
      stub = v1::Sessions::NewStub(
          grpc::CreateChannel(t.node.grpc_address, credentials_));
    }
    return stub.get();
  }

  static grpc::Status Unreachable(const Target& t) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("node '", t.node.id,
                                     "' serves no gRPC (kvd serve --grpc-port "
                                     "-1); use the router's HTTP API"));
  }

  Routing* const routing_;
  const GrpcRouterOptions options_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<v1::Sessions::Stub>> stubs_;
};

class GrpcRouterImpl : public GrpcRouter {
 public:
  GrpcRouterImpl(Routing* routing, GrpcRouterOptions options)
      : service_(routing, std::move(options)) {}
  ~GrpcRouterImpl() override { Shutdown(); }

  absl::Status Start(const std::string& address) {
    grpc::ServerBuilder b;
    b.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&service_);
    b.SetMaxReceiveMessageSize((1 << 20) + (64 << 10));
    server_ = b.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      return absl::UnavailableError(
          absl::StrCat("the router cannot listen for gRPC on ", address,
                       " (in use?): pick another --grpc-port"));
    }
    return absl::OkStatus();
  }
  int port() const override { return port_; }
  void Shutdown() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (server_ != nullptr && !shut_down_) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(5));
      shut_down_ = true;
    }
  }

 private:
  ForwardingService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex mu_;
  bool shut_down_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcRouter>> GrpcRouter::Start(
    Routing* routing, GrpcRouterOptions options) {
  const std::string address = options.address;
  auto r = std::make_unique<GrpcRouterImpl>(routing, std::move(options));
  absl::Status s = r->Start(address);
  if (!s.ok()) return s;
  return r;
}

}  // namespace kvd::router
