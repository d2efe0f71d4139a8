// Device test (tag requires-gpu): PagedAttention over K/V scattered into a
// pool with shuffled block placement (spare blocks and unwritten rows NaN)
// gives the same bits as the contiguous Attention over the same rows, for
// every block size, with GQA, sliding windows, several sequences of ragged
// lengths, prefill and decode queries and a query with no keys; outputs are
// NaN-poisoned first (row padding must stay NaN) and checked against a
// float64 softmax.
#include "kernels/cuda/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/internal/paged_test_util.h"
#include "kernels/cuda/internal/test_util.h"

namespace kvd::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::HostBf16ToFloat;

struct Case {
  int64_t n_heads, n_kv_heads, head_dim, window;
  std::vector<int64_t> len;  // per sequence
};

class PagedAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(PagedAttentionTest, EqualsContiguousBitForBitAndFloat64) {
  KVD_REQUIRE_GPU();
  const Case c = GetParam();
  std::mt19937_64 rng(testing::TestSeed());
  const int64_t n_seqs = static_cast<int64_t>(c.len.size());
  const int64_t q_width = c.n_heads * c.head_dim;
  const int64_t q_stride = q_width + 4;
  const int64_t kv_stride = c.n_kv_heads * c.head_dim + 8;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  std::vector<std::vector<uint16_t>> k(n_seqs), v(n_seqs);
  for (int64_t s = 0; s < n_seqs; ++s) {
    k[s] = testing::RandomBf16(c.len[s] * kv_stride, &rng, -2, 2);
    v[s] = testing::RandomBf16(c.len[s] * kv_stride, &rng, -1, 1);
  }
  // Sequence 0: a causal prefill over every position; each sequence: a decode
  // query at its end; one query with no keys.
  const testing::Queries qs =
      testing::MakeQueries(c.len, static_cast<int32_t>(n_seqs - 1));
  const std::vector<int32_t>& seq = qs.seq;
  const std::vector<int32_t>& last = qs.last;
  const int64_t nq = qs.size();
  const std::vector<float> q =
      testing::RandomFloats(nq * q_stride, &rng, -2, 2);

  // Contiguous reference bits: one Attention launch per query over its
  // sequence's rows.
  std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> dk, dv;
  for (int64_t s = 0; s < n_seqs; ++s) {
    dk.push_back(std::make_unique<DeviceBuffer<uint16_t>>(k[s].size()));
    dv.push_back(std::make_unique<DeviceBuffer<uint16_t>>(v[s].size()));
    KVD_CUDA_ASSERT(dk.back()->Upload(k[s]));
    KVD_CUDA_ASSERT(dv.back()->Upload(v[s]));
  }
  DeviceBuffer<float> dq(q.size()), dref(nq * q_stride), dout(nq * q_stride);
  DeviceBuffer<int32_t> dlast(nq), dseq(nq);
  const AttentionArgs shape =
      testing::AttentionShape(c.n_heads, c.n_kv_heads, c.head_dim, scale,
                              kv_stride, c.window, q_stride);
  std::vector<float> ref;
  ASSERT_NO_FATAL_FAILURE(testing::ContiguousReference(
      shape, q, qs, dk, dv, &dq, &dlast, &dseq, &dref, &ref));

  // float64 softmax of the same rows.
  std::vector<double> want(nq * q_width, 0.0);
  std::vector<float> packed_ref(nq * q_width);
  for (int64_t i = 0; i < nq; ++i) {
    std::memcpy(&packed_ref[i * q_width], &ref[i * q_stride], q_width * 4);
    if (last[i] < 0) continue;
    const std::vector<uint16_t>& ks = k[seq[i]];
    const std::vector<uint16_t>& vs = v[seq[i]];
    const int64_t first =
        c.window > 0 ? std::max<int64_t>(0, last[i] - c.window + 1) : 0;
    for (int64_t h = 0; h < c.n_heads; ++h) {
      const int64_t kvo = h / (c.n_heads / c.n_kv_heads) * c.head_dim;
      std::vector<double> e;
      double mx = -INFINITY, sum = 0;
      for (int64_t p = first; p <= last[i]; ++p) {
        double dot = 0;
        for (int64_t d = 0; d < c.head_dim; ++d) {
          dot += double{q[i * q_stride + h * c.head_dim + d]} *
                 HostBf16ToFloat(ks[p * kv_stride + kvo + d]);
        }
        e.push_back(dot * scale);
        mx = std::max(mx, e.back());
      }
      for (double& x : e) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < c.head_dim; ++d) {
        double acc = 0;
        for (int64_t p = first; p <= last[i]; ++p)
          acc += e[p - first] * HostBf16ToFloat(vs[p * kv_stride + kvo + d]);
        want[i * q_width + h * c.head_dim + d] = acc / sum;
      }
    }
  }
  EXPECT_LT(
      testing::RelativeError(packed_ref.data(), want.data(), packed_ref.size()),
      1e-5);

  for (int64_t block_rows : {32, 64, 128, 96}) {
    SCOPED_TRACE(::testing::Message() << "block_rows=" << block_rows);
    const testing::HostPages pages =
        testing::ScatterToPages(k, v, c.len, kv_stride, block_rows, &rng);
    DeviceBuffer<uint16_t> dpool(pages.pool.size());
    DeviceBuffer<int32_t> dtable(pages.table.size());
    KVD_CUDA_ASSERT(dpool.Upload(pages.pool));
    KVD_CUDA_ASSERT(dtable.Upload(pages.table));
    KVD_CUDA_ASSERT(dout.Poison());
    PagedAttentionArgs a;
    a.q = dq.get();
    a.nq = nq;
    a.q_stride = q_stride;
    a.n_heads = c.n_heads;
    a.n_kv_heads = c.n_kv_heads;
    a.head_dim = c.head_dim;
    a.scale = scale;
    a.kv = PagedKv{dpool.get(), dtable.get(), pages.table_stride, block_rows,
                   kv_stride};
    a.query_seq = dseq.get();
    a.last = dlast.get();
    a.window = c.window;
    a.out = dout.get();
    a.out_stride = q_stride;
    ASSERT_TRUE(PagedAttention(a, nullptr).ok());
    KVD_CUDA_SYNC();
    std::vector<float> out;
    KVD_CUDA_ASSERT(dout.Download(&out));
    ASSERT_NO_FATAL_FAILURE(testing::ExpectReferenceBits(
        out, ref, nq, q_width, q_stride, [&](int64_t i) {
          return ::testing::Message() << "query " << i << " (sequence "
                                      << seq[i] << ", last " << last[i] << ")";
        }));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PagedAttentionTest,
    ::testing::Values(Case{4, 4, 64, 0, {100, 33, 257}},  // MHA, ragged
                      Case{8, 2, 128, 0, {300, 1, 64}},   // GQA
                      Case{4, 1, 256, 0, {70, 129}},      // gemma-like dims
                      Case{6, 3, 80, 45, {200, 96, 31}},  // sliding window
                      Case{2, 2, 16, 1, {40, 65}}));      // window of one

}  // namespace
}  // namespace kvd::kernels::cuda
