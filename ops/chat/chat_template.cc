#include "ops/chat/chat_template.h"

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvd::ops {
namespace {

constexpr char kUnknownTemplateHelp[] = "supported: chatml, gemma, llama3";

// Python's str.isspace() set, which Jinja's trim (str.strip) uses.
bool IsPythonSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 ||
         c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Decodes the UTF-8 character at s[i]; sets *len to its byte length (1 for a
// malformed byte, which decodes to a value that is never whitespace).
uint32_t DecodeAt(std::string_view s, size_t i, size_t* len) {
  const uint8_t b0 = static_cast<uint8_t>(s[i]);
  size_t n = b0 < 0x80           ? 1
             : (b0 >> 5) == 0x6  ? 2
             : (b0 >> 4) == 0xE  ? 3
             : (b0 >> 3) == 0x1E ? 4
                                 : 0;
  if (n == 0 || i + n > s.size()) {
    *len = 1;
    return 0xFFFFFFFF;
  }
  uint32_t c = n == 1 ? b0 : b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    const uint8_t b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      *len = 1;
      return 0xFFFFFFFF;
    }
    c = (c << 6) | (b & 0x3F);
  }
  *len = n;
  return c;
}

absl::Status CheckRole(const ChatMessage& m, size_t index) {
  if (m.role.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("message ", index, " has an empty role"));
  }
  if (m.role.find_first_of("\r\n") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("message ", index, " has a role with a line break"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string JinjaTrim(std::string_view s) {
  size_t begin = s.size();
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    const uint32_t c = DecodeAt(s, i, &len);
    if (!IsPythonSpace(c)) {
      if (begin == s.size()) begin = i;
      end = i + len;
    }
    i += len;
  }
  return begin < end ? std::string(s.substr(begin, end - begin))
                     : std::string();
}

std::optional<std::string> ExtractChatMLDefaultSystem(std::string_view jinja) {
  static constexpr std::string_view kOpen = "<|im_start|>system";
  static constexpr std::string_view kClose = "<|im_end|>";
  for (size_t pos = jinja.find(kOpen); pos != std::string_view::npos;
       pos = jinja.find(kOpen, pos + 1)) {
    // Only a literal that starts inside a string constant counts.
    if (pos == 0 || (jinja[pos - 1] != '\'' && jinja[pos - 1] != '"')) continue;
    size_t start = pos + kOpen.size();
    if (jinja.substr(start, 1) == "\n") {
      start += 1;
    } else if (jinja.substr(start, 2) == "\\n") {
      start += 2;
    } else {
      continue;
    }
    const size_t close = jinja.find(kClose, start);
    if (close == std::string_view::npos) continue;
    const std::string_view body = jinja.substr(start, close - start);
    // A string constant that ends before <|im_end|> ('...system\n' +
    // messages[0]['content']) is an expression, not a default.
    if (body.empty() || body.find_first_of("'\"{}") != std::string_view::npos)
      continue;
    std::string out;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i] == '\\' && i + 1 < body.size() && body[i + 1] == 'n') {
        out.push_back('\n');
        ++i;
      } else {
        out.push_back(body[i]);
      }
    }
    return out;
  }
  return std::nullopt;
}

absl::StatusOr<ChatTemplate> ChatTemplate::Detect(
    std::string_view architecture, std::optional<std::string_view> jinja) {
  if (jinja.has_value() && !jinja->empty()) {
    if (jinja->find("<|im_start|>") != std::string_view::npos) {
      return ChatML(ExtractChatMLDefaultSystem(*jinja));
    }
    if (jinja->find("<start_of_turn>") != std::string_view::npos)
      return Gemma();
    if (jinja->find("<|start_header_id|>") != std::string_view::npos)
      return Llama3();
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown chat template in tokenizer.chat_template (architecture '",
        std::string(architecture),
        "'): none of <|im_start|>, <start_of_turn>, ",
        "<|start_header_id|> occurs in it; ", kUnknownTemplateHelp));
  }
  if (architecture == "gemma" || architecture == "gemma2" ||
      architecture == "gemma3") {
    return Gemma();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown chat template: the model (architecture '",
      std::string(architecture),
      "') has no tokenizer.chat_template and no default for its architecture; ",
      kUnknownTemplateHelp));
}

ChatTemplate ChatTemplate::ChatML(
    std::optional<std::string> default_system_prompt) {
  return ChatTemplate(Kind::kChatML, std::move(default_system_prompt),
                      {"<|im_end|>"});
}

ChatTemplate ChatTemplate::Gemma() {
  return ChatTemplate(Kind::kGemma, std::nullopt, {"<end_of_turn>"});
}

ChatTemplate ChatTemplate::Llama3() {
  return ChatTemplate(Kind::kLlama3, std::nullopt, {"<|eot_id|>"});
}

std::string_view ChatTemplate::name() const {
  switch (kind_) {
    case Kind::kChatML:
      return "chatml";
    case Kind::kGemma:
      return "gemma";
    case Kind::kLlama3:
      return "llama3";
  }
  return "";
}

absl::StatusOr<std::string> ChatTemplate::Render(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt) const {
  for (size_t i = 0; i < messages.size(); ++i) {
    if (absl::Status s = CheckRole(messages[i], i); !s.ok()) return s;
  }
  switch (kind_) {
    case Kind::kChatML:
      return RenderChatML(messages, add_generation_prompt);
    case Kind::kGemma:
      return RenderGemma(messages, add_generation_prompt);
    case Kind::kLlama3:
      return RenderLlama3(messages, add_generation_prompt);
  }
  return absl::InternalError("unhandled chat template kind");
}

absl::StatusOr<std::string> ChatTemplate::RenderFollowUp(
    const ChatMessage& message, bool reply_closed) const {
  // Index 1: CheckRole's rules for a message that is not the first.
  if (absl::Status s = CheckRole(message, 1); !s.ok()) return s;
  std::string out = reply_closed ? "" : stop_strings_.front();
  switch (kind_) {
    case Kind::kChatML:
      absl::StrAppend(&out, "\n<|im_start|>", message.role, "\n",
                      message.content, "<|im_end|>\n<|im_start|>assistant\n");
      return out;
    case Kind::kGemma:
      if (message.role != "user") {
        return absl::InvalidArgumentError(absl::StrCat(
            "gemma chat template: the turn after a model reply must be a user "
            "message, not '",
            message.role, "'"));
      }
      absl::StrAppend(&out, "\n<start_of_turn>user\n",
                      JinjaTrim(message.content),
                      "<end_of_turn>\n<start_of_turn>model\n");
      return out;
    case Kind::kLlama3:
      absl::StrAppend(&out, "<|start_header_id|>", message.role,
                      "<|end_header_id|>\n\n", JinjaTrim(message.content),
                      "<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
                      "\n\n");
      return out;
  }
  return absl::InternalError("unhandled chat template kind");
}

// SmolLM2's template (the default system prompt abbreviated):
//   {% for message in messages %}
//   {% if loop.first and messages[0]['role'] != 'system' %}
//   {{ '<|im_start|>system\nYou are ...<|im_end|>\n' }}{% endif %}
//   {{'<|im_start|>' + message['role'] + '\n' + message['content'] +
//     '<|im_end|>' + '\n'}}{% endfor %}
//   {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
absl::StatusOr<std::string> ChatTemplate::RenderChatML(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt) const {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0 && messages[0].role != "system" && default_system_) {
      absl::StrAppend(&out, "<|im_start|>system\n", *default_system_,
                      "<|im_end|>\n");
    }
    absl::StrAppend(&out, "<|im_start|>", messages[i].role, "\n",
                    messages[i].content, "<|im_end|>\n");
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// Google's Gemma 3 template, less {{ bos_token }} (the tokenizer adds BOS): a
// leading system message becomes "{system}\n\n" before the first remaining
// message's content; roles must then alternate with user first; assistant is
// called "model"; contents are trimmed.
absl::StatusOr<std::string> ChatTemplate::RenderGemma(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt) const {
  std::string first_prefix;
  absl::Span<const ChatMessage> turns = messages;
  if (!messages.empty() && messages[0].role == "system") {
    first_prefix = messages[0].content + "\n\n";
    turns = messages.subspan(1);
  }
  std::string out;
  for (size_t i = 0; i < turns.size(); ++i) {
    const ChatMessage& m = turns[i];
    if ((m.role == "user") != (i % 2 == 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("gemma chat template: conversation roles must alternate "
                       "user/assistant/user/... "
                       "(after an optional leading system message); message ",
                       i + (turns.size() < messages.size() ? 1 : 0),
                       " has role '", m.role, "'"));
    }
    const std::string_view role =
        m.role == "assistant" ? "model" : std::string_view(m.role);
    absl::StrAppend(&out, "<start_of_turn>", std::string(role), "\n",
                    i == 0 ? first_prefix : "", JinjaTrim(m.content),
                    "<end_of_turn>\n");
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

// Meta's Llama 3 Instruct template, less the leading bos_token.
absl::StatusOr<std::string> ChatTemplate::RenderLlama3(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt) const {
  std::string out;
  for (const ChatMessage& m : messages) {
    absl::StrAppend(&out, "<|start_header_id|>", m.role,
                    "<|end_header_id|>\n\n", JinjaTrim(m.content),
                    "<|eot_id|>");
  }
  if (add_generation_prompt)
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace kvd::ops
