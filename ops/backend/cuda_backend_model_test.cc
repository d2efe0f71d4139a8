// Device tests (requires-gpu; skipped with the reason where there is no CUDA
// device) of CudaBackendModel, the engine's backend interface on the GPU, on
// the random-weight llama and qwen2 models of testing/cuda_model_cases.h:
//   (a) last-token logits bit-identical to CudaModel::Forward's;
//   (b) a sequence's logits alone == in a batch of 4 (prefill and decode
//       mixed, kLast/kAll/kNone); a prompt in one chunk == several == token
//       by token; kAll's row i == the logits of the prefix [0, i] alone;
//   (c) RecomputeKvIntoCache's rows == the rows Forward wrote, bit for bit, at
//       every layer and position (blocks downloaded through BlockTable);
//       ForwardLayers over all layers and over a segment, in two position
//       chunks, writes the same rows and returns the same residuals;
//   (d) the observer's residuals are bf16 values, the same in Forward and
//       ForwardLayers, and recomputing from them reproduces the cache;
//   (e) greedy tokens equal the CPU bf16 engine's up to a near-tie
//       (cuda_model_test's rule);
//   (f) a full pool: RESOURCE_EXHAUSTED with caches and pool unchanged;
//       a patcher, a KeySelection: UNIMPLEMENTED with nothing changed;
//       host caches and pools: INVALID_ARGUMENT; the fp32 mode:
//       UNIMPLEMENTED at Create;
//   (g) a KvSource's bounded hot window (cold chunks recomputed from the
//       observed residuals inside attention, the boundary chunk's rows into
//       the cache) gives the full cache's logits bit for bit, prefill
//       chunks and decode, alone and batched, on llama and on qwen2 (whose
//       k/v bias the cold recompute must add exactly as Forward does); on
//       this backend and on the tensor-parallel one (TpCudaBackendModel,
//       two shards simulated on the GPU, each recomputing its own heads).
#include "ops/backend/cuda_backend_model.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/internal/test_util.h"
#include "ops/backend/cuda_model.h"
#include "ops/backend/testing/cuda_model_cases.h"
#include "ops/backend/tp_cuda_backend_model.h"

namespace kvd::ops {
namespace {

using testing::CpuGreedy;
using testing::CudaCasePrompts;
using testing::CudaCaseSpec;
using testing::kCudaCaseNewTokens;
using testing::kMaxLogitDiff;
using testing::LoadTinyModel;
using testing::SameBits;
using testing::Top2Margin;

// Every residual shown, by (sequence, layer, position).
class Collect : public ResidualObserver {
 public:
  void OnResidual(int64_t seq, int64_t layer, int64_t position,
                  const float* residual) override {
    auto& v = rows[{seq, layer, position}];
    v.assign(residual, residual + d);
    ++calls;
  }
  // Rows [0, n) of `layer` for `seq`, n x d.
  std::vector<float> Layer(int64_t seq, int64_t layer, int64_t n) const {
    std::vector<float> out;
    for (int64_t p = 0; p < n; ++p) {
      auto it = rows.find({seq, layer, p});
      if (it == rows.end()) return {};
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
    return out;
  }
  int64_t d = 0;
  int64_t calls = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<float>> rows;
};

bool SameResiduals(const Collect& a, const Collect& b) {
  if (a.rows.size() != b.rows.size()) return false;
  for (const auto& [key, row] : a.rows) {
    auto it = b.rows.find(key);
    if (it == b.rows.end() || it->second.size() != row.size() ||
        !SameBits(row.data(), it->second.data(), row.size())) {
      return false;
    }
  }
  return true;
}

class NoopPatcher : public ResidualPatcher {
 public:
  void Patch(int64_t, int64_t, int64_t, float*) override {}
};

class KeepAll : public KeySelection {
 public:
  absl::Span<const int64_t> KeptKeys(int64_t, int64_t, int64_t) const override {
    return {};
  }
};

// KV-Direct's bounded hot window over the residuals a Collect saw for
// sequence `seq`: rows older than `budget` positions come from residuals.
class WindowSource : public KvSource {
 public:
  WindowSource(const Collect* store, int64_t seq, int64_t budget)
      : store_(store), seq_(seq), budget_(budget) {}
  int64_t HotBegin(int64_t, int64_t length) const override {
    return std::max<int64_t>(0, length - budget_);
  }
  absl::Status Check(int64_t n_layers, int64_t length) const override {
    for (int64_t l = 0; l < n_layers; ++l)
      for (int64_t p = 0; p < HotBegin(l, length); ++p)
        if (!store_->rows.count({seq_, l, p}))
          return absl::FailedPreconditionError("residual missing");
    return absl::OkStatus();
  }
  void ReadResiduals(int64_t layer, int64_t first, int64_t n,
                     float* out) const override {
    for (int64_t i = 0; i < n; ++i) {
      const std::vector<float>& row = store_->rows.at({seq_, layer, first + i});
      std::copy(row.begin(), row.end(), out + i * store_->d);
    }
  }

 private:
  const Collect* store_;
  int64_t seq_, budget_;
};

// K and V of `layer` at positions [0, n) as bf16 bits (n x row values each),
// downloaded block by block through the cache's block table.
void DownloadRows(const KvCache& cache, int64_t layer, int64_t n,
                  std::vector<uint16_t>* k, std::vector<uint16_t>* v) {
  const int64_t br = cache.block_rows(), vals = cache.row_size();
  const size_t row = cache.row_bytes();
  k->assign(n * vals, 0);
  v->assign(n * vals, 0);
  for (int64_t p0 = 0; p0 < n; p0 += br) {
    const int64_t rows = std::min(br, n - p0);
    const uint8_t* block = cache.BlockTable(layer)[p0 / br];
    ASSERT_NE(block, nullptr) << "layer " << layer << " position " << p0;
    ASSERT_EQ(cudaMemcpy(k->data() + p0 * vals, block, rows * row,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(v->data() + p0 * vals, block + br * row, rows * row,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
}

// What every fixture here runs: a random-weight model of `family` on the
// CPU, a CUDA backend made from it, one pool.
template <typename Param>
class BackendTestBase : public ::testing::TestWithParam<Param> {
 protected:
  // degree 0: CudaBackendModel; otherwise TpCudaBackendModel with that many
  // shards simulated on the GPU.
  void Init(const std::string& family, int degree) {
    family_ = family;
    auto cpu = LoadTinyModel(CudaCaseSpec(family), Precision::kBf16, 4);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(*cpu);
    if (degree == 0) {
      auto gpu = CudaBackendModel::Create(*cpu_, {});
      ASSERT_TRUE(gpu.ok()) << gpu.status();
      gpu_ = std::move(*gpu);
    } else {
      TpCudaBackendOptions o;
      o.degree = degree;
      auto gpu = TpCudaBackendModel::Create(*cpu_, o);
      ASSERT_TRUE(gpu.ok()) << gpu.status();
      gpu_ = std::move(*gpu);
    }
    auto pool = gpu_->NewBlockPool({});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    vocab_ = cpu_->config().vocab_size;
    d_ = cpu_->config().d_model;
    n_layers_ = cpu_->config().n_layers;
  }

  KvCache NewCache() {
    auto c = gpu_->NewCache(pool_.get());
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }

  // Feeds `tokens` to `cache` in chunks of `chunk`, alone; returns the last
  // step's last-token logits.
  std::vector<float> Alone(const std::vector<int32_t>& tokens, size_t chunk,
                           KvCache* cache, ResidualObserver* observer = nullptr,
                           int64_t seq = 0) {
    ForwardOutput out;
    for (size_t b = 0; b < tokens.size(); b += chunk) {
      SequenceStep st{cache, absl::MakeConstSpan(tokens).subspan(b, chunk),
                      LogitsMode::kLast, seq};
      const absl::Status s = gpu_->Forward({&st, 1}, &out, observer);
      EXPECT_TRUE(s.ok()) << s;
      if (!s.ok()) return {};
    }
    return {out.Logits(0), out.Logits(0) + vocab_};
  }

  std::string family_;
  std::unique_ptr<Model> cpu_;
  std::unique_ptr<ModelBackend> gpu_;
  std::unique_ptr<KvBlockPool> pool_;
  int64_t vocab_ = 0, d_ = 0, n_layers_ = 0;
};

class CudaBackendModelTest : public BackendTestBase<std::string> {
 protected:
  void SetUp() override {
    KVD_REQUIRE_GPU();
    Init(GetParam(), 0);
  }
};

// The bounded-window cases run on the single-GPU backend (degree 0) and on
// the tensor-parallel one with two shards simulated on the GPU, where every
// shard recomputes its own heads' cold K/V inside attention.
using BoundedCase = std::tuple<std::string, int>;  // (family, degree)

class CudaBoundedWindowTest : public BackendTestBase<BoundedCase> {
 protected:
  void SetUp() override {
    KVD_REQUIRE_GPU();
    Init(std::get<0>(GetParam()), std::get<1>(GetParam()));
  }
};

std::string BoundedCaseName(const ::testing::TestParamInfo<BoundedCase>& i) {
  const int degree = std::get<1>(i.param);
  return std::get<0>(i.param) +
         (degree == 0 ? "" : "_tp" + std::to_string(degree));
}

TEST_P(CudaBackendModelTest, LogitsEqualCudaModelBits) {
  auto ref = CudaModel::Create(*cpu_, {});
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_STREQ(gpu_->backend_name(), "cuda");
  for (const auto& prompt : CudaCasePrompts()) {
    auto rc = (*ref)->NewCache();
    ASSERT_TRUE(rc.ok());
    std::vector<float> want;
    CudaStep st{&*rc, prompt};
    ASSERT_TRUE((*ref)->Forward({&st, 1}, &want).ok());
    KvCache cache = NewCache();
    const std::vector<float> got = Alone(prompt, prompt.size(), &cache);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_TRUE(SameBits(got.data(), want.data(), vocab_))
        << "prompt of " << prompt.size() << " differs from CudaModel";
    EXPECT_EQ(cache.length(), static_cast<int64_t>(prompt.size()));
    // A decode step too.
    const std::vector<int32_t> next = {prompt[0]};
    CudaStep st2{&*rc, next};
    ASSERT_TRUE((*ref)->Forward({&st2, 1}, &want).ok());
    const std::vector<float> got2 = Alone(next, 1, &cache);
    EXPECT_TRUE(SameBits(got2.data(), want.data(), vocab_))
        << "decode after prompt of " << prompt.size();
  }
}

TEST_P(CudaBackendModelTest, LogitsDoNotDependOnBatchOrChunking) {
  const auto prompts = CudaCasePrompts();
  const std::vector<int32_t>& a = prompts[3];  // 37 tokens
  KvCache alone_cache = NewCache();
  const std::vector<float> alone = Alone(a, a.size(), &alone_cache);
  ASSERT_EQ(alone.size(), vocab_);
  for (size_t chunk : {16, 5, 1}) {
    KvCache c = NewCache();
    EXPECT_TRUE(SameBits(Alone(a, chunk, &c).data(), alone.data(), vocab_))
        << "prefill in chunks of " << chunk << " differs from one chunk";
  }

  // A batch of 4: b decoding at position 64, a's prompt with every row's
  // logits, a fresh one-token sequence without logits, and a 20-token chunk
  // after a 3-token history.
  KvCache b = NewCache(), c = NewCache(), d = NewCache(), a2 = NewCache();
  Alone(prompts[4], 64, &b);
  const std::vector<int32_t> d_hist(prompts[1].begin(), prompts[1].begin() + 3);
  Alone(d_hist, 3, &d);
  const std::vector<int32_t> b_next = {prompts[5][0]}, c_tok = {prompts[5][1]};
  const std::vector<int32_t> d_chunk(prompts[5].begin() + 2,
                                     prompts[5].begin() + 22);
  std::vector<SequenceStep> batch = {{&b, b_next, LogitsMode::kLast, 1},
                                     {&a2, a, LogitsMode::kAll, 2},
                                     {&c, c_tok, LogitsMode::kNone, 3},
                                     {&d, d_chunk, LogitsMode::kLast, 4}};
  ForwardOutput out;
  ASSERT_TRUE(gpu_->Forward(batch, &out).ok());
  ASSERT_EQ(out.vocab_size, vocab_);
  ASSERT_EQ(out.num_rows, (std::vector<int64_t>{1, 37, 0, 1}));
  EXPECT_EQ(out.Logits(2), nullptr);
  EXPECT_TRUE(SameBits(out.Logits(1), alone.data(), vocab_))
      << "a's last row in a batch of 4 differs from a alone";
  EXPECT_EQ(c.length(), 1);
  // kAll's row i is the prefix [0, i]'s last-token logits.
  for (int64_t i : {0, 5, 31, 32}) {
    KvCache p = NewCache();
    const std::vector<int32_t> prefix(a.begin(), a.begin() + i + 1);
    EXPECT_TRUE(SameBits(out.Logits(1, i), Alone(prefix, 7, &p).data(), vocab_))
        << "row " << i << " of kAll differs from its prefix alone";
  }
  // The others replayed alone give their batch rows' bits.
  KvCache b1 = NewCache(), d1 = NewCache();
  Alone(prompts[4], 7, &b1);
  EXPECT_TRUE(SameBits(Alone(b_next, 1, &b1).data(), out.Logits(0), vocab_));
  Alone(d_hist, 1, &d1);
  EXPECT_TRUE(SameBits(Alone(d_chunk, d_chunk.size(), &d1).data(),
                       out.Logits(3), vocab_));
  // Decoding on: a2 (batched history) and alone_cache stay identical.
  const std::vector<int32_t> next = {prompts[2][0]};
  std::vector<SequenceStep> batch2 = {{&a2, next}, {&b1, next}};
  ASSERT_TRUE(gpu_->Forward(batch2, &out).ok());
  EXPECT_TRUE(
      SameBits(Alone(next, 1, &alone_cache).data(), out.Logits(0), vocab_));
}

TEST_P(CudaBackendModelTest, RecomputeAndForwardLayersReproduceTheCache) {
  const auto prompts = CudaCasePrompts();
  const std::vector<int32_t>& prompt = prompts[5];  // 100 tokens
  const int64_t n = prompt.size() + 3;
  Collect seen;
  seen.d = d_;
  KvCache cache = NewCache();
  Alone(prompt, 64, &cache, &seen, 9);  // two steps: 64 + 36
  for (int i = 0; i < 3; ++i) Alone({prompt[i]}, 1, &cache, &seen, 9);
  ASSERT_EQ(cache.length(), n);
  EXPECT_EQ(seen.calls, (n_layers_ + 1) * n) << "one call per row and layer";
  for (const auto& [key, row] : seen.rows) {
    for (float x : row) {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      ASSERT_EQ(bits & 0xffff, 0u)
          << "residual not a bf16 value at layer " << std::get<1>(key);
    }
  }

  // (c, d): recompute every layer from the observed residuals into a fresh
  // cache, in two position ranges.
  KvCache rebuilt = NewCache();
  ASSERT_TRUE(rebuilt.Reserve(n).ok());
  for (int64_t l = 0; l < n_layers_; ++l) {
    const std::vector<float> h = seen.Layer(9, l, n);
    ASSERT_EQ(h.size(), n * d_);
    ASSERT_TRUE(gpu_->RecomputeKvIntoCache(l, h.data(), 0, 40, &rebuilt).ok());
    ASSERT_TRUE(
        gpu_->RecomputeKvIntoCache(l, h.data() + 40 * d_, 40, n - 40, &rebuilt)
            .ok());
  }
  rebuilt.SetLength(n);

  // ForwardLayers from the residual entering layer 0, in two position
  // chunks, and over the segment [2, n_layers) from layer 2's.
  KvCache full = NewCache();
  Collect seen_fl;
  seen_fl.d = d_;
  std::vector<float> h = seen.Layer(9, 0, n);
  ASSERT_TRUE(
      gpu_->ForwardLayers(&full, 0, 50, 0, n_layers_, h.data(), &seen_fl, 9)
          .ok());
  ASSERT_TRUE(gpu_->ForwardLayers(&full, 50, n - 50, 0, n_layers_,
                                  h.data() + 50 * d_, &seen_fl, 9)
                  .ok());
  EXPECT_EQ(full.length(), 0) << "ForwardLayers leaves the length alone";
  const std::vector<float> final_seen = seen.Layer(9, n_layers_, n);
  ASSERT_EQ(final_seen.size(), h.size());
  EXPECT_TRUE(SameBits(h.data(), final_seen.data(), h.size()))
      << "ForwardLayers' final residual differs from Forward's";
  EXPECT_TRUE(SameResiduals(seen_fl, seen))
      << "ForwardLayers showed other residuals than Forward";

  KvCache segment = NewCache();
  std::vector<float> h2 = seen.Layer(9, 2, n);
  ASSERT_TRUE(
      gpu_->ForwardLayers(&segment, 0, n, 2, n_layers_, h2.data()).ok());
  EXPECT_TRUE(SameBits(h2.data(), final_seen.data(), h2.size()));
  std::vector<float> h3 = seen.Layer(9, 1, n);
  KvCache middle = NewCache();
  ASSERT_TRUE(gpu_->ForwardLayers(&middle, 0, n, 1, 2, h3.data()).ok());
  const std::vector<float> layer2 = seen.Layer(9, 2, n);
  EXPECT_TRUE(SameBits(h3.data(), layer2.data(), h3.size()))
      << "ForwardLayers [1, 2) does not end at the residual entering layer 2";

  for (int64_t l = 0; l < n_layers_; ++l) {
    std::vector<uint16_t> k, v, k2, v2, k3, v3;
    DownloadRows(cache, l, n, &k, &v);
    DownloadRows(rebuilt, l, n, &k2, &v2);
    DownloadRows(full, l, n, &k3, &v3);
    EXPECT_EQ(k, k2) << "layer " << l << ": recomputed K differ";
    EXPECT_EQ(v, v2) << "layer " << l << ": recomputed V differ";
    EXPECT_EQ(k, k3) << "layer " << l << ": ForwardLayers' K differ";
    EXPECT_EQ(v, v3) << "layer " << l << ": ForwardLayers' V differ";
    if (l >= 2) {
      DownloadRows(segment, l, n, &k3, &v3);
      EXPECT_EQ(k, k3) << "layer " << l << ": segment's K differ";
      EXPECT_EQ(v, v3) << "layer " << l << ": segment's V differ";
    }
  }

  // The rebuilt cache decodes on exactly like the original.
  const std::vector<int32_t> next = {prompts[2][1]};
  EXPECT_TRUE(SameBits(Alone(next, 1, &cache).data(),
                       Alone(next, 1, &rebuilt).data(), vocab_));

  // Bad ranges are refused.
  EXPECT_EQ(
      gpu_->RecomputeKvIntoCache(n_layers_, h.data(), 0, 1, &rebuilt).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->RecomputeKvIntoCache(0, h.data(), 0, 1000, &rebuilt).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->ForwardLayers(&full, 0, 1, 2, 1, h.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(CudaBoundedWindowTest, BoundedHotWindowMatchesTheFullCache) {
  const auto prompts = CudaCasePrompts();
  const std::vector<int32_t>& prompt = prompts[5];  // 100 tokens
  Collect store;
  store.d = d_;
  KvCache full = NewCache(), bounded = NewCache();
  Alone(prompt, prompt.size(), &full);
  Alone(prompt, prompt.size(), &bounded, &store, 5);
  // Hot boundaries (length - budget) that never move backwards: inside the
  // first chunk (rows recomputed into the cache only), inside a later chunk
  // (cold chunks from residuals too), then on a chunk edge and past it.
  WindowSource early(&store, 5, 90), mid(&store, 5, 40), edge(&store, 5, 38);
  // qwen2 (q/k/v bias) included: its cold K/V are recomputed with the k/v
  // bias (RecomputeKv's bk/bv). The bias is 0.1-scale random, so a recompute
  // that dropped it, or added it after RoPE, would change these logits'
  // bits at the first step with a cold chunk (step 1).
  EXPECT_TRUE(gpu_->BoundedHotWindowSupport().ok());
  std::vector<int32_t> feed = {prompts[2][0]};
  for (int step = 0; step < 9; ++step) {
    const WindowSource* src = step == 0 ? &early : step == 1 ? &mid : &edge;
    SequenceStep st{&bounded, feed, LogitsMode::kAll, 5, src};
    // Alongside a plain sequence in the same step, half the time.
    KvCache other = NewCache();
    const std::vector<int32_t> other_tokens(prompts[3].begin(),
                                            prompts[3].begin() + 7);
    std::vector<SequenceStep> batch = {st};
    if (step % 2 == 1) batch.push_back({&other, other_tokens});
    ForwardOutput got;
    const absl::Status s = gpu_->Forward(batch, &got, &store);
    ASSERT_TRUE(s.ok()) << s;
    SequenceStep plain{&full, feed, LogitsMode::kAll};
    ForwardOutput want;
    ASSERT_TRUE(gpu_->Forward({&plain, 1}, &want).ok());
    ASSERT_EQ(got.num_rows[0], want.num_rows[0]);
    for (int64_t r = 0; r < want.num_rows[0]; ++r) {
      EXPECT_TRUE(SameBits(got.Logits(0, r), want.Logits(0, r), vocab_))
          << "step " << step << " row " << r
          << ": the bounded window's logits differ from the full cache's";
    }
    EXPECT_EQ(bounded.first_kept(0),
              src->HotBegin(0, full.length() - feed.size()));
    // Next: the argmax of the last row, and a 3-token chunk every third
    // step.
    const float* l = want.Logits(0);
    const int32_t next =
        static_cast<int32_t>(std::max_element(l, l + vocab_) - l);
    feed = step % 3 == 2 ? std::vector<int32_t>{next, prompts[1][0], next}
                         : std::vector<int32_t>{next};
  }
  EXPECT_LT(bounded.blocks_held(), full.blocks_held());
}

// Past one cold recompute group (256 rows), two sequences with cold ranges
// in the same step, and a 40-token chunk over a bounded window: each
// sequence's logits equal its full cache's, bit for bit.
TEST_P(CudaBoundedWindowTest, LongBoundedHotWindowsInOneBatchMatchFullCaches) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<int32_t> id(0, vocab_ - 1);
  auto tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = id(rng);
    return t;
  };
  const std::vector<int32_t> pa = tokens(600), pb = tokens(450);
  Collect store;
  store.d = d_;
  KvCache full_a = NewCache(), full_b = NewCache();
  KvCache a = NewCache(), b = NewCache();
  Alone(pa, 128, &full_a);
  Alone(pb, 128, &full_b);
  Alone(pa, 128, &a, &store, 1);
  Alone(pb, 128, &b, &store, 2);
  const WindowSource wa(&store, 1, 100), wb(&store, 2, 70);
  for (int n : {1, 40, 1, 3, 1}) {
    const std::vector<int32_t> fa = tokens(n), fb = tokens(n);
    const SequenceStep batch[] = {{&a, fa, LogitsMode::kAll, 1, &wa},
                                  {&b, fb, LogitsMode::kAll, 2, &wb}};
    ForwardOutput got;
    const absl::Status s = gpu_->Forward(batch, &got, &store);
    ASSERT_TRUE(s.ok()) << s;
    KvCache* fulls[] = {&full_a, &full_b};
    const std::vector<int32_t>* feeds[] = {&fa, &fb};
    for (int q = 0; q < 2; ++q) {
      const SequenceStep plain{fulls[q], *feeds[q], LogitsMode::kAll};
      ForwardOutput want;
      ASSERT_TRUE(gpu_->Forward({&plain, 1}, &want).ok());
      ASSERT_EQ(got.num_rows[q], want.num_rows[0]);
      for (int64_t r = 0; r < want.num_rows[0]; ++r) {
        EXPECT_TRUE(SameBits(got.Logits(q, r), want.Logits(0, r), vocab_))
            << "sequence " << q << ", a step of " << n << ", row " << r;
      }
    }
  }
  EXPECT_GT(a.first_kept(0), 256);  // more than one recompute group is cold
  EXPECT_LT(a.blocks_held(), full_a.blocks_held());
}

TEST_P(CudaBackendModelTest, GreedyTokensEqualTheCpuEngine) {
  int identical = 0;
  for (const auto& prompt : CudaCasePrompts()) {
    std::vector<std::vector<float>> cpu_logits;
    auto want = CpuGreedy(*cpu_, prompt, kCudaCaseNewTokens, &cpu_logits);
    ASSERT_TRUE(want.ok()) << want.status();
    KvCache cache = NewCache();
    std::vector<std::vector<float>> gpu_logits;
    std::vector<int32_t> got;
    std::vector<float> logits = Alone(prompt, 16, &cache);
    for (int64_t i = 0; i < kCudaCaseNewTokens; ++i) {
      gpu_logits.push_back(logits);
      got.push_back(static_cast<int32_t>(
          std::max_element(logits.begin(), logits.end()) - logits.begin()));
      if (i + 1 < kCudaCaseNewTokens) logits = Alone({got.back()}, 1, &cache);
    }
    size_t same = 0;
    while (same < want->size() && got[same] == (*want)[same]) ++same;
    double max_diff = 0;
    for (size_t i = 0; i < std::min(same + 1, want->size()); ++i)
      for (int64_t j = 0; j < vocab_; ++j)
        max_diff = std::max<double>(
            max_diff, std::fabs(gpu_logits[i][j] - cpu_logits[i][j]));
    EXPECT_LT(max_diff, kMaxLogitDiff) << "prompt of " << prompt.size();
    if (same == want->size()) {
      ++identical;
    } else {
      const float margin = Top2Margin(cpu_logits[same]);
      std::printf(
          "[ %s backend ] prompt of %zu: first divergence at token %zu, CPU "
          "top-2 margin %.5f, max |logit diff| %.5f\n",
          GetParam().c_str(), prompt.size(), same, margin, max_diff);
      EXPECT_LT(margin, 2 * max_diff)
          << "prompt of " << prompt.size() << " diverges at token " << same
          << " where the CPU's choice was not a near-tie";
    }
  }
  std::printf("[ %s backend ] %d of %zu prompts token-identical to the CPU\n",
              GetParam().c_str(), identical, CudaCasePrompts().size());
}

TEST_P(CudaBackendModelTest, RefusalsChangeNothing) {
  const auto prompts = CudaCasePrompts();
  const size_t block_bytes = pool_->block_bytes();
  auto small = gpu_->NewBlockPool(
      {.budget_bytes = static_cast<size_t>(n_layers_ * 2) * block_bytes});
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ((*small)->capacity_blocks(), n_layers_ * 2);  // 64 positions
  EXPECT_FALSE((*small)->host_accessible());
  auto cache = gpu_->NewCache(small->get());
  ASSERT_TRUE(cache.ok());
  Alone({prompts[4].begin(), prompts[4].begin() + 10}, 10, &*cache);
  const int64_t held = cache->blocks_held();
  ForwardOutput out;
  SequenceStep too_long{&*cache, prompts[5]};  // 10 + 100 positions
  EXPECT_EQ(gpu_->Forward({&too_long, 1}, &out).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->length(), 10);
  EXPECT_EQ(cache->blocks_held(), held);
  EXPECT_EQ((*small)->stats().blocks_in_use, held);
  EXPECT_EQ((*small)->stats().blocks_reserved, 0);

  // Unsupported features: UNIMPLEMENTED, nothing changed.
  NoopPatcher patcher;
  KeepAll selection;
  KvCache other = NewCache();
  Alone(prompts[3], 37, &other);
  const std::vector<int32_t> one = {1};
  SequenceStep plain{&*cache, one};
  EXPECT_EQ(gpu_->Forward({&plain, 1}, &out, nullptr, &patcher).code(),
            absl::StatusCode::kUnimplemented);
  SequenceStep selected{&*cache, one};
  selected.key_selection = &selection;
  EXPECT_EQ(gpu_->Forward({&selected, 1}, &out).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(cache->length(), 10);
  EXPECT_EQ(cache->blocks_held(), held);
  EXPECT_EQ(other.length(), 37);
  EXPECT_EQ(other.first_kept(0), 0);

  // Host caches and pools, and a batch over two pools: INVALID_ARGUMENT.
  KvCache host = cpu_->NewCache();
  SequenceStep on_host{&host, one};
  EXPECT_EQ(gpu_->Forward({&on_host, 1}, &out).code(),
            absl::StatusCode::kInvalidArgument);
  auto host_pool = cpu_->NewBlockPool({});
  ASSERT_TRUE(host_pool.ok());
  EXPECT_EQ(gpu_->NewCache(host_pool->get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<SequenceStep> two_pools = {{&*cache, one}, {&other, one}};
  EXPECT_EQ(gpu_->Forward(two_pools, &out).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> h(d_, 0.0f);
  EXPECT_EQ(gpu_->RecomputeKvIntoCache(0, h.data(), 0, 1, &host).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->ForwardLayers(&host, 0, 1, 0, 1, h.data()).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad = {static_cast<int32_t>(vocab_)};
  SequenceStep oob{&*cache, bad};
  EXPECT_EQ(gpu_->Forward({&oob, 1}, &out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->length(), 10);

  // What fits still runs, with the big pool's bits.
  const std::vector<int32_t> rest(prompts[4].begin() + 10, prompts[4].end());
  SequenceStep fits{&*cache, rest};
  ASSERT_TRUE(gpu_->Forward({&fits, 1}, &out).ok());
  EXPECT_EQ((*small)->available_blocks(), 0);
  KvCache ref = NewCache();
  EXPECT_TRUE(
      SameBits(Alone(prompts[4], 64, &ref).data(), out.Logits(0), vocab_))
      << "pool size changed the bits";

  auto fp32 = LoadTinyModel(CudaCaseSpec(GetParam()), Precision::kF32, 4);
  ASSERT_TRUE(fp32.ok());
  EXPECT_EQ(CudaBackendModel::Create(**fp32, {}).status().code(),
            absl::StatusCode::kUnimplemented);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaBackendModelTest,
                         ::testing::Values("llama", "qwen2"));
INSTANTIATE_TEST_SUITE_P(Families, CudaBoundedWindowTest,
                         ::testing::Combine(::testing::Values("llama", "qwen2"),
                                            ::testing::Values(0, 2)),
                         BoundedCaseName);

}  // namespace
}  // namespace kvd::ops
