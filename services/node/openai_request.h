// Parsing and validation of OpenAI-compatible requests (POST
// /v1/chat/completions and /v1/completions) into typed requests, as pure
// functions: no model, no I/O. The HTTP server (http_server.h) calls these
// first; the fuzzer (openai_request_fuzzer.cc) runs them on arbitrary bytes.
//
// Every field is checked before anything is queued. Bounds (RequestLimits
// holds the adjustable ones):
//   body                 <= max_body_bytes (1 MiB)             else 413
//   JSON nesting         <= 32 levels                          else 400
//   messages             1..max_messages (256)
//     role               system | developer (= system) | user | assistant
//     content            a string, or an array of {"type":"text","text":..}
//   model                a string (checked against the served model later)
//   max_tokens / max_completion_tokens   integer in [1, 1048576]; the
//                        server also requires prompt + max_tokens <= context
//   temperature          number in [0, 2]            (OpenAI's range)
//   top_p                number in (0, 1]
//   frequency_penalty, presence_penalty   number in [-2, 2]
//   seed                 integer in [-2^63, 2^64); absent = a random seed
//   stop                 a string or an array of at most 4 strings (OpenAI's
//                        limit), each 1..max_stop_bytes (256) bytes
//   n                    1 only (kvd returns one choice)
//   logprobs             bool (chat); integer in [0, 20] (completions)
//   top_logprobs         integer in [0, 20], needs logprobs = true
//   stream               bool; stream_options.include_usage bool
//   user                 a string <= 256 bytes (logged, not used)
//   session_id (kvd)     1..128 bytes of [A-Za-z0-9._-]; chat only; also
//                        accepted as the X-Session-Id header
//   ignore_eos (kvd, as vLLM)  bool: keep generating past end-of-text
//   tools, functions, logit_bias, response_format (non-text), echo (true),
//   suffix, best_of > 1: unsupported, 400 naming the field.
// Unknown fields are ignored, as OpenAI clients send vendor extras. JSON
// itself is strict (RFC 8259): NaN, Infinity, invalid UTF-8 and trailing
// garbage are 400. Wrong types are 400 naming the field.
//
// Errors are absl::Status values carrying the HTTP status and the offending
// parameter as payloads; ApiErrorFromStatus turns any status into OpenAI's
// error object {"error": {"message", "type", "param", "code"}}.
//
//   absl::StatusOr<ChatRequest> req = ParseChatRequest(body, header_session,
//                                                      RequestLimits{});
//   if (!req.ok()) { ApiError e = ApiErrorFromStatus(req.status()); ... }
//
// Thread-safety: free functions without shared state.
#ifndef KVD_SERVICES_NODE_OPENAI_REQUEST_H_
#define KVD_SERVICES_NODE_OPENAI_REQUEST_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ops/sampler/sampler.h"

namespace kvd::node {

struct RequestLimits {
  size_t max_body_bytes = size_t{1} << 20;
  int max_messages = 256;
  int max_stop = 4;
  size_t max_stop_bytes = 256;
  int max_top_logprobs = 20;
  int64_t max_tokens_bound = int64_t{1} << 20;
  int max_json_depth = 32;
};

struct OpenAiMessage {
  std::string role;  // system, user or assistant ("developer" -> system)
  std::string content;
};

// What both endpoints share.
struct OpenAiCommon {
  std::string model;
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  std::optional<int64_t> max_tokens;  // absent: the server's default
  ops::SamplingParams sampling;       // temperature, top_p, penalties, seed
  bool seed_given = false;            // else the server picks a random seed
  std::vector<std::string> stop;
  bool logprobs = false;
  int top_logprobs = 0;
  bool ignore_eos = false;
  std::string user;
};

struct ChatRequest {
  OpenAiCommon common;
  std::vector<OpenAiMessage> messages;  // never empty
  // kvd extension: continue the stored conversation (body field
  // `session_id` or the X-Session-Id header; they must agree). Empty:
  // stateless.
  std::string session_id;
};

struct CompletionRequest {
  OpenAiCommon common;
  std::string prompt;
};

// `header_session_id`: the X-Session-Id header ("" if absent).
absl::StatusOr<ChatRequest> ParseChatRequest(
    absl::string_view body, absl::string_view header_session_id,
    const RequestLimits& limits);
absl::StatusOr<CompletionRequest> ParseCompletionRequest(
    absl::string_view body, const RequestLimits& limits);

// OK if `id` is a valid session id (1..128 bytes of [A-Za-z0-9._-]).
absl::Status ValidateSessionId(absl::string_view id, absl::string_view param);

// OpenAI's error object, and the HTTP status it goes with.
struct ApiError {
  int http_status = 500;
  std::string message;
  std::string type;   // invalid_request_error, authentication_error, ...
  std::string param;  // the offending field, or empty (JSON null)
  std::string code;   // a short machine-readable code, or empty (null)
};

// An INVALID_ARGUMENT (or `code`) status naming `param`, that maps to
// `http_status`.
absl::Status RequestError(
    absl::string_view param, absl::string_view message, int http_status = 400,
    absl::StatusCode code = absl::StatusCode::kInvalidArgument);

// HTTP status by the status code (INVALID_ARGUMENT/OUT_OF_RANGE 400,
// UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND 404, ALREADY_EXISTS
// and FAILED_PRECONDITION 409, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503,
// anything else 500) unless the status carries one (RequestError).
ApiError ApiErrorFromStatus(const absl::Status& status);
// {"error": {...}} as JSON text.
std::string ApiErrorJson(const ApiError& error);

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_OPENAI_REQUEST_H_
