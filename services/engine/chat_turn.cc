#include "services/engine/chat_turn.h"

#include <string>

#include "base/status_macros.h"

namespace kvd::engine {

absl::StatusOr<std::vector<int32_t>> ChatTurnTokens(
    const ops::ChatTemplate& tmpl, const ops::Tokenizer& tokenizer,
    absl::Span<const ops::ChatMessage> messages,
    absl::Span<const int32_t> session_tokens, bool estimate) {
  if (messages.empty()) {
    return absl::InvalidArgumentError("a chat turn needs a message");
  }
  const bool first = session_tokens.empty();
  std::string text;
  if (first) {
    KVD_ASSIGN_OR_RETURN(text, tmpl.Render(messages, true));
  } else {
    // An estimate must not undercount: the 2 tokens that close a reply
    // count unless the stored tokens are known to end it.
    const bool reply_closed =
        !estimate && tokenizer.IsEog(session_tokens.back());
    KVD_ASSIGN_OR_RETURN(text,
                         tmpl.RenderFollowUp(messages.back(), reply_closed));
  }
  return tokenizer.EncodePrompt(text, first);
}

}  // namespace kvd::engine
