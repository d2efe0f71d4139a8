#include "services/engine/sequence.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvd::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t)
      .count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Sequence>> Sequence::Create(
    const ops::ModelBackend& model, const ops::Tokenizer& tokenizer,
    GenerateRequest request, ops::KvCache* cache, DeltaCallback on_delta) {
  if (request.prompt.empty()) {
    // The prompt's last token yields the first logits, so even a session
    // that holds tokens needs at least one new one.
    return absl::InvalidArgumentError(
        cache->length() == 0
            ? "empty prompt: give at least one token"
            : "no new tokens to run after the session's history: give at "
              "least one token");
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
  KVD_ASSIGN_OR_RETURN(ops::Sampler sampler,
                       ops::Sampler::Create(request.sampling));
  KVD_ASSIGN_OR_RETURN(ops::StopMatcher stop,
                       ops::StopMatcher::Create(request.stop));
  return std::unique_ptr<Sequence>(
      new Sequence(model, tokenizer, std::move(request), cache,
                   std::move(on_delta), std::move(sampler), std::move(stop)));
}

Sequence::Sequence(const ops::ModelBackend& model,
                   const ops::Tokenizer& tokenizer, GenerateRequest request,
                   ops::KvCache* cache, DeltaCallback on_delta,
                   ops::Sampler sampler, ops::StopMatcher stop)
    : model_(model),
      tokenizer_(tokenizer),
      request_(std::move(request)),
      cache_(cache),
      on_delta_(std::move(on_delta)),
      sampler_(std::move(sampler)),
      stop_(std::move(stop)) {
  result_.prompt_tokens = request_.prompt.size();
  history_ = request_.prompt;
}

bool Sequence::PollCancelled() {
  if (done_) return true;
  if (prefilling() && request_.cancelled && request_.cancelled()) Cancel();
  return done_;
}

ops::SequenceStep Sequence::NextStep(int64_t max_prefill_tokens) {
  if (!started_) {
    started_ = true;
    prefill_start_ = std::chrono::steady_clock::now();
  }
  if (prefilling()) {
    const int64_t chunk = std::max<int64_t>(
        1, std::min(request_.prefill_chunk, max_prefill_tokens));
    last_chunk_ = std::min<int64_t>(chunk, prefill_remaining());
    const bool last = prefill_at_ + last_chunk_ == request_.prompt.size();
    return ops::SequenceStep{
        cache_,
        absl::MakeConstSpan(request_.prompt).subspan(prefill_at_, last_chunk_),
        last ? ops::LogitsMode::kLast : ops::LogitsMode::kNone,
        request_.sequence_id, request_.kv_source};
  }
  last_chunk_ = 0;
  return ops::SequenceStep{
      cache_, absl::MakeConstSpan(&result_.tokens.back(), 1),
      ops::LogitsMode::kLast, request_.sequence_id, request_.kv_source};
}

void Sequence::OnStepDone(const float* logits) {
  if (prefilling()) {
    prefill_at_ += last_chunk_;
    if (prefilling()) return;  // more chunks before the first logits
    result_.prefill_seconds = SecondsSince(prefill_start_);
    decode_start_ = std::chrono::steady_clock::now();
  }
  // One iteration of the decode loop: the step's logits give the next token.
  const int64_t i = result_.tokens.size();
  if (i >= request_.max_tokens) return Finish(FinishReason::kLength);
  const int32_t vocab = static_cast<int32_t>(model_.config().vocab_size);
  if (request_.on_logits) request_.on_logits(logits, vocab);
  const int32_t token = sampler_.Sample(logits, vocab, history_);
  result_.tokens.push_back(token);
  history_.push_back(token);
  if (request_.logprobs) {
    result_.logprobs.push_back(
        ops::ComputeLogProbs(logits, vocab, token, request_.top_logprobs));
  }
  if (!request_.ignore_eos && tokenizer_.IsEog(token))
    return Finish(FinishReason::kStop);
  const ops::StopMatcher::Result r = stop_.Feed(tokenizer_.TokenToPiece(token));
  Emit(r.emit);
  if (r.stopped) return Finish(FinishReason::kStop);
  if (i + 1 == request_.max_tokens ||
      cache_->length() + 1 >= model_.config().context_length) {
    return Finish(FinishReason::kLength);
  }
  if (request_.cancelled && request_.cancelled()) Cancel();
}

void Sequence::Cancel() {
  if (done_) return;
  if (prefilling() || !started_) {
    result_.prefill_seconds = started_ ? SecondsSince(prefill_start_) : 0;
  }
  Finish(FinishReason::kCancelled);
}

void Sequence::Emit(const std::string& s, bool flush) {
  const size_t n = result_.tokens.size();
  if (s.empty() && !(flush && delivered_tokens_ < n)) return;
  result_.text += s;
  if (on_delta_) {
    GenerateDelta d;
    d.text = s;
    d.tokens.assign(result_.tokens.begin() + delivered_tokens_,
                    result_.tokens.end());
    if (request_.logprobs) {
      d.logprobs.assign(result_.logprobs.begin() + delivered_tokens_,
                        result_.logprobs.end());
    }
    on_delta_(d);
  }
  delivered_tokens_ = n;
}

void Sequence::Finish(FinishReason reason) {
  done_ = true;
  result_.finish_reason = reason;
  Emit(reason == FinishReason::kLength ? stop_.Flush() : std::string(),
       /*flush=*/true);
  if (reason != FinishReason::kCancelled || !prefilling())
    result_.decode_seconds = SecondsSince(decode_start_);
}

GenerateResult Sequence::TakeResult() { return std::move(result_); }

}  // namespace kvd::engine
