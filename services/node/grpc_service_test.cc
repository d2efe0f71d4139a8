// A real server on 127.0.0.1:0 over a tiny random-weight GGUF model (byte
// tokenizer, no chat template: raw prompts), driven through a real client
// stub.
#include "services/node/grpc_service.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "ops/model/testing/tiny_model.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/grpc/reflection/v1/reflection.grpc.pb.h"
#include "proto/kvd/v1/health.grpc.pb.h"
#include "proto/kvd/v1/sessions.grpc.pb.h"
#include "services/node/grpc_convert.h"
#include "storage/checkpoint/session_file.h"
#include "storage/tiered/testing/sessions.h"

namespace kvd::node {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

struct Reply {
  grpc::Status status;
  std::string request_id;
  std::string text;                // concatenated deltas
  std::vector<int32_t> delta_ids;  // concatenated deltas' token ids
  std::vector<v1::TokenLogprobs> delta_logprobs;
  int deltas = 0;
  v1::GenerateFinished finished;
  bool got_finished = false;
};

class GrpcServiceTest : public ::testing::Test {
 protected:
  // The default tiny model; a 4000-token generation still outlasts a cancel
  // sent after the third delta by far.
  static ops::testing::TinyModelSpec Spec() {
    ops::testing::TinyModelSpec spec;
    spec.context_length = 4096;
    // Tied embeddings make a random model echo its last input token
    // whatever came before; an untied head lets the context show.
    spec.tied_embeddings = false;
    return spec;
  }

  void Start(KeyStore keys, GrpcServerOptions options = {},
             const std::function<void(NodeOptions&)>& tweak = nullptr) {
    const std::string dir = ::testing::TempDir();
    absl::StatusOr<std::string> path =
        ops::testing::WriteTinyModel(Spec(), dir);
    ASSERT_TRUE(path.ok()) << path.status();
    NodeOptions node;
    node.model_path = *path;
    node.data_dir =
        dir + "/" +
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    node.num_threads = 2;
    if (tweak) tweak(node);
    absl::StatusOr<std::unique_ptr<NodeRuntime>> rt =
        NodeRuntime::Open(node, nullptr);
    ASSERT_TRUE(rt.ok()) << rt.status();
    runtime_ = std::move(*rt);
    absl::StatusOr<std::unique_ptr<GrpcServer>> server =
        StartGrpcServer(runtime_.get(), std::move(keys), options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Sessions::NewStub(channel_);
  }

  void SetUp() override {}
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(2));
  }

  static void Auth(grpc::ClientContext* ctx, const std::string& key) {
    if (!key.empty()) ctx->AddMetadata("authorization", "Bearer " + key);
  }

  static v1::GenerateRequest Raw(const std::string& session,
                                 const std::string& prompt,
                                 int64_t max_tokens) {
    v1::GenerateRequest req;
    req.set_session_id(session);
    req.set_prompt(prompt);
    // Sampled, not greedy: a random model's greedy output repeats one token
    // whatever the context, so only sampling shows that context matters.
    req.mutable_sampling()->set_temperature(1);
    req.mutable_sampling()->set_seed(1234);
    req.mutable_sampling()->set_max_tokens(max_tokens);
    req.mutable_sampling()->set_ignore_eos(true);
    return req;
  }

  Reply Generate(const v1::GenerateRequest& req, const std::string& key = "",
                 grpc::ClientContext* given = nullptr) {
    grpc::ClientContext local;
    grpc::ClientContext* ctx = given != nullptr ? given : &local;
    Auth(ctx, key);
    Reply reply;
    auto reader = stub_->Generate(ctx, req);
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      if (msg.has_started()) reply.request_id = msg.started().request_id();
      if (msg.has_delta()) {
        reply.deltas++;
        reply.text += msg.delta().text();
        reply.delta_ids.insert(reply.delta_ids.end(),
                               msg.delta().token_ids().begin(),
                               msg.delta().token_ids().end());
        reply.delta_logprobs.insert(reply.delta_logprobs.end(),
                                    msg.delta().logprobs().begin(),
                                    msg.delta().logprobs().end());
      }
      if (msg.has_finished()) {
        reply.finished = msg.finished();
        reply.got_finished = true;
      }
    }
    reply.status = reader->Finish();
    return reply;
  }

  grpc::Status Create(const std::string& id, const std::string& key = "",
                      v1::Session* out = nullptr) {
    grpc::ClientContext ctx;
    Auth(&ctx, key);
    v1::CreateSessionRequest req;
    req.set_session_id(id);
    v1::Session s;
    grpc::Status st = stub_->CreateSession(&ctx, req, &s);
    if (out != nullptr) *out = s;
    return st;
  }

  grpc::Status Get(const std::string& id, v1::Session* out,
                   const std::string& key = "") {
    grpc::ClientContext ctx;
    Auth(&ctx, key);
    v1::GetSessionRequest req;
    req.set_session_id(id);
    return stub_->GetSession(&ctx, req, out);
  }

  std::unique_ptr<NodeRuntime> runtime_;
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Sessions::Stub> stub_;
};

TEST_F(GrpcServiceTest, HealthServing) {
  Start(KeyStore());
  auto health = v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  v1::HealthResponse resp;
  ASSERT_TRUE(health->Check(&ctx, v1::HealthRequest(), &resp).ok());
  EXPECT_EQ(resp.status(), v1::HealthResponse::SERVING);
  EXPECT_EQ(resp.model(), runtime_->model_id());
  EXPECT_GT(resp.numerics_version(), 0u);
  EXPECT_EQ(resp.backend(), "cpu");
}

// gRPC allows SO_REUSEPORT by default; a second node on the same port then
// started and took part of the calls.
TEST_F(GrpcServiceTest, SecondServerOnTheSamePortIsRefused) {
  Start(KeyStore());
  GrpcServerOptions options;
  options.address = absl::StrCat("127.0.0.1:", server_->port());
  absl::StatusOr<std::unique_ptr<GrpcServer>> second =
      StartGrpcServer(runtime_.get(), KeyStore(), options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(GrpcServiceTest, CreateGetListPagedDelete) {
  Start(KeyStore());
  v1::Session generated;
  ASSERT_TRUE(Create("", "", &generated).ok());
  EXPECT_THAT(generated.session_id(), Not(IsEmpty()));
  for (const char* id : {"a", "b", "c", "d"}) ASSERT_TRUE(Create(id).ok());
  EXPECT_EQ(Create("a").error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(Create("bad/name").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  {
    grpc::ClientContext ctx;
    v1::CreateSessionRequest req;
    req.set_session_id("labelled");
    (*req.mutable_labels())["title"] = "hello";
    v1::Session s;
    ASSERT_TRUE(stub_->CreateSession(&ctx, req, &s).ok());
    EXPECT_EQ(s.labels().at("title"), "hello");
  }
  v1::Session got;
  ASSERT_TRUE(Get("labelled", &got).ok());
  EXPECT_EQ(got.labels().at("title"), "hello");
  EXPECT_EQ(got.token_count(), 0);

  std::vector<std::string> listed;
  std::string token;
  int pages = 0;
  do {
    grpc::ClientContext ctx;
    v1::ListSessionsRequest req;
    req.set_page_size(2);
    req.set_page_token(token);
    v1::ListSessionsResponse resp;
    ASSERT_TRUE(stub_->ListSessions(&ctx, req, &resp).ok());
    EXPECT_LE(resp.sessions_size(), 2);
    for (const v1::Session& s : resp.sessions())
      listed.push_back(s.session_id());
    token = resp.next_page_token();
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(listed.size(), 6u);
  EXPECT_GE(pages, 3);
  EXPECT_TRUE(std::is_sorted(listed.begin(), listed.end()));

  {
    grpc::ClientContext ctx;
    v1::ListSessionsRequest req;
    req.set_page_size(1001);
    v1::ListSessionsResponse resp;
    grpc::Status st = stub_->ListSessions(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(st.error_message(), HasSubstr("1000"));
  }
  {
    grpc::ClientContext ctx;
    v1::DeleteSessionRequest req;
    req.set_session_id("a");
    v1::DeleteSessionResponse resp;
    ASSERT_TRUE(stub_->DeleteSession(&ctx, req, &resp).ok());
  }
  EXPECT_EQ(Get("a", &got).error_code(), grpc::StatusCode::NOT_FOUND);
  {
    grpc::ClientContext ctx;
    v1::DeleteSessionRequest req;
    req.set_session_id("a");
    v1::DeleteSessionResponse resp;
    EXPECT_EQ(stub_->DeleteSession(&ctx, req, &resp).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
}

TEST_F(GrpcServiceTest, TwoTurnConversationSendsOnlyTheNewMessage) {
  Start(KeyStore());
  ASSERT_TRUE(Create("chat").ok());
  Reply t1 = Generate(Raw("chat", "Hello there", 12));
  ASSERT_TRUE(t1.status.ok()) << t1.status.error_message();
  ASSERT_TRUE(t1.got_finished);
  EXPECT_THAT(t1.request_id, Not(IsEmpty()));
  EXPECT_EQ(t1.finished.turn(), 1u);
  EXPECT_EQ(t1.finished.finish_reason(), "length");
  EXPECT_EQ(t1.finished.usage().completion_tokens(), 12);
  EXPECT_EQ(t1.finished.token_ids_size(), 12);
  EXPECT_EQ(t1.text, t1.finished.text());

  Reply t2 = Generate(Raw("chat", " and more", 8));
  ASSERT_TRUE(t2.status.ok()) << t2.status.error_message();
  EXPECT_EQ(t2.finished.turn(), 2u);
  EXPECT_EQ(t2.finished.state_path(), "hot");
  // Usage counts as OpenAI's: the whole context, and as cached all of the
  // session's tokens but the pending last one (the turn ran only it and the
  // new message).
  const int64_t new_tokens = static_cast<int64_t>(
      runtime_->tokenizer().Encode(" and more", false, false).size());
  EXPECT_EQ(t2.finished.usage().prompt_tokens(),
            t1.finished.session_tokens() + new_tokens);
  EXPECT_EQ(t2.finished.usage().cached_tokens(),
            t1.finished.session_tokens() - 1);
  EXPECT_EQ(t1.finished.usage().cached_tokens(), 0);
  EXPECT_EQ(t2.finished.session_tokens(),
            t1.finished.session_tokens() + new_tokens + 8);
  v1::Session s;
  ASSERT_TRUE(Get("chat", &s).ok());
  EXPECT_EQ(s.turns(), 2);
  EXPECT_EQ(s.token_count(), t2.finished.session_tokens());

  // The reply depends on the stored context: the same message in a fresh
  // session continues differently.
  ASSERT_TRUE(Create("fresh").ok());
  Reply alone = Generate(Raw("fresh", " and more", 8));
  ASSERT_TRUE(alone.status.ok());
  EXPECT_NE(std::vector<int32_t>(alone.finished.token_ids().begin(),
                                 alone.finished.token_ids().end()),
            std::vector<int32_t>(t2.finished.token_ids().begin(),
                                 t2.finished.token_ids().end()));
}

TEST_F(GrpcServiceTest, StatelessGenerateStoresNothing) {
  Start(KeyStore());
  Reply r = Generate(Raw("", "Once upon a time", 10));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finished.state_path(), "");
  EXPECT_EQ(r.finished.token_ids_size(), 10);
  grpc::ClientContext ctx;
  v1::ListSessionsResponse list;
  ASSERT_TRUE(stub_->ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok());
  EXPECT_EQ(list.sessions_size(), 0);

  // A session's first turn over the same prompt generates the same tokens.
  ASSERT_TRUE(Create("s").ok());
  Reply first = Generate(Raw("s", "Once upon a time", 10));
  ASSERT_TRUE(first.status.ok());
  EXPECT_EQ(std::vector<int32_t>(first.finished.token_ids().begin(),
                                 first.finished.token_ids().end()),
            std::vector<int32_t>(r.finished.token_ids().begin(),
                                 r.finished.token_ids().end()));
}

TEST_F(GrpcServiceTest, TenantsAreIsolatedAndKeysRequired) {
  absl::StatusOr<KeyStore> keys =
      KeyStore::FromPairs({{"sk-a", "acme"}, {"sk-b", "globex"}});
  ASSERT_TRUE(keys.ok());
  Start(std::move(*keys));
  ASSERT_TRUE(Create("secret", "sk-a").ok());
  v1::Session s;
  EXPECT_TRUE(Get("secret", &s, "sk-a").ok());
  EXPECT_EQ(Get("secret", &s, "sk-b").error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Generate(Raw("secret", "hi", 2), "sk-b").status.error_code(),
            grpc::StatusCode::NOT_FOUND);
  {
    grpc::ClientContext ctx;
    Auth(&ctx, "sk-b");
    v1::DeleteSessionRequest req;
    req.set_session_id("secret");
    v1::DeleteSessionResponse resp;
    EXPECT_EQ(stub_->DeleteSession(&ctx, req, &resp).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    Auth(&ctx, "sk-b");
    v1::ExportSessionRequest req;
    req.set_session_id("secret");
    auto reader = stub_->ExportSession(&ctx, req);
    v1::ExportSessionResponse msg;
    while (reader->Read(&msg)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    Auth(&ctx, "sk-b");
    v1::ListSessionsResponse list;
    ASSERT_TRUE(
        stub_->ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok());
    EXPECT_EQ(list.sessions_size(), 0);
  }
  // The owner still has it.
  EXPECT_TRUE(Get("secret", &s, "sk-a").ok());

  grpc::Status no_key = Get("secret", &s, "");
  EXPECT_EQ(no_key.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(no_key.error_message(), HasSubstr("Bearer"));
  EXPECT_EQ(Get("secret", &s, "sk-wrong").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Generate(Raw("", "hi", 2), "").status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Health stays open for probes.
  auto health = v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  v1::HealthResponse resp;
  EXPECT_TRUE(health->Check(&ctx, v1::HealthRequest(), &resp).ok());
}

TEST_F(GrpcServiceTest, InvalidParametersAreRejectedQuickly) {
  Start(KeyStore());
  ASSERT_TRUE(Create("s").ok());
  struct Case {
    const char* name;
    std::function<void(v1::GenerateRequest*)> edit;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"negative max_tokens",
       [](v1::GenerateRequest* r) {
         r->mutable_sampling()->set_max_tokens(-1);
       },
       "4096"},
      {"huge max_tokens",
       [](v1::GenerateRequest* r) {
         r->mutable_sampling()->set_max_tokens(int64_t{1} << 40);
       },
       "4096"},
      {"NaN temperature",
       [](v1::GenerateRequest* r) {
         r->mutable_sampling()->set_temperature(std::nanf(""));
       },
       "temperature"},
      {"negative temperature",
       [](v1::GenerateRequest* r) {
         r->mutable_sampling()->set_temperature(-0.5f);
       },
       "temperature"},
      {"top_p 0",
       [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(0); },
       "(0, 1]"},
      // HTTP's bounds: temperature in [0, 2], at most 4 stop strings.
      {"temperature above 2",
       [](v1::GenerateRequest* r) {
         r->mutable_sampling()->set_temperature(2.5f);
       },
       "[0, 2]"},
      {"5 stop strings",
       [](v1::GenerateRequest* r) {
         for (int i = 0; i < 5; ++i) r->mutable_sampling()->add_stop("x");
       },
       "at most 4"},
      {"bad session id",
       [](v1::GenerateRequest* r) { r->set_session_id("../x"); }, "session id"},
      {"no input", [](v1::GenerateRequest* r) { r->clear_prompt(); }, "prompt"},
      // Each fits alone; together with the prompt they exceed the context.
      {"prompt + max_tokens over the context",
       [](v1::GenerateRequest* r) {
         r->mutable_sampling()->set_max_tokens(4096);
       },
       "context"},
      {"unknown role",
       [](v1::GenerateRequest* r) {
         r->clear_prompt();
         v1::ChatMessage* m = r->add_messages();
         m->set_role("wizard");
         m->set_content("hi");
       },
       "role"},
  };
  for (const Case& c : cases) {
    for (const std::string session : {"s", ""}) {
      v1::GenerateRequest req = Raw(session, "hi", 4);
      c.edit(&req);
      const auto start = std::chrono::steady_clock::now();
      Reply r = Generate(req);
      const double seconds = std::chrono::duration<double>(
                                 std::chrono::steady_clock::now() - start)
                                 .count();
      EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << c.name << " session='" << session << "'";
      EXPECT_THAT(r.status.error_message(), HasSubstr(c.message)) << c.name;
      EXPECT_FALSE(r.got_finished) << c.name;
      // Refused before the `started` event, as HTTP answers 400 at once
      // (a session turn's fit to the context is exact only under the
      // session's lock, after it).
      if (std::string(c.name) != "prompt + max_tokens over the context" ||
          session.empty()) {
        EXPECT_THAT(r.request_id, IsEmpty()) << c.name;
      }
      EXPECT_LT(seconds, 1.0) << c.name;
    }
  }
  // Messages on a model without a chat template.
  v1::GenerateRequest chat = Raw("s", "", 4);
  v1::ChatMessage* m = chat.add_messages();
  m->set_role("user");
  m->set_content("hi");
  EXPECT_EQ(Generate(chat).status.error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  v1::Session s;
  ASSERT_TRUE(Get("s", &s).ok());
  EXPECT_EQ(s.turns(), 0);
}

// A generation that the node's shutdown stops is UNAVAILABLE (retry on
// another node), not CANCELLED, which clients read as their own cancel.
TEST_F(GrpcServiceTest, ShutdownEndsRunningGenerationsWithUnavailable) {
  Start(KeyStore());
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Raw("", "a long one", 4000));
  v1::GenerateResponse msg;
  int deltas = 0;
  std::thread stopper;
  while (reader->Read(&msg)) {
    if (msg.has_delta() && ++deltas == 3) {
      stopper = std::thread([this] { server_->Shutdown(absl::Seconds(10)); });
    }
    ASSERT_FALSE(msg.has_finished()) << "generation finished before shutdown";
  }
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << status.error_message();
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("shutting down"));
  if (stopper.joinable()) stopper.join();
}

TEST_F(GrpcServiceTest, ClientCancelStopsGenerationAndCommitsNothing) {
  Start(KeyStore());
  ASSERT_TRUE(Create("s").ok());
  ASSERT_TRUE(Generate(Raw("s", "first turn", 4)).status.ok());

  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Raw("s", " long one", 4000));
  v1::GenerateResponse msg;
  int deltas = 0;
  const auto start = std::chrono::steady_clock::now();
  while (reader->Read(&msg)) {
    if (msg.has_delta() && ++deltas == 3) ctx.TryCancel();
    ASSERT_FALSE(msg.has_finished()) << "generation finished before cancel";
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);

  // The server stops the turn at its next step; until then the session is
  // busy (a turn sent meanwhile is ABORTED, as over HTTP).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (runtime_->engine().stats().turns_failed < 1 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // The session's lock is free again and the next turn starts from turn 1.
  Reply next = Generate(Raw("s", " again", 4));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.finished.turn(), 2u);
  EXPECT_LT(seconds, 10.0);
  EXPECT_EQ(runtime_->engine().stats().turns_failed, 1);
}

TEST_F(GrpcServiceTest, CancelByRequestIdAndDeadline) {
  Start(KeyStore());
  ASSERT_TRUE(Create("s").ok());
  {
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, Raw("s", "go", 4000));
    v1::GenerateResponse msg;
    ASSERT_TRUE(reader->Read(&msg));
    ASSERT_TRUE(msg.has_started());
    grpc::ClientContext cancel_ctx;
    v1::CancelRequest cancel;
    cancel.set_request_id(msg.started().request_id());
    v1::CancelResponse resp;
    ASSERT_TRUE(stub_->Cancel(&cancel_ctx, cancel, &resp).ok());
    while (reader->Read(&msg)) ASSERT_FALSE(msg.has_finished());
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
    grpc::ClientContext again;
    EXPECT_EQ(stub_->Cancel(&again, cancel, &resp).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(300));
    Reply r = Generate(Raw("s", "go", 4000), "", &ctx);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_FALSE(r.got_finished);
  }
  // The client gives up at its deadline by itself; the server notices at
  // its next step and fails the turn.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (runtime_->engine().stats().turns_failed < 2 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(runtime_->engine().stats().turns_failed, 2);
  v1::Session s;
  ASSERT_TRUE(Get("s", &s).ok());
  EXPECT_EQ(s.turns(), 0);
}

// A call resent with the request_id of the session's last committed turn
// streams that turn's reply again and commits nothing; a request_id without
// a session, or not printable, is refused.
TEST_F(GrpcServiceTest, ARetriedRequestIdGetsTheCommittedReplyAgain) {
  Start(KeyStore());
  ASSERT_TRUE(Create("retried").ok());
  v1::GenerateRequest request = Raw("retried", "Hello there", 6);
  request.set_request_id("call-1");
  Reply first = Generate(request);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_FALSE(first.finished.replayed());

  Reply again = Generate(request);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_TRUE(again.finished.replayed());
  EXPECT_EQ(again.text, first.text);
  EXPECT_EQ(again.finished.text(), first.finished.text());
  EXPECT_EQ(std::vector<int32_t>(again.finished.token_ids().begin(),
                                 again.finished.token_ids().end()),
            std::vector<int32_t>(first.finished.token_ids().begin(),
                                 first.finished.token_ids().end()));
  EXPECT_EQ(again.finished.usage().prompt_tokens(),
            first.finished.usage().prompt_tokens());
  EXPECT_EQ(again.finished.turn(), 1u);
  v1::Session s;
  ASSERT_TRUE(Get("retried", &s).ok());
  EXPECT_EQ(s.turns(), 1);

  request.set_request_id("call-2");
  Reply next = Generate(request);
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_FALSE(next.finished.replayed());
  EXPECT_EQ(next.finished.turn(), 2u);

  v1::GenerateRequest stateless = Raw("", "Hello", 2);
  stateless.set_request_id("call-3");
  EXPECT_EQ(Generate(stateless).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  request.set_request_id("has space");
  EXPECT_EQ(Generate(request).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// A session that moved to another node is ABORTED over gRPC too, saying
// so, with nothing written.
TEST_F(GrpcServiceTest, TurnOfASessionThatMovedIsAborted) {
  Start(KeyStore());
  ASSERT_TRUE(Create("moved").ok());
  ASSERT_TRUE(Generate(Raw("moved", "hi", 2)).status.ok());
  absl::StatusOr<v1::SessionManifest> m =
      runtime_->store().GetManifest("local", "moved");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(storage::testing::MoveSessionForTest(runtime_->store(), "local",
                                                   "moved", "elsewhere", 2)
                  .ok());
  Reply r = Generate(Raw("moved", " more", 2));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(r.status.error_message(), HasSubstr("moved"));
  EXPECT_EQ(runtime_->store().GetManifest("local", "moved")->token_count(),
            m->token_count());
}

// A streamed import past the node's limit is refused while it arrives,
// and nothing of it is stored.
TEST_F(GrpcServiceTest, ImportPastTheLimitIsRefused) {
  GrpcServerOptions options;
  options.max_import_bytes = 10000;
  Start(KeyStore(), options);
  grpc::ClientContext ctx;
  v1::Session out;
  auto writer = stub_->ImportSession(&ctx, &out);
  // A well-formed header announcing a 9000-byte manifest, so the parser
  // keeps reading while the limit is reached.
  std::string head(storage::kSessionFileMagic);
  auto le = [&head](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i)
      head.push_back(static_cast<char>(v >> (8 * i)));
  };
  le(storage::kSessionFileVersion, 4);
  le(storage::kCheckpointFormatVersion, 4);
  le(9000, 8);
  v1::ImportSessionRequest req;
  req.set_session_id("big");
  req.set_chunk(head + std::string(8000 - head.size(), 'x'));
  EXPECT_TRUE(writer->Write(req));
  req.clear_session_id();
  req.set_chunk(std::string(8000, 'x'));
  writer->Write(req);  // over the limit now
  writer->WritesDone();
  const grpc::Status s = writer->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("10000"));
  v1::Session got;
  EXPECT_EQ(Get("big", &got).error_code(), grpc::StatusCode::NOT_FOUND);
}

// One admission control for both front ends: a slot the HTTP side holds is
// one gRPC cannot take, and the refusal carries gRPC's retry pushback.
TEST_F(GrpcServiceTest, AdmissionIsSharedAndRefusalsCarryRetryPushback) {
  GrpcServerOptions options;
  options.admission = std::make_shared<Admission>(/*max_inflight=*/1,
                                                  /*max_queue=*/0);
  options.retry_after_ms = 1500;
  Start(KeyStore(), options);
  {
    // As an HTTP request would hold it.
    absl::StatusOr<Admission::Permit> http = options.admission->Acquire();
    ASSERT_TRUE(http.ok());
    grpc::ClientContext ctx;
    Reply refused = Generate(Raw("", "go", 2), "", &ctx);
    EXPECT_EQ(refused.status.error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(refused.status.error_message(), HasSubstr("retry"));
    EXPECT_THAT(refused.request_id, IsEmpty());  // refused before `started`
    const auto& trailers = ctx.GetServerTrailingMetadata();
    auto pushback = trailers.find("grpc-retry-pushback-ms");
    ASSERT_NE(pushback, trailers.end());
    EXPECT_EQ(std::string(pushback->second.data(), pushback->second.size()),
              "1500");
  }
  // The slot is free again: gRPC takes it, and the HTTP side is refused.
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Raw("", "go", 4000));
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));  // started: the slot is taken
  EXPECT_EQ(options.admission->Acquire().status().code(),
            absl::StatusCode::kResourceExhausted);
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  reader->Finish();
}

// A message past the receive limit (HTTP's body limit) is refused by gRPC
// before the service sees it: nothing is tokenized or run.
TEST_F(GrpcServiceTest, OversizedRequestIsRefusedBeforeAnyWork) {
  GrpcServerOptions options;
  options.metrics = std::make_shared<Metrics>();
  Start(KeyStore(), options);
  const std::string huge(2 << 20, 'a');
  Reply r = Generate(Raw("", huge, 2));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << r.status.error_message();
  EXPECT_THAT(r.request_id, IsEmpty());
  EXPECT_EQ(runtime_->engine().stats().scheduler.prefill_tokens, 0);
  // gRPC refuses it in its transport, before any handler or interceptor of
  // kvd's sees it: neither logged nor counted (HTTP logs its 413).
  EXPECT_EQ(options.metrics->Value("kvd_grpc_requests_total",
                                   {{"method", "/kvd.v1.Sessions/Generate"},
                                    {"code", "RESOURCE_EXHAUSTED"}}),
            0);
  // A request under the limit still runs.
  EXPECT_TRUE(Generate(Raw("", std::string(1000, 'a'), 2)).status.ok());
}

// A turn on a session that is running one is refused at once (HTTP's 409),
// instead of holding an admission slot while it waits.
TEST_F(GrpcServiceTest, TurnOnABusySessionIsAbortedAtOnce) {
  Start(KeyStore());
  ASSERT_TRUE(Create("busy").ok());
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Raw("busy", "go", 4000));
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));  // started
  ASSERT_TRUE(reader->Read(&msg));  // a delta: the turn holds the session
  ASSERT_TRUE(msg.has_delta());
  Reply second = Generate(Raw("busy", "more", 2));
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(second.status.error_message(), HasSubstr("busy"));
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  reader->Finish();
}

// protobuf refuses a string field with invalid UTF-8; the client is told so
// as INVALID_ARGUMENT, not an empty INTERNAL.
TEST_F(GrpcServiceTest, InvalidUtf8IsInvalidArgument) {
  Start(KeyStore());
  // Valid bytes, then the prompt's last byte made invalid UTF-8.
  v1::GenerateRequest req = Raw("", "hi!", 2);
  std::string bytes = req.SerializeAsString();
  const size_t at = bytes.find("hi!");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 2] = static_cast<char>(0xff);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::GenericStub generic(channel_);
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  auto call = generic.PrepareCall(&ctx, "/kvd.v1.Sessions/Generate", &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(4)) {
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("UTF-8"));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

// Every call is counted per method and status code, with its latency, in
// the metrics HTTP's /metrics renders.
TEST_F(GrpcServiceTest, CallsAreCountedPerMethodAndCode) {
  GrpcServerOptions options;
  options.metrics = std::make_shared<Metrics>();
  Start(KeyStore(), options);
  ASSERT_TRUE(Create("m").ok());
  EXPECT_EQ(Create("m").error_code(), grpc::StatusCode::ALREADY_EXISTS);
  ASSERT_TRUE(Generate(Raw("m", "hi", 2)).status.ok());
  Metrics& m = *options.metrics;
  EXPECT_EQ(
      m.Value("kvd_grpc_requests_total",
              {{"method", "/kvd.v1.Sessions/CreateSession"}, {"code", "OK"}}),
      1);
  EXPECT_EQ(m.Value("kvd_grpc_requests_total",
                    {{"method", "/kvd.v1.Sessions/CreateSession"},
                     {"code", "ALREADY_EXISTS"}}),
            1);
  EXPECT_EQ(m.Value("kvd_grpc_requests_total",
                    {{"method", "/kvd.v1.Sessions/Generate"}, {"code", "OK"}}),
            1);
  EXPECT_THAT(m.Render(),
              HasSubstr("kvd_grpc_request_seconds_count{method=\"/kvd.v1."
                        "Sessions/Generate\"} 1"));
}

// A node whose next typical turn would not fit on its disk, though the disk
// is above its reserve, reports NOT_SERVING on both health services (the
// turn itself is refused), and SERVING again once there is room.
TEST_F(GrpcServiceTest, HealthSaysNotServingWhileATypicalTurnWouldNotFit) {
  // kvd keeps its memtable budget free, a sixteenth of a small disk: 4 MiB.
  constexpr int64_t kTotal = 64 << 20;
  constexpr int64_t kReserve = 4 << 20;
  auto available = std::make_shared<std::atomic<int64_t>>(48 << 20);
  Start(KeyStore(), {}, [available](NodeOptions& node) {
    node.disk_space_for_test =
        [available](const std::string&) -> absl::StatusOr<storage::DiskSpace> {
      return storage::DiskSpace{kTotal, *available};
    };
  });
  auto serving = [this] {
    auto kvd_health = v1::Health::NewStub(channel_);
    grpc::ClientContext a;
    v1::HealthResponse kvd_resp;
    EXPECT_TRUE(kvd_health->Check(&a, v1::HealthRequest(), &kvd_resp).ok());
    auto std_health = grpc::health::v1::Health::NewStub(channel_);
    grpc::ClientContext b;
    grpc::health::v1::HealthCheckResponse std_resp;
    EXPECT_TRUE(
        std_health->Check(&b, grpc::health::v1::HealthCheckRequest(), &std_resp)
            .ok());
    const bool kvd_serving = kvd_resp.status() == v1::HealthResponse::SERVING;
    EXPECT_EQ(kvd_serving, std_resp.status() ==
                               grpc::health::v1::HealthCheckResponse::SERVING);
    return kvd_serving;
  };
  for (const char* session : {"a", "b", "c", "d"}) {
    ASSERT_TRUE(Create(session).ok()) << session;
  }
  for (const char* session : {"a", "b", "c"}) {
    ASSERT_TRUE(
        Generate(Raw(session, "a prompt of a few words", 4)).status.ok())
        << session;
  }
  EXPECT_TRUE(serving());
  const int64_t typical =
      runtime_->engine().GetSession("local", "a")->stored_bytes();
  ASSERT_GT(typical, 0);

  *available = kReserve + typical / 2;  // above the reserve, not by a turn
  EXPECT_FALSE(serving());
  const Reply refused = Generate(Raw("d", "a prompt of a few words", 4));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.status.error_message();

  *available = 48 << 20;
  EXPECT_TRUE(serving());
  EXPECT_TRUE(Generate(Raw("d", "a prompt of a few words", 4)).status.ok());
}

// Reflection v1, as current grpcurl asks it: the service list (both
// reflection versions included), a service's file with every file it
// imports, and a clear NOT_FOUND.
TEST_F(GrpcServiceTest, ReflectionV1ListsServicesAndDescribesThem) {
  namespace refl = grpc::reflection::v1;
  Start(KeyStore());
  auto stub = refl::ServerReflection::NewStub(channel_);
  grpc::ClientContext ctx;
  auto stream = stub->ServerReflectionInfo(&ctx);
  refl::ServerReflectionRequest req;
  refl::ServerReflectionResponse resp;

  req.set_list_services("");
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  std::vector<std::string> names;
  for (const auto& s : resp.list_services_response().service()) {
    names.push_back(s.name());
  }
  EXPECT_THAT(names,
              ::testing::IsSupersetOf(
                  {"kvd.v1.Sessions", "kvd.v1.Health", "grpc.health.v1.Health",
                   "grpc.reflection.v1.ServerReflection",
                   "grpc.reflection.v1alpha.ServerReflection"}));

  req.set_file_containing_symbol("kvd.v1.Sessions.Generate");
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_TRUE(resp.has_file_descriptor_response()) << resp.DebugString();
  google::protobuf::DescriptorPool pool;
  std::vector<google::protobuf::FileDescriptorProto> files;
  for (const std::string& bytes :
       resp.file_descriptor_response().file_descriptor_proto()) {
    files.emplace_back();
    ASSERT_TRUE(files.back().ParseFromString(bytes));
  }
  ASSERT_FALSE(files.empty());
  // Dependencies first, as a client builds them.
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    ASSERT_NE(pool.BuildFile(*it), nullptr) << it->name();
  }
  const google::protobuf::ServiceDescriptor* sessions =
      pool.FindServiceByName("kvd.v1.Sessions");
  ASSERT_NE(sessions, nullptr);
  EXPECT_NE(sessions->FindMethodByName("Generate"), nullptr);

  req.set_file_containing_symbol("no.such.Symbol");
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(resp.error_response().error_code(),
            static_cast<int>(grpc::StatusCode::NOT_FOUND));
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
}

// The standard health protocol, as Kubernetes' gRPC probe asks it.
TEST_F(GrpcServiceTest, StandardHealthServiceAnswers) {
  Start(KeyStore());
  auto health = grpc::health::v1::Health::NewStub(channel_);
  for (const char* service : {"", "kvd.v1.Sessions"}) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, req, &resp).ok()) << service;
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("no.such.Service");
  grpc::health::v1::HealthCheckResponse resp;
  EXPECT_EQ(health->Check(&ctx, req, &resp).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // Watch sends the status now, and NOT_SERVING when the node shuts down.
  grpc::ClientContext watch_ctx;
  req.set_service("");
  auto watch = health->Watch(&watch_ctx, req);
  ASSERT_TRUE(watch->Read(&resp));
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  std::thread stop([this] { server_->Shutdown(absl::Seconds(2)); });
  ASSERT_TRUE(watch->Read(&resp));
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  while (watch->Read(&resp)) {
  }
  watch->Finish();
  stop.join();
}

TEST_F(GrpcServiceTest, ExportImportContinuesBitIdentically) {
  // Small export messages, so the file travels as many of them.
  GrpcServerOptions options;
  options.export_chunk_bytes = 4096;
  Start(KeyStore(), options);
  ASSERT_TRUE(Create("orig").ok());
  ASSERT_TRUE(Generate(Raw("orig", "The start of a story", 16)).status.ok());

  std::string file;
  {
    grpc::ClientContext ctx;
    v1::ExportSessionRequest req;
    req.set_session_id("orig");
    auto reader = stub_->ExportSession(&ctx, req);
    v1::ExportSessionResponse msg;
    int messages = 0;
    while (reader->Read(&msg)) {
      if (messages++ == 0) {
        EXPECT_EQ(msg.session().session_id(), "orig");
      }
      EXPECT_LE(msg.chunk().size(), 4096u);
      file += msg.chunk();
    }
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_GT(messages, 1);  // streamed as it was written
  }
  ASSERT_GT(file.size(), 16u);

  auto import = [&](const std::string& name, const std::string& bytes) {
    grpc::ClientContext ctx;
    v1::Session out;
    auto writer = stub_->ImportSession(&ctx, &out);
    // Several messages, as a client streaming a large file would send.
    const size_t step = bytes.size() / 3 + 1;
    for (size_t at = 0; at < bytes.size(); at += step) {
      v1::ImportSessionRequest req;
      if (at == 0) req.set_session_id(name);
      req.set_chunk(bytes.substr(at, step));
      EXPECT_TRUE(writer->Write(req));
    }
    writer->WritesDone();
    return writer->Finish();
  };
  ASSERT_TRUE(import("copy", file).ok());
  EXPECT_EQ(import("copy", file).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(import("junk", "not a session file").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  std::string corrupt = file;
  corrupt[corrupt.size() / 2] ^= 0x55;
  EXPECT_THAT(import("corrupt", corrupt).error_code(),
              ::testing::AnyOf(grpc::StatusCode::DATA_LOSS,
                               grpc::StatusCode::INVALID_ARGUMENT));
  v1::Session s;
  EXPECT_EQ(Get("corrupt", &s).error_code(), grpc::StatusCode::NOT_FOUND);

  // Continued with every step's top-20 log-probabilities (a function of the
  // step's logits): the streamed copy gives the same bits as the original.
  v1::GenerateRequest cont_a = Raw("orig", " continued", 24);
  cont_a.mutable_sampling()->set_logprobs(true);
  cont_a.mutable_sampling()->set_top_logprobs(20);
  v1::GenerateRequest cont_b = cont_a;
  cont_b.set_session_id("copy");
  Reply a = Generate(cont_a);
  Reply b = Generate(cont_b);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(a.finished.state_path(), "hot");
  EXPECT_THAT(b.finished.state_path(), ::testing::AnyOf("dram", "rocksdb"));
  EXPECT_EQ(std::vector<int32_t>(a.finished.token_ids().begin(),
                                 a.finished.token_ids().end()),
            std::vector<int32_t>(b.finished.token_ids().begin(),
                                 b.finished.token_ids().end()));
  EXPECT_EQ(a.finished.session_tokens(), b.finished.session_tokens());
  ASSERT_EQ(a.finished.logprobs_size(), 24);
  ASSERT_EQ(b.finished.logprobs_size(), 24);
  for (int i = 0; i < 24; ++i) {
    const v1::TokenLogprobs& x = a.finished.logprobs(i);
    const v1::TokenLogprobs& y = b.finished.logprobs(i);
    ASSERT_EQ(x.top_size(), 20);
    ASSERT_EQ(y.top_size(), 20);
    for (int k = 0; k < 20; ++k) {
      const float fx = x.top(k).logprob(), fy = y.top(k).logprob();
      EXPECT_EQ(std::memcmp(&fx, &fy, sizeof(float)), 0)
          << "step " << i << " rank " << k;
      EXPECT_EQ(x.top(k).token_id(), y.top(k).token_id());
    }
  }

  // The same session as another node's numerics wrote it (a GPU node's):
  // accepted, and re-prefilled from its tokens on this node's numerics, so
  // it continues as the copy did. As another model's: refused.
  absl::StatusOr<storage::SessionCheckpoint> parsed =
      storage::ParseSessionFile(file, "the export");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto variant = [&](const std::function<void(v1::ModelIdentity*)>& edit) {
    v1::SessionManifest m = parsed->manifest();
    edit(m.mutable_model());
    storage::SessionCheckpoint cp;
    cp.Reset(m, parsed->chunks());
    absl::StatusOr<std::string> bytes = storage::SerializeSessionFile(cp);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return bytes.ok() ? *bytes : std::string();
  };
  ASSERT_TRUE(import("gpu-made", variant([](v1::ModelIdentity* id) {
                       id->set_numerics_version(id->numerics_version() + 1000);
                     }))
                  .ok());
  Reply c = Generate(Raw("gpu-made", " continued", 24));
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(c.finished.state_path(), "reprefill");
  EXPECT_EQ(std::vector<int32_t>(c.finished.token_ids().begin(),
                                 c.finished.token_ids().end()),
            std::vector<int32_t>(b.finished.token_ids().begin(),
                                 b.finished.token_ids().end()));
  EXPECT_EQ(import("other-model", variant([](v1::ModelIdentity* id) {
                     id->set_fingerprint("sha256:other-weights");
                   }))
                .error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

bool SameLogprob(const v1::TokenLogprob& a, const ops::TokenLogProb& b) {
  const float got = a.logprob();
  return a.token_id() == b.token &&
         std::memcmp(&b.logprob, &got, sizeof(float)) == 0;
}

// The stream's deltas carry every token id and logprob the finished message
// lists, and those logprobs are ComputeLogProbs of the logits the engine
// computes for the same request driven directly.
TEST_F(GrpcServiceTest, DeltasCarryTokenIdsAndLogprobs) {
  Start(KeyStore());
  v1::GenerateRequest req = Raw("", "Once upon a time", 16);
  req.mutable_sampling()->set_logprobs(true);
  req.mutable_sampling()->set_top_logprobs(3);
  Reply r = Generate(req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const std::vector<int32_t> ids(r.finished.token_ids().begin(),
                                 r.finished.token_ids().end());
  ASSERT_EQ(ids.size(), 16u);
  // Deltas a slow reader missed arrive merged (Scheduler::Run), so on a
  // loaded machine all 16 tokens may come as one delta: their count is not
  // checked, their contents are.
  EXPECT_EQ(r.delta_ids, ids);
  ASSERT_EQ(r.delta_logprobs.size(), ids.size());
  ASSERT_EQ(r.finished.logprobs_size(), static_cast<int>(ids.size()));

  // The reference: the engine, asked for raw logits instead of logprobs.
  const ops::Tokenizer& tok = runtime_->tokenizer();
  absl::StatusOr<engine::GenerateRequest> g = GenerateRequestFromProto(
      req.sampling(), runtime_->model().config().context_length);
  ASSERT_TRUE(g.ok()) << g.status();
  g->logprobs = false;
  g->prompt = tok.Encode("Once upon a time", true, false);
  std::vector<std::vector<float>> logits;
  g->on_logits = [&logits](const float* l, int64_t n) {
    logits.emplace_back(l, l + n);
  };
  absl::StatusOr<engine::GenerateResult> want =
      runtime_->engine().Complete(*g, tok, nullptr);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(want->tokens, ids);
  ASSERT_EQ(logits.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    SCOPED_TRACE(i);
    const ops::LogProbs lp = ops::ComputeLogProbs(
        logits[i].data(), static_cast<int32_t>(logits[i].size()), ids[i], 3);
    const v1::TokenLogprobs* both[] = {&r.delta_logprobs[i],
                                       &r.finished.logprobs(i)};
    for (const v1::TokenLogprobs* got : both) {
      EXPECT_TRUE(SameLogprob(got->chosen(), lp.chosen));
      EXPECT_EQ(got->chosen().token(), tok.TokenToPiece(ids[i]));
      ASSERT_EQ(got->top_size(), 3);
      for (int k = 0; k < 3; ++k) {
        EXPECT_TRUE(SameLogprob(got->top(k), lp.top[k]));
      }
    }
  }

  // A session turn without logprobs: ids only.
  ASSERT_TRUE(Create("s").ok());
  Reply t = Generate(Raw("s", "Once upon a time", 10));
  ASSERT_TRUE(t.status.ok()) << t.status.error_message();
  EXPECT_EQ(t.delta_ids, std::vector<int32_t>(t.finished.token_ids().begin(),
                                              t.finished.token_ids().end()));
  EXPECT_TRUE(t.delta_logprobs.empty());
  EXPECT_EQ(t.finished.logprobs_size(), 0);

  req.mutable_sampling()->set_logprobs(false);
  Reply bad = Generate(req);
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.status.error_message(), HasSubstr("logprobs"));
}

// A turn of a session that is only on disk starts loading it into DRAM
// before anything else: even a turn refused because the engine is busy
// leaves it there, and the retry restores from memory.
TEST_F(GrpcServiceTest, ColdSessionIsPrefetchedBeforeTheTurnRuns) {
  auto one_at_a_time = [](NodeOptions& n) {
    n.engine.scheduler.max_running = 1;
    n.engine.scheduler.max_waiting = 0;
  };
  Start(KeyStore(), {}, one_at_a_time);
  ASSERT_TRUE(Create("cold").ok());
  ASSERT_TRUE(Generate(Raw("cold", "The start", 8)).status.ok());
  // A restart: the session is in RocksDB only.
  server_->Shutdown(absl::Seconds(2));
  server_.reset();
  stub_.reset();
  channel_.reset();
  runtime_.reset();
  Start(KeyStore(), {}, one_at_a_time);
  ASSERT_EQ(runtime_->store().dram_stats().entries, 0);

  // A long stateless generation takes the only place in the batch...
  grpc::ClientContext long_ctx;
  auto reader = stub_->Generate(&long_ctx, Raw("", "go", 4000));
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg) && msg.has_started());
  ASSERT_TRUE(reader->Read(&msg) && msg.has_delta());
  // ... so the cold session's turn is refused, after its prefetch started.
  Reply refused = Generate(Raw("cold", " more", 4));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.status.error_message();
  ASSERT_TRUE(runtime_->store().Flush().ok());  // waits for prefetches
  EXPECT_EQ(runtime_->store().dram_stats().prefetches, 1);
  EXPECT_EQ(runtime_->store().dram_stats().entries, 1);

  long_ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  reader->Finish();
  for (int i = 0; i < 400 && runtime_->engine().Saturated(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Reply retry = Generate(Raw("cold", " more", 4));
  ASSERT_TRUE(retry.status.ok()) << retry.status.error_message();
  EXPECT_EQ(retry.finished.state_path(), "dram");
}

}  // namespace
}  // namespace kvd::node
