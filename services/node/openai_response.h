// OpenAI-compatible response bodies (chat.completion, chat.completion.chunk,
// text_completion, model list) and kvd's session objects, as pure functions
// over plain values, so their shape is tested without a model or a socket.
//
//   ChoiceOutput out{.text = "Hello", .finish_reason = "stop"};
//   std::string body = ChatCompletionJson(meta, out, Usage{12, 1});
//   std::string sse = SseEvent(ChatChunkJson(meta, "Hel", nullptr, nullptr));
//
// Thread-safety: free functions without shared state.
#ifndef KVD_SERVICES_NODE_OPENAI_RESPONSE_H_
#define KVD_SERVICES_NODE_OPENAI_RESPONSE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "ops/sampler/sampler.h"
#include "proto/kvd/v1/checkpoint.pb.h"

namespace kvd::node {

// Identifies one response; every chunk of a stream repeats it.
struct ResponseMeta {
  std::string id;  // "chatcmpl-..." or "cmpl-..."
  int64_t created_unix_s = 0;
  std::string model;
  std::string session_id;  // kvd extension, omitted when empty
};

// As OpenAI counts it: prompt_tokens is the whole context the reply follows
// (a session's stored tokens plus the new ones); cached_tokens is the part of
// it reused from the session's stored state rather than run through the
// model (prompt_tokens_details.cached_tokens).
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  // kvd extensions sent beside the usage, for session turns only (omitted
  // when empty): where the turn found the session's state (new, hot, dram,
  // rocksdb, reprefill: engine::StatePathName) and the milliseconds its
  // restore took, so a client can tell a warm turn from a cold one.
  std::string session_state;
  double restore_ms = -1;
};

// One generated token's log-probabilities, with the text of each token.
struct TokenLogProbText {
  // The token's bytes (may be part of a UTF-8 char); a special token's text
  // ("<|im_end|>"), as vLLM and llama-server give it.
  std::string token;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
  // Bytes the token adds to the response's text: `token`'s size, 0 for a
  // special token (its text is not part of the reply).
  int64_t text_bytes = 0;
};

struct ChoiceOutput {
  std::string text;
  std::string finish_reason;  // "stop" or "length"
  // Set when the request asked for logprobs.
  std::optional<std::vector<TokenLogProbText>> logprobs;
};

std::string ChatCompletionJson(const ResponseMeta& meta,
                               const ChoiceOutput& out, const Usage& usage);
// A chat.completion.chunk: `content` (may be empty: the first chunk carries
// the role), `finish_reason` (null = none yet), `usage` (null = omitted; set
// only on the extra last chunk of stream_options.include_usage, whose
// choices are empty), `logprobs` (null = omitted).
std::string ChatChunkJson(const ResponseMeta& meta, absl::string_view content,
                          bool first, const std::string* finish_reason,
                          const Usage* usage,
                          const std::vector<TokenLogProbText>* logprobs);
std::string CompletionJson(const ResponseMeta& meta, const ChoiceOutput& out,
                           const Usage& usage);
// `text_offset`: where the chunk's first logprobs token starts in the
// streamed text (the legacy format's text_offset counts from the start).
std::string CompletionChunkJson(const ResponseMeta& meta,
                                absl::string_view text,
                                const std::string* finish_reason,
                                const Usage* usage,
                                const std::vector<TokenLogProbText>* logprobs,
                                int64_t text_offset = 0);
// {"object": "list", "data": [{"id", "object": "model", "created",
// "owned_by": "kvd"}]}
std::string ModelsJson(const std::string& model_id, int64_t created_unix_s);
// A session as GET /v1/sessions/{id} shows it. With `tier` (where its state
// is on this node: "hot", its K/V in memory; "dram", its checkpoint in the
// host-DRAM tier; "rocksdb", on disk only) it also says how its state is
// represented when stored ("representation": "kv" for K/V rows, "residuals"
// for kv-direct and stride:k, "tokens" for token ids only) and how its next
// turn gets it back ("next_turn_restore": "hot", nothing to do; "copy", the
// stored K/V rows copied; "recompute", K/V rebuilt from residuals;
// "reprefill", the model runs over its token ids).
std::string SessionJson(const v1::SessionManifest& manifest,
                        std::optional<std::string> tier = std::nullopt);
std::string SessionListJson(const std::vector<v1::SessionManifest>& sessions,
                            const std::string& next_page_token);

// "data: <json>\n\n"
std::string SseEvent(absl::string_view json);
inline constexpr char kSseDone[] = "data: [DONE]\n\n";

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_OPENAI_RESPONSE_H_
