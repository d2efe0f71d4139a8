// Single-sequence generation: chunked prefill, then sample/decode until a stop
// condition.
//
// This is the loop `kvd generate` runs: a batch of one Sequence
// (sequence.h), the state machine the Scheduler batches. Text is streamed
// through `on_text` as soon as it is safe to show: never half a UTF-8
// character, never a prefix of a stop string that may still complete.
//
//   GenerateRequest req;
//   req.prompt = tokenizer.Encode(text, /*add_special=*/true,
//                                 /*parse_special=*/true);
//   KVD_ASSIGN_OR_RETURN(auto pool, model.NewBlockPool({}));
//   KVD_ASSIGN_OR_RETURN(KvCache cache, model.NewCache(pool.get()));
//   KVD_ASSIGN_OR_RETURN(
//       GenerateResult r,
//       Generate(model, tokenizer, req, &cache, [](std::string_view s) {
//         std::cout << s << std::flush;
//       }));
//
// The model is any ops::ModelBackend (model_backend.h), driven only through
// Forward. Thread-safety: one call per cache; the model and tokenizer may be
// shared.
#ifndef KVD_SERVICES_ENGINE_GENERATOR_H_
#define KVD_SERVICES_ENGINE_GENERATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ops/model/model_backend.h"
#include "ops/sampler/sampler.h"
#include "ops/tokenizer/tokenizer.h"

namespace kvd::engine {

struct GenerateRequest {
  std::vector<int32_t> prompt;    // appended after what the cache already holds
  int64_t max_tokens = 128;       // new tokens at most
  ops::SamplingParams sampling;   // temperature 0 = greedy
  std::vector<std::string> stop;  // stop strings (not included in the output)
  bool ignore_eos = false;        // keep going past end-of-generation tokens
  // Prompt tokens per forward step at most (bounds scratch memory); the
  // Scheduler also caps it by its per-iteration prefill budget. Chunking
  // never changes a result bit.
  int64_t prefill_chunk = 256;

  // KV-Direct (optional): where K/V older than the hot window come from, and
  // who records each token's residuals; `sequence_id` names the sequence to
  // both. Null: a plain cache.
  const ops::KvSource* kv_source = nullptr;
  ops::ResidualObserver* observer = nullptr;
  int64_t sequence_id = 0;
  // Called with every step's logits (vocab_size floats) before sampling, for
  // callers that compare runs bit for bit or report logprobs.
  std::function<void(const float* logits, int64_t vocab_size)> on_logits;
  // Log-probabilities of every sampled token (ops::ComputeLogProbs of the
  // raw logits) with the `top_logprobs` most likely alternatives, computed
  // as each token is sampled: streamed with each delta and kept in the
  // result, so no caller needs to hold every step's logits.
  bool logprobs = false;
  int32_t top_logprobs = 0;  // clamped to [0, vocab_size]
  // Polled between forward steps; true stops generation with kCancelled
  // (client disconnect, deadline).
  std::function<bool()> cancelled;
};

enum class FinishReason { kStop, kLength, kCancelled };
const char* FinishReasonName(FinishReason r);

struct GenerateResult {
  // Generated ids (including a final end-of-generation token).
  std::vector<int32_t> tokens;
  // One per token of `tokens` when the request asked for logprobs, else
  // empty.
  std::vector<ops::LogProbs> logprobs;
  std::string text;  // visible text (stop string and EOG token excluded)
  FinishReason finish_reason = FinishReason::kLength;
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// One piece of streamed output. A token whose text is held back (half a
// UTF-8 character, a possible stop-string prefix) travels with the delta
// that releases its text, so each delta's text is what its tokens produced
// as far as the stream can tell. The last delta of a generation carries the
// tokens no text was released for (an end-of-generation token, a stop
// string's tokens), possibly with empty text. Concatenated, the deltas'
// `tokens` are GenerateResult::tokens, their `logprobs` its logprobs and
// their `text` its text.
struct GenerateDelta {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<ops::LogProbs> logprobs;  // parallel to tokens, when requested

  bool empty() const { return text.empty() && tokens.empty(); }
  // Appends `next` (a later delta) to this one.
  void Append(GenerateDelta&& next);
};

// Receives the stream's deltas: from a callable taking `const
// GenerateDelta&`, or, for text-only consumers, one taking std::string_view
// (called with each non-empty text). Null or empty: nothing is delivered.
class DeltaCallback {
 public:
  DeltaCallback() = default;
  DeltaCallback(std::nullptr_t) {}  // NOLINT: null callback, like std::function
  template <typename F,
            std::enable_if_t<std::is_invocable_v<F&, const GenerateDelta&>,
                             int> = 0>
  DeltaCallback(F f) {  // NOLINT: implicit, like std::function
    if (IsSet(f)) fn_ = std::move(f);
  }
  template <typename F,
            std::enable_if_t<!std::is_invocable_v<F&, const GenerateDelta&> &&
                                 std::is_invocable_v<F&, std::string_view>,
                             int> = 0>
  DeltaCallback(F f) {  // NOLINT: implicit, like std::function
    if (!IsSet(f)) return;
    fn_ = [f = std::move(f)](const GenerateDelta& d) mutable {
      if (!d.text.empty()) f(std::string_view(d.text));
    };
  }

  explicit operator bool() const { return static_cast<bool>(fn_); }
  void operator()(const GenerateDelta& delta) const {
    if (fn_) fn_(delta);
  }

 private:
  // An empty std::function (or null function pointer) stays unset.
  template <typename F>
  static bool IsSet(const F& f) {
    if constexpr (std::is_constructible_v<bool, const F&>) {
      return static_cast<bool>(f);
    } else {
      return true;
    }
  }

  std::function<void(const GenerateDelta&)> fn_;
};

absl::StatusOr<GenerateResult> Generate(const ops::ModelBackend& model,
                                        const ops::Tokenizer& tokenizer,
                                        const GenerateRequest& request,
                                        ops::KvCache* cache,
                                        const DeltaCallback& on_delta);

}  // namespace kvd::engine

#endif  // KVD_SERVICES_ENGINE_GENERATOR_H_
