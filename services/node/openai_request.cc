#include "services/node/openai_request.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "storage/rocksdb/disk_full.h"

namespace kvd::node {
namespace {

using nlohmann::json;

constexpr char kParamPayload[] = "kvd.dev/param";
constexpr char kHttpPayload[] = "kvd.dev/http_status";
constexpr size_t kMaxSessionIdBytes = 128;
constexpr size_t kMaxUserBytes = 256;

// Nesting depth of `body` outside strings, without building anything: the
// parser would otherwise need memory proportional to "[[[[..." before we
// could say no.
absl::Status CheckDepth(absl::string_view body, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return RequestError(
            "", absl::StrCat("request body nests JSON deeper than ", max_depth,
                             " levels"));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<json> ParseBody(absl::string_view body,
                               const RequestLimits& limits) {
  if (body.size() > limits.max_body_bytes) {
    return RequestError(
        "",
        absl::StrCat("request body is ", body.size(), " bytes; the limit is ",
                     limits.max_body_bytes),
        413);
  }
  if (absl::Status s = CheckDepth(body, limits.max_json_depth); !s.ok()) {
    return s;
  }
  json j = json::parse(body.begin(), body.end(), nullptr,
                       /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return RequestError("",
                        "request body is not valid JSON (RFC 8259, UTF-8; "
                        "NaN and Infinity are not JSON)");
  }
  if (!j.is_object()) {
    return RequestError("", "request body must be a JSON object");
  }
  return j;
}

// A present, non-null member or nullptr. OpenAI treats null as absent.
const json* Field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status WrongType(const char* name, const char* want) {
  return RequestError(name, absl::StrCat("'", name, "' must be ", want));
}

absl::StatusOr<std::optional<double>> GetNumber(const json& j, const char* name,
                                                double lo, double hi,
                                                bool lo_open) {
  const json* f = Field(j, name);
  if (f == nullptr) return std::optional<double>();
  if (!f->is_number()) return WrongType(name, "a number");
  const double v = f->get<double>();
  if (!std::isfinite(v) || v > hi || v < lo || (lo_open && v == lo)) {
    return RequestError(name,
                        absl::StrFormat("'%s' is %g; it must be in %c%g, "
                                        "%g]",
                                        name, v, lo_open ? '(' : '[', lo, hi));
  }
  return std::optional<double>(v);
}

absl::StatusOr<std::optional<int64_t>> GetInt(const json& j, const char* name,
                                              int64_t lo, int64_t hi) {
  const json* f = Field(j, name);
  if (f == nullptr) return std::optional<int64_t>();
  if (!f->is_number_integer()) return WrongType(name, "an integer");
  if (f->is_number_unsigned() &&
      f->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return RequestError(
        name, absl::StrFormat("'%s' must be in [%d, %d]", name, lo, hi));
  }
  const int64_t v = f->get<int64_t>();
  if (v < lo || v > hi) {
    return RequestError(name, absl::StrFormat("'%s' is %d; it must be in "
                                              "[%d, %d]",
                                              name, v, lo, hi));
  }
  return std::optional<int64_t>(v);
}

absl::StatusOr<std::optional<bool>> GetBool(const json& j, const char* name) {
  const json* f = Field(j, name);
  if (f == nullptr) return std::optional<bool>();
  if (!f->is_boolean()) return WrongType(name, "true or false");
  return std::optional<bool>(f->get<bool>());
}

absl::StatusOr<std::optional<std::string>> GetString(const json& j,
                                                     const char* name,
                                                     size_t max_bytes) {
  const json* f = Field(j, name);
  if (f == nullptr) return std::optional<std::string>();
  if (!f->is_string()) return WrongType(name, "a string");
  std::string s = f->get<std::string>();
  if (s.size() > max_bytes) {
    return RequestError(name, absl::StrCat("'", name, "' is ", s.size(),
                                           " bytes; the limit is ", max_bytes));
  }
  return std::optional<std::string>(std::move(s));
}

absl::Status Unsupported(const json& j, const char* name,
                         const char* why = "is not supported by kvd") {
  return RequestError(name, absl::StrCat("'", name, "' ", why));
}

absl::Status ParseStop(const json& j, const RequestLimits& limits,
                       std::vector<std::string>* out) {
  const json* f = Field(j, "stop");
  if (f == nullptr) return absl::OkStatus();
  std::vector<const json*> items;
  if (f->is_string()) {
    items.push_back(f);
  } else if (f->is_array()) {
    if (f->size() > static_cast<size_t>(limits.max_stop)) {
      return RequestError(
          "stop", absl::StrCat("'stop' has ", f->size(), " strings; at most ",
                               limits.max_stop, " are allowed"));
    }
    for (const json& s : *f) items.push_back(&s);
  } else {
    return WrongType("stop", "a string or an array of strings");
  }
  for (const json* s : items) {
    if (!s->is_string()) {
      return WrongType("stop", "a string or an array of strings");
    }
    std::string v = s->get<std::string>();
    if (v.empty() || v.size() > limits.max_stop_bytes) {
      return RequestError("stop",
                          absl::StrCat("each stop string must be 1..",
                                       limits.max_stop_bytes, " bytes"));
    }
    out->push_back(std::move(v));
  }
  return absl::OkStatus();
}

// Fields common to both endpoints. `chat`: logprobs is a bool (chat) or an
// integer count (completions).
absl::Status ParseCommon(const json& j, const RequestLimits& limits, bool chat,
                         OpenAiCommon* c) {
  const json* model = Field(j, "model");
  if (model == nullptr) {
    return RequestError("model", "'model' is required (see GET /v1/models)");
  }
  if (!model->is_string()) return WrongType("model", "a string");
  c->model = model->get<std::string>();

  if (auto v = GetBool(j, "stream"); !v.ok()) {
    return v.status();
  } else {
    c->stream = v->value_or(false);
  }
  if (const json* so = Field(j, "stream_options"); so != nullptr) {
    if (!so->is_object()) return WrongType("stream_options", "an object");
    auto v = GetBool(*so, "include_usage");
    if (!v.ok())
      return RequestError("stream_options.include_usage",
                          "'include_usage' must be true or false");
    c->include_usage = v->value_or(false);
  }

  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    auto v = GetInt(j, name, 1, limits.max_tokens_bound);
    if (!v.ok()) return v.status();
    if (v->has_value()) c->max_tokens = **v;
  }

  auto temperature = GetNumber(j, "temperature", 0, 2, false);
  if (!temperature.ok()) return temperature.status();
  c->sampling.temperature = static_cast<float>(temperature->value_or(1.0));
  auto top_p = GetNumber(j, "top_p", 0, 1, /*lo_open=*/true);
  if (!top_p.ok()) return top_p.status();
  c->sampling.top_p = static_cast<float>(top_p->value_or(1.0));
  // A float that rounds to 0 would be out of the sampler's range.
  if (!(c->sampling.top_p > 0)) c->sampling.top_p = 1e-7f;
  // vLLM's and llama.cpp's sampling extensions; -1 is vLLM's "off" for top_k.
  auto top_k = GetInt(j, "top_k", -1, std::numeric_limits<int32_t>::max());
  if (!top_k.ok()) return top_k.status();
  c->sampling.top_k =
      static_cast<int32_t>(std::max<int64_t>(0, top_k->value_or(0)));
  auto min_p = GetNumber(j, "min_p", 0, 1, /*lo_open=*/false);
  if (!min_p.ok()) return min_p.status();
  c->sampling.min_p = static_cast<float>(min_p->value_or(0.0));
  auto rp = GetNumber(j, "repetition_penalty", 0, 10, /*lo_open=*/true);
  if (!rp.ok()) return rp.status();
  c->sampling.repetition_penalty = static_cast<float>(rp->value_or(1.0));
  if (!(c->sampling.repetition_penalty > 0)) {
    c->sampling.repetition_penalty = 1e-7f;  // rounded to 0 as a float
  }
  auto fp = GetNumber(j, "frequency_penalty", -2, 2, false);
  if (!fp.ok()) return fp.status();
  c->sampling.frequency_penalty = static_cast<float>(fp->value_or(0.0));
  auto pp = GetNumber(j, "presence_penalty", -2, 2, false);
  if (!pp.ok()) return pp.status();
  c->sampling.presence_penalty = static_cast<float>(pp->value_or(0.0));

  if (const json* seed = Field(j, "seed"); seed != nullptr) {
    if (!seed->is_number_integer()) return WrongType("seed", "an integer");
    c->sampling.seed = seed->is_number_unsigned()
                           ? seed->get<uint64_t>()
                           : static_cast<uint64_t>(seed->get<int64_t>());
    c->seed_given = true;
  }

  if (absl::Status s = ParseStop(j, limits, &c->stop); !s.ok()) return s;

  if (auto n = GetInt(j, "n", 1, std::numeric_limits<int64_t>::max());
      !n.ok()) {
    return n.status();
  } else if (n->value_or(1) != 1) {
    return RequestError("n",
                        "'n' must be 1: kvd returns one choice per "
                        "request; send several requests instead");
  }
  if (chat) {
    auto lp = GetBool(j, "logprobs");
    if (!lp.ok()) return lp.status();
    c->logprobs = lp->value_or(false);
    auto top = GetInt(j, "top_logprobs", 0, limits.max_top_logprobs);
    if (!top.ok()) return top.status();
    c->top_logprobs = static_cast<int>(top->value_or(0));
    if (top->has_value() && !c->logprobs) {
      return RequestError("top_logprobs",
                          "'top_logprobs' needs 'logprobs': true");
    }
  } else {
    auto lp = GetInt(j, "logprobs", 0, limits.max_top_logprobs);
    if (!lp.ok()) return lp.status();
    c->logprobs = lp->has_value();
    c->top_logprobs = static_cast<int>(lp->value_or(0));
  }
  auto ignore_eos = GetBool(j, "ignore_eos");
  if (!ignore_eos.ok()) return ignore_eos.status();
  c->ignore_eos = ignore_eos->value_or(false);
  auto user = GetString(j, "user", kMaxUserBytes);
  if (!user.ok()) return user.status();
  c->user = user->value_or("");

  for (const char* name : {"tools", "functions", "logit_bias"}) {
    const json* f = Field(j, name);
    if (f != nullptr && !f->empty()) return Unsupported(j, name);
  }
  for (const char* name : {"tool_choice", "function_call"}) {
    const json* f = Field(j, name);
    if (f != nullptr && !(f->is_string() && f->get<std::string>() == "none")) {
      return Unsupported(j, name);
    }
  }
  if (const json* rf = Field(j, "response_format"); rf != nullptr) {
    const json* type = rf->is_object() ? Field(*rf, "type") : nullptr;
    if (type == nullptr || !type->is_string() ||
        type->get<std::string>() != "text") {
      return Unsupported(j, "response_format",
                         "other than {\"type\": \"text\"} is not supported "
                         "by kvd");
    }
  }
  // The sampler checks its parameters again (SamplingParams::Validate) when
  // the server builds the generation; the ranges above are OpenAI's.
  return absl::OkStatus();
}

absl::StatusOr<OpenAiMessage> ParseMessage(const json& m, size_t index) {
  const std::string where = absl::StrCat("messages[", index, "]");
  if (!m.is_object()) {
    return RequestError(where, absl::StrCat("'", where, "' must be an object"));
  }
  OpenAiMessage out;
  const json* role = Field(m, "role");
  if (role == nullptr || !role->is_string()) {
    return RequestError(where + ".role",
                        absl::StrCat("'", where, ".role' must be a string"));
  }
  out.role = role->get<std::string>();
  if (out.role == "developer") out.role = "system";
  if (out.role != "system" && out.role != "user" && out.role != "assistant") {
    return RequestError(
        where + ".role",
        absl::StrCat("'", where, ".role' is \"", out.role,
                     "\"; kvd accepts system, developer, user and assistant"));
  }
  const json* content = Field(m, "content");
  if (content == nullptr) {
    if (out.role == "assistant") return out;  // e.g. a tool-call placeholder
    return RequestError(where + ".content",
                        absl::StrCat("'", where, ".content' is required"));
  }
  if (content->is_string()) {
    out.content = content->get<std::string>();
    return out;
  }
  if (!content->is_array()) {
    return WrongType("content", "a string or an array of text parts");
  }
  for (const json& part : *content) {
    const json* type = part.is_object() ? Field(part, "type") : nullptr;
    const json* text = part.is_object() ? Field(part, "text") : nullptr;
    if (type == nullptr || !type->is_string() ||
        type->get<std::string>() != "text" || text == nullptr ||
        !text->is_string()) {
      return RequestError(where + ".content",
                          absl::StrCat("'", where,
                                       ".content' parts must be {\"type\": "
                                       "\"text\", \"text\": \"...\"}; kvd "
                                       "serves text-only models"));
    }
    out.content += text->get<std::string>();
  }
  return out;
}

}  // namespace

absl::Status RequestError(absl::string_view param, absl::string_view message,
                          int http_status, absl::StatusCode code) {
  absl::Status s(code, message);
  if (!param.empty()) s.SetPayload(kParamPayload, absl::Cord(param));
  s.SetPayload(kHttpPayload, absl::Cord(absl::StrCat(http_status)));
  return s;
}

absl::Status ValidateSessionId(absl::string_view id, absl::string_view param) {
  bool ok = !id.empty() && id.size() <= kMaxSessionIdBytes;
  for (char c : id) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                         (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                         c == '-';
    if (!allowed) ok = false;
  }
  if (ok) return absl::OkStatus();
  return RequestError(param, absl::StrCat("'", param,
                                          "' must be 1..128 characters of "
                                          "[A-Za-z0-9._-]"));
}

absl::StatusOr<ChatRequest> ParseChatRequest(
    absl::string_view body, absl::string_view header_session_id,
    const RequestLimits& limits) {
  absl::StatusOr<json> j = ParseBody(body, limits);
  if (!j.ok()) return j.status();
  ChatRequest req;
  if (absl::Status s = ParseCommon(*j, limits, /*chat=*/true, &req.common);
      !s.ok()) {
    return s;
  }
  const json* messages = Field(*j, "messages");
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    return RequestError("messages",
                        "'messages' must be a non-empty array of messages");
  }
  if (messages->size() > static_cast<size_t>(limits.max_messages)) {
    return RequestError(
        "messages",
        absl::StrCat("'messages' has ", messages->size(),
                     " entries; the limit is ", limits.max_messages));
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    absl::StatusOr<OpenAiMessage> m = ParseMessage((*messages)[i], i);
    if (!m.ok()) return m.status();
    req.messages.push_back(*std::move(m));
  }
  if (req.messages.back().role != "user") {
    return RequestError("messages",
                        "the last message must have role \"user\": kvd "
                        "generates the assistant's reply to it");
  }
  auto session = GetString(*j, "session_id", kMaxSessionIdBytes + 1);
  if (!session.ok()) return session.status();
  if (session->has_value()) {
    if (absl::Status s = ValidateSessionId(**session, "session_id"); !s.ok()) {
      return s;
    }
    req.session_id = **session;
  }
  if (!header_session_id.empty()) {
    if (absl::Status s = ValidateSessionId(header_session_id, "X-Session-Id");
        !s.ok()) {
      return s;
    }
    if (!req.session_id.empty() && req.session_id != header_session_id) {
      return RequestError("session_id",
                          "the 'session_id' field and the X-Session-Id "
                          "header name different sessions");
    }
    req.session_id = std::string(header_session_id);
  }
  return req;
}

absl::StatusOr<CompletionRequest> ParseCompletionRequest(
    absl::string_view body, const RequestLimits& limits) {
  absl::StatusOr<json> j = ParseBody(body, limits);
  if (!j.ok()) return j.status();
  CompletionRequest req;
  if (absl::Status s = ParseCommon(*j, limits, /*chat=*/false, &req.common);
      !s.ok()) {
    return s;
  }
  const json* prompt = Field(*j, "prompt");
  if (prompt == nullptr) return RequestError("prompt", "'prompt' is required");
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    prompt = &(*prompt)[0];
  }
  if (!prompt->is_string()) {
    return RequestError("prompt",
                        "'prompt' must be a string (or an array of one "
                        "string): kvd runs one prompt per request");
  }
  req.prompt = prompt->get<std::string>();
  if (auto echo = GetBool(*j, "echo"); !echo.ok()) {
    return echo.status();
  } else if (echo->value_or(false)) {
    return Unsupported(*j, "echo", "= true is not supported by kvd");
  }
  if (const json* suffix = Field(*j, "suffix"); suffix != nullptr) {
    return Unsupported(*j, "suffix");
  }
  if (auto best = GetInt(*j, "best_of", 1, std::numeric_limits<int64_t>::max());
      !best.ok()) {
    return best.status();
  } else if (best->value_or(1) != 1) {
    return RequestError("best_of", "'best_of' must be 1");
  }
  if (Field(*j, "session_id") != nullptr) {
    return RequestError("session_id",
                        "sessions are a /v1/chat/completions extension; "
                        "/v1/completions is stateless");
  }
  return req;
}

ApiError ApiErrorFromStatus(const absl::Status& status) {
  ApiError e;
  e.message = std::string(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      e.http_status = 400;
      e.type = "invalid_request_error";
      break;
    case absl::StatusCode::kUnauthenticated:
      e.http_status = 401;
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      break;
    case absl::StatusCode::kPermissionDenied:
      e.http_status = 403;
      e.type = "permission_error";
      break;
    case absl::StatusCode::kNotFound:
      e.http_status = 404;
      e.type = "not_found_error";
      break;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
      e.http_status = 409;
      e.type = "conflict_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "server_error";
      break;
    case absl::StatusCode::kCancelled:
      // nginx's "client closed request": the client went away (or cancelled
      // by request id); not a server error.
      e.http_status = 499;
      e.type = "cancelled";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  if (storage::IsDiskFull(status)) {
    // The node's disk, not the client's quota (same code): retrying soon
    // does not help, so not 429.
    e.http_status = 507;
    e.type = "server_error";
    e.code = "insufficient_storage";
  }
  if (auto http = status.GetPayload(kHttpPayload); http.has_value()) {
    int code = 0;
    if (absl::SimpleAtoi(std::string(*http), &code) && code >= 400 &&
        code < 600) {
      e.http_status = code;
    }
  }
  if (e.http_status == 413) {
    e.type = "invalid_request_error";
    e.code = "request_too_large";
  }
  if (auto param = status.GetPayload(kParamPayload); param.has_value()) {
    e.param = std::string(*param);
  }
  return e;
}

std::string ApiErrorJson(const ApiError& error) {
  json inner = {{"message", error.message}, {"type", error.type}};
  inner["param"] = error.param.empty() ? json(nullptr) : json(error.param);
  inner["code"] = error.code.empty() ? json(nullptr) : json(error.code);
  return json{{"error", inner}}.dump(-1, ' ', false,
                                     json::error_handler_t::replace);
}

}  // namespace kvd::node
