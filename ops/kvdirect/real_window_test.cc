// Sliding-window trimming on real Gemma 3 270M (bf16; 18 layers, 15 of them
// local with a 512-token window): a 560-token prompt and 20 greedy decode
// steps, so the local windows slide past two attention chunks. The reference
// is the plain cache that keeps every row. Checked: a trimmed plain cache and
// kv-direct (B = 512) with its store trimmed after every step give
// bit-identical logits at every step; what they hold matches the bound; the
// trimmed store's bytes equal ComputeBytesPerToken's accounting (global
// layers for every token, local layers for their window only); and rebuilds
// at step 10 from the trimmed kv-direct and stride:1 checkpoints continue
// bit-identically. Needs tools/setup.sh --test.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <tuple>

#include "base/model_dir.h"
#include "gtest/gtest.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/rebuild.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/kvdirect/testing/conversation.h"
#include "ops/model/model.h"

namespace kvd::ops {
namespace {

constexpr int64_t kPrompt = 560;
constexpr int kDecode = 20;
constexpr int kCutStep = 10;  // rebuild after the prompt + 10 decode steps
constexpr int64_t kBudget = 512;

TEST(RealGemma, TrimmedWindowsAreBitIdenticalAndBounded) {
  const std::string path = CachedModelPath("gemma-3-270m-q4_k_m.gguf");
  if (!std::filesystem::exists(path)) {
    FAIL() << path << " is missing: run tools/setup.sh --test";
  }
  LoadOptions opts;
  opts.precision = Precision::kBf16;
  opts.num_threads = 2;
  absl::StatusOr<std::unique_ptr<Model>> loaded = Model::Load(path, opts);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Model& model = **loaded;
  const ModelConfig& c = model.config();
  ASSERT_EQ(c.layers[0].sliding_window, 512);
  const CheckpointPolicy direct = *ParseCheckpointPolicy("kv-direct");
  const CheckpointPolicy stride1 = *ParseCheckpointPolicy("stride:1");

  std::mt19937 rng(21);
  std::vector<int32_t> prompt(kPrompt);
  for (int32_t& t : prompt) t = rng() % c.vocab_size;

  // The untrimmed reference decides the tokens; the trimmed plain cache
  // (which also feeds the checkpoints up to the cut) and kv-direct B = 512
  // replay them.
  KvCache reference = model.NewCache(), trimmed = model.NewCache(),
          bounded = model.NewCache();
  reference.KeepRowsPastWindows();
  testing::PlainTranscript want;
  {
    const absl::Status st = testing::AppendPlainTurn(model, {prompt, kDecode},
                                                     {}, &reference, &want);
    ASSERT_TRUE(st.ok()) << st;
  }
  ASSERT_EQ(want.size(), static_cast<size_t>(kDecode + 1));

  ResidualStore store(c, model.precision(), CheckpointLayers(direct, 18));
  ResidualStore direct_ckpt(c, model.precision(), CheckpointLayers(direct, 18));
  ResidualStore stride_ckpt(c, model.precision(),
                            CheckpointLayers(stride1, 18));
  testing::FanoutObserver checkpoints({&direct_ckpt, &stride_ckpt});
  ResidualKvSource source(&store, 0, kBudget);
  int64_t mismatches = 0;
  testing::ReplayOptions plain;
  plain.after_step = [&](size_t, int64_t before) {
    for (int64_t l = 0; l < c.n_layers; ++l) {
      ASSERT_EQ(trimmed.first_kept(l),
                WindowStart(c.layers[l].sliding_window, before));
    }
  };
  testing::ReplayOptions checkpointing = plain;
  checkpointing.observer = &checkpoints;
  checkpointing.after_step = [&](size_t s, int64_t before) {
    TrimToWindows(c, direct, 0, trimmed.length(), &direct_ckpt);
    TrimToWindows(c, stride1, 0, trimmed.length(), &stride_ckpt);
    plain.after_step(s, before);
  };
  testing::ReplayOptions direct_run;
  direct_run.kv_source = &source;
  direct_run.observer = &store;
  direct_run.after_step = [&](size_t, int64_t before) {
    TrimToWindows(c, direct, 0, bounded.length(), &store);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const int64_t window = c.layers[l].sliding_window;
      ASSERT_EQ(bounded.first_kept(l), std::max(source.HotBegin(l, before),
                                                WindowStart(window, before)));
      ASSERT_EQ(store.first_kept(0, l), WindowStart(window, bounded.length()));
    }
  };
  // The trimmed cache feeds the checkpoints up to the cut only; kv-direct
  // runs every step.
  for (const auto& [options, begin, end, cache] :
       {std::tuple{&checkpointing, size_t{0}, size_t{kCutStep}, &trimmed},
        std::tuple{&plain, size_t{kCutStep}, want.size(), &trimmed},
        std::tuple{&direct_run, size_t{0}, want.size(), &bounded}}) {
    const absl::StatusOr<int64_t> n =
        testing::CountLogitMismatches(model, want, begin, end, *options, cache);
    ASSERT_TRUE(n.ok()) << n.status();
    ASSERT_FALSE(HasFatalFailure());
    mismatches += *n;
  }
  const std::vector<int32_t> history = want.TokensBefore(kCutStep);
  EXPECT_EQ(mismatches, 0);
  const int64_t length = reference.length();
  ASSERT_EQ(length, kPrompt + kDecode);
  EXPECT_EQ(trimmed.first_kept(0), 64);  // 580 - 511 = 69 -> chunk 64

  // Bytes: global layers keep every token, local layers their window's
  // chunk on: exactly ComputeBytesPerToken's state_past_window per token
  // plus the local layers' kept rows.
  const BytesPerToken b = ComputeBytesPerToken(c, model.precision(), direct);
  int64_t local = 0;
  for (const LayerConfig& lc : c.layers) local += lc.sliding_window > 0;
  EXPECT_EQ(local, 15);
  EXPECT_EQ(store.size_bytes(),
            length * b.state_past_window +
                local * (length - WindowStart(512, length)) * b.residual_row);
  std::cout << "Gemma 3 270M bf16 at " << length
            << " tokens: kv-direct residual store trimmed "
            << store.size_bytes() << " B, untrimmed " << length * b.state
            << " B; plain K/V held trimmed " << trimmed.size_bytes()
            << " B, untrimmed " << reference.size_bytes() << " B\n";

  // Rebuild at the cut from the trimmed checkpoints, then continue.
  const int64_t cut = history.size();
  ASSERT_EQ(cut, kPrompt + kCutStep - 1);
  struct Rebuild {
    const CheckpointPolicy* policy;
    ResidualStore* checkpoint;
    int64_t budget;
  };
  for (const Rebuild& r : {Rebuild{&direct, &direct_ckpt, kBudget},
                           Rebuild{&stride1, &stride_ckpt, int64_t{-1}}}) {
    SCOPED_TRACE(r.policy->Name());
    KvCache cache = model.NewCache();
    RebuildSpec rs;
    rs.policy = *r.policy;
    rs.tokens = history;
    rs.checkpoint = r.checkpoint;
    rs.budget = r.budget;
    const absl::Status st = RebuildKv(model, rs, &cache, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ResidualKvSource src(r.checkpoint, 0, r.budget);
    testing::ReplayOptions replay;
    if (r.budget >= 0) {
      replay.kv_source = &src;
      replay.observer = r.checkpoint;
      replay.after_step = [&](size_t, int64_t) {
        TrimToWindows(c, direct, 0, cache.length(), r.checkpoint);
      };
    }
    const absl::StatusOr<int64_t> after = testing::CountLogitMismatches(
        model, want, kCutStep, want.size(), replay, &cache);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(*after, 0);
  }
}

}  // namespace
}  // namespace kvd::ops
