// Device test (tag requires-gpu): canonical chunked attention against a
// float64 softmax on fresh random inputs (GQA, sliding window, ragged chunk
// boundaries), with NaN-poisoned outputs, and bit-identity of a query's output
// whether it runs alone or inside a batch of other queries.
#include "kernels/cuda/attention.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/internal/test_util.h"

namespace kvd::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::HostBf16ToFloat;

struct Case {
  int64_t n_heads, n_kv_heads, head_dim, positions, window;
};

class AttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionTest, MatchesFloat64AndIsBatchInvariant) {
  KVD_REQUIRE_GPU();
  const Case c = GetParam();
  std::mt19937_64 rng(testing::TestSeed());
  const int64_t q_width = c.n_heads * c.head_dim;
  const int64_t kv_stride = c.n_kv_heads * c.head_dim + 8;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // Queries: a causal prefill block over every position, plus decode-like
  // repeats at the end.
  std::vector<int32_t> last;
  for (int64_t p = 0; p < c.positions; ++p)
    last.push_back(static_cast<int32_t>(p));
  last.push_back(static_cast<int32_t>(c.positions - 1));
  last.push_back(-1);  // no keys: zeros
  const int64_t nq = static_cast<int64_t>(last.size());
  const int64_t q_stride = q_width + 4;
  const std::vector<float> q =
      testing::RandomFloats(nq * q_stride, &rng, -2, 2);
  const std::vector<uint16_t> k =
      testing::RandomBf16(c.positions * kv_stride, &rng, -2, 2);
  const std::vector<uint16_t> v =
      testing::RandomBf16(c.positions * kv_stride, &rng, -1, 1);

  std::vector<double> want(nq * q_width, 0.0);
  for (int64_t i = 0; i < nq; ++i) {
    if (last[i] < 0) continue;
    const int64_t first =
        c.window > 0 ? std::max<int64_t>(0, last[i] - c.window + 1) : 0;
    for (int64_t h = 0; h < c.n_heads; ++h) {
      const int64_t kvh = h / (c.n_heads / c.n_kv_heads);
      std::vector<double> s;
      double mx = -INFINITY;
      for (int64_t p = first; p <= last[i]; ++p) {
        double dot = 0;
        for (int64_t d = 0; d < c.head_dim; ++d) {
          dot += double{q[i * q_stride + h * c.head_dim + d]} *
                 HostBf16ToFloat(k[p * kv_stride + kvh * c.head_dim + d]);
        }
        s.push_back(dot * scale);
        mx = std::max(mx, s.back());
      }
      double sum = 0;
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (int64_t d = 0; d < c.head_dim; ++d) {
        double acc = 0;
        for (int64_t p = first; p <= last[i]; ++p) {
          acc += s[p - first] *
                 HostBf16ToFloat(v[p * kv_stride + kvh * c.head_dim + d]);
        }
        want[i * q_width + h * c.head_dim + d] = acc / sum;
      }
    }
  }

  DeviceBuffer<float> dq(q.size()), dout(nq * q_stride), dout1(q_stride);
  DeviceBuffer<uint16_t> dk(k.size()), dv(v.size());
  DeviceBuffer<int32_t> dlast(nq);
  for (cudaError_t e : {dq.status(), dout.status(), dout1.status(), dk.status(),
                        dv.status(), dlast.status()}) {
    KVD_CUDA_ASSERT(e);
  }
  KVD_CUDA_ASSERT(dq.Upload(q));
  KVD_CUDA_ASSERT(dk.Upload(k));
  KVD_CUDA_ASSERT(dv.Upload(v));
  KVD_CUDA_ASSERT(dlast.Upload(last));
  KVD_CUDA_ASSERT(dout.Poison());
  AttentionArgs a;
  a.q = dq.get();
  a.nq = nq;
  a.q_stride = q_stride;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.scale = scale;
  a.k = dk.get();
  a.v = dv.get();
  a.kv_stride = kv_stride;
  a.last = dlast.get();
  a.window = c.window;
  a.out = dout.get();
  a.out_stride = q_stride;
  ASSERT_TRUE(Attention(a, nullptr).ok());
  KVD_CUDA_SYNC();
  std::vector<float> out;
  KVD_CUDA_ASSERT(dout.Download(&out));
  std::vector<float> packed(nq * q_width);
  for (int64_t i = 0; i < nq; ++i) {
    std::memcpy(&packed[i * q_width], &out[i * q_stride], q_width * 4);
    for (int64_t j = q_width; j < q_stride; ++j)
      ASSERT_TRUE(std::isnan(out[i * q_stride + j]));
  }
  EXPECT_LT(testing::RelativeError(packed.data(), want.data(), packed.size()),
            1e-5);

  // A few queries alone (nq = 1) give the same bits as inside the batch.
  for (int64_t i : {int64_t{0}, c.positions / 2, nq - 2}) {
    AttentionArgs one = a;
    one.q = dq.get() + i * q_stride;
    one.nq = 1;
    one.last = dlast.get() + i;
    one.out = dout1.get();
    KVD_CUDA_ASSERT(dout1.Poison());
    ASSERT_TRUE(Attention(one, nullptr).ok());
    KVD_CUDA_SYNC();
    std::vector<float> single;
    KVD_CUDA_ASSERT(dout1.Download(&single));
    ASSERT_EQ(std::memcmp(single.data(), &out[i * q_stride], q_width * 4), 0)
        << "query " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionTest,
    ::testing::Values(Case{4, 4, 64, 100, 0},   // MHA
                      Case{8, 2, 128, 257, 0},  // GQA, ragged
                      Case{4, 1, 256, 70, 0},   // gemma-like dims
                      Case{6, 3, 80, 200, 45},  // sliding window
                      Case{2, 2, 16, 33, 1}));  // window of one

}  // namespace
}  // namespace kvd::kernels::cuda
