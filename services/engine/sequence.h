// One sequence's decoding state machine: chunked prefill of its prompt, then
// sample / feed back one token at a time until a stop condition.
//
// Generate (a batch of one) and the Scheduler (many sequences per Forward
// step) drive the same object, so stop strings, UTF-8-safe text emission,
// max_tokens, end-of-generation, cancellation, logprobs, the deltas streamed
// and on_logits behave the same
// whoever runs it. The driver asks for the sequence's next step, runs it in a
// Forward batch and hands back the step's logits row:
//
//   KVD_ASSIGN_OR_RETURN(std::unique_ptr<Sequence> seq,
//                        Sequence::Create(model, tokenizer, request, &cache,
//                                         on_delta));
//   ForwardOutput out;
//   while (!seq->done()) {
//     if (seq->PollCancelled()) break;
//     ops::SequenceStep step = seq->NextStep(/*max_prefill_tokens=*/256);
//     KVD_RETURN_IF_ERROR(model.Forward({&step, 1}, &out, request.observer));
//     seq->OnStepDone(step.logits == ops::LogitsMode::kNone ? nullptr
//                                                          : out.Logits(0));
//   }
//   GenerateResult result = seq->TakeResult();
//
// The cache, the request's callbacks and its kv_source must outlive the
// Sequence. Thread-safety: none; one driver thread at a time (the callbacks
// run on that thread).
#ifndef KVD_SERVICES_ENGINE_SEQUENCE_H_
#define KVD_SERVICES_ENGINE_SEQUENCE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "ops/model/model_backend.h"
#include "ops/sampler/sampler.h"
#include "ops/sampler/stop_matcher.h"
#include "ops/tokenizer/tokenizer.h"
#include "services/engine/generator.h"

namespace kvd::engine {

class Sequence {
 public:
  // INVALID_ARGUMENT for an empty prompt, a negative max_tokens, bad sampling
  // parameters or stop strings, or a prompt that does not fit the context.
  // Touches neither the cache nor any callback.
  static absl::StatusOr<std::unique_ptr<Sequence>> Create(
      const ops::ModelBackend& model, const ops::Tokenizer& tokenizer,
      GenerateRequest request, ops::KvCache* cache, DeltaCallback on_delta);

  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  bool done() const { return done_; }
  bool prefilling() const { return prefill_at_ < request_.prompt.size(); }
  // Prompt tokens not yet run.
  int64_t prefill_remaining() const {
    return request_.prompt.size() - prefill_at_;
  }
  const GenerateRequest& request() const { return request_; }

  // Polls the request's `cancelled` callback while the next step is a prefill
  // chunk (during decode it is polled after each sample, as Generate always
  // did); true finishes the sequence with kCancelled. Call before NextStep.
  bool PollCancelled();

  // The next step: a prefill chunk of at most min(prefill_chunk,
  // max_prefill_tokens) tokens (>= 1), or the last sampled token. Its
  // sequence_id is the request's; a batching driver may renumber it. Valid
  // until OnStepDone. Requires !done().
  ops::SequenceStep NextStep(int64_t max_prefill_tokens);

  // After the step ran: `logits` is its logits row (vocab_size values) when
  // the step asked for one, else null. Samples, emits text, and finishes the
  // sequence on a stop condition.
  void OnStepDone(const float* logits);

  // Finishes the sequence as cancelled (client gone, engine shutting down).
  void Cancel();

  // The result so far; call once, after done().
  GenerateResult TakeResult();

 private:
  Sequence(const ops::ModelBackend& model, const ops::Tokenizer& tokenizer,
           GenerateRequest request, ops::KvCache* cache, DeltaCallback on_delta,
           ops::Sampler sampler, ops::StopMatcher stop);
  // Releases `s` with the tokens sampled since the last delta; with
  // `flush`, delivers those tokens even when `s` is empty.
  void Emit(const std::string& s, bool flush = false);
  void Finish(FinishReason reason);

  const ops::ModelBackend& model_;
  const ops::Tokenizer& tokenizer_;
  const GenerateRequest request_;
  ops::KvCache* const cache_;
  const DeltaCallback on_delta_;
  ops::Sampler sampler_;
  ops::StopMatcher stop_;

  size_t prefill_at_ = 0;         // prompt tokens already run
  size_t last_chunk_ = 0;         // tokens of the step in flight
  std::vector<int32_t> history_;  // prompt + generated, for penalties
  GenerateResult result_;
  size_t delivered_tokens_ = 0;  // result_.tokens already in a delta
  bool done_ = false;
  bool started_ = false;
  std::chrono::steady_clock::time_point prefill_start_, decode_start_;
};

}  // namespace kvd::engine

#endif  // KVD_SERVICES_ENGINE_SEQUENCE_H_
