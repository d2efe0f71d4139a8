// The one rule that turns chat messages into a session turn's new tokens,
// shared by every front end (HTTP, gRPC, `kvd chat`) so a conversation gets
// the same tokens whichever way it arrives:
//   - a new conversation (no stored tokens): every message rendered with the
//     model's chat template and the generation prompt, encoded from the
//     start of a sequence (BOS where the vocabulary asks for it);
//   - a stored conversation: only `message` rendered as a follow-up, closing
//     the previous reply first unless the stored tokens end with
//     end-of-generation.
// Prompt text is encoded by Tokenizer::EncodePrompt (special-token text is
// parsed). With `estimate`, the stored tokens are not known yet (only
// whether there are any): the count is an upper bound (the reply is assumed
// open), for sizing a default max_tokens before the session's lock.
//
//   KVD_ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
//                        ChatTurnTokens(tmpl, tokenizer, messages, have));
//
// Thread-safety: a free function over immutable inputs.
#ifndef KVD_SERVICES_ENGINE_CHAT_TURN_H_
#define KVD_SERVICES_ENGINE_CHAT_TURN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ops/chat/chat_template.h"
#include "ops/tokenizer/tokenizer.h"

namespace kvd::engine {

// `messages`: the whole conversation for a new one; for a stored one, its
// last element is the new message (the rest is ignored: the session holds
// it). INVALID_ARGUMENT (from the template) for a role it cannot render, or
// no message.
absl::StatusOr<std::vector<int32_t>> ChatTurnTokens(
    const ops::ChatTemplate& tmpl, const ops::Tokenizer& tokenizer,
    absl::Span<const ops::ChatMessage> messages,
    absl::Span<const int32_t> session_tokens, bool estimate = false);

}  // namespace kvd::engine

#endif  // KVD_SERVICES_ENGINE_CHAT_TURN_H_
