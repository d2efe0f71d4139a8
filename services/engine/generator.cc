#include "services/engine/generator.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "ops/sampler/stop_matcher.h"

namespace kvd::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t)
      .count();
}

}  // namespace

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

absl::StatusOr<GenerateResult> Generate(
    const ops::Model& model, const ops::Tokenizer& tokenizer,
    const GenerateRequest& request, ops::KvCache* cache,
    const std::function<void(std::string_view)>& on_text) {
  if (request.prompt.empty() && cache->length() == 0) {
    return absl::InvalidArgumentError("empty prompt: give at least one token");
  }
  if (request.max_tokens < 0)
    return absl::InvalidArgumentError("max_tokens must be >= 0");
  KVD_RETURN_IF_ERROR(request.sampling.Validate());
  const int64_t context = model.config().context_length;
  if (cache->length() + static_cast<int64_t>(request.prompt.size()) >=
      context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt of ", request.prompt.size(), " tokens (plus ", cache->length(),
        " already in the session) does not fit the context of ", context,
        " tokens; shorten it"));
  }

  GenerateResult result;
  result.prompt_tokens = request.prompt.size();
  std::vector<int32_t> history;  // for repetition penalties
  history.insert(history.end(), request.prompt.begin(), request.prompt.end());

  // Prefill in chunks; the last chunk yields the logits for the first new
  // token.
  const auto prefill_start = std::chrono::steady_clock::now();
  ops::ForwardOutput out;
  const int64_t chunk = std::max<int64_t>(1, request.prefill_chunk);
  for (size_t at = 0; at < request.prompt.size(); at += chunk) {
    const size_t n = std::min<size_t>(chunk, request.prompt.size() - at);
    const bool last = at + n == request.prompt.size();
    if (request.cancelled && request.cancelled()) {
      result.finish_reason = FinishReason::kCancelled;
      result.prefill_seconds = SecondsSince(prefill_start);
      return result;
    }
    ops::SequenceStep step{
        cache, absl::MakeConstSpan(request.prompt).subspan(at, n),
        last ? ops::LogitsMode::kLast : ops::LogitsMode::kNone,
        request.sequence_id, request.kv_source};
    KVD_RETURN_IF_ERROR(model.Forward({&step, 1}, &out, request.observer));
  }
  result.prefill_seconds = SecondsSince(prefill_start);

  const auto decode_start = std::chrono::steady_clock::now();
  KVD_ASSIGN_OR_RETURN(ops::Sampler sampler,
                       ops::Sampler::Create(request.sampling));
  KVD_ASSIGN_OR_RETURN(ops::StopMatcher stop,
                       ops::StopMatcher::Create(request.stop));
  const int32_t vocab = static_cast<int32_t>(model.config().vocab_size);
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    result.text += s;
    if (on_text) on_text(s);
  };
  for (int64_t i = 0; i < request.max_tokens; ++i) {
    if (request.on_logits) request.on_logits(out.Logits(0), vocab);
    const int32_t token = sampler.Sample(out.Logits(0), vocab, history);
    result.tokens.push_back(token);
    history.push_back(token);
    if (!request.ignore_eos && tokenizer.IsEog(token)) {
      result.finish_reason = FinishReason::kStop;
      break;
    }
    const ops::StopMatcher::Result r = stop.Feed(tokenizer.TokenToPiece(token));
    emit(r.emit);
    if (r.stopped) {
      result.finish_reason = FinishReason::kStop;
      break;
    }
    if (i + 1 == request.max_tokens || cache->length() + 1 >= context) break;
    if (request.cancelled && request.cancelled()) {
      result.finish_reason = FinishReason::kCancelled;
      break;
    }
    ops::SequenceStep step{cache, absl::MakeConstSpan(&result.tokens.back(), 1),
                           ops::LogitsMode::kLast, request.sequence_id,
                           request.kv_source};
    KVD_RETURN_IF_ERROR(model.Forward({&step, 1}, &out, request.observer));
  }
  if (result.finish_reason == FinishReason::kLength) emit(stop.Flush());
  result.decode_seconds = SecondsSince(decode_start);
  return result;
}

}  // namespace kvd::engine
