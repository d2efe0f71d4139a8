// The async front end against real sockets: limits before the bytes are
// read, the connection cap, timeouts, a client that leaves seen at once,
// streams, and /healthz answering while thousands of connections idle and
// hundreds of clients trickle their requests.
#include "services/node/async_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace kvd::node {
namespace {

// A raw TCP client, so the test controls every byte and every pause.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ =
        ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawClient() { Close(); }
  bool connected() const { return connected_; }
  bool Send(const std::string& s) {
    return ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(s.size());
  }
  // Reads until the connection closes, `until` appears, or 10 s pass.
  std::string Read(const std::string& until = "") {
    std::string out;
    timeval tv{0, 200000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    char buf[4096];
    while (absl::Now() < deadline) {
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n == 0) {
        closed_by_peer_ = true;
        break;
      }
      if (n > 0) out.append(buf, n);
      if (!until.empty() && absl::StrContains(out, until)) break;
    }
    return out;
  }
  // Whether the server closed the connection (seen by Read).
  bool closed_by_peer() const { return closed_by_peer_; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_by_peer_ = false;
};

std::string Get(const std::string& path) {
  return absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: x\r\n\r\n");
}

class AsyncHttpTest : public ::testing::Test {
 protected:
  void StartServer(AsyncHttpOptions o = {}) {
    o.host = "127.0.0.1";
    o.port = 0;
    server_ = std::make_unique<AsyncHttpServer>(o);
    server_->Route(
        "GET", "/healthz",
        [](const HttpRequest&, HttpResponse& r) {
          r.set_content("ok\n", "text/plain");
        },
        /*on_io_thread=*/true);
    server_->Route("POST", "/echo", [](const HttpRequest& q, HttpResponse& r) {
      r.set_content(q.body, "text/plain");
    });
    server_->Route(
        "GET", R"(/items/([^/]+))", [](const HttpRequest& q, HttpResponse& r) {
          r.set_content(absl::StrCat(q.matches[1], " ", q.get_param_value("x")),
                        "text/plain");
        });
    server_->Route("GET", "/stream", [](const HttpRequest&, HttpResponse& r) {
      r.set_chunked_content_provider("text/event-stream", [](ChunkSink& sink) {
        for (int i = 0; i < 3; ++i) {
          const std::string e = absl::StrCat("data: ", i, "\n\n");
          if (!sink.write(e.data(), e.size())) return;
        }
      });
    });
    // Runs until its client leaves (or 20 s): what a generation does.
    server_->Route("GET", "/wait",
                   [this](const HttpRequest& q, HttpResponse& r) {
                     waiting_ = true;
                     const absl::Time until = absl::Now() + absl::Seconds(20);
                     while (!q.peer_closed() && absl::Now() < until) {
                       absl::SleepFor(absl::Milliseconds(2));
                     }
                     saw_peer_closed_ = q.peer_closed();
                     r.set_content("late\n", "text/plain");
                   });
    ASSERT_TRUE(server_->Start().ok());
    port_ = server_->port();
  }

  std::unique_ptr<AsyncHttpServer> server_;
  int port_ = 0;
  std::atomic<bool> waiting_{false};
  std::atomic<bool> saw_peer_closed_{false};
};

TEST_F(AsyncHttpTest, ServesRoutesKeepAliveAndStreams) {
  StartServer();
  RawClient c(port_);
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.Send(Get("/healthz")));
  EXPECT_TRUE(absl::StartsWith(c.Read("ok\n"), "HTTP/1.1 200 OK"));
  // The same connection, a pipelined pair.
  ASSERT_TRUE(c.Send(Get("/items/a%20b?x=1+2") +
                     "POST /echo HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"));
  const std::string two = c.Read("hello");
  EXPECT_TRUE(absl::StrContains(two, "a b 1 2")) << two;
  EXPECT_TRUE(absl::StrContains(two, "hello")) << two;
  ASSERT_TRUE(c.Send(Get("/stream")));
  const std::string stream = c.Read("0\r\n\r\n");
  EXPECT_TRUE(absl::StrContains(stream, "Transfer-Encoding: chunked"));
  EXPECT_TRUE(absl::StrContains(stream, "data: 2")) << stream;
  ASSERT_TRUE(c.Send(Get("/nothing")));
  EXPECT_TRUE(absl::StrContains(c.Read("}"), "404")) << "unknown path";
}

TEST_F(AsyncHttpTest, HeadAndHostilePathsAreAnsweredSafely) {
  StartServer();
  RawClient c(port_);
  // HEAD: GET's headers and length, no body; the connection stays usable.
  ASSERT_TRUE(c.Send("HEAD /healthz HTTP/1.1\r\n\r\n" + Get("/healthz")));
  const std::string both = c.Read("ok\n");
  EXPECT_TRUE(absl::StrContains(both, "Content-Length: 3")) << both;
  EXPECT_EQ(both.find("ok\n"), both.rfind("ok\n")) << "one body, not two";
  // A path that is not UTF-8 once decoded gets a 404, not a crash.
  RawClient bad(port_);
  ASSERT_TRUE(bad.Send(Get("/%ff%fe")));
  EXPECT_TRUE(absl::StartsWith(bad.Read("}"), "HTTP/1.1 404"));
  RawClient after(port_);
  ASSERT_TRUE(after.Send(Get("/healthz")));
  EXPECT_TRUE(absl::StrContains(after.Read("ok\n"), "200 OK"));
}

TEST_F(AsyncHttpTest, LimitsAreEnforcedBeforeTheBytesAreRead) {
  AsyncHttpOptions o;
  o.max_header_bytes = 4096;
  o.max_body_bytes = 1000;
  StartServer(o);
  {
    // Many small header lines, 8 KiB in all: 431 though each line is short.
    RawClient c(port_);
    std::string req = "GET /healthz HTTP/1.1\r\n";
    for (int i = 0; i < 800; ++i) req += "X: 1234567\r\n";
    c.Send(req);
    EXPECT_TRUE(absl::StartsWith(c.Read(), "HTTP/1.1 431"));
  }
  {
    // The declared length is refused at once: no body was sent.
    RawClient c(port_);
    c.Send("POST /echo HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n");
    const std::string r = c.Read();
    EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 413")) << r;
    EXPECT_TRUE(absl::StrContains(r, "request_too_large"));
  }
  {
    // A client already sending its too-large body still reads the 413 (the
    // server drains before it closes, so no reset eats the answer).
    RawClient c(port_);
    c.Send("POST /echo HTTP/1.1\r\nContent-Length: 200000\r\n\r\n" +
           std::string(100000, 'x'));
    const std::string r = c.Read();
    EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 413")) << r.substr(0, 100);
  }
}

TEST_F(AsyncHttpTest, ConnectionCapRefusesCleanly) {
  AsyncHttpOptions o;
  o.max_connections = 3;
  StartServer(o);
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<RawClient>(port_));
    ASSERT_TRUE(held.back()->Send(Get("/healthz")));
    ASSERT_TRUE(absl::StrContains(held.back()->Read("ok\n"), "200"));
  }
  RawClient extra(port_);
  const std::string r = extra.Read();
  EXPECT_TRUE(absl::StartsWith(r, "HTTP/1.1 503")) << r;
  EXPECT_TRUE(absl::StrContains(r, "Retry-After"));
  held.clear();
  // Room again once they left.
  for (int i = 0; i < 100 && server_->connections() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  RawClient again(port_);
  again.Send(Get("/healthz"));
  EXPECT_TRUE(absl::StrContains(again.Read("ok\n"), "200"));
}

TEST_F(AsyncHttpTest, SilentAndSlowConnectionsAreClosed) {
  AsyncHttpOptions o;
  o.idle_timeout = absl::Milliseconds(300);
  o.read_timeout = absl::Milliseconds(600);
  StartServer(o);
  RawClient idle(port_);
  EXPECT_EQ(idle.Read(), "");          // nothing said...
  EXPECT_TRUE(idle.closed_by_peer());  // ...and closed by the server
  RawClient slow(port_);
  slow.Send("GET /healthz HTTP/1.1\r\n");
  // Trickles a header line every 200 ms, so it is never silent for the idle
  // timeout; the request never completes, and the read timeout closes it.
  for (int i = 0; i < 10 && slow.Send("X: y\r\n"); ++i) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_FALSE(absl::StrContains(slow.Read(), "200 OK"));
  EXPECT_TRUE(slow.closed_by_peer());
}

TEST_F(AsyncHttpTest, AClientThatLeavesIsSeenAtOnce) {
  StartServer();
  {
    RawClient c(port_);
    c.Send(Get("/wait"));
    for (int i = 0; i < 1000 && !waiting_; ++i) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    ASSERT_TRUE(waiting_);
  }  // closes
  for (int i = 0; i < 1000 && !saw_peer_closed_; ++i) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_TRUE(saw_peer_closed_);
}

// Thousands of idle keep-alive connections and hundreds of clients that
// trickle their requests cost sockets, not threads: /healthz still
// answers, and so do requests that need a worker.
TEST_F(AsyncHttpTest, IdleAndSlowClientsDoNotStarveOthers) {
  RaiseOpenFileLimit();
  AsyncHttpOptions o;
  o.worker_threads = 4;
  StartServer(o);
  std::vector<std::unique_ptr<RawClient>> idle, slow;
  for (int i = 0; i < 2000; ++i) {
    idle.push_back(std::make_unique<RawClient>(port_));
    if (!idle.back()->connected()) GTEST_SKIP() << "cannot open 2,000 sockets";
    // Kept alive after one request, then silent.
    idle.back()->Send(Get("/healthz"));
  }
  for (auto& c : idle) ASSERT_TRUE(absl::StrContains(c->Read("ok\n"), "200"));
  for (int i = 0; i < 200; ++i) {
    slow.push_back(std::make_unique<RawClient>(port_));
    slow.back()->Send("POST /echo HTTP/1.1\r\nContent-Length: 100\r\n\r\nab");
  }
  double worst_ms = 0;
  for (int i = 0; i < 20; ++i) {
    const auto start = std::chrono::steady_clock::now();
    RawClient c(port_);
    c.Send(Get("/healthz"));
    const std::string r = c.Read("ok\n");
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count();
    worst_ms = std::max(worst_ms, ms);
    ASSERT_TRUE(absl::StrContains(r, "200 OK")) << r;
    RawClient w(port_);
    w.Send("POST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi");
    ASSERT_TRUE(absl::StrContains(w.Read("hi"), "200 OK"));
  }
  // Printed, not asserted against a threshold (shared machines are noisy);
  // the test bounds it only by Read's 10 s.
  std::printf(
      "/healthz with 2,000 idle + 200 slow connections: worst %.1f ms\n",
      worst_ms);
  EXPECT_GE(server_->connections(), 2200);
}

}  // namespace
}  // namespace kvd::node
