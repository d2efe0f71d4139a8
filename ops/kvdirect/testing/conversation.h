// Test-only scaffolding for the KV-Direct bit-exactness tests: a scripted
// multi-turn chat run greedily through a plain KvCache (the reference, which
// never recomputes K/V from residuals and never rebuilds), and a replay of
// the same steps through the path under test (a kv-direct sequence, a
// trimmed cache, a rebuilt cache) that counts the steps whose logits differ
// from the reference's in any bit.
//
// The reference decides every token (greedy on its own logits); a replay
// feeds those tokens, so a replay that went wrong still sees the reference's
// inputs and every later step is compared too.
//
// Thread-safety: none; one test thread.
//
// Usage:
//   KvCache plain = model.NewCache();
//   PlainTranscript want;
//   for (const ChatTurn& turn : RandomTurns(c, {40, 25}, {70, 70}, 10))
//     ASSERT_TRUE(AppendPlainTurn(model, turn, {}, &plain, &want).ok());
//   ReplayOptions r;
//   r.kv_source = &source;  // a ResidualKvSource over `store`
//   r.observer = &store;
//   absl::StatusOr<int64_t> bad =
//       CountLogitMismatches(model, want, 0, want.size(), r, &cache);
//   ASSERT_TRUE(bad.ok()) << bad.status();
//   EXPECT_EQ(*bad, 0);
#ifndef KVD_OPS_KVDIRECT_TESTING_CONVERSATION_H_
#define KVD_OPS_KVDIRECT_TESTING_CONVERSATION_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/model/model.h"

namespace kvd::ops::testing {

// The greedy pick: the first index of the largest logit.
int32_t Argmax(const float* logits, int64_t n);

// Hands every residual to several stores, so one forward pass fills the
// checkpoints of several policies.
class FanoutObserver : public ResidualObserver {
 public:
  explicit FanoutObserver(std::vector<ResidualStore*> stores)
      : stores_(std::move(stores)) {}
  void OnResidual(int64_t sequence_id, int64_t layer, int64_t position,
                  const float* residual) override;

 private:
  std::vector<ResidualStore*> stores_;
};

// One turn of a scripted chat: the user's tokens, prefilled in one step,
// then `replies` greedy decode steps (so replies + 1 steps in all; the last
// reply token ends the turn and is fed nowhere).
struct ChatTurn {
  std::vector<int32_t> user;
  int replies = 0;
};

// Turn i: user_tokens[i] random tokens (RandomTokens, seed first_seed + i)
// and replies[i] replies. The spans must have the same length.
std::vector<ChatTurn> RandomTurns(const ModelConfig& config,
                                  absl::Span<const int> user_tokens,
                                  absl::Span<const int> replies,
                                  uint32_t first_seed);

// What the reference computed: each Forward's new tokens and the logits of
// its last position (vocab_size floats).
struct PlainTranscript {
  std::vector<std::vector<int32_t>> steps;
  std::vector<std::vector<float>> logits;

  size_t size() const { return steps.size(); }
  // The tokens of steps [0, end): what a rebuild at step `end` resumes from.
  std::vector<int32_t> TokensBefore(size_t end) const;
};

struct PlainTurnOptions {
  int64_t sequence_id = 0;
  // Sees every residual of the turn (checkpoints taken up to a cut).
  ResidualObserver* observer = nullptr;
  // Runs after each step with the step's index in the transcript.
  std::function<void(size_t step)> after_step;
};

// Runs `turn` through `cache` with no KvSource (the reference path) and
// appends its steps and logits to `out`. The cache is the caller's so it can
// keep every row (KvCache::KeepRowsPastWindows) and be inspected or copied.
// Returns Forward's error, naming the step.
absl::Status AppendPlainTurn(const Model& model, const ChatTurn& turn,
                             const PlainTurnOptions& options, KvCache* cache,
                             PlainTranscript* out);

struct ReplayOptions {
  int64_t sequence_id = 0;
  // Null: a plain sequence (every cached row hot).
  const KvSource* kv_source = nullptr;
  ResidualObserver* observer = nullptr;
  // Runs after each step with the step's index and the cache length before
  // it: checks what the cache and stores hold, trims stores. A fatal gtest
  // failure inside it stops the replay.
  std::function<void(size_t step, int64_t length_before)> after_step;
};

// Feeds steps [begin, end) of `want` into `cache` and returns how many of
// them gave logits that differ from the reference's in any bit. Returns
// Forward's error (naming the step) instead of a count if a step fails.
absl::StatusOr<int64_t> CountLogitMismatches(const Model& model,
                                             const PlainTranscript& want,
                                             size_t begin, size_t end,
                                             const ReplayOptions& options,
                                             KvCache* cache);

// An empty store of `policy`'s checkpoint layers for `model`.
ResidualStore NewStore(const Model& model, const CheckpointPolicy& policy);

// The kv-direct store a sequence rebuilt from `checkpoint` (taken with
// `policy`) decodes on: a copy of the checkpoint itself for kv-direct, else
// an empty kv-direct store for RebuildKv to fill with the cold residuals.
ResidualStore SessionStoreForRebuild(const Model& model,
                                     const CheckpointPolicy& policy,
                                     const ResidualStore& checkpoint);

// Rows p in [begin, end) of `layer` whose key or value bytes differ between
// the two caches (which must hold those rows).
int64_t CountDifferingRows(const KvCache& got, const KvCache& want,
                           int64_t layer, int64_t begin, int64_t end);

}  // namespace kvd::ops::testing

#endif  // KVD_OPS_KVDIRECT_TESTING_CONVERSATION_H_
