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
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>

#include "base/model_dir.h"
#include "gtest/gtest.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/rebuild.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/model/model.h"

namespace kvd::ops {
namespace {

constexpr int64_t kPrompt = 560;
constexpr int kDecode = 20;
constexpr int kCutStep = 10;  // rebuild after the prompt + 10 decode steps
constexpr int64_t kBudget = 512;

int32_t Argmax(const float* logits, int64_t n) {
  return std::max_element(logits, logits + n) - logits;
}

class Fanout : public ResidualObserver {
 public:
  explicit Fanout(std::vector<ResidualStore*> stores)
      : stores_(std::move(stores)) {}
  void OnResidual(int64_t seq, int64_t layer, int64_t position,
                  const float* residual) override {
    for (ResidualStore* s : stores_)
      s->OnResidual(seq, layer, position, residual);
  }

 private:
  std::vector<ResidualStore*> stores_;
};

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

  // Three runs side by side: the untrimmed reference, the trimmed plain cache
  // (which also feeds the checkpoints), and kv-direct B = 512.
  KvCache reference = model.NewCache(), trimmed = model.NewCache(),
          bounded = model.NewCache();
  reference.KeepRowsPastWindows();
  ResidualStore store(c, model.precision(), CheckpointLayers(direct, 18));
  ResidualStore direct_ckpt(c, model.precision(), CheckpointLayers(direct, 18));
  ResidualStore stride_ckpt(c, model.precision(),
                            CheckpointLayers(stride1, 18));
  Fanout checkpoints({&direct_ckpt, &stride_ckpt});
  ResidualKvSource source(&store, 0, kBudget);
  std::vector<std::vector<int32_t>> steps = {prompt};
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> history;
  int64_t mismatches = 0;
  for (size_t s = 0; s <= static_cast<size_t>(kDecode); ++s) {
    const int64_t before = reference.length();
    SequenceStep a{&reference, steps[s], LogitsMode::kLast, 0};
    SequenceStep b{&trimmed, steps[s], LogitsMode::kLast, 0};
    SequenceStep d{&bounded, steps[s], LogitsMode::kLast, 0, &source};
    ForwardOutput out_a, out_b, out_d;
    const bool checkpointing = static_cast<int>(s) < kCutStep;
    ASSERT_TRUE(model.Forward({&a, 1}, &out_a).ok());
    ASSERT_TRUE(
        model.Forward({&b, 1}, &out_b, checkpointing ? &checkpoints : nullptr)
            .ok());
    const absl::Status st = model.Forward({&d, 1}, &out_d, &store);
    ASSERT_TRUE(st.ok()) << st;
    TrimToWindows(c, direct, 0, bounded.length(), &store);
    if (checkpointing) {
      history.insert(history.end(), steps[s].begin(), steps[s].end());
      TrimToWindows(c, direct, 0, trimmed.length(), &direct_ckpt);
      TrimToWindows(c, stride1, 0, trimmed.length(), &stride_ckpt);
    }
    const size_t bytes = c.vocab_size * sizeof(float);
    logits.emplace_back(out_a.Logits(0), out_a.Logits(0) + c.vocab_size);
    mismatches += std::memcmp(out_a.Logits(0), out_b.Logits(0), bytes) != 0;
    mismatches += std::memcmp(out_a.Logits(0), out_d.Logits(0), bytes) != 0;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const int64_t window = c.layers[l].sliding_window;
      ASSERT_EQ(trimmed.first_kept(l), WindowStart(window, before));
      ASSERT_EQ(bounded.first_kept(l), std::max(source.HotBegin(l, before),
                                                WindowStart(window, before)));
      ASSERT_EQ(store.first_kept(0, l), WindowStart(window, bounded.length()));
    }
    steps.push_back({Argmax(out_a.Logits(0), c.vocab_size)});
  }
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
    int64_t after = 0;
    for (size_t s = kCutStep; s <= static_cast<size_t>(kDecode); ++s) {
      SequenceStep step{&cache, steps[s], LogitsMode::kLast, 0,
                        r.budget < 0 ? nullptr : &src};
      ForwardOutput out;
      ASSERT_TRUE(
          model.Forward({&step, 1}, &out, r.budget < 0 ? nullptr : r.checkpoint)
              .ok());
      if (r.budget >= 0)
        TrimToWindows(c, direct, 0, cache.length(), r.checkpoint);
      after += std::memcmp(out.Logits(0), logits[s].data(),
                           c.vocab_size * sizeof(float)) != 0;
    }
    EXPECT_EQ(after, 0);
  }
}

}  // namespace
}  // namespace kvd::ops
