#include "tools/kvd/chat_client.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvd::cli {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseServerUrlTest, SplitsHostAndPrefix) {
  absl::StatusOr<ServerUrl> u = ParseServerUrl("http://127.0.0.1:8080");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->scheme_host_port, "http://127.0.0.1:8080");
  EXPECT_EQ(u->prefix, "");
  u = ParseServerUrl("http://h:1/v1/");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->scheme_host_port, "http://h:1");
  EXPECT_EQ(u->prefix, "");
  u = ParseServerUrl("http://h/api/v1");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->prefix, "/api");
}

TEST(ParseServerUrlTest, RejectsWhatItCannotReach) {
  EXPECT_EQ(ParseServerUrl("127.0.0.1:8080").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseServerUrl("https://h").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseServerUrl("http://").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseServerUrl("http://:80").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The example stream of the SSE spec's section on parsing, plus CRLF line
// ends and a comment, fed one byte at a time and all at once.
TEST(SseParserTest, EventsIndependentOfHowBytesArrive) {
  const std::string stream =
      ": ping\n\n"
      "data: YHOO\ndata: +2\ndata: 10\n\n"
      "event: x\r\ndata:{\"a\":1}\r\n\r\n"
      "data: [DONE]\n\n"
      "data: unterminated";
  const std::vector<std::string> want = {"YHOO\n+2\n10", "{\"a\":1}", "[DONE]"};
  SseParser whole;
  EXPECT_EQ(whole.Feed(stream), want);
  SseParser bytes;
  std::vector<std::string> got;
  for (char c : stream) {
    for (std::string& e : bytes.Feed(std::string(1, c))) got.push_back(e);
  }
  EXPECT_EQ(got, want);
}

TEST(ChatRequestJsonTest, CarriesSessionAndSampling) {
  ChatCall c;
  c.model = "m";
  c.session_id = "s1";
  c.messages = {{"user", "hi"}};
  c.max_tokens = 7;
  c.temperature = 0.0;
  c.seed = 3;
  c.stop = {"\n\n"};
  c.stream = true;
  const json j = json::parse(ChatRequestJson(c));
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["session_id"], "s1");
  EXPECT_EQ(j["messages"], json::parse(R"([{"role":"user","content":"hi"}])"));
  EXPECT_EQ(j["max_tokens"], 7);
  EXPECT_EQ(j["temperature"], 0.0);
  EXPECT_EQ(j["seed"], 3);
  EXPECT_EQ(j["stop"], json::array({"\n\n"}));
  EXPECT_EQ(j["stream"], true);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  EXPECT_FALSE(j.contains("ignore_eos"));
  EXPECT_FALSE(j.contains("top_p"));
  c.session_id.clear();
  c.stream = false;
  const json k = json::parse(ChatRequestJson(c));
  EXPECT_FALSE(k.contains("session_id"));
  EXPECT_FALSE(k.contains("stream_options"));
}

// A scripted stand-in for a server (a test double, not kvd's server): the
// answer is chosen by the request's first message.
class FakeServer {
 public:
  FakeServer() {
    server_.Post("/v1/chat/completions", [this](const httplib::Request& req,
                                                httplib::Response& res) {
      {
        std::lock_guard<std::mutex> l(mu_);
        bodies_.push_back(req.body);
        session_headers_.push_back(req.get_header_value("X-Session-Id"));
        auth_.push_back(req.get_header_value("Authorization"));
      }
      const json j = json::parse(req.body);
      const std::string what = j["messages"][0]["content"];
      if (what == "slow") {  // a queued request: no answer for 3 s
        std::this_thread::sleep_for(std::chrono::seconds(3));
        res.set_content("{}", "application/json");
      } else if (what == "busy") {
        res.status = 429;
        res.set_header("Retry-After", "7");
        res.set_content(
            R"({"error":{"message":"queue full","type":"x","param":null,"code":null}})",
            "application/json");
      } else if (what == "detail") {
        res.status = 400;
        res.set_content(R"({"detail":"bad thing"})", "application/json");
      } else if (what == "plain") {
        res.set_content(
            R"({"choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":3}})",
            "application/json");
      } else {
        std::string sse =
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\","
            "\"content\":\"\"},\"finish_reason\":null}]}\n\n"
            ": ping\n\n"
            "data: {\"choices\":[{\"delta\":{\"content\":\"Ber\"},"
            "\"finish_reason\":null}]}\n\n"
            "data: {\"choices\":[{\"delta\":{\"content\":\"lin\"},"
            "\"finish_reason\":null}]}\n\n";
        if (what == "midstream-error") {
          sse += "data: {\"error\":{\"message\":\"engine failed\"}}\n\n";
        } else if (what != "cut") {
          sse +=
              "data: {\"choices\":[{\"delta\":{},\"finish_reason\":"
              "\"length\"}]}\n\n"
              "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":20,"
              "\"completion_tokens\":2}}\n\n"
              "data: [DONE]\n\n";
        }
        // Sent in small pieces so that events straddle reads.
        res.set_chunked_content_provider(
            "text/event-stream", [sse](size_t, httplib::DataSink& sink) {
              for (size_t i = 0; i < sse.size(); i += 5) {
                sink.write(sse.data() + i, std::min<size_t>(5, sse.size() - i));
              }
              sink.done();
              return true;
            });
      }
    });
    server_.Get(
        "/v1/models", [](const httplib::Request&, httplib::Response& res) {
          res.set_content(R"({"object":"list","data":[{"id":"smollm2"}]})",
                          "application/json");
        });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ~FakeServer() {
    server_.stop();
    thread_.join();
  }
  ServerUrl url() const {
    return ServerUrl{"http://127.0.0.1:" + std::to_string(port_), ""};
  }
  std::vector<std::string> bodies() {
    std::lock_guard<std::mutex> l(mu_);
    return bodies_;
  }
  std::vector<std::string> session_headers() {
    std::lock_guard<std::mutex> l(mu_);
    return session_headers_;
  }
  std::vector<std::string> auth() {
    std::lock_guard<std::mutex> l(mu_);
    return auth_;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> bodies_, session_headers_, auth_;
};

ChatCall Call(const std::string& first, bool stream) {
  ChatCall c;
  c.session_id = "trip";
  c.messages = {{"user", first}};
  c.stream = stream;
  return c;
}

TEST(ChatClientTest, StreamsPiecesUsageAndTimeToFirstToken) {
  FakeServer server;
  ChatClient client(server.url(), "k1");
  std::vector<std::string> pieces;
  absl::StatusOr<ChatCallResult> r =
      client.Complete(Call("hello", true),
                      [&](absl::string_view s) { pieces.emplace_back(s); });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->error;
  EXPECT_EQ(r->http_status, 200);
  EXPECT_THAT(pieces, ElementsAre("Ber", "lin"));
  EXPECT_EQ(r->text, "Berlin");
  EXPECT_EQ(r->finish_reason, "length");
  EXPECT_EQ(r->prompt_tokens, 20);
  EXPECT_EQ(r->completion_tokens, 2);
  EXPECT_EQ(r->content_chunks, 2);
  EXPECT_GE(r->ttft_s, 0);
  EXPECT_LE(r->ttft_s, r->latency_s);
  EXPECT_THAT(server.session_headers(), ElementsAre("trip"));
  EXPECT_THAT(server.auth(), ElementsAre("Bearer k1"));
  EXPECT_EQ(json::parse(server.bodies()[0])["session_id"], "trip");
}

TEST(ChatClientTest, NonStreamedAnswer) {
  FakeServer server;
  ChatClient client(server.url(), "");
  std::string seen;
  absl::StatusOr<ChatCallResult> r = client.Complete(
      Call("plain", false),
      [&](absl::string_view s) { seen.append(s.data(), s.size()); });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok());
  EXPECT_EQ(r->text, "Paris.");
  EXPECT_EQ(seen, "Paris.");
  EXPECT_EQ(r->completion_tokens, 3);
  EXPECT_EQ(r->ttft_s, -1);
  EXPECT_THAT(server.auth(), ElementsAre(""));
}

TEST(ChatClientTest, RefusalsAndErrorsAreResultsNotStatuses) {
  FakeServer server;
  ChatClient client(server.url(), "");
  absl::StatusOr<ChatCallResult> busy =
      client.Complete(Call("busy", true), nullptr);
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_FALSE(busy->ok());
  EXPECT_EQ(busy->http_status, 429);
  EXPECT_EQ(busy->retry_after_s, 7);
  EXPECT_EQ(busy->error, "queue full");

  absl::StatusOr<ChatCallResult> detail =
      client.Complete(Call("detail", false), nullptr);
  ASSERT_TRUE(detail.ok());
  EXPECT_EQ(detail->http_status, 400);
  EXPECT_EQ(detail->error, "bad thing");

  absl::StatusOr<ChatCallResult> mid =
      client.Complete(Call("midstream-error", true), nullptr);
  ASSERT_TRUE(mid.ok());
  EXPECT_EQ(mid->http_status, 200);
  EXPECT_FALSE(mid->ok());
  EXPECT_EQ(mid->error, "engine failed");
  EXPECT_EQ(mid->text, "Berlin");

  absl::StatusOr<ChatCallResult> cut =
      client.Complete(Call("cut", true), nullptr);
  ASSERT_TRUE(cut.ok());
  EXPECT_FALSE(cut->ok());
  EXPECT_THAT(cut->error, HasSubstr("cut short"));
  EXPECT_EQ(cut->output_tokens(), 2);  // no usage: counted chunks
}

TEST(ChatClientTest, StopAbortsAWaitingRequest) {
  FakeServer server;
  ChatClient client(server.url(), "");
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    client.Stop();
  });
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<ChatCallResult> r =
      client.Complete(Call("slow", true), nullptr);
  stopper.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(client.Complete(Call("hello", true), nullptr).status().code(),
            absl::StatusCode::kCancelled);
}

TEST(ChatClientTest, FirstModelId) {
  FakeServer server;
  ChatClient client(server.url(), "");
  absl::StatusOr<std::string> id = client.FirstModelId();
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, "smollm2");
}

TEST(ChatClientTest, NoServerIsUnavailable) {
  // Bind a socket without listening, so connections to its port are refused.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  ChatClient client(ServerUrl{"http://127.0.0.1:" + std::to_string(port), ""},
                    "", absl::Seconds(2));
  absl::StatusOr<ChatCallResult> r = client.Complete(Call("x", true), nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("127.0.0.1"));
  close(fd);
}

}  // namespace
}  // namespace kvd::cli
