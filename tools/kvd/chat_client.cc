#include "tools/kvd/chat_client.h"

#include <httplib.h>

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace kvd::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

int64_t IntOr(const json& obj, const char* key, int64_t missing) {
  return obj.is_object() && obj.contains(key) && obj[key].is_number()
             ? obj[key].get<int64_t>()
             : missing;
}

// The usage object of a response or of a stream's last chunk, if any.
void ReadUsage(const json& response, ChatCallResult& out) {
  if (!response.contains("usage") || !response["usage"].is_object()) return;
  const json& u = response["usage"];
  out.prompt_tokens = IntOr(u, "prompt_tokens", out.prompt_tokens);
  out.completion_tokens = IntOr(u, "completion_tokens", out.completion_tokens);
  if (u.contains("prompt_tokens_details")) {
    out.cached_tokens =
        IntOr(u["prompt_tokens_details"], "cached_tokens", out.cached_tokens);
  }
  // kvd's extension beside the usage: where a session turn found its state.
  if (response.contains("session_state") &&
      response["session_state"].is_string()) {
    out.session_state = response["session_state"].get<std::string>();
  }
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The message of an error body: OpenAI's {"error": {"message"}}, FastAPI's
// {"detail": ...} (llama.cpp's Python server), else the raw text.
std::string ErrorMessage(absl::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_object()) {
    if (j.contains("error")) {
      const json& e = j["error"];
      if (e.is_object() && e.contains("message") && e["message"].is_string())
        return e["message"].get<std::string>();
      if (e.is_string()) return e.get<std::string>();
      return e.dump();
    }
    if (j.contains("detail")) {
      return j["detail"].is_string() ? j["detail"].get<std::string>()
                                     : j["detail"].dump();
    }
  }
  std::string s(body);
  if (s.empty()) s = "(empty body)";
  return s;
}

// httplib's names ("Connection", "Read") say little on their own.
std::string HttpErrorName(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
      return "cannot connect (is kvd serve running at that address, on "
             "that port?)";
    case httplib::Error::ConnectionTimeout:
      return "connecting timed out (check the address and any firewall)";
    case httplib::Error::Read:
      return "the connection closed or timed out while reading the answer";
    case httplib::Error::Write:
      return "the connection closed while sending the request";
    case httplib::Error::SSLConnection:
    case httplib::Error::SSLServerVerification:
      return "TLS handshake failed (https:// against a plain-HTTP server, or "
             "a certificate this client does not trust?)";
    default:
      return httplib::to_string(e);
  }
}

}  // namespace

absl::StatusOr<ServerUrl> ParseServerUrl(absl::string_view url) {
  absl::string_view rest = url;
  std::string scheme;
  if (absl::ConsumePrefix(&rest, "http://")) {
    scheme = "http://";
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "server URL '", url,
        "' must start with http:// (e.g. http://127.0.0.1:8080); https is "
        "not supported by this client"));
  }
  const size_t slash = rest.find('/');
  absl::string_view host = rest.substr(0, slash);
  absl::string_view path =
      slash == absl::string_view::npos ? "" : rest.substr(slash);
  if (host.empty() || absl::StartsWith(host, ":")) {
    return absl::InvalidArgumentError(
        absl::StrCat("server URL '", url, "' has no host"));
  }
  while (absl::ConsumeSuffix(&path, "/")) {
  }
  absl::ConsumeSuffix(&path, "/v1");
  return ServerUrl{absl::StrCat(scheme, host), std::string(path)};
}

std::vector<std::string> SseParser::Feed(absl::string_view bytes) {
  std::vector<std::string> events;
  for (char c : bytes) {
    if (c != '\n') {
      line_.push_back(c);
      continue;
    }
    absl::string_view line = line_;
    absl::ConsumeSuffix(&line, "\r");
    if (line.empty()) {  // blank line: the event is complete
      if (has_data_) events.push_back(std::move(data_));
      data_.clear();
      has_data_ = false;
    } else if (absl::ConsumePrefix(&line, "data:")) {
      absl::ConsumePrefix(&line, " ");
      if (has_data_) data_.push_back('\n');
      data_.append(line.data(), line.size());
      has_data_ = true;
    }  // ": comment", "event:", "id:", "retry:" carry nothing we use
    line_.clear();
  }
  return events;
}

std::string ChatRequestJson(const ChatCall& call) {
  json j;
  if (!call.model.empty()) j["model"] = call.model;
  if (!call.session_id.empty()) j["session_id"] = call.session_id;
  json messages = json::array();
  for (const ChatMessageText& m : call.messages) {
    messages.push_back({{"role", m.role}, {"content", m.content}});
  }
  j["messages"] = std::move(messages);
  j["max_tokens"] = call.max_tokens;
  if (call.temperature.has_value()) j["temperature"] = *call.temperature;
  if (call.top_p.has_value()) j["top_p"] = *call.top_p;
  if (call.seed.has_value()) j["seed"] = *call.seed;
  if (!call.stop.empty()) j["stop"] = call.stop;
  if (call.ignore_eos) j["ignore_eos"] = true;
  j["stream"] = call.stream;
  if (call.stream) j["stream_options"] = {{"include_usage", true}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

ChatClient::ChatClient(const ServerUrl& url, std::string api_key,
                       absl::Duration timeout)
    : url_(url),
      api_key_(std::move(api_key)),
      http_(std::make_unique<httplib::Client>(url.scheme_host_port)) {
  const auto t = absl::ToChronoMilliseconds(timeout);
  http_->set_connection_timeout(t);
  http_->set_read_timeout(t);
  http_->set_write_timeout(t);
  // A fresh connection per request: a POST sent on a kept-alive connection
  // the server is closing fails with a read error and cannot safely be
  // retried (the turn may have been committed). Connecting costs
  // microseconds next to a generation.
  http_->set_keep_alive(false);
}

ChatClient::~ChatClient() = default;

absl::StatusOr<std::string> ChatClient::FirstModelId() {
  httplib::Headers headers;
  if (!api_key_.empty()) headers.emplace("Authorization", "Bearer " + api_key_);
  const std::string path = url_.prefix + "/v1/models";
  httplib::Result r = http_->Get(path.c_str(), headers);
  if (!r) {
    return absl::UnavailableError(absl::StrCat(
        "GET ", url_.scheme_host_port, path, ": ", HttpErrorName(r.error())));
  }
  if (r->status != 200) {
    return absl::UnavailableError(absl::StrCat(
        "GET ", path, ": HTTP ", r->status, ": ", ErrorMessage(r->body)));
  }
  json j = json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() ||
      j["data"].empty() || !j["data"][0].contains("id") ||
      !j["data"][0]["id"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GET ", path, ": no model id in the answer: ", r->body.substr(0, 200)));
  }
  return j["data"][0]["id"].get<std::string>();
}

void ChatClient::Stop() {
  stopped_ = true;
  http_->stop();
}

absl::StatusOr<ChatCallResult> ChatClient::Complete(
    const ChatCall& call,
    const std::function<void(absl::string_view)>& on_text) {
  if (stopped_.load()) {
    return absl::CancelledError("the client was stopped (ChatClient::Stop)");
  }
  ChatCallResult out;
  SseParser sse;
  std::string body;  // non-streamed answers and error bodies
  bool streaming = false;
  const Clock::time_point start = Clock::now();

  // One chunk of a stream: text, finish reason, usage, or an error object.
  auto on_event = [&](const std::string& data) {
    if (data == "[DONE]") return;
    json j = json::parse(data, nullptr, false);
    if (!j.is_object()) return;
    if (j.contains("error")) {
      out.error = ErrorMessage(data);
      return;
    }
    ReadUsage(j, out);
    if (!j.contains("choices") || !j["choices"].is_array()) return;
    for (const json& c : j["choices"]) {
      if (c.contains("finish_reason") && c["finish_reason"].is_string())
        out.finish_reason = c["finish_reason"].get<std::string>();
      if (!c.contains("delta") || !c["delta"].is_object()) continue;
      const json& d = c["delta"];
      if (!d.contains("content") || !d["content"].is_string()) continue;
      const std::string piece = d["content"].get<std::string>();
      if (piece.empty()) continue;
      if (out.ttft_s < 0) out.ttft_s = SecondsSince(start);
      ++out.content_chunks;
      out.text += piece;
      if (on_text) on_text(piece);
    }
  };

  httplib::Request req;
  req.method = "POST";
  req.path = url_.prefix + "/v1/chat/completions";
  req.body = ChatRequestJson(call);
  req.set_header("Content-Type", "application/json");
  if (call.stream) req.set_header("Accept", "text/event-stream");
  if (!api_key_.empty()) req.set_header("Authorization", "Bearer " + api_key_);
  if (!call.session_id.empty()) req.set_header("X-Session-Id", call.session_id);
  req.response_handler = [&](const httplib::Response& res) {
    out.http_status = res.status;
    streaming = res.status == 200 &&
                absl::StartsWith(res.get_header_value("Content-Type"),
                                 "text/event-stream");
    out.node = res.get_header_value("X-Kvd-Node");
    int retry = 0;
    if (absl::SimpleAtoi(res.get_header_value("Retry-After"), &retry)) {
      out.retry_after_s = retry;
    }
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (streaming) {
      for (const std::string& e : sse.Feed(absl::string_view(data, n))) {
        on_event(e);
      }
    } else {
      body.append(data, n);
    }
    return !stopped_.load();
  };
  httplib::Result r = http_->send(req);
  out.latency_s = SecondsSince(start);
  if (stopped_.load()) {
    return absl::CancelledError(absl::StrCat(
        "POST ", url_.scheme_host_port, req.path, ": stopped by the caller"));
  }
  if (!r) {
    return absl::UnavailableError(absl::StrCat("POST ", url_.scheme_host_port,
                                               req.path, ": ",
                                               HttpErrorName(r.error())));
  }
  if (out.http_status != 200) {
    out.error = ErrorMessage(body);
    return out;
  }
  if (streaming) {
    // A stream that ends without a finish reason or error was cut short.
    if (out.error.empty() && out.finish_reason.empty()) {
      out.error = "the stream ended without a finish_reason (cut short)";
    }
    return out;
  }
  json j = json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("choices") || !j["choices"].is_array() ||
      j["choices"].empty()) {
    out.error = absl::StrCat("unexpected answer: ", body.substr(0, 200));
    return out;
  }
  const json& c = j["choices"][0];
  if (c.contains("message") && c["message"].contains("content") &&
      c["message"]["content"].is_string()) {
    out.text = c["message"]["content"].get<std::string>();
  }
  if (c.contains("finish_reason") && c["finish_reason"].is_string())
    out.finish_reason = c["finish_reason"].get<std::string>();
  ReadUsage(j, out);
  if (!out.text.empty()) out.content_chunks = 1;
  if (on_text && !out.text.empty()) on_text(out.text);
  return out;
}

}  // namespace kvd::cli
