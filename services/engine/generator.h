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
//   /*parse_special=*/true); KvCache cache = model.NewCache();
//   KVD_ASSIGN_OR_RETURN(GenerateResult r,
//                        Generate(model, tokenizer, req, &cache,
//                                 [](std::string_view s) { std::cout << s <<
//                                 std::flush; }));
//
// Thread-safety: one call per cache; the model and tokenizer may be shared.
#ifndef KVD_SERVICES_ENGINE_GENERATOR_H_
#define KVD_SERVICES_ENGINE_GENERATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "ops/model/model.h"
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
  // Polled between forward steps; true stops generation with kCancelled
  // (client disconnect, deadline).
  std::function<bool()> cancelled;
};

enum class FinishReason { kStop, kLength, kCancelled };
const char* FinishReasonName(FinishReason r);

struct GenerateResult {
  std::vector<int32_t>
      tokens;  // generated ids (including a final end-of-generation token)
  std::string text;  // visible text (stop string and EOG token excluded)
  FinishReason finish_reason = FinishReason::kLength;
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

absl::StatusOr<GenerateResult> Generate(
    const ops::Model& model, const ops::Tokenizer& tokenizer,
    const GenerateRequest& request, ops::KvCache* cache,
    const std::function<void(std::string_view)>& on_text);

}  // namespace kvd::engine

#endif  // KVD_SERVICES_ENGINE_GENERATOR_H_
