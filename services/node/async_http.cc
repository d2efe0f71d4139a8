#include "services/node/async_http.h"

#include <sys/resource.h>

#include <array>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/node/openai_request.h"
#include "services/node/peer_identity.h"

namespace kvd::node {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::string PercentDecode(absl::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else if (c == '%' && i + 2 < s.size() && absl::ascii_isxdigit(s[i + 1]) &&
               absl::ascii_isxdigit(s[i + 2])) {
      out.push_back(static_cast<char>(
          std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// OpenAI's error format (openai_request.h), `code` null when empty.
std::string ErrorJson(absl::string_view message, absl::string_view code = "",
                      absl::string_view type = "invalid_request_error") {
  return ApiErrorJson(ApiError{0, std::string(message), std::string(type), "",
                               std::string(code)});
}

std::string Reason(int status) {
  const auto r =
      http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  const std::string reason(r.data(), r.size());
  return reason.empty() || reason == "<unknown-status>" ? "Status" : reason;
}

// The status line and headers of a response.
std::string Head(int status, const HttpResponse& res, bool keep_alive,
                 bool chunked, size_t content_length) {
  std::string head =
      absl::StrCat("HTTP/1.1 ", status, " ", Reason(status), "\r\n");
  if (!res.content_type.empty()) {
    absl::StrAppend(&head, "Content-Type: ", res.content_type, "\r\n");
  }
  for (const auto& [k, v] : res.headers) {
    absl::StrAppend(&head, k, ": ", v, "\r\n");
  }
  if (chunked) {
    absl::StrAppend(&head, "Transfer-Encoding: chunked\r\n");
  } else {
    absl::StrAppend(&head, "Content-Length: ", content_length, "\r\n");
  }
  if (!keep_alive) absl::StrAppend(&head, "Connection: close\r\n");
  absl::StrAppend(&head, "\r\n");
  return head;
}

struct RouteEntry {
  std::string method;
  std::regex pattern;
  HttpHandler handler;
  bool on_io_thread = false;
};

class SessionBase {
 public:
  virtual ~SessionBase() = default;
  virtual void Close() = 0;
  // Closes the connection unless a response is being produced (that one
  // closes it when done, the server being stopped).
  virtual void CloseIfIdle() = 0;
};

// The open connections. Shared with every session, so that a session whose
// last reference goes only when the I/O context is destroyed still finds it.
struct Registry {
  std::mutex mu;
  std::map<SessionBase*, std::weak_ptr<SessionBase>> sessions;
  std::atomic<int64_t> connections{0};
};

}  // namespace

bool HttpRequest::has_header(absl::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (absl::EqualsIgnoreCase(k, name)) return true;
  }
  return false;
}

std::string HttpRequest::get_header_value(absl::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (absl::EqualsIgnoreCase(k, name)) return v;
  }
  return "";
}

bool HttpRequest::has_param(const std::string& name) const {
  return params.count(name) > 0;
}

std::string HttpRequest::get_param_value(const std::string& name) const {
  auto it = params.find(name);
  return it == params.end() ? "" : it->second;
}

void HttpResponse::set_header(std::string name, std::string value) {
  headers.emplace_back(std::move(name), std::move(value));
}

void HttpResponse::set_content(std::string b, std::string type) {
  body = std::move(b);
  content_type = std::move(type);
}

void HttpResponse::set_chunked_content_provider(
    std::string type, std::function<void(ChunkSink&)> p) {
  content_type = std::move(type);
  provider = std::move(p);
}

class AsyncHttpServer::Impl {
 public:
  explicit Impl(AsyncHttpOptions options)
      : options_(std::move(options)),
        acceptor_(ioc_),
        pool_(static_cast<size_t>(std::max(1, options_.worker_threads))) {}

  absl::Status Start(int* port);
  void Stop();
  void Accept();
  const RouteEntry* Match(const std::string& method, const std::string& path,
                          std::vector<std::string>* matches) const;

  AsyncHttpOptions options_;
  std::vector<RouteEntry> routes_;
  std::shared_ptr<Registry> registry_ = std::make_shared<Registry>();
  std::atomic<bool> stopped_{false};
  // Handlers running on workers (Stop waits for them).
  std::mutex active_mu_;
  std::condition_variable active_cv_;
  int active_ = 0;
  asio::io_context ioc_{1};
  // Keeps the I/O thread running while Stop closes everything down.
  asio::executor_work_guard<asio::io_context::executor_type> work_ =
      asio::make_work_guard(ioc_);
  std::unique_ptr<asio::ssl::context> ssl_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_{ioc_};
  asio::thread_pool pool_;
  std::thread io_thread_;
};

namespace {

// The common name of the certificate the client presented and the handshake
// verified; "" without one.
std::string PeerCertificateName(beast::ssl_stream<beast::tcp_stream>& stream) {
  X509* cert = SSL_get_peer_certificate(stream.native_handle());
  if (cert == nullptr) return "";
  std::string name;
  if (SSL_get_verify_result(stream.native_handle()) == X509_V_OK) {
    name = CommonNameOf(cert);
  }
  X509_free(cert);
  return name;
}

// One connection: reads requests one at a time, runs each one's handler
// (on the I/O thread or a worker) and writes its response. Everything that
// touches the stream runs on the I/O thread; a worker hands its writes over
// and waits for them.
template <class Stream>
class Session : public SessionBase,
                public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  Session(AsyncHttpServer::Impl* server, Stream stream, tcp::endpoint remote)
      : server_(server),
        registry_(server->registry_),
        stream_(std::move(stream)),
        remote_(std::move(remote)),
        write_timer_(server->ioc_) {}

  ~Session() override {
    std::lock_guard<std::mutex> lock(registry_->mu);
    registry_->sessions.erase(this);
    registry_->connections.fetch_sub(1);
  }

  void Start() {
    {
      std::lock_guard<std::mutex> lock(registry_->mu);
      registry_->sessions[this] = this->weak_from_this();
    }
    if constexpr (kTls) {
      Lowest().expires_after(
          absl::ToChronoNanoseconds(server_->options_.read_timeout));
      stream_.async_handshake(
          asio::ssl::stream_base::server,
          [self = this->shared_from_this()](beast::error_code ec) {
            if (ec) return self->Close();
            self->peer_name_ = PeerCertificateName(self->stream_);
            self->WaitForRequest();
          });
    } else {
      WaitForRequest();
    }
  }

  void CloseIfIdle() override {
    if (!responding_) Close();
  }

  void Close() override {
    if (closed_) return;
    closed_ = true;
    if (peer_closed_) peer_closed_->store(true);
    write_timer_.cancel();
    beast::error_code ec;
    Lowest().socket().shutdown(tcp::socket::shutdown_both, ec);
    Lowest().close();
  }

  // Called on a worker: queues `data` for writing and waits for it.
  bool WriteFromWorker(std::string data) {
    auto done = std::make_shared<std::promise<bool>>();
    std::future<bool> result = done->get_future();
    asio::post(server_->ioc_,
               [self = this->shared_from_this(), data = std::move(data),
                done]() mutable { self->Write(std::move(data), done); });
    return result.get();
  }

  // After a worker finished the response (all of it written, or failed).
  void ResponseDone() {
    asio::post(server_->ioc_, [self = this->shared_from_this()] {
      self->responding_ = false;
      self->NextRequest();
    });
  }

 private:
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }
  const AsyncHttpOptions& options() const { return server_->options_; }

  // Waits up to idle_timeout for the next request's first byte.
  void WaitForRequest() {
    if (closed_) return;
    if (buffer_.size() > 0) return ReadHeader();
    buffer_.shrink_to_fit();  // an idle connection keeps no large buffer
    Lowest().expires_after(absl::ToChronoNanoseconds(options().idle_timeout));
    stream_.async_read_some(
        buffer_.prepare(4096),
        [self = this->shared_from_this()](beast::error_code ec, size_t n) {
          if (ec) return self->Close();
          self->buffer_.commit(n);
          self->ReadHeader();
        });
  }

  void ReadHeader() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(options().max_header_bytes));
    parser_->body_limit(options().max_body_bytes);
    Lowest().expires_after(absl::ToChronoNanoseconds(options().read_timeout));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) {
          if (ec) return self->ReadFailed(ec);
          self->OnHeader();
        });
  }

  void OnHeader() {
    const auto& msg = parser_->get();
    auto expect = msg.find(http::field::expect);
    if (expect != msg.end() &&
        absl::EqualsIgnoreCase(std::string(expect->value()), "100-continue")) {
      // The client waits for this before it sends its body.
      auto line =
          std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      asio::async_write(stream_, asio::buffer(*line),
                        [self = this->shared_from_this(), line](
                            beast::error_code ec, size_t) {
                          if (ec) return self->Close();
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    http::async_read(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) {
          if (ec) return self->ReadFailed(ec);
          self->OnRequest();
        });
  }

  void ReadFailed(beast::error_code ec) {
    if (ec == http::error::header_limit) {
      return Refuse(431,
                    absl::StrCat("the request line and headers exceed ",
                                 options().max_header_bytes, " bytes"),
                    "request_header_fields_too_large");
    }
    if (ec == http::error::body_limit) {
      return Refuse(413,
                    absl::StrCat("the request body exceeds ",
                                 options().max_body_bytes, " bytes"),
                    "request_too_large");
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == beast::error::timeout || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset) {
      return Close();
    }
    Refuse(400, absl::StrCat("malformed HTTP request: ", ec.message()));
  }

  // Answers an unreadable request and closes the connection.
  void Refuse(int status, absl::string_view message,
              absl::string_view code = "") {
    HttpResponse res;
    res.set_content(ErrorJson(message, code), "application/json");
    auto data = std::make_shared<std::string>(
        Head(status, res, /*keep_alive=*/false, false, res.body.size()) +
        res.body);
    Lowest().expires_after(absl::ToChronoNanoseconds(options().write_timeout));
    asio::async_write(
        stream_, asio::buffer(*data),
        [self = this->shared_from_this(), data](beast::error_code ec, size_t) {
          if (ec) return self->Close();
          self->Linger();
        });
  }

  // Closing with unread request bytes would reset the connection and the
  // client might never read the refusal: stop sending, read and drop what
  // it still sends (up to 1 s or 1 MiB), then close.
  void Linger() {
    beast::error_code ec;
    Lowest().socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return Close();
    Lowest().expires_after(std::chrono::seconds(1));
    Drain(0);
  }

  void Drain(size_t dropped) {
    auto buf = std::make_shared<std::array<char, 16384>>();
    Lowest().async_read_some(asio::buffer(*buf),
                             [self = this->shared_from_this(), buf, dropped](
                                 beast::error_code ec, size_t n) {
                               if (ec || dropped + n > (size_t{1} << 20))
                                 return self->Close();
                               self->Drain(dropped + n);
                             });
  }

  void OnRequest() {
    // From here until the next request, only our own write timer applies:
    // a long handler must not be cut by the read deadline.
    Lowest().expires_never();
    auto msg = parser_->release();
    parser_.reset();
    keep_alive_ = msg.keep_alive();
    auto req = std::make_shared<HttpRequest>();
    req->method = std::string(msg.method_string());
    req->target = std::string(msg.target());
    const size_t q = req->target.find('?');
    req->path = PercentDecode(absl::string_view(req->target).substr(0, q),
                              /*plus_is_space=*/false);
    if (q != std::string::npos) {
      for (absl::string_view kv :
           absl::StrSplit(absl::string_view(req->target).substr(q + 1), '&',
                          absl::SkipEmpty())) {
        const size_t eq = kv.find('=');
        req->params.emplace(PercentDecode(kv.substr(0, eq), true),
                            eq == absl::string_view::npos
                                ? std::string()
                                : PercentDecode(kv.substr(eq + 1), true));
      }
    }
    for (const auto& field : msg) {
      req->headers.emplace_back(
          absl::AsciiStrToLower(std::string(field.name_string())),
          std::string(field.value()));
    }
    req->body = std::move(msg.body());
    req->remote_addr = remote_.address().to_string();
    req->remote_port = remote_.port();
    req->peer_certificate_name = peer_name_;
    peer_closed_ = std::make_shared<std::atomic<bool>>(false);
    req->peer_closed_ = peer_closed_;

    const RouteEntry* route =
        server_->Match(req->method, req->path, &req->matches);
    if (route == nullptr) {
      auto res = std::make_shared<HttpResponse>();
      res->status = 404;
      res->set_content(ErrorJson(absl::StrCat("no such endpoint: ", req->method,
                                              " ", req->path),
                                 "", "not_found_error"),
                       "application/json");
      responding_ = true;
      return WriteWhole(res);
    }
    responding_ = true;
    head_ = req->method == "HEAD";
    if (route->on_io_thread) {
      auto res = std::make_shared<HttpResponse>();
      Handle(*req, *route, *res);
      if (options().after) options().after(*req, *res);
      return WriteWhole(res);
    }
    // A client that leaves while its handler runs is seen at once.
    Probe();
    {
      std::lock_guard<std::mutex> lock(server_->active_mu_);
      server_->active_++;
    }
    asio::post(server_->pool_, [self = this->shared_from_this(), req, route] {
      self->RunOnWorker(*req, *route);
      AsyncHttpServer::Impl* server = self->server_;
      std::lock_guard<std::mutex> lock(server->active_mu_);
      if (--server->active_ == 0) server->active_cv_.notify_all();
    });
  }

  // Runs the `before` hook and the handler; an exception (a bug) becomes a
  // 500 instead of ending the process.
  void Handle(const HttpRequest& req, const RouteEntry& route,
              HttpResponse& res) {
    try {
      if (options().before) options().before(req);
      route.handler(req, res);
    } catch (const std::exception& e) {
      res = HttpResponse();
      res.status = 500;
      res.set_content(ErrorJson(absl::StrCat("internal error: ", e.what()), "",
                                "server_error"),
                      "application/json");
    }
  }

  void RunOnWorker(const HttpRequest& req, const RouteEntry& route) {
    auto res = std::make_shared<HttpResponse>();
    Handle(req, route, *res);
    if (!res->provider) {
      if (options().after) options().after(req, *res);
      asio::post(server_->ioc_, [self = this->shared_from_this(), res] {
        self->WriteWhole(res);
      });
      return;
    }
    class Sink : public ChunkSink {
     public:
      explicit Sink(Session* s) : s_(s) {}
      bool write(const char* data, size_t size) override {
        if (broken_) return false;
        if (size == 0) return true;
        std::string chunk = absl::StrCat(absl::Hex(size), "\r\n");
        chunk.append(data, size);
        chunk.append("\r\n");
        if (!s_->WriteFromWorker(std::move(chunk))) broken_ = true;
        return !broken_;
      }
      bool broken_ = false;
      Session* s_;
    } sink(this);
    const bool head = req.method == "HEAD";
    sink.broken_ = !WriteFromWorker(
        Head(res->status, *res, keep_alive_, /*chunked=*/true, 0));
    // HEAD: the provider still runs (it may hold resources), but writes
    // nothing.
    const bool headers_sent = !sink.broken_;
    if (head) sink.broken_ = true;
    try {
      res->provider(sink);
    } catch (const std::exception&) {
      sink.broken_ = true;  // the stream ends short: close the connection
      keep_alive_ = false;
    }
    if (head && headers_sent) {
      sink.broken_ = false;
    } else if (!sink.broken_ && !WriteFromWorker("0\r\n\r\n")) {
      sink.broken_ = true;
    }
    if (sink.broken_) keep_alive_ = false;
    if (options().after) options().after(req, *res);
    ResponseDone();
  }

  // Writes a whole (not streamed) response, then goes on with the
  // connection.
  void WriteWhole(const std::shared_ptr<HttpResponse>& res) {
    auto data = std::make_shared<std::string>(
        Head(res->status, *res, keep_alive_, false, res->body.size()));
    if (!head_) data->append(res->body);  // HEAD: the length, not the body
    Write(std::move(*data), nullptr, [self = this->shared_from_this()](bool) {
      self->responding_ = false;
      self->NextRequest();
    });
  }

  // On the I/O thread: writes `data` within write_timeout; reports to
  // `done` (a waiting worker) and/or `then`.
  void Write(std::string data, std::shared_ptr<std::promise<bool>> done,
             std::function<void(bool)> then = nullptr) {
    if (closed_) {
      if (done) done->set_value(false);
      if (then) then(false);
      return;
    }
    auto buf = std::make_shared<std::string>(std::move(data));
    write_timer_.expires_after(
        absl::ToChronoNanoseconds(options().write_timeout));
    write_timer_.async_wait(
        [self = this->shared_from_this()](beast::error_code ec) {
          if (!ec) self->Close();  // the client did not take it in time
        });
    asio::async_write(stream_, asio::buffer(*buf),
                      [self = this->shared_from_this(), buf, done, then](
                          beast::error_code ec, size_t) {
                        self->write_timer_.cancel();
                        if (ec) self->Close();
                        if (done) done->set_value(!ec);
                        if (then) then(!ec);
                      });
  }

  // Reads while a handler runs: an error or end of stream means the client
  // left; bytes are kept for the next (pipelined) request.
  void Probe() {
    if (closed_ || probing_ || buffer_.size() >= options().max_header_bytes) {
      return;
    }
    probing_ = true;
    stream_.async_read_some(
        buffer_.prepare(4096),
        [self = this->shared_from_this()](beast::error_code ec, size_t n) {
          self->probing_ = false;
          if (ec == asio::error::operation_aborted && self->cancel_probe_) {
            self->cancel_probe_ = false;
            return self->NextRequest();
          }
          if (ec) {
            self->peer_closed_->store(true);
            self->keep_alive_ = false;
            if (!self->responding_) self->Close();
            return;
          }
          self->buffer_.commit(n);
          if (self->responding_) return self->Probe();
          self->NextRequest();
        });
  }

  void NextRequest() {
    if (responding_ || closed_) return;
    if (!keep_alive_ || server_->stopped_.load()) return Close();
    if (probing_) {
      // Take the reader back from the probe first.
      cancel_probe_ = true;
      beast::error_code ec;
      Lowest().socket().cancel(ec);
      return;
    }
    WaitForRequest();
  }

  AsyncHttpServer::Impl* const server_;
  const std::shared_ptr<Registry> registry_;
  Stream stream_;
  const tcp::endpoint remote_;
  std::string peer_name_;  // of the verified client certificate, if any
  asio::steady_timer write_timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<std::atomic<bool>> peer_closed_;
  std::atomic<bool> keep_alive_{true};  // a worker reads it
  bool head_ = false;                   // the current request is a HEAD
  bool closed_ = false;
  bool responding_ = false;
  bool probing_ = false;
  bool cancel_probe_ = false;
};

}  // namespace

absl::Status AsyncHttpServer::Impl::Start(int* port) {
  if (options_.tls_cert_path.empty() != options_.tls_key_path.empty()) {
    return absl::InvalidArgumentError(
        "HTTP server: give both a TLS certificate and its key, or neither");
  }
  if (!options_.tls_cert_path.empty()) {
    ssl_ = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
    beast::error_code ec;
    ssl_->set_options(asio::ssl::context::default_workarounds |
                      asio::ssl::context::no_sslv2 |
                      asio::ssl::context::no_sslv3);
    ssl_->use_certificate_chain_file(options_.tls_cert_path, ec);
    if (!ec) {
      ssl_->use_private_key_file(options_.tls_key_path, asio::ssl::context::pem,
                                 ec);
    }
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat(
          "HTTP server: cannot load the TLS certificate ",
          options_.tls_cert_path, " and key ", options_.tls_key_path,
          " (PEM files, readable, matching each other): ", ec.message()));
    }
    if (!options_.client_ca_path.empty()) {
      ssl_->load_verify_file(options_.client_ca_path, ec);
      if (ec) {
        return absl::InvalidArgumentError(
            absl::StrCat("HTTP server: cannot load the client CA ",
                         options_.client_ca_path, ": ", ec.message()));
      }
      // Verified when presented, not required (see client_ca_path).
      ssl_->set_verify_mode(asio::ssl::verify_peer);
    }
  }
  beast::error_code ec;
  const asio::ip::address address = asio::ip::make_address(
      options_.host == "localhost" ? "127.0.0.1" : options_.host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP server: '", options_.host,
                     "' is not an IP address to listen on"));
  }
  const tcp::endpoint endpoint(address,
                               static_cast<unsigned short>(options_.port));
  acceptor_.open(endpoint.protocol(), ec);
  // SO_REUSEADDR for a quick restart past TIME_WAIT; never SO_REUSEPORT,
  // with which a second server on the same port would start and split the
  // connections.
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options_.host, ":", options_.port, " (",
        ec.message(),
        "; in use, or not an address of this machine): pick another port"));
  }
  *port = acceptor_.local_endpoint().port();
  Accept();
  io_thread_ = std::thread([this] { ioc_.run(); });
  return absl::OkStatus();
}

void AsyncHttpServer::Impl::Accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted || stopped_.load()) return;
      // E.g. out of file descriptors: the connection waits in the backlog;
      // try again shortly rather than spin on it.
      accept_retry_.expires_after(std::chrono::milliseconds(50));
      accept_retry_.async_wait([this](beast::error_code e) {
        if (!e && !stopped_.load()) Accept();
      });
      return;
    }
    if (registry_->connections.load() >= options_.max_connections) {
      // A clean refusal: the client learns why and when to come back.
      HttpResponse res;
      res.set_header("Retry-After", "1");
      res.set_content(
          ErrorJson(absl::StrCat("the server has its maximum of ",
                                 options_.max_connections,
                                 " connections open; retry shortly")),
          "application/json");
      auto sock = std::make_shared<tcp::socket>(std::move(socket));
      auto data = std::make_shared<std::string>(
          Head(503, res, false, false, res.body.size()) + res.body);
      if (!ssl_) {
        asio::async_write(*sock, asio::buffer(*data),
                          [sock, data](beast::error_code, size_t) {
                            beast::error_code ignored;
                            sock->shutdown(tcp::socket::shutdown_both, ignored);
                          });
      }
      return Accept();
    }
    registry_->connections.fetch_add(1);
    beast::error_code rec;
    const tcp::endpoint remote = socket.remote_endpoint(rec);
    beast::tcp_stream stream(std::move(socket));
    if (ssl_) {
      std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(
          this, beast::ssl_stream<beast::tcp_stream>(std::move(stream), *ssl_),
          remote)
          ->Start();
    } else {
      std::make_shared<Session<beast::tcp_stream>>(this, std::move(stream),
                                                   remote)
          ->Start();
    }
    Accept();
  });
}

const RouteEntry* AsyncHttpServer::Impl::Match(
    const std::string& method, const std::string& path,
    std::vector<std::string>* matches) const {
  // HEAD is GET without the body (the server drops it).
  const std::string wanted = method == "HEAD" ? "GET" : method;
  for (const RouteEntry& r : routes_) {
    if (r.method != wanted) continue;
    std::smatch m;
    if (std::regex_match(path, m, r.pattern)) {
      matches->clear();
      for (const auto& g : m) matches->push_back(g.str());
      return &r;
    }
  }
  return nullptr;
}

void AsyncHttpServer::Impl::Stop() {
  if (stopped_.exchange(true)) return;
  if (!io_thread_.joinable()) return;
  auto each_session = [this](void (SessionBase::*what)()) {
    std::promise<void> done;
    asio::post(ioc_, [this, what, &done] {
      beast::error_code ec;
      acceptor_.close(ec);
      accept_retry_.cancel();
      std::vector<std::shared_ptr<SessionBase>> all;
      {
        std::lock_guard<std::mutex> lock(registry_->mu);
        for (auto& [raw, weak] : registry_->sessions) {
          if (std::shared_ptr<SessionBase> s = weak.lock()) all.push_back(s);
        }
      }
      for (const auto& s : all) ((*s).*what)();
      done.set_value();
    });
    done.get_future().wait();
  };
  // No new connections or requests; responses being produced finish (the
  // owner stops its handlers, e.g. cancels generations) and are written.
  each_session(&SessionBase::CloseIfIdle);
  {
    std::unique_lock<std::mutex> lock(active_mu_);
    active_cv_.wait(lock, [this] { return active_ == 0; });
  }
  const auto until = std::chrono::steady_clock::now() +
                     absl::ToChronoNanoseconds(options_.write_timeout);
  while (registry_->connections.load() > 0 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  each_session(&SessionBase::Close);
  pool_.stop();
  pool_.join();
  ioc_.stop();
  io_thread_.join();
}

AsyncHttpServer::AsyncHttpServer(AsyncHttpOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

AsyncHttpServer::~AsyncHttpServer() { Stop(); }

void AsyncHttpServer::Route(std::string method, std::string pattern,
                            HttpHandler handler, bool on_io_thread) {
  impl_->routes_.push_back(RouteEntry{std::move(method), std::regex(pattern),
                                      std::move(handler), on_io_thread});
}

absl::Status AsyncHttpServer::Start() {
  int port = 0;
  absl::Status s = impl_->Start(&port);
  if (s.ok()) port_.store(port);
  return s;
}

int64_t AsyncHttpServer::connections() const {
  return impl_->registry_->connections.load();
}

void AsyncHttpServer::Stop() { impl_->Stop(); }

void RaiseOpenFileLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 &&
      limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace kvd::node
