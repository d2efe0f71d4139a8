// Runs one OpenAI-style generation on a node: checks a parsed request
// against the served model and its context, then generates either
// statelessly (SessionEngine::Complete) or as the next turn of a stored
// session (SessionEngine::RunTurn), collecting logprobs when asked. Used by
// the HTTP server (http_server.h); free of HTTP so it is reusable.
//
// Chat prompts are built as `kvd chat` builds them: a new session (or a
// stateless request) renders every message with the model's chat template
// and encodes with BOS and special tokens; a continued session renders only
// the last message with RenderFollowUp, closing the previous reply if it did
// not end with an end-of-generation token. The template's stop strings are
// added to the request's.
//
//   GenerationJob job{.chat = true, .tenant = "acme", .session = "c1", ...};
//   KVD_RETURN_IF_ERROR(PrepareGeneration(runtime, 512, job));  // 400s
//   KVD_ASSIGN_OR_RETURN(GenerationOutcome out,
//                        RunGeneration(runtime, job, on_delta, cancelled));
//
// Thread-safety: as the SessionEngine (concurrent calls are fine).
#ifndef KVD_SERVICES_NODE_OPENAI_GENERATION_H_
#define KVD_SERVICES_NODE_OPENAI_GENERATION_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "services/engine/generator.h"
#include "services/node/openai_request.h"
#include "services/node/openai_response.h"
#include "services/node/runtime.h"

namespace kvd::node {

// A parsed request, validated against the model and the context before it
// queues.
struct GenerationJob {
  bool chat = false;
  std::string tenant;
  std::string session;  // empty: stateless
  // The client's X-Request-Id (a router always sends one): a retried turn
  // with the id of the session's last committed turn is refused (409).
  std::string request_id;
  OpenAiCommon common;
  std::vector<OpenAiMessage> messages;  // chat
  // Stateless: every prompt token (set by the caller for completions, by
  // PrepareGeneration for chat).
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;  // set by PrepareGeneration
  ResponseMeta meta;
};

struct GenerationOutcome {
  engine::GenerateResult gen;
  // OpenAI's usage: the whole context the reply follows (a session's stored
  // tokens + this request's), and how much of it was reused from the
  // session's stored state (0 when it had to be re-prefilled).
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  std::optional<std::vector<TokenLogProbText>> logprobs;
  // Session turns: how the session's state was obtained (hot, dram, ...) and
  // the time spent loading it and rebuilding (recomputing) its K/V.
  std::optional<engine::StatePath> state_path;
  double restore_seconds = 0;
  // A retried X-Request-Id: the turn's stored reply, not run again
  // (engine::TurnResult::replayed).
  bool replayed = false;
};

// Checks the model name (404), sampling parameters, that the model has a
// chat template (chat), and that prompt (+ the session's tokens) +
// max_tokens fits the context (400); fills job.max_tokens (the request's,
// else min(default_max_tokens, what the context leaves)) and, for stateless
// chat, job.prompt.
absl::Status PrepareGeneration(NodeRuntime& runtime, int64_t default_max_tokens,
                               GenerationJob& job);

// A chat request's new prompt tokens: every message for a stateless request
// or a session's first turn (`session_tokens` empty), else the last message
// as a follow-up, closing the previous reply unless `session_tokens` ends with
// end-of-generation. With `estimate` the session's tokens are not known yet
// (a placeholder stands for them) and the count is an upper bound: the reply
// is assumed open. PrepareGeneration sizes the default max_tokens from it.
absl::StatusOr<std::vector<int32_t>> ChatTokens(
    const NodeRuntime& runtime, const GenerationJob& job,
    absl::Span<const int32_t> session_tokens, bool estimate);

// Generates. A session is started by its first turn and stored when that turn
// commits (TurnRequest::create_if_missing). `on_delta` sees the output
// as it is produced (with each token's logprobs when the request asked;
// LogprobsText turns them into the API's form); `cancelled` (may be empty)
// is polled between steps; when it stops the generation, the result is
// CANCELLED (a session turn then stores nothing).
absl::StatusOr<GenerationOutcome> RunGeneration(
    NodeRuntime& runtime, const GenerationJob& job,
    const engine::DeltaCallback& on_delta,
    const std::function<bool()>& cancelled);

// The API's logprobs of `tokens` (parallel to `logprobs`): each token's text
// and its alternatives'. End-of-generation tokens are left out unless the
// request set ignore_eos (they are not part of the reply), so a stream's
// chunks and the whole response list the same entries.
std::vector<TokenLogProbText> LogprobsText(
    const ops::Tokenizer& tokenizer, const GenerationJob& job,
    absl::Span<const int32_t> tokens, absl::Span<const ops::LogProbs> logprobs);

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_OPENAI_GENERATION_H_
