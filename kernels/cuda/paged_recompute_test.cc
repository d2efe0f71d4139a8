// Device test (tag requires-gpu): PagedAttentionRecompute, where positions
// below each sequence's hot boundary are recomputed from residuals inside the
// call, equals the contiguous Attention over a cache that RecomputeKv filled
// from the same residuals, bit for bit: for several group sizes (the scratch
// bound), block sizes, hot boundaries (none, all, in between, different per
// sequence), GQA, a sliding window and k/v biases (qwen2: the reference
// cache is RecomputeKv's with the bias, so a bias PagedAttentionRecompute
// failed to pass on would show). The pool rows below the hot boundary
// are NaN, so reading one instead of recomputing it would show; the
// workspace and outputs are NaN-poisoned first.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/internal/paged_test_util.h"
#include "kernels/cuda/internal/test_util.h"
#include "kernels/cuda/kv_recompute.h"
#include "kernels/cuda/paged_attention.h"

namespace kvd::kernels::cuda {
namespace {

using testing::DeviceBuffer;

struct Case {
  int64_t d_model, n_heads, n_kv_heads, head_dim, rot_dim, window;
  std::vector<int64_t> len;  // per sequence
  std::vector<int64_t> hot;  // per sequence, multiples of 32, <= len
  bool bias = false;         // random k/v biases
};

class PagedRecomputeTest : public ::testing::TestWithParam<Case> {};

TEST_P(PagedRecomputeTest, EqualsAttentionOverRecomputedCache) {
  KVD_REQUIRE_GPU();
  const Case c = GetParam();
  std::mt19937_64 rng(testing::TestSeed());
  const int64_t n_seqs = static_cast<int64_t>(c.len.size());
  const int64_t width = c.n_kv_heads * c.head_dim;
  const int64_t kv_stride = width + 8;
  const int64_t ld_res = c.d_model + 8;
  const int64_t q_width = c.n_heads * c.head_dim;
  const int64_t q_stride = q_width + 4;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const float rope_base = 500000.0f;

  const std::vector<uint16_t> wk =
      testing::RandomBf16(width * c.d_model, &rng, -0.1f, 0.1f);
  const std::vector<uint16_t> wv =
      testing::RandomBf16(width * c.d_model, &rng, -0.1f, 0.1f);
  const std::vector<float> norm =
      testing::RandomFloats(c.d_model, &rng, 0.5f, 1.5f);
  const std::vector<float> bk = testing::RandomFloats(width, &rng, -0.5f, 0.5f);
  const std::vector<float> bv = testing::RandomFloats(width, &rng, -0.5f, 0.5f);
  DeviceBuffer<uint16_t> dwk(wk.size()), dwv(wv.size());
  DeviceBuffer<float> dnorm(norm.size()), dbk(width), dbv(width);
  KVD_CUDA_ASSERT(dwk.Upload(wk));
  KVD_CUDA_ASSERT(dwv.Upload(wv));
  KVD_CUDA_ASSERT(dnorm.Upload(norm));
  KVD_CUDA_ASSERT(dbk.Upload(bk));
  KVD_CUDA_ASSERT(dbv.Upload(bv));
  const float* bias_k = c.bias ? dbk.get() : nullptr;
  const float* bias_v = c.bias ? dbv.get() : nullptr;

  // Residuals, and the cache RecomputeKv fills from them (the reference).
  std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> dres, dk, dv;
  std::vector<std::vector<uint16_t>> k(n_seqs), v(n_seqs);
  for (int64_t s = 0; s < n_seqs; ++s) {
    const int64_t n = c.len[s];
    dres.push_back(std::make_unique<DeviceBuffer<uint16_t>>(n * ld_res));
    KVD_CUDA_ASSERT(
        dres.back()->Upload(testing::RandomBf16(n * ld_res, &rng, -3, 3)));
    dk.push_back(std::make_unique<DeviceBuffer<uint16_t>>(n * kv_stride));
    dv.push_back(std::make_unique<DeviceBuffer<uint16_t>>(n * kv_stride));
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), 0);
    DeviceBuffer<int32_t> dpos(n);
    DeviceBuffer<float> ws(KvRecomputeWorkspaceFloats(n, c.d_model, width));
    KVD_CUDA_ASSERT(dpos.Upload(pos));
    KvRecomputeArgs r;
    r.residual = dres[s]->get();
    r.rows = n;
    r.d_model = c.d_model;
    r.ld_residual = ld_res;
    r.norm_weight = dnorm.get();
    r.eps = 1e-5f;
    r.wk = dwk.get();
    r.wv = dwv.get();
    r.bk = bias_k;
    r.bv = bias_v;
    r.n_kv_heads = c.n_kv_heads;
    r.head_dim = c.head_dim;
    r.head_begin = 0;
    r.head_end = c.n_kv_heads;
    r.rot_dim = c.rot_dim;
    r.rope_base = rope_base;
    r.positions = dpos.get();
    r.k_out = dk[s]->get();
    r.v_out = dv[s]->get();
    r.ld_out = kv_stride;
    r.workspace = ws.get();
    ASSERT_TRUE(RecomputeKv(r, nullptr).ok());
    KVD_CUDA_SYNC();
    KVD_CUDA_ASSERT(dk[s]->Download(&k[s]));
    KVD_CUDA_ASSERT(dv[s]->Download(&v[s]));
  }

  const testing::Queries qs = testing::MakeQueries(c.len, 0);
  const std::vector<int32_t>& seq = qs.seq;
  const std::vector<int32_t>& last = qs.last;
  const int64_t nq = qs.size();
  const std::vector<float> q =
      testing::RandomFloats(nq * q_stride, &rng, -2, 2);
  DeviceBuffer<float> dq(q.size()), dref(nq * q_stride), dout(nq * q_stride);
  DeviceBuffer<int32_t> dlast(nq), dseq(nq);
  const AttentionArgs shape =
      testing::AttentionShape(c.n_heads, c.n_kv_heads, c.head_dim, scale,
                              kv_stride, c.window, q_stride);
  std::vector<float> ref;
  ASSERT_NO_FATAL_FAILURE(testing::ContiguousReference(
      shape, q, qs, dk, dv, &dq, &dlast, &dseq, &dref, &ref));
  for (int64_t i = 0; i < nq; ++i) {
    for (int64_t j = 0; j < q_width; ++j)
      ASSERT_TRUE(std::isfinite(ref[i * q_stride + j])) << "reference NaN";
  }

  std::vector<const uint16_t*> residual(n_seqs);
  for (int64_t s = 0; s < n_seqs; ++s) residual[s] = dres[s]->get();
  const int64_t max_hot = *std::max_element(c.hot.begin(), c.hot.end());
  for (int64_t block_rows : {32, 64}) {
    // Cold rows are never written to the pool: left NaN.
    const testing::HostPages pages = testing::ScatterToPages(
        k, v, c.len, kv_stride, block_rows, &rng, c.hot);
    DeviceBuffer<uint16_t> dpool(pages.pool.size());
    DeviceBuffer<int32_t> dtable(pages.table.size());
    KVD_CUDA_ASSERT(dpool.Upload(pages.pool));
    KVD_CUDA_ASSERT(dtable.Upload(pages.table));
    for (int64_t group_rows : {32, 64, 256}) {
      SCOPED_TRACE(::testing::Message() << "block_rows=" << block_rows
                                        << " group_rows=" << group_rows);
      const int64_t ws_bytes =
          PagedRecomputeWorkspaceBytes(nq, c.n_heads, c.n_kv_heads, c.head_dim,
                                       n_seqs, c.d_model, group_rows, max_hot);
      DeviceBuffer<char> ws(ws_bytes);
      KVD_CUDA_ASSERT(ws.Poison());
      KVD_CUDA_ASSERT(dout.Poison());
      PagedRecomputeArgs r;
      r.attn.q = dq.get();
      r.attn.nq = nq;
      r.attn.q_stride = q_stride;
      r.attn.n_heads = c.n_heads;
      r.attn.n_kv_heads = c.n_kv_heads;
      r.attn.head_dim = c.head_dim;
      r.attn.scale = scale;
      r.attn.kv = PagedKv{dpool.get(), dtable.get(), pages.table_stride,
                          block_rows, kv_stride};
      r.attn.query_seq = dseq.get();
      r.attn.last = dlast.get();
      r.attn.window = c.window;
      r.attn.out = dout.get();
      r.attn.out_stride = q_stride;
      r.n_seqs = n_seqs;
      r.hot_begin = c.hot.data();
      r.residual = residual.data();
      r.ld_residual = ld_res;
      r.d_model = c.d_model;
      r.norm_weight = dnorm.get();
      r.eps = 1e-5f;
      r.wk = dwk.get();
      r.wv = dwv.get();
      r.bk = bias_k;
      r.bv = bias_v;
      r.rot_dim = c.rot_dim;
      r.rope_base = rope_base;
      r.rope_style = RopeStyle::kHalfSplit;
      r.group_rows = group_rows;
      r.workspace = ws.get();
      r.workspace_bytes = ws_bytes;
      const absl::Status st = PagedAttentionRecompute(r, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      KVD_CUDA_SYNC();
      std::vector<float> out;
      KVD_CUDA_ASSERT(dout.Download(&out));
      ASSERT_NO_FATAL_FAILURE(testing::ExpectReferenceBits(
          out, ref, nq, q_width, q_stride, [&](int64_t i) {
            return ::testing::Message()
                   << "query " << i << " (sequence " << seq[i] << ", last "
                   << last[i] << ", hot_begin " << c.hot[seq[i]] << ")";
          }));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PagedRecomputeTest,
    ::testing::Values(
        // d_model, heads, kv heads, head_dim, rot_dim, window, len, hot
        Case{256, 4, 2, 64, 64, 0, {300, 97, 64}, {160, 96, 0}},
        Case{512, 8, 2, 128, 128, 0, {200, 64}, {192, 64}},  // all cold
        Case{128, 4, 4, 32, 16, 0, {100, 40}, {0, 0}},       // all hot
        Case{192, 6, 3, 64, 64, 70, {260, 130}, {224, 32}},  // window
        Case{256, 4, 1, 256, 128, 0, {90}, {64}},            // gemma dims
        // qwen2-style k/v bias: cold, mixed and hot sequences; a window.
        Case{256, 4, 2, 64, 64, 0, {300, 97, 64}, {160, 96, 0}, true},
        Case{192, 6, 3, 64, 64, 70, {260, 130}, {224, 32}, true}));

}  // namespace
}  // namespace kvd::kernels::cuda
