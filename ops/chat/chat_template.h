// Chat templates: turn a conversation ({role, content} messages) into the
// prompt text a model was trained on.
//
// kvd does not run Jinja. It recognises the template a model file carries
// (GGUF tokenizer.chat_template) by its markers and renders that format
// natively:
//  - chatml (SmolLM2, Qwen2, ...): "<|im_start|>{role}\n{content}<|im_end|>\n".
//    A default system message written into the template (SmolLM2: "You are a
//    helpful AI assistant named SmolLM, trained by Hugging Face") is inserted
//    when the conversation does not start with one, as the template does.
//  - gemma (Gemma 1-3): "<start_of_turn>{user|model}\n{content}"
//    "<end_of_turn>\n". A leading system message is folded into the first
//    user turn ("{system}\n\n{user}"), contents are trimmed, and the roles
//    after it must alternate user/model, as Google's template requires.
//  - llama3 (Llama 3): "<|start_header_id|>{role}<|end_header_id|>\n\n"
//    "{content}<|eot_id|>", contents trimmed.
// No template emits BOS: the tokenizer adds it. So render, then
// Encode(text, /*add_special=*/true, /*parse_special=*/true). parse_special
// also turns control-token text typed by a user into control tokens (as in
// llama.cpp).
//
// Thread-safety: immutable value type; const methods are safe to call
// concurrently.
//
//   KVD_ASSIGN_OR_RETURN(ChatTemplate tmpl,
//                        ChatTemplate::Detect("llama", jinja));
//   KVD_ASSIGN_OR_RETURN(std::string prompt,
//                        tmpl.Render({{"user", "Hi!"}}, true));
//   // SmolLM2: "<|im_start|>system\nYou are ...<|im_end|>\n"
//   //          "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
#ifndef KVD_OPS_CHAT_CHAT_TEMPLATE_H_
#define KVD_OPS_CHAT_CHAT_TEMPLATE_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvd::ops {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (chatml and llama3 also
                     // pass others on)
  std::string content;
};

class ChatTemplate {
 public:
  enum class Kind { kChatML, kGemma, kLlama3 };

  // Chooses the template by markers in `jinja_template` ("<|im_start|>",
  // "<start_of_turn>",
  // "<|start_header_id|>"), else by `architecture` (gemma, gemma2, gemma3 ->
  // gemma). Otherwise INVALID_ARGUMENT naming the supported templates.
  static absl::StatusOr<ChatTemplate> Detect(
      std::string_view architecture,
      std::optional<std::string_view> jinja_template);

  static ChatTemplate ChatML(
      std::optional<std::string> default_system_prompt = std::nullopt);
  static ChatTemplate Gemma();
  static ChatTemplate Llama3();

  Kind kind() const { return kind_; }
  // "chatml", "gemma" or "llama3".
  std::string_view name() const;
  // chatml only: the system message used when the conversation has none.
  const std::optional<std::string>& default_system_prompt() const {
    return default_system_;
  }
  // Text that ends a model turn (<|im_end|>, <end_of_turn>, <|eot_id|>): stop
  // generating there.
  const std::vector<std::string>& stop_strings() const { return stop_strings_; }

  // The prompt for `messages`; with add_generation_prompt, followed by the
  // opening of an assistant turn. INVALID_ARGUMENT for an empty or multi-line
  // role, or (gemma) roles that do not alternate.
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages,
                                     bool add_generation_prompt) const;

  // Continues a stored conversation whose text so far ends inside an
  // assistant reply (Render(..., true) + the reply's tokens): closes the reply
  // -- its end marker, unless the model already emitted it
  // (`reply_closed`), and what the template writes after it -- then renders
  // `message` as a later turn (no default system prompt) with the generation
  // prompt. So Render(history + [reply, message], true) ==
  // Render(history, true) + reply + RenderFollowUp(message, false).
  // INVALID_ARGUMENT for a bad role (gemma: `message` must be a user turn).
  absl::StatusOr<std::string> RenderFollowUp(const ChatMessage& message,
                                             bool reply_closed) const;

 private:
  ChatTemplate(Kind kind, std::optional<std::string> default_system,
               std::vector<std::string> stop_strings)
      : kind_(kind),
        default_system_(std::move(default_system)),
        stop_strings_(std::move(stop_strings)) {}

  absl::StatusOr<std::string> RenderChatML(
      absl::Span<const ChatMessage> messages, bool add_generation_prompt) const;
  absl::StatusOr<std::string> RenderGemma(
      absl::Span<const ChatMessage> messages, bool add_generation_prompt) const;
  absl::StatusOr<std::string> RenderLlama3(
      absl::Span<const ChatMessage> messages, bool add_generation_prompt) const;

  Kind kind_;
  std::optional<std::string> default_system_;
  std::vector<std::string> stop_strings_;
};

// Jinja's `trim` (Python str.strip()): drops leading and trailing whitespace as
// Python defines it (includes U+001C..U+001F, U+0085, U+00A0, U+3000, ...).
std::string JinjaTrim(std::string_view s);

// The default system prompt a ChatML Jinja template writes as a literal
// '<|im_start|>system\n...<|im_end|>' (with "\n" or an escaped "\\n"), if any.
std::optional<std::string> ExtractChatMLDefaultSystem(
    std::string_view jinja_template);

}  // namespace kvd::ops

#endif  // KVD_OPS_CHAT_CHAT_TEMPLATE_H_
