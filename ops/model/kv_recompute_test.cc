// K/V recomputed from residual checkpoints must equal the cached K/V bit for
// bit, per layer and position, for every family and both precision modes:
// the guarantee KV-Direct stands on (DESIGN.md sections 1 and 3). The
// expected bytes come from the forward pass's own cache, an independent
// producer of the same rows (it runs attention, the FFN and batching around
// them); a shifted-position control shows the comparison can fail.
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <utility>

#include "base/model_dir.h"
#include "gtest/gtest.h"
#include "ops/model/model.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::ops {
namespace {

// Residuals by (sequence, layer), rows in position order.
class Recorder : public ResidualObserver {
 public:
  explicit Recorder(int64_t d) : d_(d) {}
  void OnResidual(int64_t seq, int64_t layer, int64_t pos,
                  const float* h) override {
    std::vector<float>& rows = rows_[{seq, layer}];
    if (rows.size() < static_cast<size_t>((pos + 1) * d_))
      rows.resize((pos + 1) * d_);
    std::memcpy(rows.data() + pos * d_, h, d_ * sizeof(float));
  }
  const std::vector<float>& Rows(int64_t seq, int64_t layer) const {
    return rows_.at({seq, layer});
  }

 private:
  int64_t d_;
  std::map<std::pair<int64_t, int64_t>, std::vector<float>> rows_;
};

// Differing bytes between the cache's rows [0, n) of `layer` and the rows
// recomputed from `residuals` at positions [0, n) + shift, recomputing in
// pieces of `piece` tokens (the result must not depend on the piece size).
struct Diff {
  int64_t key_bytes = 0, value_bytes = 0;
};
Diff CompareLayer(const Model& model, const KvCache& cache, int64_t layer,
                  const std::vector<float>& residuals, int64_t n, int64_t piece,
                  int64_t shift = 0) {
  const size_t rb = cache.row_bytes();
  const int64_t d = model.config().d_model;
  std::vector<uint8_t> k(n * rb), v(n * rb);
  for (int64_t at = 0; at < n; at += piece) {
    const int64_t m = std::min(piece, n - at);
    std::vector<int64_t> pos(m);
    for (int64_t i = 0; i < m; ++i) pos[i] = at + i + shift;
    const absl::Status s =
        model.RecomputeKv(layer, residuals.data() + at * d, pos.data(), m,
                          k.data() + at * rb, v.data() + at * rb);
    EXPECT_TRUE(s.ok()) << s;
  }
  Diff diff;
  for (int64_t p = 0; p < n; ++p) {
    for (size_t b = 0; b < rb; ++b) {
      diff.key_bytes += k[p * rb + b] != cache.KeyBytes(layer, p)[b];
      diff.value_bytes += v[p * rb + b] != cache.ValueBytes(layer, p)[b];
    }
  }
  return diff;
}

using Case = testing::FamilyCase;

class TinyRecompute : public ::testing::TestWithParam<Case> {
 protected:
  std::unique_ptr<Model> Load() {
    testing::TinyModelSpec spec;
    spec.family = GetParam().family;
    spec.tied_embeddings = spec.family != "qwen2";
    if (spec.family == "gemma3") spec.n_layers = 6;  // 5 local + 1 global
    absl::StatusOr<std::string> path =
        testing::WriteTinyModel(spec, ::testing::TempDir());
    EXPECT_TRUE(path.ok()) << path.status();
    LoadOptions opts;
    opts.precision = GetParam().precision;
    opts.num_threads = 2;
    absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(*path, opts);
    EXPECT_TRUE(model.ok()) << model.status();
    return std::move(*model);
  }
};

TEST_P(TinyRecompute, RecomputedKvEqualsCachedKvBitForBit) {
  auto model = Load();
  const ModelConfig& c = model->config();
  // Two sequences sharing steps: prefill chunks that straddle attention
  // chunk boundaries, then single-token decodes.
  const std::vector<int32_t> a = testing::RandomTokens(90, 3, c.vocab_size),
                             b = testing::RandomTokens(61, 4, c.vocab_size);
  const std::vector<std::pair<int, int>> pieces = {{37, 20}, {1, 30}, {1, 1},
                                                   {20, 1},  {1, 1},  {30, 8}};
  Recorder rec(c.d_model);
  KvCache ca = model->NewCache(), cb = model->NewCache();
  // The comparison reads every position, including rows a local layer's
  // window no longer sees (which Forward would otherwise free).
  ca.KeepRowsPastWindows();
  cb.KeepRowsPastWindows();
  size_t at_a = 0, at_b = 0;
  for (auto [na, nb] : pieces) {
    SequenceStep steps[] = {
        {&ca, absl::MakeConstSpan(a).subspan(at_a, na), LogitsMode::kLast, 0},
        {&cb, absl::MakeConstSpan(b).subspan(at_b, nb), LogitsMode::kLast, 1}};
    ForwardOutput out;
    ASSERT_TRUE(model->Forward(steps, &out, &rec).ok());
    at_a += na;
    at_b += nb;
  }
  ASSERT_EQ(ca.length(), 90);
  ASSERT_EQ(cb.length(), 61);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int64_t piece : {int64_t{1}, int64_t{7}, int64_t{90}}) {
      const Diff da = CompareLayer(*model, ca, l, rec.Rows(0, l), 90, piece);
      EXPECT_EQ(da.key_bytes, 0) << "layer " << l << " piece " << piece;
      EXPECT_EQ(da.value_bytes, 0) << "layer " << l << " piece " << piece;
    }
    const Diff db = CompareLayer(*model, cb, l, rec.Rows(1, l), 61, 32);
    EXPECT_EQ(db.key_bytes, 0) << "layer " << l;
    EXPECT_EQ(db.value_bytes, 0) << "layer " << l;
  }
}

TEST_P(TinyRecompute, ComparisonDetectsWrongPositionsAndResiduals) {
  auto model = Load();
  const ModelConfig& c = model->config();
  const std::vector<int32_t> a = testing::RandomTokens(40, 5, c.vocab_size);
  Recorder rec(c.d_model);
  KvCache cache = model->NewCache();
  SequenceStep step{&cache, a, LogitsMode::kLast, 0};
  ForwardOutput out;
  ASSERT_TRUE(model->Forward({&step, 1}, &out, &rec).ok());
  // RoPE at the wrong positions changes K (not V).
  const Diff shifted = CompareLayer(*model, cache, 0, rec.Rows(0, 0), 40, 40,
                                    /*shift=*/1);
  EXPECT_GT(shifted.key_bytes, 0);
  EXPECT_EQ(shifted.value_bytes, 0);
  // Another layer's residual changes both.
  const Diff wrong = CompareLayer(*model, cache, 0, rec.Rows(0, 1), 40, 40);
  EXPECT_GT(wrong.key_bytes, 0);
  EXPECT_GT(wrong.value_bytes, 0);
}

TEST_P(TinyRecompute, RejectsBadArguments) {
  auto model = Load();
  const ModelConfig& c = model->config();
  std::vector<float> h(c.d_model, 0.5f);
  std::vector<uint8_t> k(model->NewCache().row_bytes()), v(k.size());
  int64_t pos = 0;
  EXPECT_EQ(
      model->RecomputeKv(c.n_layers, h.data(), &pos, 1, k.data(), v.data())
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      model->RecomputeKv(-1, h.data(), &pos, 1, k.data(), v.data()).code(),
      absl::StatusCode::kInvalidArgument);
  pos = c.context_length;
  EXPECT_EQ(model->RecomputeKv(0, h.data(), &pos, 1, k.data(), v.data()).code(),
            absl::StatusCode::kInvalidArgument);
  pos = -1;
  EXPECT_EQ(model->RecomputeKv(0, h.data(), &pos, 1, k.data(), v.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      model->RecomputeKv(0, h.data(), &pos, 0, k.data(), v.data()).ok());
}

// The backend interface's form (model_backend.h) that the rebuild uses:
// rows recomputed straight into a second cache's blocks, in pieces that
// straddle blocks, equal the rows Forward cached, byte for byte.
TEST_P(TinyRecompute, RecomputeIntoCacheWritesTheRowsForwardCached) {
  auto model = Load();
  const ModelConfig& c = model->config();
  const int64_t n = 75;  // three blocks of 32, the last one partly used
  const std::vector<int32_t> a = testing::RandomTokens(n, 6, c.vocab_size);
  Recorder rec(c.d_model);
  KvCache forward = model->NewCache();
  forward.KeepRowsPastWindows();
  SequenceStep step{&forward, a, LogitsMode::kLast, 0};
  ForwardOutput out;
  ASSERT_TRUE(model->Forward({&step, 1}, &out, &rec).ok());

  KvCache rebuilt = model->NewCache();
  rebuilt.KeepRowsPastWindows();
  ASSERT_TRUE(rebuilt.Reserve(n).ok());
  const ModelBackend& backend = *model;
  const size_t rb = forward.row_bytes();
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int64_t at = 0; at < n; at += 29) {
      const int64_t m = std::min<int64_t>(29, n - at);
      ASSERT_TRUE(
          backend
              .RecomputeKvIntoCache(l, rec.Rows(0, l).data() + at * c.d_model,
                                    at, m, &rebuilt)
              .ok());
    }
    int64_t differing = 0;
    for (int64_t p = 0; p < n; ++p) {
      differing +=
          std::memcmp(forward.KeyBytes(l, p), rebuilt.KeyBytes(l, p), rb) != 0;
      differing += std::memcmp(forward.ValueBytes(l, p),
                               rebuilt.ValueBytes(l, p), rb) != 0;
    }
    EXPECT_EQ(differing, 0) << "layer " << l;
  }
  // The comparison can fail: one layer's residuals written into another.
  ASSERT_TRUE(
      backend.RecomputeKvIntoCache(0, rec.Rows(0, 1).data(), 0, n, &rebuilt)
          .ok());
  EXPECT_NE(std::memcmp(forward.KeyBytes(0, 5), rebuilt.KeyBytes(0, 5), rb), 0);
}

TEST_P(TinyRecompute, RecomputeIntoCacheRefusesRowsTheCacheDoesNotHold) {
  auto model = Load();
  const ModelConfig& c = model->config();
  std::vector<float> h(40 * c.d_model, 0.25f);
  KvCache cache = model->NewCache();
  ASSERT_TRUE(cache.Reserve(32).ok());  // one block: positions [0, 32)
  const auto code = [&](int64_t layer, int64_t position, int64_t n,
                        KvCache* target) {
    return model->RecomputeKvIntoCache(layer, h.data(), position, n, target)
        .code();
  };
  EXPECT_EQ(code(0, 0, 32, &cache), absl::StatusCode::kOk);
  EXPECT_EQ(code(0, 0, 33, &cache), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(0, -1, 1, &cache), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(c.n_layers, 0, 1, &cache), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(0, 0, 1, nullptr), absl::StatusCode::kInvalidArgument);
  cache.SetLength(32);
  cache.DropBelow(0, 32);  // layer 0 no longer holds [0, 32)
  EXPECT_EQ(code(0, 0, 1, &cache), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Families, TinyRecompute,
                         ::testing::ValuesIn(testing::AllFamilyCases()),
                         testing::FamilyCaseName);

// The real SmolLM2-135M file (Q4_1/Q8_0 weights dequantized by the loader).
class SmolLm2Recompute : public ::testing::TestWithParam<Precision> {};

TEST_P(SmolLm2Recompute, RecomputedKvEqualsCachedKvBitForBit) {
  const std::string path = CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!std::filesystem::exists(path)) {
    FAIL() << path << " is missing: run tools/setup.sh --test";
  }
  LoadOptions opts;
  opts.precision = GetParam();
  opts.num_threads = 2;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(path, opts);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  const std::vector<int32_t> tokens =
      testing::RandomTokens(100, 8, c.vocab_size);
  Recorder rec(c.d_model);
  KvCache cache = (*model)->NewCache();
  cache.KeepRowsPastWindows();  // compared at every position
  size_t at = 0;
  for (int n : {45, 1, 1, 30, 1, 1, 1, 20}) {
    SequenceStep step{&cache, absl::MakeConstSpan(tokens).subspan(at, n),
                      LogitsMode::kLast, 0};
    ForwardOutput out;
    ASSERT_TRUE((*model)->Forward({&step, 1}, &out, &rec).ok());
    at += n;
  }
  ASSERT_EQ(cache.length(), 100);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const Diff diff = CompareLayer(**model, cache, l, rec.Rows(0, l), 100, 32);
    EXPECT_EQ(diff.key_bytes, 0) << "layer " << l;
    EXPECT_EQ(diff.value_bytes, 0) << "layer " << l;
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, SmolLm2Recompute,
                         ::testing::Values(Precision::kF32, Precision::kBf16),
                         [](const ::testing::TestParamInfo<Precision>& info) {
                           return std::string(PrecisionName(info.param));
                         });

}  // namespace
}  // namespace kvd::ops
