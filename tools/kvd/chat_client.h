// A small client for an OpenAI-compatible chat endpoint (`kvd serve`, or any
// server speaking POST /v1/chat/completions, such as llama.cpp's), used by
// `kvd chat --server` and `kvd bench serve`. One call = one request; with
// `stream` the reply arrives as server-sent events and each text piece is
// handed to a callback as it comes, and the call measures time to first
// token.
//
// HTTP-level refusals (429, 4xx, 5xx) and errors sent inside a stream are
// not absl errors: they come back in ChatCallResult (http_status, error,
// retry_after_s) so that a load generator can count them by kind. The
// absl::Status of a call is an error only when no HTTP exchange happened
// (connection refused, timeout, malformed URL): UNAVAILABLE; or CANCELLED
// after Stop().
//
//   KVD_ASSIGN_OR_RETURN(ServerUrl url, ParseServerUrl("http://h:8080"));
//   ChatClient client(url, /*api_key=*/"");
//   ChatCall call;
//   call.session_id = "trip";
//   call.messages = {{"user", "What is the capital of France?"}};
//   KVD_ASSIGN_OR_RETURN(ChatCallResult r,
//       client.Complete(call, [](absl::string_view s) { std::cout << s; }));
//   if (!r.ok()) { ... r.http_status, r.error ... }
//
// Thread-safety: a ChatClient holds one keep-alive connection; use one per
// thread (Stop() may be called from any thread). SseParser and ParseServerUrl
// have no shared state.
#ifndef KVD_TOOLS_KVD_CHAT_CLIENT_H_
#define KVD_TOOLS_KVD_CHAT_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace httplib {
class Client;
}  // namespace httplib

namespace kvd::cli {

// "http://host:port[/prefix][/v1]" split into what cpp-httplib wants and the
// path prefix in front of "/v1/...".
struct ServerUrl {
  std::string scheme_host_port;  // "http://127.0.0.1:8080"
  std::string prefix;            // "" or e.g. "/api" (without "/v1")
};
// INVALID_ARGUMENT unless `url` is http:// or https:// with a host.
absl::StatusOr<ServerUrl> ParseServerUrl(absl::string_view url);

// Splits a text/event-stream into the `data:` payloads of its events, fed in
// arbitrary pieces (bytes as they arrive). Comments (": ping") and other
// fields are skipped; the lines of a multi-line data field are joined by
// '\n' (as the SSE spec says).
class SseParser {
 public:
  // Appends `bytes`; returns the payloads of the events completed by them.
  std::vector<std::string> Feed(absl::string_view bytes);

 private:
  std::string line_;  // the incomplete line so far
  std::string data_;  // the event being assembled
  bool has_data_ = false;
};

struct ChatMessageText {
  std::string role;  // system, user, assistant
  std::string content;
};

struct ChatCall {
  std::string model;       // empty: omitted
  std::string session_id;  // kvd extension; empty: stateless
  std::vector<ChatMessageText> messages;
  int64_t max_tokens = 64;
  std::optional<double> temperature;  // absent: the server's default
  std::optional<double> top_p;
  std::optional<int64_t> seed;
  std::vector<std::string> stop;  // sent when not empty
  bool ignore_eos = false;        // sent only when true
  bool stream = true;
};

struct ChatCallResult {
  int http_status = 0;        // 200 when the server accepted the request
  std::string error;          // the server's message; empty on success
  int retry_after_s = -1;     // from Retry-After (429), -1 if absent
  std::string text;           // the reply
  std::string finish_reason;  // "stop", "length", ... ("" if not sent)
  // From the usage object when the server sends one (stream_options.
  // include_usage is requested), else -1.
  int64_t prompt_tokens = -1;
  int64_t cached_tokens = -1;  // prompt_tokens_details.cached_tokens
  int64_t completion_tokens = -1;
  // kvd only ("" elsewhere): where a session turn found the session's state
  // (new, hot, dram, rocksdb, reprefill), and the node that answered (the
  // X-Kvd-Node header a cluster sets).
  std::string session_state;
  std::string node;
  int64_t content_chunks = 0;  // SSE chunks that carried text
  double ttft_s = -1;          // first text piece; -1 without one
  double latency_s = 0;        // request sent -> response complete

  bool ok() const { return http_status == 200 && error.empty(); }
  // completion_tokens if known, else the number of text chunks (servers
  // send about one token per chunk).
  int64_t output_tokens() const {
    return completion_tokens >= 0 ? completion_tokens : content_chunks;
  }
};

// The JSON body of `call` (with stream_options.include_usage when
// streaming).
std::string ChatRequestJson(const ChatCall& call);

class ChatClient {
 public:
  // `api_key`: sent as "Authorization: Bearer KEY" when not empty.
  // `timeout`: per read (a queued request may wait this long for its first
  // byte) and for connecting.
  ChatClient(const ServerUrl& url, std::string api_key,
             absl::Duration timeout = absl::Seconds(600));
  ~ChatClient();
  ChatClient(const ChatClient&) = delete;
  ChatClient& operator=(const ChatClient&) = delete;

  // POST {prefix}/v1/chat/completions. `on_text` (may be null) gets each
  // piece of the reply as it arrives (streaming) or the whole reply.
  absl::StatusOr<ChatCallResult> Complete(
      const ChatCall& call,
      const std::function<void(absl::string_view)>& on_text);

  // GET {prefix}/v1/models: the first model's id.
  absl::StatusOr<std::string> FirstModelId();

  // Aborts the request in progress (from another thread) and every later
  // one: Complete() returns CANCELLED.
  void Stop();

 private:
  ServerUrl url_;
  std::string api_key_;
  std::unique_ptr<httplib::Client> http_;
  std::atomic<bool> stopped_{false};
};

}  // namespace kvd::cli

#endif  // KVD_TOOLS_KVD_CHAT_CLIENT_H_
