// ResidualStore keeps exactly what the forward pass produced: the bytes it
// stores widen back to the very fp32 values the ResidualObserver saw (in the
// bf16 mode too, where it stores half the bytes), for exactly the policy's
// layers, and K/V rebuilt from its rows equal the cached K/V bit for bit.
#include "ops/kvdirect/residual_store.h"

#include <cstring>
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::ops {
namespace {

// An independent copy of every residual, as fp32.
class Recorder : public ResidualObserver {
 public:
  explicit Recorder(int64_t d) : d_(d) {}
  void OnResidual(int64_t seq, int64_t layer, int64_t pos,
                  const float* h) override {
    seen[{seq, layer, pos}] = std::vector<float>(h, h + d_);
  }
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<float>> seen;

 private:
  int64_t d_;
};

// Forwards to several observers.
class Tee : public ResidualObserver {
 public:
  Tee(ResidualObserver* a, ResidualObserver* b) : a_(a), b_(b) {}
  void OnResidual(int64_t seq, int64_t layer, int64_t pos,
                  const float* h) override {
    a_->OnResidual(seq, layer, pos, h);
    b_->OnResidual(seq, layer, pos, h);
  }

 private:
  ResidualObserver* a_;
  ResidualObserver* b_;
};

using Case = testing::FamilyCase;

class ResidualStoreTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    testing::TinyModelSpec spec;
    spec.family = GetParam().family;
    if (spec.family == "gemma3") spec.n_layers = 6;
    absl::StatusOr<std::string> path =
        testing::WriteTinyModel(spec, ::testing::TempDir());
    ASSERT_TRUE(path.ok()) << path.status();
    LoadOptions opts;
    opts.precision = GetParam().precision;
    opts.num_threads = 2;
    absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(*path, opts);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
  }

  // Runs two sequences through prefill chunks and decodes.
  void Run(ResidualObserver* observer, KvCache* ca, KvCache* cb) {
    const int vocab = model_->config().vocab_size;
    const std::vector<int32_t> a = testing::RandomTokens(50, 1, vocab),
                               b = testing::RandomTokens(12, 2, vocab);
    size_t at_a = 0, at_b = 0;
    for (auto [na, nb] : {std::pair{33, 9}, {1, 1}, {15, 1}, {1, 1}}) {
      SequenceStep steps[] = {
          {ca, absl::MakeConstSpan(a).subspan(at_a, na), LogitsMode::kLast, 7},
          {cb, absl::MakeConstSpan(b).subspan(at_b, nb), LogitsMode::kLast, 9}};
      ForwardOutput out;
      ASSERT_TRUE(model_->Forward(steps, &out, observer).ok());
      at_a += na;
      at_b += nb;
    }
  }

  std::unique_ptr<Model> model_;
};

TEST_P(ResidualStoreTest, StoresExactlyWhatTheForwardPassSaw) {
  const ModelConfig& c = model_->config();
  ResidualStore store(
      c, model_->precision(),
      CheckpointLayers(*ParseCheckpointPolicy("kv-direct"), c.n_layers));
  Recorder rec(c.d_model);
  Tee tee(&store, &rec);
  KvCache ca = model_->NewCache(), cb = model_->NewCache();
  Run(&tee, &ca, &cb);
  ASSERT_TRUE(store.status().ok()) << store.status();
  EXPECT_EQ(store.length(7), 50);
  EXPECT_EQ(store.length(9), 12);
  const int64_t elem = GetParam().precision == Precision::kF32 ? 4 : 2;
  EXPECT_EQ(store.row_bytes(), c.d_model * elem);
  EXPECT_EQ(store.bytes_per_token(), c.n_layers * c.d_model * elem);
  EXPECT_EQ(store.size_bytes(), 62 * store.bytes_per_token());
  // Round trip: stored bytes widen to the observed fp32 values, bit for bit.
  int64_t checked = 0;
  std::vector<float> row(c.d_model);
  for (const auto& [key, value] : rec.seen) {
    const auto [seq, layer, pos] = key;
    if (layer == c.n_layers) {
      EXPECT_EQ(store.RowBytes(seq, layer, pos), nullptr);
      continue;
    }
    ASSERT_TRUE(store.ReadRows(seq, layer, pos, 1, row.data()).ok());
    EXPECT_EQ(std::memcmp(row.data(), value.data(), c.d_model * 4), 0)
        << "seq " << seq << " layer " << layer << " pos " << pos;
    ++checked;
  }
  EXPECT_EQ(checked, 62 * c.n_layers);
}

TEST_P(ResidualStoreTest, KvRebuiltFromStoredRowsEqualsTheCache) {
  const ModelConfig& c = model_->config();
  ResidualStore store(
      c, model_->precision(),
      CheckpointLayers(*ParseCheckpointPolicy("kv-direct"), c.n_layers));
  KvCache ca = model_->NewCache(), cb = model_->NewCache();
  ca.KeepRowsPastWindows();  // compared at every position below
  Run(&store, &ca, &cb);
  const size_t rb = ca.row_bytes();
  std::vector<float> h(50 * c.d_model);
  std::vector<int64_t> pos(50);
  for (int64_t i = 0; i < 50; ++i) pos[i] = i;
  std::vector<uint8_t> k(50 * rb), v(50 * rb);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    ASSERT_TRUE(store.ReadRows(7, l, 0, 50, h.data()).ok());
    ASSERT_TRUE(
        model_->RecomputeKv(l, h.data(), pos.data(), 50, k.data(), v.data())
            .ok());
    for (int64_t p = 0; p < 50; ++p) {
      EXPECT_EQ(std::memcmp(k.data() + p * rb, ca.KeyBytes(l, p), rb), 0)
          << "layer " << l << " pos " << p;
      EXPECT_EQ(std::memcmp(v.data() + p * rb, ca.ValueBytes(l, p), rb), 0)
          << "layer " << l << " pos " << p;
    }
  }
}

TEST_P(ResidualStoreTest, StrideKeepsOnlyItsLayers) {
  const ModelConfig& c = model_->config();
  ResidualStore store(
      c, model_->precision(),
      CheckpointLayers(*ParseCheckpointPolicy("stride:2"), c.n_layers));
  KvCache ca = model_->NewCache(), cb = model_->NewCache();
  Run(&store, &ca, &cb);
  ASSERT_TRUE(store.status().ok());
  const int64_t kept = (c.n_layers + 1) / 2;
  EXPECT_EQ(store.bytes_per_token(), kept * store.row_bytes());
  EXPECT_EQ(store.size_bytes(), 62 * kept * store.row_bytes());
  std::vector<float> row(c.d_model);
  EXPECT_TRUE(store.ReadRows(7, 2, 0, 1, row.data()).ok());
  EXPECT_EQ(store.ReadRows(7, 1, 0, 1, row.data()).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store.ReadRows(7, 0, 45, 10, row.data()).code(),
            absl::StatusCode::kNotFound);
}

TEST_P(ResidualStoreTest, TruncateThenRerunOverwrites) {
  const ModelConfig& c = model_->config();
  ResidualStore store(c, model_->precision(), {0, 1});
  KvCache cache = model_->NewCache();
  const std::vector<int32_t> t = testing::RandomTokens(20, 3, c.vocab_size);
  SequenceStep step{&cache, t, LogitsMode::kLast, 1};
  ForwardOutput out;
  ASSERT_TRUE(model_->Forward({&step, 1}, &out, &store).ok());
  std::vector<uint8_t> before(store.RowBytes(1, 1, 15),
                              store.RowBytes(1, 1, 15) + store.row_bytes());
  cache.Truncate(10);
  store.Truncate(1, 10);
  EXPECT_EQ(store.length(1), 10);
  std::vector<int32_t> other = testing::RandomTokens(10, 4, c.vocab_size);
  SequenceStep again{&cache, other, LogitsMode::kLast, 1};
  ASSERT_TRUE(model_->Forward({&again, 1}, &out, &store).ok());
  ASSERT_TRUE(store.status().ok());
  EXPECT_EQ(store.length(1), 20);
  EXPECT_NE(
      std::memcmp(before.data(), store.RowBytes(1, 1, 15), store.row_bytes()),
      0);
}

TEST_P(ResidualStoreTest, ReportsGapsAndInexactRows) {
  const ModelConfig& c = model_->config();
  ResidualStore gap(c, model_->precision(), {0});
  std::vector<float> row(c.d_model, 1.0f);
  gap.OnResidual(1, 0, 3, row.data());
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gap.length(1), 0);
  if (GetParam().precision == Precision::kBf16) {
    ResidualStore store(c, Precision::kBf16, {0});
    row[5] = 1.0f + 1.0f / 1024;  // needs 10 mantissa bits; bf16 has 7
    store.OnResidual(1, 0, 0, row.data());
    EXPECT_EQ(store.status().code(), absl::StatusCode::kInternal);
    EXPECT_EQ(store.length(1), 0);
  }
}

TEST_P(ResidualStoreTest, DropBelowKeepsLaterRowsAtTheirPositions) {
  const ModelConfig& c = model_->config();
  ResidualStore store(c, model_->precision(), {0, 1});
  Recorder rec(c.d_model);
  Tee tee(&store, &rec);
  KvCache ca = model_->NewCache(), cb = model_->NewCache();
  Run(&tee, &ca, &cb);  // sequence 7: 50 positions
  ASSERT_TRUE(store.status().ok());
  const int64_t all = store.size_bytes();
  store.DropBelow(7, 1, 20);
  store.DropBelow(7, 3, 20);  // not checkpointed: nothing happens
  EXPECT_EQ(store.first_kept(7, 0), 0);
  EXPECT_EQ(store.first_kept(7, 1), 20);
  EXPECT_EQ(store.length(7), 50);
  EXPECT_EQ(store.size_bytes(), all - 20 * store.row_bytes());
  EXPECT_EQ(store.RowBytes(7, 1, 19), nullptr);
  std::vector<float> row(c.d_model);
  EXPECT_EQ(store.ReadRows(7, 1, 19, 2, row.data()).code(),
            absl::StatusCode::kNotFound);
  // Rows past the cut still widen to what the forward pass saw, and dropping
  // further (past the halfway mark, which compacts) keeps them.
  for (int64_t cut : {int64_t{20}, int64_t{40}}) {
    store.DropBelow(7, 1, cut);
    for (int64_t p = cut; p < 50; ++p) {
      ASSERT_TRUE(store.ReadRows(7, 1, p, 1, row.data()).ok());
      EXPECT_EQ(
          std::memcmp(row.data(), rec.seen.at({7, 1, p}).data(), c.d_model * 4),
          0)
          << "pos " << p;
    }
  }
  // Appending goes on; re-running a dropped position is refused.
  std::vector<float> next(c.d_model, 0.5f);
  store.OnResidual(7, 1, 50, next.data());
  EXPECT_TRUE(store.status().ok());
  EXPECT_NE(store.RowBytes(7, 1, 50), nullptr);
  store.OnResidual(7, 1, 39, next.data());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  // On an unknown sequence DropBelow sets where its rows start.
  ResidualStore fresh(c, model_->precision(), {0});
  fresh.DropBelow(3, 0, 64);
  EXPECT_EQ(fresh.first_kept(3, 0), 64);
  fresh.OnResidual(3, 0, 64, next.data());
  EXPECT_TRUE(fresh.status().ok());
  EXPECT_EQ(fresh.length(3), 65);
  EXPECT_EQ(fresh.size_bytes(), fresh.row_bytes());
  // Truncating below the kept range empties the layer at that position.
  fresh.Truncate(3, 10);
  EXPECT_EQ(fresh.length(3), 10);
  EXPECT_EQ(fresh.size_bytes(), 0);
}

INSTANTIATE_TEST_SUITE_P(Families, ResidualStoreTest,
                         ::testing::ValuesIn(testing::AllFamilyCases()),
                         testing::FamilyCaseName);

// Gemma 3's pattern shrunk: layers 0-4 see 8 positions, layer 5 is global.
// The expected positions are worked out by hand from the rule "a query at
// position >= t reads keys from the chunk holding t - 7" (chunks of 32).
ModelConfig WindowedConfig() {
  ModelConfig c;
  c.n_layers = 6;
  c.layers.assign(6, LayerConfig{});
  for (int l = 0; l < 5; ++l) c.layers[l].sliding_window = 8;
  return c;
}

TEST(ResidualKeepBegin, FollowsEachPolicysReach) {
  const ModelConfig c = WindowedConfig();
  auto keep = [&](const char* policy, int64_t layer, int64_t length) {
    return ResidualKeepBegin(c, *ParseCheckpointPolicy(policy), layer, length);
  };
  // kv-direct: 200 - 7 = 193 lies in chunk [192, 224).
  EXPECT_EQ(keep("kv-direct", 0, 200), 192);
  EXPECT_EQ(keep("kv-direct", 4, 200), 192);
  EXPECT_EQ(keep("kv-direct", 5, 200), 0);
  EXPECT_EQ(keep("kv-direct", 0, 199), 192);  // 199 - 7 = 192
  EXPECT_EQ(keep("kv-direct", 0, 198), 160);  // 191 is in chunk [160, 192)
  EXPECT_EQ(keep("kv-direct", 0, 30), 0);
  // stride:2, segment [0, 2): layer 1 needs 192 on, so layer 0's outputs
  // from 192 need its keys from 185 -> chunk 160. Segment [4, 6) is global.
  EXPECT_EQ(keep("stride:2", 0, 200), 160);
  EXPECT_EQ(keep("stride:2", 2, 200), 160);
  EXPECT_EQ(keep("stride:2", 4, 200), 0);
  EXPECT_EQ(keep("stride:2", 1, 200), 0);  // not a checkpoint
  // stride:3, segment [0, 3): 192 -> 160 -> 153 -> 128.
  EXPECT_EQ(keep("stride:3", 0, 200), 128);
  EXPECT_EQ(keep("stride:3", 3, 200), 0);
  EXPECT_EQ(keep("tokens", 0, 200), 0);
  EXPECT_EQ(keep("kv", 0, 200), 0);
}

TEST(ResidualKeepBegin, TrimToWindowsDropsExactlyThat) {
  ModelConfig c = WindowedConfig();
  c.d_model = 4;
  ResidualStore store(c, Precision::kF32, {0, 1, 2, 3, 4, 5});
  std::vector<float> row(4, 1.0f);
  for (int64_t p = 0; p < 200; ++p)
    for (int64_t l = 0; l < 6; ++l) store.OnResidual(1, l, p, row.data());
  TrimToWindows(c, *ParseCheckpointPolicy("kv-direct"), 1, 200, &store);
  for (int64_t l = 0; l < 5; ++l) EXPECT_EQ(store.first_kept(1, l), 192);
  EXPECT_EQ(store.first_kept(1, 5), 0);
  EXPECT_EQ(store.size_bytes(), (5 * 8 + 200) * 16);
}

}  // namespace
}  // namespace kvd::ops
