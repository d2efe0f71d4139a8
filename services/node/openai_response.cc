#include "services/node/openai_response.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kvd::node {
namespace {

using nlohmann::json;

// Generated text is whole UTF-8 characters, but a token's bytes need not be;
// those are replaced (U+FFFD) rather than failing the response.
std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json UsageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

// The usage object and, for session turns, the kvd extensions beside it.
void PutUsage(const Usage& u, json& j) {
  j["usage"] = UsageJson(u);
  if (u.session_state.empty()) return;
  j["session_state"] = u.session_state;
  if (u.restore_ms >= 0) j["session_restore_ms"] = u.restore_ms;
}

json Bytes(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

json ChatLogprobs(const std::vector<TokenLogProbText>& lps) {
  json content = json::array();
  for (const TokenLogProbText& t : lps) {
    json top = json::array();
    for (const auto& [tok, lp] : t.top) {
      top.push_back({{"token", tok}, {"logprob", lp}, {"bytes", Bytes(tok)}});
    }
    content.push_back({{"token", t.token},
                       {"logprob", t.logprob},
                       {"bytes", Bytes(t.token)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// The legacy completions format; text offsets count token bytes from
// `offset` (where a stream chunk's tokens start).
json CompletionLogprobs(const std::vector<TokenLogProbText>& lps,
                        int64_t offset = 0) {
  json tokens = json::array(), token_logprobs = json::array(),
       top = json::array(), offsets = json::array();
  for (const TokenLogProbText& t : lps) {
    tokens.push_back(t.token);
    token_logprobs.push_back(t.logprob);
    json m = json::object();
    for (const auto& [tok, lp] : t.top) m[tok] = lp;
    top.push_back(m);
    offsets.push_back(offset);
    offset += t.text_bytes;
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

json Base(const ResponseMeta& meta, const char* object) {
  json j = {{"id", meta.id},
            {"object", object},
            {"created", meta.created_unix_s},
            {"model", meta.model},
            {"system_fingerprint", nullptr}};
  if (!meta.session_id.empty()) j["session_id"] = meta.session_id;
  return j;
}

json FinishOrNull(const std::string* finish_reason) {
  return finish_reason == nullptr ? json(nullptr) : json(*finish_reason);
}

}  // namespace

std::string ChatCompletionJson(const ResponseMeta& meta,
                               const ChoiceOutput& out, const Usage& usage) {
  json j = Base(meta, "chat.completion");
  json choice = {{"index", 0},
                 {"message", {{"role", "assistant"}, {"content", out.text}}},
                 {"finish_reason", out.finish_reason}};
  choice["logprobs"] =
      out.logprobs.has_value() ? ChatLogprobs(*out.logprobs) : json(nullptr);
  j["choices"] = json::array({choice});
  PutUsage(usage, j);
  return Dump(j);
}

std::string ChatChunkJson(const ResponseMeta& meta, absl::string_view content,
                          bool first, const std::string* finish_reason,
                          const Usage* usage,
                          const std::vector<TokenLogProbText>* logprobs) {
  json j = Base(meta, "chat.completion.chunk");
  if (usage != nullptr) {
    j["choices"] = json::array();
    PutUsage(*usage, j);
    return Dump(j);
  }
  json delta = json::object();
  if (first) delta["role"] = "assistant";
  if (!content.empty() || first) {
    delta["content"] = std::string(content.data(), content.size());
  }
  json choice = {{"index", 0},
                 {"delta", delta},
                 {"finish_reason", FinishOrNull(finish_reason)}};
  choice["logprobs"] =
      logprobs != nullptr ? ChatLogprobs(*logprobs) : json(nullptr);
  j["choices"] = json::array({choice});
  return Dump(j);
}

std::string CompletionJson(const ResponseMeta& meta, const ChoiceOutput& out,
                           const Usage& usage) {
  json j = Base(meta, "text_completion");
  json choice = {
      {"index", 0}, {"text", out.text}, {"finish_reason", out.finish_reason}};
  choice["logprobs"] = out.logprobs.has_value()
                           ? CompletionLogprobs(*out.logprobs)
                           : json(nullptr);
  j["choices"] = json::array({choice});
  PutUsage(usage, j);
  return Dump(j);
}

std::string CompletionChunkJson(const ResponseMeta& meta,
                                absl::string_view text,
                                const std::string* finish_reason,
                                const Usage* usage,
                                const std::vector<TokenLogProbText>* logprobs,
                                int64_t text_offset) {
  json j = Base(meta, "text_completion");
  if (usage != nullptr) {
    j["choices"] = json::array();
    PutUsage(*usage, j);
    return Dump(j);
  }
  json choice = {{"index", 0},
                 {"text", std::string(text.data(), text.size())},
                 {"finish_reason", FinishOrNull(finish_reason)}};
  choice["logprobs"] = logprobs != nullptr
                           ? CompletionLogprobs(*logprobs, text_offset)
                           : json(nullptr);
  j["choices"] = json::array({choice});
  return Dump(j);
}

std::string ModelsJson(const std::string& model_id, int64_t created_unix_s) {
  json model = {{"id", model_id},
                {"object", "model"},
                {"created", created_unix_s},
                {"owned_by", "kvd"}};
  return Dump(json{{"object", "list"}, {"data", json::array({model})}});
}

namespace {
json SessionObject(const v1::SessionManifest& m) {
  json labels = json::object();
  for (const auto& [k, v] : m.labels()) labels[k] = v;
  return {{"id", m.session_id()},
          {"object", "session"},
          {"policy", m.policy()},
          {"tokens", m.token_count()},
          {"turns", m.turn_ends_size()},
          {"stored_bytes", m.stored_bytes()},
          {"created_unix_ms", m.created_unix_ms()},
          {"updated_unix_ms", m.updated_unix_ms()},
          {"labels", labels}};
}
}  // namespace

std::string SessionJson(const v1::SessionManifest& manifest,
                        std::optional<std::string> tier) {
  json j = SessionObject(manifest);
  if (tier.has_value()) {
    const bool hot = *tier == "hot";
    const std::string& policy = manifest.policy();
    j["hot"] = hot;
    j["tier"] = *tier;
    j["representation"] = policy == "kv"       ? "kv"
                          : policy == "tokens" ? "tokens"
                                               : "residuals";
    j["next_turn_restore"] = hot                  ? "hot"
                             : policy == "kv"     ? "copy"
                             : policy == "tokens" ? "reprefill"
                                                  : "recompute";
  }
  return Dump(j);
}

std::string SessionListJson(const std::vector<v1::SessionManifest>& sessions,
                            const std::string& next_page_token) {
  json data = json::array();
  for (const v1::SessionManifest& m : sessions)
    data.push_back(SessionObject(m));
  json j = {{"object", "list"}, {"data", data}};
  j["next_page_token"] =
      next_page_token.empty() ? json(nullptr) : json(next_page_token);
  return Dump(j);
}

std::string SseEvent(absl::string_view json_text) {
  return absl::StrCat("data: ", json_text, "\n\n");
}

}  // namespace kvd::node
