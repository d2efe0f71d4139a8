#include "services/engine/generator.h"

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

absl::StatusOr<GenerateResult> Generate(
    const ops::Model& model, const ops::Tokenizer& tokenizer,
    const GenerateRequest& request, ops::KvCache* cache,
    const std::function<void(std::string_view)>& on_text) {
  KVD_ASSIGN_OR_RETURN(
      std::unique_ptr<Sequence> seq,
      Sequence::Create(model, tokenizer, request, cache, on_text));
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
