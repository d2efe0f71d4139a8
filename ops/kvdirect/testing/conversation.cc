#include "ops/kvdirect/testing/conversation.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ops/model/testing/model_cases.h"

namespace kvd::ops::testing {

int32_t Argmax(const float* logits, int64_t n) {
  return std::max_element(logits, logits + n) - logits;
}

void FanoutObserver::OnResidual(int64_t sequence_id, int64_t layer,
                                int64_t position, const float* residual) {
  for (ResidualStore* s : stores_)
    s->OnResidual(sequence_id, layer, position, residual);
}

std::vector<ChatTurn> RandomTurns(const ModelConfig& config,
                                  absl::Span<const int> user_tokens,
                                  absl::Span<const int> replies,
                                  uint32_t first_seed) {
  std::vector<ChatTurn> turns;
  for (size_t i = 0; i < user_tokens.size() && i < replies.size(); ++i) {
    turns.push_back(
        {RandomTokens(user_tokens[i], first_seed + i, config.vocab_size),
         replies[i]});
  }
  return turns;
}

std::vector<int32_t> PlainTranscript::TokensBefore(size_t end) const {
  std::vector<int32_t> tokens;
  for (size_t s = 0; s < end && s < steps.size(); ++s)
    tokens.insert(tokens.end(), steps[s].begin(), steps[s].end());
  return tokens;
}

absl::Status AppendPlainTurn(const Model& model, const ChatTurn& turn,
                             const PlainTurnOptions& options, KvCache* cache,
                             PlainTranscript* out) {
  const int64_t vocab = model.config().vocab_size;
  std::vector<int32_t> next = turn.user;
  for (int g = 0; g <= turn.replies; ++g) {
    SequenceStep step{cache, next, LogitsMode::kLast, options.sequence_id};
    ForwardOutput fwd;
    const absl::Status st = model.Forward({&step, 1}, &fwd, options.observer);
    if (!st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat("reference step ", out->size(),
                                       " (plain cache): ", st.message()));
    }
    out->steps.push_back(next);
    out->logits.emplace_back(fwd.Logits(0), fwd.Logits(0) + vocab);
    if (options.after_step) options.after_step(out->size() - 1);
    if (g == turn.replies) break;
    next = {Argmax(fwd.Logits(0), vocab)};
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CountLogitMismatches(const Model& model,
                                             const PlainTranscript& want,
                                             size_t begin, size_t end,
                                             const ReplayOptions& options,
                                             KvCache* cache) {
  const int64_t vocab = model.config().vocab_size;
  int64_t mismatches = 0;
  for (size_t s = begin; s < end && s < want.size(); ++s) {
    const int64_t before = cache->length();
    SequenceStep step{cache, want.steps[s], LogitsMode::kLast,
                      options.sequence_id, options.kv_source};
    ForwardOutput out;
    const absl::Status st = model.Forward({&step, 1}, &out, options.observer);
    if (!st.ok()) {
      return absl::Status(
          st.code(), absl::StrCat("replayed step ", s, ": ", st.message()));
    }
    mismatches += std::memcmp(out.Logits(0), want.logits[s].data(),
                              vocab * sizeof(float)) != 0;
    if (options.after_step) {
      options.after_step(s, before);
      if (::testing::Test::HasFatalFailure()) break;
    }
  }
  return mismatches;
}

ResidualStore NewStore(const Model& model, const CheckpointPolicy& policy) {
  return ResidualStore(model.config(), model.precision(),
                       CheckpointLayers(policy, model.config().n_layers));
}

ResidualStore SessionStoreForRebuild(const Model& model,
                                     const CheckpointPolicy& policy,
                                     const ResidualStore& checkpoint) {
  if (policy.kind == CheckpointPolicy::Kind::kKvDirect) return checkpoint;
  return NewStore(model, *ParseCheckpointPolicy("kv-direct"));
}

int64_t CountDifferingRows(const KvCache& got, const KvCache& want,
                           int64_t layer, int64_t begin, int64_t end) {
  int64_t differing = 0;
  for (int64_t p = begin; p < end; ++p) {
    differing += std::memcmp(got.KeyBytes(layer, p), want.KeyBytes(layer, p),
                             got.row_bytes()) != 0 ||
                 std::memcmp(got.ValueBytes(layer, p),
                             want.ValueBytes(layer, p), got.row_bytes()) != 0;
  }
  return differing;
}

}  // namespace kvd::ops::testing
