#include "ops/model/testing/backend_conformance.h"

#include <cmath>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "ops/model/testing/model_cases.h"

namespace kvd::ops::testing {
namespace {

// Residuals by (sequence, layer, position), and how often each was shown.
class Recorder : public ResidualObserver {
 public:
  explicit Recorder(int64_t d) : d_(d) {}
  void OnResidual(int64_t seq, int64_t layer, int64_t position,
                  const float* residual) override {
    auto& entry = rows_[{seq, layer, position}];
    entry.first.assign(residual, residual + d_);
    ++entry.second;
  }
  // Rows [0, n) of (seq, layer), n x d; empty if one is missing.
  std::vector<float> Rows(int64_t seq, int64_t layer, int64_t n) const {
    std::vector<float> out;
    for (int64_t p = 0; p < n; ++p) {
      auto it = rows_.find({seq, layer, p});
      if (it == rows_.end()) return {};
      out.insert(out.end(), it->second.first.begin(), it->second.first.end());
    }
    return out;
  }
  int Times(int64_t seq, int64_t layer, int64_t position) const {
    auto it = rows_.find({seq, layer, position});
    return it == rows_.end() ? 0 : it->second.second;
  }
  size_t size() const { return rows_.size(); }

 private:
  int64_t d_;
  std::map<std::tuple<int64_t, int64_t, int64_t>,
           std::pair<std::vector<float>, int>>
      rows_;
};

::testing::AssertionResult SameBits(const std::vector<float>& a,
                                    const std::vector<float>& b) {
  if (a.empty() || a.size() != b.size()) {
    return ::testing::AssertionFailure()
           << "sizes " << a.size() << " and " << b.size();
  }
  if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0) {
    size_t i = 0;
    while (i < a.size() && std::memcmp(&a[i], &b[i], sizeof(float)) == 0) ++i;
    return ::testing::AssertionFailure()
           << "first difference at " << i << ": " << a[i] << " vs " << b[i];
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

std::string BackendCaseName(const ::testing::TestParamInfo<BackendCase>& info) {
  return info.param.name;
}

void ModelBackendConformanceTest::SetUp() {
  absl::StatusOr<BackendUnderTest> made = GetParam().make();
  if (!made.ok() && absl::StartsWith(made.status().message(), "skip: ")) {
    GTEST_SKIP() << made.status().message();
  }
  ASSERT_TRUE(made.ok()) << made.status();
  under_test_ = std::move(*made);
  backend_ = under_test_.backend;
  ASSERT_NE(backend_, nullptr);
  absl::StatusOr<std::unique_ptr<KvBlockPool>> pool =
      backend_->NewBlockPool({});
  ASSERT_TRUE(pool.ok()) << pool.status();
  pool_ = std::move(*pool);
}

namespace {

// Helpers for the cases, on the fixture's backend and pool.
class Cases {
 public:
  Cases(const ModelBackend& backend, KvBlockPool* pool)
      : b_(backend), pool_(pool) {}

  KvCache NewCache(KvBlockPool* pool = nullptr) {
    absl::StatusOr<KvCache> cache = b_.NewCache(pool != nullptr ? pool : pool_);
    EXPECT_TRUE(cache.ok()) << cache.status();
    return std::move(*cache);
  }

  // Last-row logits of one step of `tokens` on `cache`; empty on failure.
  std::vector<float> Step(KvCache* cache, const std::vector<int32_t>& tokens,
                          ResidualObserver* observer = nullptr,
                          int64_t seq = 0) {
    SequenceStep step{cache, tokens, LogitsMode::kLast, seq};
    ForwardOutput out;
    const absl::Status s = b_.Forward({&step, 1}, &out, observer);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) return {};
    return {out.Logits(0), out.Logits(0) + b_.config().vocab_size};
  }

  std::vector<int32_t> Tokens(int n, uint32_t seed) const {
    return RandomTokens(n, seed, b_.config().vocab_size);
  }

 private:
  const ModelBackend& b_;
  KvBlockPool* pool_;
};

}  // namespace

TEST_P(ModelBackendConformanceTest, IdentifiesItself) {
  EXPECT_NE(std::string(backend_->backend_name()), "");
  EXPECT_GT(backend_->numerics_version(), 0u);
  EXPECT_GT(backend_->config().n_layers, 0);
  EXPECT_GT(backend_->config().vocab_size, 0);
  KvCache cache = Cases(*backend_, pool_.get()).NewCache();
  EXPECT_EQ(cache.n_layers(), backend_->config().n_layers);
  EXPECT_EQ(cache.precision(), backend_->precision());
}

TEST_P(ModelBackendConformanceTest, LogitsDoNotDependOnBatchOrChunking) {
  Cases t(*backend_, pool_.get());
  const std::vector<int32_t> prompt = t.Tokens(37, 1), other = t.Tokens(11, 2);
  const std::vector<int32_t> next = t.Tokens(1, 3);
  KvCache alone = t.NewCache();
  const std::vector<float> want = t.Step(&alone, prompt);
  const std::vector<float> want_next = t.Step(&alone, next);

  // In chunks of 7 (over attention chunk and block edges).
  KvCache chunked = t.NewCache();
  std::vector<float> got;
  for (size_t at = 0; at < prompt.size(); at += 7) {
    const size_t n = std::min<size_t>(7, prompt.size() - at);
    got = t.Step(&chunked, {prompt.begin() + at, prompt.begin() + at + n});
  }
  EXPECT_TRUE(SameBits(want, got)) << "chunked prefill";
  EXPECT_TRUE(SameBits(want_next, t.Step(&chunked, next))) << "chunked decode";

  // Beside another sequence in the same steps.
  KvCache mine = t.NewCache(), theirs = t.NewCache();
  SequenceStep batch[] = {{&theirs, other, LogitsMode::kLast, 1},
                          {&mine, prompt, LogitsMode::kLast, 2}};
  ForwardOutput out;
  ASSERT_TRUE(backend_->Forward(batch, &out).ok());
  const int64_t v = backend_->config().vocab_size;
  EXPECT_TRUE(SameBits(want, {out.Logits(1), out.Logits(1) + v}))
      << "batched prefill";
  batch[0].tokens = next;
  batch[1].tokens = next;
  ASSERT_TRUE(backend_->Forward(batch, &out).ok());
  EXPECT_TRUE(SameBits(want_next, {out.Logits(1), out.Logits(1) + v}))
      << "batched decode";
}

TEST_P(ModelBackendConformanceTest, ObserverSeesEveryLayerOfEveryNewToken) {
  Cases t(*backend_, pool_.get());
  const int64_t layers = backend_->config().n_layers;
  Recorder rec(backend_->config().d_model);
  KvCache cache = t.NewCache();
  t.Step(&cache, t.Tokens(9, 4), &rec, /*seq=*/3);
  t.Step(&cache, t.Tokens(1, 5), &rec, /*seq=*/3);
  // Layers 0..n_layers (the final residual too), positions 0..9, once each.
  EXPECT_EQ(rec.size(), static_cast<size_t>((layers + 1) * 10));
  for (int64_t l = 0; l <= layers; ++l) {
    for (int64_t p = 0; p < 10; ++p) {
      EXPECT_EQ(rec.Times(3, l, p), 1) << "layer " << l << " position " << p;
    }
    for (float x : rec.Rows(3, l, 10)) ASSERT_TRUE(std::isfinite(x));
  }
}

// A cache rebuilt from the observed residuals, through RecomputeKvIntoCache
// or ForwardLayers, decodes exactly like the cache Forward filled; and the
// comparison can fail (another layer's residuals give other logits).
TEST_P(ModelBackendConformanceTest, RebuiltCachesDecodeBitIdentically) {
  Cases t(*backend_, pool_.get());
  const ModelConfig& c = backend_->config();
  const int64_t n = 75;  // three 32-row blocks, the last partly used
  Recorder rec(c.d_model);
  KvCache original = t.NewCache();
  t.Step(&original, t.Tokens(n, 6), &rec);
  const std::vector<int32_t> next = t.Tokens(1, 7);
  const std::vector<float> want = t.Step(&original, next);

  KvCache recomputed = t.NewCache();
  ASSERT_TRUE(recomputed.Reserve(n).ok());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::vector<float> h = rec.Rows(0, l, n);
    ASSERT_FALSE(h.empty()) << "layer " << l;
    for (int64_t at = 0; at < n; at += 29) {
      const int64_t m = std::min<int64_t>(29, n - at);
      ASSERT_TRUE(backend_
                      ->RecomputeKvIntoCache(l, h.data() + at * c.d_model, at,
                                             m, &recomputed)
                      .ok());
    }
  }
  recomputed.SetLength(n);
  EXPECT_TRUE(SameBits(want, t.Step(&recomputed, next)))
      << "RecomputeKvIntoCache";

  // Layers [0, 2) then the rest, from the residuals entering layer 0.
  KvCache layered = t.NewCache();
  std::vector<float> h = rec.Rows(0, 0, n);
  const int64_t split = std::min<int64_t>(2, c.n_layers);
  ASSERT_TRUE(backend_->ForwardLayers(&layered, 0, n, 0, split, h.data()).ok());
  EXPECT_TRUE(SameBits(rec.Rows(0, split, n), h)) << "residuals after layers";
  ASSERT_TRUE(
      backend_->ForwardLayers(&layered, 0, n, split, c.n_layers, h.data())
          .ok());
  EXPECT_TRUE(SameBits(rec.Rows(0, c.n_layers, n), h)) << "final residuals";
  layered.SetLength(n);
  EXPECT_TRUE(SameBits(want, t.Step(&layered, next))) << "ForwardLayers";

  // The control: layer 0 rebuilt from layer 1's residuals.
  KvCache wrong = t.NewCache();
  ASSERT_TRUE(wrong.Reserve(n).ok());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::vector<float> rows = rec.Rows(0, l == 0 ? 1 : l, n);
    ASSERT_TRUE(
        backend_->RecomputeKvIntoCache(l, rows.data(), 0, n, &wrong).ok());
  }
  wrong.SetLength(n);
  EXPECT_FALSE(SameBits(want, t.Step(&wrong, next)));
}

TEST_P(ModelBackendConformanceTest, FullPoolFailsTheStepAndChangesNothing) {
  Cases t(*backend_, pool_.get());
  const ModelConfig& c = backend_->config();
  KvBlockPool::Options o;
  // Two blocks per layer: 64 positions.
  o.budget_bytes = static_cast<size_t>(c.n_layers) * 2 * 2 *
                   KvBlockPool::kDefaultBlockRows *
                   KvCache::RowBytes(c, backend_->precision());
  absl::StatusOr<std::unique_ptr<KvBlockPool>> small =
      backend_->NewBlockPool(o);
  ASSERT_TRUE(small.ok()) << small.status();
  KvCache cache = t.NewCache(small->get()), reference = t.NewCache();
  const std::vector<int32_t> prompt = t.Tokens(30, 8), next = t.Tokens(1, 9);
  t.Step(&cache, prompt);
  t.Step(&reference, prompt);
  const std::vector<int32_t> more = t.Tokens(40, 10);
  SequenceStep step{&cache, more, LogitsMode::kLast};
  ForwardOutput out;
  EXPECT_EQ(backend_->Forward({&step, 1}, &out).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache.length(), 30);
  EXPECT_TRUE(SameBits(t.Step(&reference, next), t.Step(&cache, next)));
}

TEST_P(ModelBackendConformanceTest, BadInputIsRefusedAndChangesNothing) {
  Cases t(*backend_, pool_.get());
  const ModelConfig& c = backend_->config();
  KvCache cache = t.NewCache();
  const std::vector<int32_t> prompt = t.Tokens(5, 11);
  t.Step(&cache, prompt);
  ForwardOutput out;
  const std::vector<int32_t> bad = {static_cast<int32_t>(c.vocab_size)};
  SequenceStep step{&cache, bad, LogitsMode::kLast};
  EXPECT_EQ(backend_->Forward({&step, 1}, &out).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> too_long(c.context_length, 0);
  step.tokens = too_long;
  EXPECT_EQ(backend_->Forward({&step, 1}, &out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.length(), 5);
  std::vector<float> h(c.d_model, 0.5f);
  EXPECT_EQ(
      backend_->RecomputeKvIntoCache(c.n_layers, h.data(), 0, 1, &cache).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->ForwardLayers(&cache, 0, 1, 2, 1, h.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace kvd::ops::testing
