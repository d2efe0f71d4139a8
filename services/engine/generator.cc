#include "services/engine/generator.h"

#include <iterator>
#include <memory>

#include "base/status_macros.h"
#include "services/engine/sequence.h"

namespace kvd::engine {

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

void GenerateDelta::Append(GenerateDelta&& next) {
  text += next.text;
  tokens.insert(tokens.end(), next.tokens.begin(), next.tokens.end());
  logprobs.insert(logprobs.end(),
                  std::make_move_iterator(next.logprobs.begin()),
                  std::make_move_iterator(next.logprobs.end()));
}

absl::StatusOr<GenerateResult> Generate(const ops::ModelBackend& model,
                                        const ops::Tokenizer& tokenizer,
                                        const GenerateRequest& request,
                                        ops::KvCache* cache,
                                        const DeltaCallback& on_delta) {
  KVD_ASSIGN_OR_RETURN(
      std::unique_ptr<Sequence> seq,
      Sequence::Create(model, tokenizer, request, cache, on_delta));
  ops::ForwardOutput out;
  while (!seq->PollCancelled()) {
    ops::SequenceStep step = seq->NextStep(request.prefill_chunk);
    KVD_RETURN_IF_ERROR(model.Forward({&step, 1}, &out, request.observer));
    seq->OnStepDone(step.logits == ops::LogitsMode::kNone ? nullptr
                                                          : out.Logits(0));
  }
  return seq->TakeResult();
}

}  // namespace kvd::engine
