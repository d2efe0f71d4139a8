#include "services/node/openai_generation.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "ops/sampler/sampler.h"
#include "services/engine/chat_turn.h"

namespace kvd::node {
namespace {

uint64_t RandomSeed() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> ChatTokens(
    const NodeRuntime& runtime, const GenerationJob& job,
    absl::Span<const int32_t> session_tokens, bool estimate) {
  std::vector<ops::ChatMessage> messages;
  for (const OpenAiMessage& m : job.messages) {
    messages.push_back({m.role, m.content});
  }
  absl::StatusOr<std::vector<int32_t>> tokens =
      engine::ChatTurnTokens(*runtime.chat_template(), runtime.tokenizer(),
                             messages, session_tokens, estimate);
  if (!tokens.ok()) return RequestError("messages", tokens.status().message());
  return tokens;
}

absl::Status PrepareGeneration(NodeRuntime& runtime, int64_t default_max_tokens,
                               GenerationJob& job) {
  if (job.common.model != runtime.model_id()) {
    absl::Status s =
        RequestError("model",
                     absl::StrCat("model '", job.common.model,
                                  "' is not served here; this node serves '",
                                  runtime.model_id(), "' (GET /v1/models)"),
                     404, absl::StatusCode::kNotFound);
    return s;
  }
  if (absl::Status s = job.common.sampling.Validate(); !s.ok()) {
    return RequestError("", s.message());
  }
  const int64_t context = runtime.model().config().context_length;
  int64_t have = 0;  // tokens the generation will follow
  // A continued session's count is an upper bound (see ChatTokens): it sizes
  // the default max_tokens, but only the exact check under the session's
  // lock may refuse a max_tokens the client chose.
  bool estimated = false;
  if (job.chat) {
    if (!runtime.chat_template().has_value()) {
      return RequestError("messages",
                          absl::StrCat("model '", runtime.model_id(),
                                       "' has no chat template kvd "
                                       "recognises; use /v1/completions"));
    }
    int64_t session_tokens = 0;
    if (!job.session.empty()) {
      absl::StatusOr<v1::SessionManifest> m =
          runtime.engine().GetSession(job.tenant, job.session);
      if (m.ok()) {
        session_tokens = m->token_count();
      } else if (m.status().code() != absl::StatusCode::kNotFound) {
        return m.status();
      }
    }
    // For a continued session an estimate (the exact count is known only
    // under the session's lock, where it is checked again).
    std::vector<int32_t> placeholder(session_tokens > 0 ? 1 : 0, -1);
    KVD_ASSIGN_OR_RETURN(
        std::vector<int32_t> tokens,
        ChatTokens(runtime, job, placeholder, /*estimate=*/true));
    have = session_tokens + static_cast<int64_t>(tokens.size());
    estimated = session_tokens > 0;
    if (job.session.empty()) job.prompt = std::move(tokens);
  } else {
    have = static_cast<int64_t>(job.prompt.size());
  }
  const bool exact_check_decides =
      estimated && job.common.max_tokens.has_value();
  if (have >= context && !exact_check_decides) {
    absl::Status s = RequestError(
        job.chat ? "messages" : "prompt",
        absl::StrCat("the prompt is ", have, " tokens",
                     job.session.empty() ? "" : " with the session's",
                     "; the model's context is ", context, " tokens"));
    return s;
  }
  job.max_tokens = job.common.max_tokens.value_or(
      std::min(default_max_tokens, context - have));
  if (have + job.max_tokens > context && !exact_check_decides) {
    return RequestError(
        "max_tokens",
        absl::StrCat("prompt (", have, " tokens) + max_tokens (",
                     job.max_tokens, ") exceeds the model's context of ",
                     context, " tokens; lower max_tokens"));
  }
  return absl::OkStatus();
}

std::vector<TokenLogProbText> LogprobsText(
    const ops::Tokenizer& tokenizer, const GenerationJob& job,
    absl::Span<const int32_t> tokens,
    absl::Span<const ops::LogProbs> logprobs) {
  std::vector<TokenLogProbText> out;
  const size_t n = std::min(tokens.size(), logprobs.size());
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = tokens[i];
    if (!job.common.ignore_eos && tokenizer.IsEog(id)) continue;
    TokenLogProbText t{tokenizer.TokenToPiece(id, /*special=*/true),
                       logprobs[i].chosen.logprob,
                       {},
                       static_cast<int64_t>(tokenizer.TokenToPiece(id).size())};
    for (const ops::TokenLogProb& top : logprobs[i].top) {
      t.top.emplace_back(tokenizer.TokenToPiece(top.token, /*special=*/true),
                         top.logprob);
    }
    out.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<GenerationOutcome> RunGeneration(
    NodeRuntime& runtime, const GenerationJob& job,
    const engine::DeltaCallback& on_delta,
    const std::function<bool()>& cancelled) {
  engine::GenerateRequest g;
  g.max_tokens = job.max_tokens;
  g.sampling = job.common.sampling;
  if (!job.common.seed_given) g.sampling.seed = RandomSeed();
  g.stop = job.common.stop;
  if (job.chat) {
    for (const std::string& s : runtime.chat_template()->stop_strings()) {
      g.stop.push_back(s);
    }
  }
  g.ignore_eos = job.common.ignore_eos;
  g.cancelled = cancelled;
  g.logprobs = job.common.logprobs;
  g.top_logprobs = job.common.top_logprobs;
  GenerationOutcome out;
  engine::SessionEngine& engine = runtime.engine();
  if (job.session.empty()) {
    g.prompt = job.prompt;
    KVD_ASSIGN_OR_RETURN(out.gen,
                         engine.Complete(g, runtime.tokenizer(), on_delta));
    out.prompt_tokens = static_cast<int64_t>(job.prompt.size());
  } else {
    const int64_t context = runtime.model().config().context_length;
    engine::TurnRequest turn;
    turn.tenant = job.tenant;
    turn.session = job.session;
    // Stored only once its first turn commits; a node that creates sessions
    // only explicitly answers an unknown one with 404.
    turn.create_if_missing = runtime.create_sessions_on_first_use();
    // A waiting turn would hold its admission slot while it waits.
    turn.fail_if_busy = true;
    turn.request_id = job.request_id;
    turn.generate = std::move(g);
    turn.make_tokens = [&runtime, &job, context](absl::Span<const int32_t> have)
        -> absl::StatusOr<std::vector<int32_t>> {
      KVD_ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                           ChatTokens(runtime, job, have, /*estimate=*/false));
      const int64_t total = static_cast<int64_t>(have.size() + tokens.size());
      if (total + job.max_tokens > context) {
        return RequestError(
            "max_tokens",
            absl::StrCat("session '", job.session, "' holds ", have.size(),
                         " tokens; with this message (", tokens.size(),
                         ") and max_tokens (", job.max_tokens,
                         ") it exceeds the context of ", context, " tokens"));
      }
      return tokens;
    };
    KVD_ASSIGN_OR_RETURN(engine::TurnResult r,
                         engine.RunTurn(turn, runtime.tokenizer(), on_delta));
    out.gen = std::move(r.generation);
    out.prompt_tokens = r.context_tokens;
    out.cached_tokens = r.cached_tokens;
    out.state_path = r.path;
    out.restore_seconds = r.restore_seconds;
    out.replayed = r.replayed;
  }
  if (job.common.logprobs) {
    out.logprobs = LogprobsText(runtime.tokenizer(), job, out.gen.tokens,
                                out.gen.logprobs);
  }
  return out;
}

}  // namespace kvd::node
