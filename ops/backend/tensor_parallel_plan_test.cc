// The tensor-parallel plan on the real configs (head counts read from the
// GGUF files' metadata / the published Llama-3-8B config): every head and
// MLP column is owned exactly once, GQA groups stay whole, shard slices
// reassemble the full matrices, and the shards' partial products sum to the
// full product (float64, so only the split can make them differ).
#include "ops/backend/tensor_parallel_plan.h"

#include <cmath>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::ops {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModelConfig Config(int64_t d_model, int64_t n_heads, int64_t n_kv_heads,
                   int64_t head_dim, int64_t d_ff) {
  ModelConfig c;
  c.n_layers = 2;
  c.d_model = d_model;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  c.d_ff = d_ff;
  c.vocab_size = 16;
  c.context_length = 64;
  return c;
}

// llama.* / gemma3.* GGUF metadata of the cached model files.
ModelConfig SmolLm2() { return Config(576, 9, 3, 64, 1536); }
ModelConfig Gemma3_270m() { return Config(640, 4, 1, 256, 2048); }
ModelConfig Llama3_8b() { return Config(4096, 32, 8, 128, 14336); }
// ops/backend/testing/cuda_model_cases.h's device-test model.
ModelConfig CudaCase() { return Config(256, 8, 2, 32, 768); }

TEST(TensorParallelPlanTest, ValidDegreesAreTheDivisorsOfTheKvHeads) {
  EXPECT_THAT(TensorParallelPlan::ValidDegrees(SmolLm2()), ElementsAre(1, 3));
  EXPECT_THAT(TensorParallelPlan::ValidDegrees(Gemma3_270m()), ElementsAre(1));
  EXPECT_THAT(TensorParallelPlan::ValidDegrees(Llama3_8b()),
              ElementsAre(1, 2, 4, 8));
  EXPECT_THAT(TensorParallelPlan::ValidDegrees(CudaCase()), ElementsAre(1, 2));
}

TEST(TensorParallelPlanTest, RefusesDegreesThatSplitAGqaGroup) {
  for (int bad : {0, -1, 2, 4, 9}) {
    auto plan = TensorParallelPlan::Make(SmolLm2(), bad);
    ASSERT_FALSE(plan.ok()) << bad;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(plan.status().message(),
                HasSubstr("degrees that work for this model: 1, 3"));
  }
  auto gemma = TensorParallelPlan::Make(Gemma3_270m(), 2);
  ASSERT_FALSE(gemma.ok());
  EXPECT_THAT(gemma.status().message(), HasSubstr("does not divide"));
  EXPECT_THAT(gemma.status().message(), HasSubstr("work for this model: 1"));
  auto bad_gqa = TensorParallelPlan::Make(Config(64, 6, 4, 16, 64), 1);
  EXPECT_EQ(bad_gqa.status().code(), absl::StatusCode::kInvalidArgument);
}

// Every index of [0, n) in exactly one shard's range, ranges in shard order.
void ExpectPartition(const std::vector<IndexRange>& ranges, int64_t n,
                     const char* what) {
  std::vector<int> owners(n, 0);
  for (const IndexRange& r : ranges) {
    ASSERT_GE(r.begin, 0) << what;
    ASSERT_LE(r.end, n) << what;
    EXPECT_GT(r.size(), 0) << what << ": an empty shard";
    for (int64_t i = r.begin; i < r.end; ++i) ++owners[i];
  }
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(owners[i], 1)
        << what << " " << i << " owned " << owners[i] << " times";
}

TEST(TensorParallelPlanTest, EveryHeadAndColumnIsOwnedOnce) {
  for (const ModelConfig& c :
       {SmolLm2(), Gemma3_270m(), Llama3_8b(), CudaCase()}) {
    for (int s : TensorParallelPlan::ValidDegrees(c)) {
      SCOPED_TRACE(testing::Message()
                   << "n_heads " << c.n_heads << " TP " << s);
      auto plan = TensorParallelPlan::Make(c, s);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_EQ(plan->degree(), s);
      std::vector<IndexRange> kv, q, qr, kvr, ff;
      for (const ShardSlice& sl : plan->shards()) {
        kv.push_back(sl.kv_heads);
        q.push_back(sl.q_heads);
        qr.push_back(sl.q_rows);
        kvr.push_back(sl.kv_rows);
        ff.push_back(sl.ff);
        // GQA: query head h reads K/V head h / (n_heads / n_kv_heads)
        // (llama.cpp's and the kernels' mapping); all of a shard's query
        // heads read its own K/V heads and no other shard's.
        const int64_t group = c.n_heads / c.n_kv_heads;
        for (int64_t h = 0; h < c.n_heads; ++h) {
          const bool mine = h >= sl.q_heads.begin && h < sl.q_heads.end;
          const int64_t kvh = h / group;
          EXPECT_EQ(mine, kvh >= sl.kv_heads.begin && kvh < sl.kv_heads.end)
              << "query head " << h;
        }
        EXPECT_EQ(sl.q_rows.size(), sl.q_heads.size() * c.head_dim);
        EXPECT_EQ(sl.q_rows.begin, sl.q_heads.begin * c.head_dim);
        EXPECT_EQ(sl.kv_rows.begin, sl.kv_heads.begin * c.head_dim);
        EXPECT_EQ(sl.kv_rows.size(), sl.kv_heads.size() * c.head_dim);
        EXPECT_LE(sl.ff.size() - c.d_ff / s, 1);  // balanced
      }
      ExpectPartition(kv, c.n_kv_heads, "K/V head");
      ExpectPartition(q, c.n_heads, "query head");
      ExpectPartition(qr, c.q_dim(), "Wq row / W_o column");
      ExpectPartition(kvr, c.kv_dim(), "Wk/Wv row");
      ExpectPartition(ff, c.d_ff, "MLP column");
    }
  }
}

std::vector<double> Random(int64_t n, std::mt19937* rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(n);
  for (double& x : v) x = u(*rng);
  return v;
}

// y[i][o] = sum_k a[i][k] * w[o][k] (GGUF layout, w is n x k).
std::vector<double> MatMulT(const std::vector<double>& a,
                            const std::vector<double>& w, int64_t m, int64_t n,
                            int64_t k) {
  std::vector<double> y(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t o = 0; o < n; ++o)
      for (int64_t j = 0; j < k; ++j)
        y[i * n + o] += a[i * k + j] * w[o * k + j];
  return y;
}

TEST(TensorParallelPlanTest, SlicesReassembleAndPartialsSumToTheFullLayer) {
  // A small config with an uneven MLP split (d_ff 30 over 4 shards).
  const ModelConfig c = Config(24, 8, 4, 6, 30);
  std::mt19937 rng(5);
  const int64_t m = 3, d = c.d_model, qd = c.q_dim(), kvd = c.kv_dim(),
                ff = c.d_ff;
  const auto wq = Random(qd * d, &rng), wk = Random(kvd * d, &rng),
             wo = Random(d * qd, &rng), wg = Random(ff * d, &rng),
             wu = Random(ff * d, &rng), wd = Random(d * ff, &rng);
  const auto x = Random(m * d, &rng), attn = Random(m * qd, &rng);
  const auto y_o = MatMulT(attn, wo, m, d, qd);
  auto g = MatMulT(x, wg, m, ff, d);
  const auto u = MatMulT(x, wu, m, ff, d);
  for (int64_t i = 0; i < m * ff; ++i) g[i] *= u[i];
  const auto y_down = MatMulT(g, wd, m, d, ff);

  for (int s : {1, 2, 4}) {
    SCOPED_TRACE(testing::Message() << "TP " << s);
    auto plan = TensorParallelPlan::Make(c, s);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<double> q_cat, k_cat, o_sum(m * d, 0.0), down_sum(m * d, 0.0);
    std::vector<std::vector<double>> wo_parts, wd_parts;
    for (const ShardSlice& sl : plan->shards()) {
      const auto q_part = SliceRows(wq.data(), d, d, sl.q_rows);
      const auto k_part = SliceRows(wk.data(), d, d, sl.kv_rows);
      q_cat.insert(q_cat.end(), q_part.begin(), q_part.end());
      k_cat.insert(k_cat.end(), k_part.begin(), k_part.end());
      // Attention output: the shard's heads' columns of attn times its W_o
      // columns.
      const auto wo_part = SliceCols(wo.data(), d, qd, sl.q_rows);
      const auto a_part = SliceCols(attn.data(), m, qd, sl.q_rows);
      const auto o = MatMulT(a_part, wo_part, m, d, sl.q_rows.size());
      for (int64_t i = 0; i < m * d; ++i) o_sum[i] += o[i];
      wo_parts.push_back(wo_part);
      // MLP: gate/up rows, down columns.
      auto gp =
          MatMulT(x, SliceRows(wg.data(), d, d, sl.ff), m, sl.ff.size(), d);
      const auto up =
          MatMulT(x, SliceRows(wu.data(), d, d, sl.ff), m, sl.ff.size(), d);
      for (size_t i = 0; i < gp.size(); ++i) gp[i] *= up[i];
      const auto wd_part = SliceCols(wd.data(), d, ff, sl.ff);
      const auto dn = MatMulT(gp, wd_part, m, d, sl.ff.size());
      for (int64_t i = 0; i < m * d; ++i) down_sum[i] += dn[i];
      wd_parts.push_back(wd_part);
    }
    EXPECT_EQ(q_cat, wq) << "Wq row slices do not reassemble Wq";
    EXPECT_EQ(k_cat, wk) << "Wk row slices do not reassemble Wk";
    // Column slices side by side reassemble W_o and W_down.
    for (int64_t r = 0; r < d; ++r) {
      std::vector<double> row_o, row_d;
      for (size_t p = 0; p < wo_parts.size(); ++p) {
        const int64_t w = plan->shard(p).q_rows.size();
        row_o.insert(row_o.end(), wo_parts[p].begin() + r * w,
                     wo_parts[p].begin() + (r + 1) * w);
        const int64_t wf = plan->shard(p).ff.size();
        row_d.insert(row_d.end(), wd_parts[p].begin() + r * wf,
                     wd_parts[p].begin() + (r + 1) * wf);
      }
      EXPECT_EQ(row_o, std::vector<double>(wo.begin() + r * qd,
                                           wo.begin() + (r + 1) * qd));
      EXPECT_EQ(row_d, std::vector<double>(wd.begin() + r * ff,
                                           wd.begin() + (r + 1) * ff));
    }
    for (int64_t i = 0; i < m * d; ++i) {
      EXPECT_NEAR(o_sum[i], y_o[i], 1e-12) << "W_o partials, element " << i;
      EXPECT_NEAR(down_sum[i], y_down[i], 1e-12)
          << "MLP partials, element " << i;
    }
  }
}

}  // namespace
}  // namespace kvd::ops
