#include "services/node/grpc_convert.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "ops/tokenizer/unicode.h"
#include "services/engine/chat_turn.h"

namespace kvd::node {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::StatusOr<engine::GenerateRequest> GenerateRequestFromProto(
    const v1::SamplingParams& p, int64_t context_length) {
  engine::GenerateRequest g;
  if (p.has_temperature()) {
    if (!(p.temperature() >= 0 && p.temperature() <= kMaxTemperature)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.temperature must be in [0, ", kMaxTemperature,
                       "] (0 = greedy), got ", p.temperature()));
    }
    g.sampling.temperature = p.temperature();
  }
  if (p.has_top_p()) {
    if (!(p.top_p() > 0 && p.top_p() <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling.top_p must be in (0, 1] (1 = off), got ", p.top_p()));
    }
    g.sampling.top_p = p.top_p();
  }
  if (p.has_top_k()) {
    if (p.top_k() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling.top_k must be >= 0 (0 = off), got ", p.top_k()));
    }
    g.sampling.top_k = p.top_k();
  }
  if (p.has_seed()) g.sampling.seed = p.seed();
  if (p.top_logprobs() < 0 || p.top_logprobs() > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_logprobs must be in 0..", kMaxTopLogprobs,
                     ", got ", p.top_logprobs()));
  }
  if (p.top_logprobs() > 0 && !p.logprobs()) {
    return absl::InvalidArgumentError(
        "sampling.top_logprobs needs sampling.logprobs = true");
  }
  g.logprobs = p.logprobs();
  g.top_logprobs = p.top_logprobs();
  g.max_tokens = std::min(kDefaultMaxTokens, context_length);
  if (p.has_max_tokens()) {
    if (p.max_tokens() < 1 || p.max_tokens() > context_length) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.max_tokens must be in 1..", context_length,
                       " (the model's context length), got ", p.max_tokens()));
    }
    g.max_tokens = p.max_tokens();
  }
  if (p.stop_size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.stop has ", p.stop_size(), " strings; at most ",
                     kMaxStopStrings, " are allowed"));
  }
  for (int i = 0; i < p.stop_size(); ++i) {
    const std::string& s = p.stop(i);
    if (s.empty() || s.size() > kMaxStopBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.stop[", i, "] must be 1..", kMaxStopBytes,
                       " bytes, got ", s.size()));
    }
    g.stop.push_back(s);
  }
  g.ignore_eos = p.ignore_eos();
  // The sampler's own range checks (e.g. fields added later).
  KVD_RETURN_IF_ERROR(g.sampling.Validate());
  return g;
}

absl::Status ValidateLabels(
    const google::protobuf::Map<std::string, std::string>& labels) {
  if (labels.size() > kMaxLabels) {
    return absl::InvalidArgumentError(absl::StrCat(
        labels.size(), " labels; at most ", kMaxLabels, " are allowed"));
  }
  for (const auto& [key, value] : labels) {
    if (key.empty() || key.size() > kMaxLabelKeyBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("label keys must be 1..", kMaxLabelKeyBytes,
                       " bytes, got one of ", key.size()));
    }
    if (value.size() > kMaxLabelValueBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("label '", key, "' has a value of ", value.size(),
                       " bytes; at most ", kMaxLabelValueBytes));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> PageSize(int32_t requested) {
  if (requested == 0) return kDefaultPageSize;
  if (requested < 0 || requested > kMaxPageSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be in 1..", kMaxPageSize,
                     " (0 = ", kDefaultPageSize, "), got ", requested));
  }
  return requested;
}

absl::Status ValidateInput(const v1::GenerateRequest& request,
                           const std::optional<ops::ChatTemplate>& tmpl) {
  const bool has_messages = request.messages_size() > 0;
  const bool has_prompt = !request.prompt().empty();
  if (has_messages == has_prompt) {
    return absl::InvalidArgumentError(
        has_messages ? "give either messages or prompt, not both"
                     : "give messages (chat) or prompt (raw text)");
  }
  if (request.messages_size() > kMaxMessages) {
    return absl::InvalidArgumentError(
        absl::StrCat(request.messages_size(), " messages; at most ",
                     kMaxMessages, " per request"));
  }
  for (int i = 0; i < request.messages_size(); ++i) {
    const std::string& role = request.messages(i).role();
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i,
                       "].role must be system, user or "
                       "assistant, got '",
                       role, "'"));
    }
  }
  if (has_messages && !tmpl.has_value()) {
    return absl::FailedPreconditionError(
        "the loaded model has no recognised chat template; send a raw "
        "prompt instead of messages");
  }
  // As over HTTP: the reply answers a user message.
  if (has_messages &&
      request.messages(request.messages_size() - 1).role() != "user") {
    return absl::InvalidArgumentError(
        "the last message must have role 'user': kvd replies to it");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> TurnTokens(
    const v1::GenerateRequest& request, const ops::Tokenizer& tokenizer,
    const std::optional<ops::ChatTemplate>& tmpl,
    absl::Span<const int32_t> session_tokens) {
  KVD_RETURN_IF_ERROR(ValidateInput(request, tmpl));
  const bool first = session_tokens.empty();
  if (request.messages_size() == 0) {
    return tokenizer.EncodePrompt(request.prompt(), first);
  }
  if (!first && request.messages_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session already holds the conversation; send only the new "
        "message (got ",
        request.messages_size(), ")"));
  }
  std::vector<ops::ChatMessage> messages;
  for (const v1::ChatMessage& m : request.messages()) {
    messages.push_back({m.role(), m.content()});
  }
  return engine::ChatTurnTokens(*tmpl, tokenizer, messages, session_tokens);
}

void SetLogprobs(const ops::Tokenizer& tokenizer,
                 absl::Span<const ops::LogProbs> logprobs,
                 google::protobuf::RepeatedPtrField<v1::TokenLogprobs>* out) {
  auto set = [&tokenizer](const ops::TokenLogProb& t, v1::TokenLogprob* p) {
    p->set_token_id(t.token);
    p->set_logprob(t.logprob);
    p->set_token(tokenizer.TokenToPiece(t.token, /*special=*/true));
  };
  for (const ops::LogProbs& lp : logprobs) {
    v1::TokenLogprobs* m = out->Add();
    set(lp.chosen, m->mutable_chosen());
    for (const ops::TokenLogProb& t : lp.top) set(t, m->add_top());
  }
}

std::string ValidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (uint32_t cpt : ops::unicode::DecodeUtf8(text)) {
    // The decoder accepts encoded UTF-16 surrogates (a model's byte tokens
    // can spell them); protobuf rejects them, so they are replaced too.
    if (cpt >= 0xD800 && cpt <= 0xDFFF) cpt = 0xFFFD;
    ops::unicode::AppendUtf8(cpt, &out);
  }
  return out;
}

v1::Session SessionFromManifest(const v1::SessionManifest& m) {
  v1::Session s;
  s.set_session_id(m.session_id());
  s.mutable_labels()->insert(m.labels().begin(), m.labels().end());
  s.set_token_count(m.token_count());
  s.set_turns(m.turn_ends_size());
  s.set_policy(m.policy());
  s.set_stored_bytes(m.stored_bytes());
  s.set_created_unix_ms(m.created_unix_ms());
  s.set_updated_unix_ms(m.updated_unix_ms());
  s.set_model_name(m.model().model_name());
  return s;
}

}  // namespace kvd::node
