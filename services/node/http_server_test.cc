// The HTTP API on 127.0.0.1 with real models: SmolLM2 (it has a chat
// template) for chat, sessions, admission and disconnects; the tiny random
// model for /v1/completions. Expected generations come from driving the
// SessionEngine directly (the way `kvd chat` does), not from the server.
#include "services/node/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/process_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "ops/model/testing/tiny_model.h"
#include "storage/tiered/testing/sessions.h"

namespace kvd::node {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kSmolLm[] =
    "/root/.cache/kvd/models/SmolLM2-135M-Instruct.Q4_1.gguf";

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return std::string(base != nullptr ? base : "/tmp") + "/" + name;
}

std::unique_ptr<NodeRuntime> OpenRuntime(const std::string& model,
                                         const std::string& dir) {
  NodeOptions options;
  options.model_path = model;
  options.data_dir = TempDir(dir);
  options.num_threads = 2;
  options.memory_commits = true;
  absl::StatusOr<std::unique_ptr<NodeRuntime>> rt =
      NodeRuntime::Open(options, nullptr);
  EXPECT_TRUE(rt.ok()) << rt.status();
  return rt.ok() ? *std::move(rt) : nullptr;
}

struct Reply {
  int status = 0;
  std::string body;
  httplib::Headers headers;
  json Json() const { return json::parse(body, nullptr, false); }
};

Reply Send(int port, const std::string& method, const std::string& path,
           const std::string& body = "", httplib::Headers headers = {}) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  httplib::Request req;
  req.method = method;
  req.path = path;
  req.body = body;
  req.headers = std::move(headers);
  if (!body.empty()) req.headers.emplace("Content-Type", "application/json");
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  if (!cli.send(req, res, error)) return Reply{-1, "", {}};
  return Reply{res.status, res.body, res.headers};
}

Reply Post(int port, const std::string& path, const json& body,
           httplib::Headers headers = {}) {
  return Send(port, "POST", path, body.dump(), std::move(headers));
}

// The JSON payloads of an SSE body, in order; "[DONE]" as a string.
std::vector<json> SseEvents(const std::string& body) {
  std::vector<json> out;
  for (absl::string_view event : absl::StrSplit(body, "\n\n")) {
    if (!absl::StartsWith(event, "data: ")) continue;
    absl::string_view data = event.substr(6);
    out.push_back(data == "[DONE]" ? json("[DONE]")
                                   : json::parse(data, nullptr, false));
  }
  return out;
}

class HttpServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    smol_ = OpenRuntime(kSmolLm, "smol").release();
    absl::StatusOr<std::string> tiny_path =
        ops::testing::WriteTinyModel({}, TempDir(""));
    ASSERT_TRUE(tiny_path.ok()) << tiny_path.status();
    tiny_ = OpenRuntime(*tiny_path, "tiny").release();
  }
  static void TearDownTestSuite() {
    delete smol_;
    delete tiny_;
  }

  std::unique_ptr<HttpServer> Start(NodeRuntime* rt,
                                    HttpServerOptions options = {}) {
    options.log_requests = false;
    absl::StatusOr<std::unique_ptr<HttpServer>> s =
        StartHttpServer(rt, std::move(options));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  // Generates like a stateless request would: greedy over `prompt`.
  static std::string Reference(NodeRuntime* rt, std::vector<int32_t> prompt,
                               int64_t max_tokens,
                               std::vector<std::string> stop = {}) {
    engine::GenerateRequest g;
    g.prompt = std::move(prompt);
    g.max_tokens = max_tokens;
    g.sampling.temperature = 0;
    g.stop = std::move(stop);
    absl::StatusOr<engine::GenerateResult> r =
        rt->engine().Complete(g, rt->tokenizer(), nullptr);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->text : "";
  }

  static NodeRuntime* smol_;
  static NodeRuntime* tiny_;
};
NodeRuntime* HttpServerTest::smol_ = nullptr;
NodeRuntime* HttpServerTest::tiny_ = nullptr;

TEST_F(HttpServerTest, CompletionsJsonAndStreamMatchTheEngine) {
  auto server = Start(tiny_);
  const std::string model = tiny_->model_id();
  const std::string expected =
      Reference(tiny_, tiny_->tokenizer().Encode("hello", true, false), 12);

  Reply r = Post(server->port(), "/v1/completions",
                 {{"model", model},
                  {"prompt", "hello"},
                  {"max_tokens", 12},
                  {"temperature", 0},
                  {"logprobs", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], expected);
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 12);
  EXPECT_EQ(j["usage"]["prompt_tokens"].get<size_t>(),
            tiny_->tokenizer().Encode("hello", true, false).size());
  // Greedy: each chosen token is the most likely one.
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_FALSE(lp["token_logprobs"].empty());
  for (size_t i = 0; i < lp["token_logprobs"].size(); ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    ASSERT_EQ(lp["top_logprobs"][i].size(), 2u);
    double best = -1e30;
    for (const auto& [token, logprob] : lp["top_logprobs"][i].items()) {
      best = std::max(best, logprob.get<double>());
    }
    EXPECT_EQ(lp["token_logprobs"][i].get<double>(), best) << i;
    // Keyed by the token's text, as OpenAI's client looks them up.
    const std::string token = lp["tokens"][i].get<std::string>();
    ASSERT_TRUE(lp["top_logprobs"][i].contains(token))
        << i << ": " << lp["top_logprobs"][i].dump();
    EXPECT_EQ(lp["top_logprobs"][i][token].get<double>(), best) << i;
  }

  r = Post(server->port(), "/v1/completions",
           {{"model", model},
            {"prompt", "hello"},
            {"max_tokens", 12},
            {"temperature", 0},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<json> events = SseEvents(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json& usage = events[events.size() - 2];
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"],
            j["usage"]["completion_tokens"]);
  std::string text;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    text += events[i]["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, expected);
  EXPECT_EQ(events[events.size() - 3]["choices"][0]["finish_reason"],
            j["choices"][0]["finish_reason"]);
}

TEST_F(HttpServerTest, ModelsHealthAndMetrics) {
  auto server = Start(tiny_);
  Reply r = Send(server->port(), "GET", "/v1/models");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.Json()["data"][0]["id"], tiny_->model_id());
  EXPECT_EQ(Send(server->port(), "GET", "/healthz").status, 200);
  EXPECT_EQ(Send(server->port(), "GET", "/readyz").status, 200);
  // Request counts are recorded by the access logger, which runs after the
  // response is written: poll until the /v1/models request shows.
  const std::string models_count =
      "kvd_http_requests_total{code=\"200\",endpoint=\"/v1/models\"} 1\n";
  for (int i = 0; i < 200; ++i) {
    r = Send(server->port(), "GET", "/metrics");
    if (r.body.find(models_count) != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(r.status, 200);
  EXPECT_THAT(r.body, HasSubstr(models_count));
  EXPECT_THAT(r.body, HasSubstr("kvd_store_bytes{tier=\"dram\"}"));
  EXPECT_THAT(r.body, HasSubstr("kvd_http_queue_depth 0\n"));
  // The process's memory, from the kernel and from malloc: a running server
  // has a nonzero resident size and heap in use.
  EXPECT_THAT(r.body, ::testing::ContainsRegex(
                          "\nprocess_resident_memory_bytes [1-9][0-9]*\n"));
  // (Under AddressSanitizer malloc is not glibc's and reports 0.)
  EXPECT_THAT(
      r.body,
      ::testing::ContainsRegex(
          kGlibcMalloc ? "\nkvd_heap_bytes\\{state=\"in_use\"\\} [1-9]"
                       : "\nkvd_heap_bytes\\{state=\"in_use\"\\} [0-9]"));
  EXPECT_THAT(r.body, ::testing::ContainsRegex(
                          "\nkvd_kv_pool_block_bytes [1-9][0-9]*\n"));
}

TEST_F(HttpServerTest, ChatJsonAndStreamAgree) {
  auto server = Start(smol_);
  const json body = {
      {"model", smol_->model_id()},
      {"messages", {{{"role", "user"}, {"content", "What is 2+2?"}}}},
      {"max_tokens", 10},
      {"temperature", 0}};
  Reply r = Post(server->port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.Json();
  EXPECT_EQ(j["object"], "chat.completion");
  const std::string content =
      j["choices"][0]["message"]["content"].get<std::string>();
  EXPECT_FALSE(content.empty());

  json stream_body = body;
  stream_body["stream"] = true;
  r = Post(server->port(), "/v1/chat/completions", stream_body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.headers.find("Content-Type")->second,
              HasSubstr("text/event-stream"));
  std::vector<json> events = SseEvents(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(events.back(), "[DONE]");
  std::string streamed;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(events[i]["object"], "chat.completion.chunk");
    EXPECT_EQ(events[i]["id"], events[0]["id"]);
    const json& delta = events[i]["choices"][0]["delta"];
    if (delta.contains("content")) streamed += delta["content"];
  }
  EXPECT_EQ(streamed, content);
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"],
            j["choices"][0]["finish_reason"]);
}

TEST_F(HttpServerTest, SessionTurnsMatchAnUninterruptedEngineSession) {
  auto server = Start(smol_);
  const std::vector<std::string> user = {"Hi! My name is Ann.",
                                         "What is my name?"};
  const int max_tokens = 12;
  // The reference: one session driven through the engine as `kvd chat`
  // does (Render for the first turn, RenderFollowUp after).
  const ops::ChatTemplate& tmpl = *smol_->chat_template();
  const ops::Tokenizer& tok = smol_->tokenizer();
  ASSERT_TRUE(smol_->engine().CreateSession("local", "ref-1", {}).ok());
  std::vector<std::string> expected;
  std::vector<int64_t> expected_prompt, expected_cached;
  for (size_t t = 0; t < user.size(); ++t) {
    engine::TurnRequest turn;
    turn.tenant = "local";
    turn.session = "ref-1";
    turn.generate.max_tokens = max_tokens;
    turn.generate.sampling.temperature = 0;
    turn.generate.stop = tmpl.stop_strings();
    const std::string message = user[t];
    turn.make_tokens = [&](absl::Span<const int32_t> have)
        -> absl::StatusOr<std::vector<int32_t>> {
      const bool first = have.empty();
      absl::StatusOr<std::string> text =
          first
              ? tmpl.Render({{"user", message}}, true)
              : tmpl.RenderFollowUp({"user", message}, tok.IsEog(have.back()));
      if (!text.ok()) return text.status();
      return tok.Encode(*text, first, true);
    };
    absl::StatusOr<engine::TurnResult> r =
        smol_->engine().RunTurn(turn, tok, nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    expected.push_back(r->generation.text);
    expected_prompt.push_back(r->context_tokens);
    expected_cached.push_back(r->cached_tokens);
  }

  int64_t stored = 0;  // web-1's tokens before each turn
  for (size_t t = 0; t < user.size(); ++t) {
    // Each request carries only its new message.
    Reply r = Post(server->port(), "/v1/chat/completions",
                   {{"model", smol_->model_id()},
                    {"messages", {{{"role", "user"}, {"content", user[t]}}}},
                    {"max_tokens", max_tokens},
                    {"temperature", 0},
                    {"session_id", "web-1"}});
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = r.Json();
    EXPECT_EQ(j["session_id"], "web-1");
    EXPECT_EQ(j["session_state"], t == 0 ? "new" : "hot") << t;
    EXPECT_EQ(j["choices"][0]["message"]["content"], expected[t]) << t;
    // OpenAI's usage: the whole context the reply follows, the stored part
    // of it as cached (all but the previous reply's last token, which the
    // model has not seen yet).
    const int64_t prompt = j["usage"]["prompt_tokens"].get<int64_t>();
    const int64_t cached =
        j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    EXPECT_EQ(prompt, expected_prompt[t]);
    EXPECT_EQ(cached, expected_cached[t]);
    absl::StatusOr<v1::SessionManifest> web =
        smol_->engine().GetSession("local", "web-1");
    ASSERT_TRUE(web.ok()) << web.status();
    EXPECT_EQ(prompt, web->token_count() -
                          j["usage"]["completion_tokens"].get<int64_t>());
    EXPECT_EQ(cached, t == 0 ? 0 : stored - 1);
    stored = web->token_count();
  }
  absl::StatusOr<v1::SessionManifest> ref =
      smol_->engine().GetSession("local", "ref-1");
  ASSERT_TRUE(ref.ok());
  // Each web-1 turn recorded how its state was obtained: the first created
  // the session, the second found it hot.
  Metrics& m = server->metrics();
  EXPECT_EQ(m.Value("kvd_session_restore_seconds", {{"path", "new"}}), 1);
  EXPECT_EQ(m.Value("kvd_session_restore_seconds", {{"path", "hot"}}), 1);

  // Operator REST.
  Reply r = Send(server->port(), "GET", "/v1/sessions/web-1");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["tokens"], ref->token_count());
  EXPECT_EQ(r.Json()["turns"], 2);
  // Where its state is: still in memory after its turn, then demoted.
  EXPECT_EQ(r.Json()["hot"], true);
  EXPECT_EQ(r.Json()["tier"], "hot");
  EXPECT_EQ(r.Json()["representation"], "residuals");
  EXPECT_EQ(r.Json()["next_turn_restore"], "hot");
  smol_->engine().Suspend("local", "web-1");
  r = Send(server->port(), "GET", "/v1/sessions/web-1");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["hot"], false);
  EXPECT_EQ(r.Json()["policy"], "kv-direct");  // the engine's default
  EXPECT_EQ(r.Json()["next_turn_restore"], "recompute");
  // Demoted from memory, its checkpoint is still in the DRAM tier (turns
  // commit into it), which /metrics counts too.
  EXPECT_EQ(r.Json()["tier"], "dram");
  EXPECT_THAT(Send(server->port(), "GET", "/metrics").body,
              ::testing::ContainsRegex(
                  "\nkvd_sessions\\{state=\"dram\"\\} [1-9][0-9]*\n"));
  r = Send(server->port(), "GET", "/v1/sessions?limit=10");
  ASSERT_EQ(r.status, 200) << r.body;
  r = Send(server->port(), "GET", "/v1/sessions/web-1/export");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body.substr(0, 8), std::string("KVDSESS\0", 8));
  EXPECT_EQ(Send(server->port(), "DELETE", "/v1/sessions/web-1").status, 200);
  r = Send(server->port(), "GET", "/v1/sessions/web-1");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.Json()["error"]["type"], "not_found_error");
  EXPECT_EQ(Send(server->port(), "DELETE", "/v1/sessions/web-1").status, 404);
}

TEST_F(HttpServerTest, ApiKeysScopeSessionsToTheirTenant) {
  HttpServerOptions options;
  absl::StatusOr<KeyStore> keys =
      KeyStore::FromPairs({{"key-a", "acme"}, {"key-b", "beta"}});
  ASSERT_TRUE(keys.ok()) << keys.status();
  options.keys = *keys;
  auto server = Start(smol_, options);
  const httplib::Headers a = {{"Authorization", "Bearer key-a"}};
  const httplib::Headers b = {{"Authorization", "Bearer key-b"}};
  const json chat = {{"model", smol_->model_id()},
                     {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                     {"max_tokens", 2},
                     {"session_id", "mine"}};

  Reply r = Post(server->port(), "/v1/chat/completions", chat);
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.Json()["error"]["type"], "authentication_error");
  EXPECT_EQ(Post(server->port(), "/v1/chat/completions", chat,
                 {{"Authorization", "Bearer nope"}})
                .status,
            401);
  EXPECT_EQ(Send(server->port(), "GET", "/v1/models").status, 401);
  ASSERT_EQ(Post(server->port(), "/v1/chat/completions", chat, a).status, 200);
  EXPECT_EQ(Send(server->port(), "GET", "/v1/sessions/mine", "", a).status,
            200);
  EXPECT_EQ(Send(server->port(), "GET", "/v1/sessions/mine", "", b).status,
            404);
  EXPECT_EQ(
      Send(server->port(), "GET", "/v1/sessions/mine/export", "", b).status,
      404);
  EXPECT_EQ(Send(server->port(), "DELETE", "/v1/sessions/mine", "", b).status,
            404);
  Reply list = Send(server->port(), "GET", "/v1/sessions", "", b);
  ASSERT_EQ(list.status, 200);
  EXPECT_TRUE(list.Json()["data"].empty());
  EXPECT_EQ(Send(server->port(), "DELETE", "/v1/sessions/mine", "", a).status,
            200);
}

// vLLM's sampling extensions reach the sampler: top_k 1 (or min_p 1) at
// temperature 1 keeps only the most likely token, which is greedy decoding.
TEST_F(HttpServerTest, TopKAndMinPReachTheSampler) {
  auto server = Start(smol_);
  auto text = [&](json extra) {
    json body = {{"model", smol_->model_id()},
                 {"prompt", "The capital of France is"},
                 {"max_tokens", 12},
                 {"seed", 7}};
    body.update(extra);
    Reply r = Post(server->port(), "/v1/completions", body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.Json()["choices"][0]["text"].get<std::string>();
  };
  const std::string greedy = text({{"temperature", 0}});
  const std::string sampled = text({{"temperature", 1.5}});
  ASSERT_NE(sampled, greedy) << "seed 7 at temperature 1.5 happens to be "
                                "greedy; pick another seed";
  EXPECT_EQ(text({{"temperature", 1.5}, {"top_k", 1}}), greedy);
  EXPECT_EQ(text({{"temperature", 1.5}, {"min_p", 1}}), greedy);
}

// Two nodes on one port must not share it: with SO_REUSEPORT the second
// started and the kernel split the clients (and their sessions) between them.
TEST_F(HttpServerTest, SecondServerOnTheSamePortIsRefused) {
  auto first = Start(tiny_);
  ASSERT_NE(first, nullptr);
  HttpServerOptions options;
  options.log_requests = false;
  options.port = first->port();
  absl::StatusOr<std::unique_ptr<HttpServer>> second =
      StartHttpServer(tiny_, std::move(options));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("in use"));
}

TEST_F(HttpServerTest, MalformedRequestsGetOpenAiErrors) {
  HttpServerOptions options;
  options.limits.max_body_bytes = 4096;
  auto server = Start(smol_, options);
  const int port = server->port();
  auto error = [](const Reply& r) { return r.Json()["error"]; };

  Reply r = Send(port, "POST", "/v1/chat/completions", "{not json");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(error(r)["type"], "invalid_request_error");

  r = Send(port, "POST", "/v1/chat/completions",
           "{\"model\":\"x\",\"pad\":\"" + std::string(8000, 'x') + "\"}");
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(error(r)["code"], "request_too_large");

  const json ok = {{"model", smol_->model_id()},
                   {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
  json bad = ok;
  bad["model"] = "gpt-4";
  r = Post(port, "/v1/chat/completions", bad);
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(error(r)["param"], "model");

  bad = ok;
  bad["max_tokens"] = 1000000;
  r = Post(port, "/v1/chat/completions", bad);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(error(r)["param"], "max_tokens");

  bad = ok;
  bad["temperature"] = 5;
  r = Post(port, "/v1/chat/completions", bad);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(error(r)["param"], "temperature");

  r = Post(port, "/v1/chat/completions", ok, {{"X-Session-Id", "a b"}});
  EXPECT_EQ(r.status, 400);

  r = Send(port, "GET", "/v1/nothing");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(error(r)["type"], "not_found_error");
  EXPECT_EQ(Send(port, "GET", "/v1/sessions/unknown").status, 404);
  EXPECT_EQ(Send(port, "GET", "/v1/sessions?limit=0").status, 400);

  // A model without a chat template serves completions only.
  auto tiny = Start(tiny_);
  r = Post(tiny->port(), "/v1/chat/completions",
           {{"model", tiny_->model_id()},
            {"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(error(r)["message"].get<std::string>(),
              HasSubstr("/v1/completions"));
  // The server still works after all that.
  EXPECT_EQ(Send(port, "GET", "/healthz").status, 200);
}

// Stopping the server ends running stateless generations with 503 (retry on
// another node), JSON or streamed, never with a 200 and a cut-off answer.
TEST_F(HttpServerTest, ShutdownAnswersRunningStatelessRequestsWith503) {
  auto server = Start(smol_);
  const int port = server->port();
  const json body = {{"model", smol_->model_id()},
                     {"prompt", "Once upon a time"},
                     {"max_tokens", 4000},
                     {"ignore_eos", true}};
  Reply json_reply, stream_reply;
  std::thread plain([&] { json_reply = Post(port, "/v1/completions", body); });
  json streamed = body;
  streamed["stream"] = true;
  std::thread stream(
      [&] { stream_reply = Post(port, "/v1/completions", streamed); });
  for (int i = 0; i < 4000 && smol_->engine().stats().scheduler.running < 2;
       ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(smol_->engine().stats().scheduler.running, 2);
  server->Stop();  // waits for the handlers
  plain.join();
  stream.join();

  EXPECT_EQ(json_reply.status, 503) << json_reply.body;
  EXPECT_THAT(json_reply.Json()["error"]["message"].get<std::string>(),
              HasSubstr("shutting down"));
  ASSERT_EQ(stream_reply.status, 200);  // the stream had started
  const std::vector<json> events = SseEvents(stream_reply.body);
  ASSERT_FALSE(events.empty());
  EXPECT_THAT(events.back()["error"]["message"].get<std::string>(),
              HasSubstr("shutting down"))
      << stream_reply.body.substr(stream_reply.body.size() > 500
                                      ? stream_reply.body.size() - 500
                                      : 0);
  for (const json& e : events) EXPECT_NE(e, json("[DONE]"));
  EXPECT_EQ(server->metrics().Value("kvd_http_generations_cancelled_total", {}),
            2);
}

// A session's first turn whose client hangs up stores nothing: no empty
// session is left to list, export or resume.
TEST_F(HttpServerTest, FirstTurnCancelledLeavesNoSession) {
  auto server = Start(smol_);
  const int port = server->port();
  {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(1, 0);  // gives up and closes after a second
    const json body = {
        {"model", smol_->model_id()},
        {"session_id", "ghost"},
        {"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}},
        {"max_tokens", 2000},
        {"ignore_eos", true}};
    auto res =
        cli.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_FALSE(res) << "the request finished within a second";
  }
  Metrics& m = server->metrics();
  for (int i = 0;
       i < 1000 && m.Value("kvd_http_generations_cancelled_total", {}) == 0;
       ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(m.Value("kvd_http_generations_cancelled_total", {}), 1);
  EXPECT_EQ(Send(port, "GET", "/v1/sessions/ghost").status, 404);
  // The next request with that id starts the session afresh.
  Reply r = Post(port, "/v1/chat/completions",
                 {{"model", smol_->model_id()},
                  {"session_id", "ghost"},
                  {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                  {"max_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  Reply got = Send(port, "GET", "/v1/sessions/ghost");
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["turns"], 1) << got.body;
}

// Streams a long completion and hangs up after the first chunk.
struct Streamer {
  std::atomic<bool> got_data{false};
  std::atomic<bool> hang_up{false};
  std::thread thread;
  void Start(int port, const json& body,
             const std::string& path = "/v1/completions") {
    thread = std::thread([this, port, body, path] {
      httplib::Client cli("127.0.0.1", port);
      httplib::Request req;
      req.method = "POST";
      req.path = path;
      req.body = body.dump();
      req.headers.emplace("Content-Type", "application/json");
      req.content_receiver = [this](const char*, size_t, uint64_t, uint64_t) {
        got_data = true;
        while (!hang_up) absl::SleepFor(absl::Milliseconds(5));
        return false;  // closes the connection
      };
      httplib::Response res;
      httplib::Error error = httplib::Error::Success;
      cli.send(req, res, error);
    });
  }
};

// A second turn sent while the session's first is still running is refused
// at once (409), instead of holding an admission slot while it waits: one
// client's queued turns must not block everyone else's requests.
TEST_F(HttpServerTest, TurnOfABusySessionIsRefusedAtOnce) {
  auto server = Start(smol_);
  const int port = server->port();
  auto turn = [&](const std::string& content, int max_tokens) {
    return json{{"model", smol_->model_id()},
                {"session_id", "busy"},
                {"messages", {{{"role", "user"}, {"content", content}}}},
                {"max_tokens", max_tokens},
                {"ignore_eos", true},
                {"stream", true}};
  };
  Streamer a;
  a.Start(port, turn("Tell me a long story.", 2000), "/v1/chat/completions");
  for (int i = 0; i < 6000 && !a.got_data; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (!a.got_data) {
    a.hang_up = true;
    a.thread.join();
    FAIL() << "the first turn streamed nothing in 30 s";
  }

  json second = turn("And then?", 2);
  second["stream"] = false;
  Reply b = Post(port, "/v1/chat/completions", second);
  EXPECT_EQ(b.status, 409) << b.body;
  EXPECT_EQ(b.Json()["error"]["type"], "conflict_error");
  EXPECT_THAT(b.Json()["error"]["message"].get<std::string>(),
              HasSubstr("busy"));
  a.hang_up = true;
  a.thread.join();
  // Once the first turn has ended (the server sees the hang-up at its next
  // step) the session takes turns again.
  Reply c = Post(port, "/v1/chat/completions", second);
  for (int i = 0; i < 500 && c.status == 409; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    c = Post(port, "/v1/chat/completions", second);
  }
  EXPECT_EQ(c.status, 200) << c.body;
}

TEST_F(HttpServerTest, QueueLimitGives429AndDisconnectStopsGeneration) {
  HttpServerOptions options;
  options.max_inflight = 1;
  options.max_queue = 1;
  options.retry_after_s = 3;
  auto server = Start(smol_, options);
  const int port = server->port();
  const int long_tokens = 400;
  const json long_body = {{"model", smol_->model_id()},
                          {"prompt", "Once upon a time"},
                          {"max_tokens", long_tokens},
                          {"ignore_eos", true},
                          {"stream", true}};
  Streamer a;
  a.Start(port, long_body);
  while (!a.got_data) absl::SleepFor(absl::Milliseconds(5));

  // B waits in the queue...
  std::atomic<int> b_status{0};
  std::thread b([&] {
    b_status =
        Post(
            port, "/v1/completions",
            {{"model", smol_->model_id()}, {"prompt", "Hi"}, {"max_tokens", 2}})
            .status;
  });
  for (int i = 0; i < 2000; ++i) {
    if (server->metrics().Value("kvd_http_queue_depth", {}) == 1) break;
    Send(port, "GET", "/metrics");  // refreshes the gauge
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(server->metrics().Value("kvd_http_queue_depth", {}), 1);
  // ... so C is refused.
  Reply c =
      Post(port, "/v1/completions",
           {{"model", smol_->model_id()}, {"prompt", "Hi"}, {"max_tokens", 2}});
  EXPECT_EQ(c.status, 429) << c.body;
  ASSERT_NE(c.headers.find("Retry-After"), c.headers.end());
  EXPECT_EQ(c.headers.find("Retry-After")->second, "3");
  EXPECT_EQ(c.Json()["error"]["type"], "rate_limit_error");
  EXPECT_EQ(Send(port, "GET", "/readyz").status, 503);

  // A hangs up: its generation stops early and B runs.
  a.hang_up = true;
  a.thread.join();
  b.join();
  EXPECT_EQ(b_status, 200);
  Metrics& m = server->metrics();
  for (int i = 0;
       i < 400 && m.Value("kvd_http_generations_cancelled_total", {}) == 0;
       ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(m.Value("kvd_http_generations_cancelled_total", {}), 1);
  EXPECT_LT(m.Value("kvd_http_generated_tokens_total", {}), long_tokens);
  EXPECT_EQ(m.Value("kvd_http_rejected_total", {}), 1);
  // And the server keeps serving.
  EXPECT_EQ(
      Post(port, "/v1/completions",
           {{"model", smol_->model_id()}, {"prompt", "Hi"}, {"max_tokens", 1}})
          .status,
      200);
}

// Streamed logprobs: each chunk carries those of its own tokens, and
// together they are the JSON response's, exactly (same floats, same order).
TEST_F(HttpServerTest, StreamedLogprobsEqualTheJsonOnes) {
  {
    auto server = Start(smol_);
    const json body = {{"model", smol_->model_id()},
                       {"messages", {{{"role", "user"}, {"content", "Hi!"}}}},
                       {"max_tokens", 12},
                       {"temperature", 0},
                       {"logprobs", true},
                       {"top_logprobs", 2}};
    Reply r = Post(server->port(), "/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json want = r.Json()["choices"][0]["logprobs"]["content"];
    ASSERT_FALSE(want.empty());
    json streamed = body;
    streamed["stream"] = true;
    r = Post(server->port(), "/v1/chat/completions", streamed);
    ASSERT_EQ(r.status, 200) << r.body;
    json got = json::array();
    int chunks_with_logprobs = 0;
    for (const json& e : SseEvents(r.body)) {
      if (!e.is_object() || e["choices"].empty()) continue;
      const json& lp = e["choices"][0]["logprobs"];
      if (lp.is_null()) continue;
      chunks_with_logprobs++;
      for (const json& t : lp["content"]) got.push_back(t);
    }
    EXPECT_EQ(got, want);
    EXPECT_GT(chunks_with_logprobs, 1);
  }
  {
    auto server = Start(tiny_);
    const json body = {
        {"model", tiny_->model_id()}, {"prompt", "hello"}, {"max_tokens", 12},
        {"temperature", 0.7},         {"seed", 5},         {"logprobs", 3}};
    Reply r = Post(server->port(), "/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json want = r.Json()["choices"][0]["logprobs"];
    ASSERT_FALSE(want["tokens"].empty());
    json streamed = body;
    streamed["stream"] = true;
    r = Post(server->port(), "/v1/completions", streamed);
    ASSERT_EQ(r.status, 200) << r.body;
    json got = {{"tokens", json::array()},
                {"token_logprobs", json::array()},
                {"top_logprobs", json::array()},
                {"text_offset", json::array()}};
    for (const json& e : SseEvents(r.body)) {
      if (!e.is_object() || e["choices"].empty()) continue;
      const json& lp = e["choices"][0]["logprobs"];
      if (lp.is_null()) continue;
      for (const char* key :
           {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
        for (const json& v : lp[key]) got[key].push_back(v);
      }
    }
    EXPECT_EQ(got, want);
  }
}

// A special token in logprobs carries its text ("<|im_end|>") and bytes, as
// vLLM's and llama-server's do, while the reply's text leaves it out.
TEST_F(HttpServerTest, LogprobsGiveSpecialTokensTheirText) {
  auto server = Start(smol_);
  const Reply r = Post(server->port(), "/v1/chat/completions",
                       {{"model", smol_->model_id()},
                        {"messages", {{{"role", "user"}, {"content", "Hi!"}}}},
                        {"max_tokens", 48},
                        {"temperature", 0},
                        {"ignore_eos", true},
                        {"logprobs", true},
                        {"top_logprobs", 5}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.Json();
  const std::string im_end = "<|im_end|>";
  int seen = 0;
  auto check = [&](const json& entry) {
    const std::string token = entry["token"];
    EXPECT_FALSE(token.empty()) << entry.dump();
    json bytes = json::array();
    for (unsigned char c : token) bytes.push_back(static_cast<int>(c));
    EXPECT_EQ(entry["bytes"], bytes) << entry.dump();
    if (token == im_end) seen++;
  };
  for (const json& t : j["choices"][0]["logprobs"]["content"]) {
    check(t);
    for (const json& top : t["top_logprobs"]) check(top);
  }
  EXPECT_GT(seen, 0) << "no <|im_end|> among the chosen or top tokens";
  EXPECT_EQ(
      j["choices"][0]["message"]["content"].get<std::string>().find(im_end),
      std::string::npos);
}

// A non-streaming request writes nothing until it is done, so only its
// socket shows that the client left: the generation stops within moments
// instead of running its 2000 tokens for nobody.
TEST_F(HttpServerTest, NonStreamingRequestStopsWhenTheClientHangsUp) {
  auto server = Start(smol_);
  const int port = server->port();
  const int long_tokens = 2000;
  {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(1, 0);  // gives up and closes after a second
    const json body = {{"model", smol_->model_id()},
                       {"prompt", "Once upon a time"},
                       {"max_tokens", long_tokens},
                       {"ignore_eos", true}};
    auto res = cli.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_FALSE(res) << "the request finished within a second";
  }
  Metrics& m = server->metrics();
  for (int i = 0;
       i < 1000 && m.Value("kvd_http_client_disconnects_total", {}) == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(m.Value("kvd_http_client_disconnects_total", {}), 1);
  EXPECT_EQ(m.Value("kvd_http_generations_cancelled_total", {}), 1);
  EXPECT_LT(m.Value("kvd_http_generated_tokens_total", {}), long_tokens / 4);
  EXPECT_EQ(smol_->engine().stats().scheduler.running, 0);
  // A request whose client stays gets its whole answer.
  Reply ok = Post(port, "/v1/completions",
                  {{"model", smol_->model_id()},
                   {"prompt", "Hi"},
                   {"max_tokens", 3},
                   {"ignore_eos", true}});
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.Json()["usage"]["completion_tokens"], 3);
  EXPECT_EQ(m.Value("kvd_http_client_disconnects_total", {}), 1);
}

// A full disk: turns are refused with 507 and advice sized to the disk,
// /readyz says not ready and why (so a router sends session traffic
// elsewhere), DELETE still works (it is how space comes back), and turns
// resume by themselves once there is room.
TEST_F(HttpServerTest, FullDiskRefusesTurnsButDeletesAndRecoversByItself) {
  constexpr int64_t kTotal = 5 << 20;
  auto available = std::make_shared<std::atomic<int64_t>>(4 << 20);
  NodeOptions options;
  options.model_path = kSmolLm;
  options.data_dir = TempDir("full_disk");
  options.num_threads = 2;
  options.disk_space_for_test =
      [available](const std::string&) -> absl::StatusOr<storage::DiskSpace> {
    return storage::DiskSpace{kTotal, *available};
  };
  absl::StatusOr<std::unique_ptr<NodeRuntime>> rt =
      NodeRuntime::Open(options, nullptr);
  ASSERT_TRUE(rt.ok()) << rt.status();
  std::unique_ptr<HttpServer> server = Start(rt->get());
  const int port = server->port();
  auto turn = [&](const std::string& session) {
    return Post(port, "/v1/chat/completions",
                {{"model", (*rt)->model_id()},
                 {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                 {"max_tokens", 2},
                 {"temperature", 0},
                 {"session_id", session}});
  };
  ASSERT_EQ(turn("keep").status, 200);
  ASSERT_EQ(turn("drop").status, 200);
  EXPECT_EQ(Send(port, "GET", "/readyz").status, 200);

  *available = 100 << 10;  // under the reserve of an eighth of 5 MiB
  const Reply refused = turn("keep");
  EXPECT_EQ(refused.status, 507) << refused.body;
  EXPECT_EQ(refused.Json()["error"]["code"], "insufficient_storage");
  const std::string message = refused.Json()["error"]["message"];
  EXPECT_THAT(message, HasSubstr("100 KiB free of 5.0 MiB"));
  EXPECT_THAT(message, HasSubstr("keeps 640 KiB free"));
  const Reply ready = Send(port, "GET", "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_THAT(ready.body, HasSubstr("free of 5.0 MiB"));

  const Reply deleted = Send(port, "DELETE", "/v1/sessions/drop");
  EXPECT_EQ(deleted.status, 200) << deleted.body;
  EXPECT_EQ(Send(port, "GET", "/v1/sessions/drop").status, 404);

  *available = 4 << 20;  // space is back: no restart needed
  EXPECT_EQ(Send(port, "GET", "/readyz").status, 200);
  const Reply resumed = turn("keep");
  EXPECT_EQ(resumed.status, 200) << resumed.body;
  absl::StatusOr<v1::SessionManifest> keep =
      (*rt)->engine().GetSession("local", "keep");
  ASSERT_TRUE(keep.ok()) << keep.status();
  EXPECT_EQ(keep->turn_ends_size(), 2);
}

// A request resent with the X-Request-Id of the session's last committed
// turn (its reply was lost) gets that reply again, streamed or not, and
// commits nothing; a new id runs a new turn.
TEST_F(HttpServerTest, ARetriedRequestIdGetsTheCommittedReplyAgain) {
  std::unique_ptr<HttpServer> server = Start(smol_);
  const int64_t replayed_before = smol_->engine().stats().turns_replayed;
  auto turn = [&](const std::string& id, const std::string& text, bool stream) {
    return Post(server->port(), "/v1/chat/completions",
                {{"model", smol_->model_id()},
                 {"messages", {{{"role", "user"}, {"content", text}}}},
                 {"max_tokens", 8},
                 {"temperature", 0},
                 {"stream", stream},
                 {"session_id", "retried-1"}},
                {{"X-Request-Id", id}});
  };
  const Reply first = turn("req-a", "Name three colours.", false);
  ASSERT_EQ(first.status, 200) << first.body;
  const json j = first.Json();
  const std::string content = j["choices"][0]["message"]["content"];
  absl::StatusOr<v1::SessionManifest> m =
      smol_->store().GetManifest("local", "retried-1");
  ASSERT_TRUE(m.ok()) << m.status();

  // The retry may carry anything (the first attempt's body): it is not run.
  const Reply again = turn("req-a", "Something else entirely.", false);
  ASSERT_EQ(again.status, 200) << again.body;
  const json k = again.Json();
  EXPECT_EQ(k["choices"][0]["message"]["content"], content);
  EXPECT_EQ(k["choices"][0]["finish_reason"], j["choices"][0]["finish_reason"]);
  EXPECT_EQ(k["usage"], j["usage"]);

  const Reply streamed = turn("req-a", "Name three colours.", true);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::string text;
  std::vector<json> events = SseEvents(streamed.body);
  ASSERT_GE(events.size(), 2u);
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json& delta = events[i]["choices"][0]["delta"];
    if (delta.contains("content")) text += delta["content"];
  }
  EXPECT_EQ(text, content);
  EXPECT_EQ(events.back(), json("[DONE]"));

  absl::StatusOr<v1::SessionManifest> after =
      smol_->store().GetManifest("local", "retried-1");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->token_count(), m->token_count());
  EXPECT_EQ(after->turn_ends_size(), 1);
  EXPECT_EQ(smol_->engine().stats().turns_replayed - replayed_before, 2);

  ASSERT_EQ(turn("req-b", "And three more.", false).status, 200);
  EXPECT_EQ(smol_->store().GetManifest("local", "retried-1")->turn_ends_size(),
            2);
}

// A session that moved to another node (a newer epoch stored) is refused
// with 409 saying so, and nothing of the turn is written.
TEST_F(HttpServerTest, TurnOfASessionThatMovedIs409) {
  std::unique_ptr<HttpServer> server = Start(smol_);
  auto turn = [&] {
    return Post(server->port(), "/v1/chat/completions",
                {{"model", smol_->model_id()},
                 {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                 {"max_tokens", 2},
                 {"temperature", 0},
                 {"session_id", "moved-1"}});
  };
  ASSERT_EQ(turn().status, 200);
  absl::StatusOr<v1::SessionManifest> m =
      smol_->store().GetManifest("local", "moved-1");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(storage::testing::MoveSessionForTest(smol_->store(), "local",
                                                   "moved-1", "elsewhere", 2)
                  .ok());
  const Reply refused = turn();
  EXPECT_EQ(refused.status, 409) << refused.body;
  EXPECT_THAT(refused.body, HasSubstr("moved"));
  EXPECT_EQ(smol_->store().GetManifest("local", "moved-1")->token_count(),
            m->token_count());
}

}  // namespace
}  // namespace kvd::node
