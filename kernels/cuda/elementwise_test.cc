// Device test (tag requires-gpu): RMSNorm, SiLU/GELU gating and RoPE against
// float64 host formulas on fresh random inputs, with NaN-poisoned outputs and
// row-count invariance (a row's bits do not depend on how many rows share the
// launch).
#include "kernels/cuda/elementwise.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/internal/test_util.h"

namespace kvd::kernels::cuda {
namespace {

using testing::DeviceBuffer;

TEST(CudaRmsNorm, MatchesFloat64AndIsRowInvariant) {
  KVD_REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed());
  for (int64_t n : {1, 31, 576, 640, 4096, 5000}) {
    SCOPED_TRACE(n);
    const int64_t rows = 33, ld = n + 5;
    const std::vector<float> x = testing::RandomFloats(rows * ld, &rng, -4, 4);
    const std::vector<float> w = testing::RandomFloats(n, &rng, 0.5f, 1.5f);
    const float eps = 1e-6f;
    std::vector<double> want(rows * n);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < n; ++i)
        ss += double{x[r * ld + i]} * x[r * ld + i];
      const double scale = 1.0 / std::sqrt(ss / n + eps);
      for (int64_t i = 0; i < n; ++i)
        want[r * n + i] = x[r * ld + i] * scale * w[i];
    }
    DeviceBuffer<float> dx(x.size()), dw(n), dy(rows * ld), dy1(ld);
    KVD_CUDA_ASSERT(dx.status());
    KVD_CUDA_ASSERT(dw.status());
    KVD_CUDA_ASSERT(dy.status());
    KVD_CUDA_ASSERT(dy1.status());
    KVD_CUDA_ASSERT(dx.Upload(x));
    KVD_CUDA_ASSERT(dw.Upload(w));
    KVD_CUDA_ASSERT(dy.Poison());
    ASSERT_TRUE(
        RmsNorm(dx.get(), ld, dw.get(), eps, rows, n, dy.get(), ld, nullptr)
            .ok());
    KVD_CUDA_ASSERT(dy1.Poison());
    ASSERT_TRUE(RmsNorm(dx.get() + 7 * ld, ld, dw.get(), eps, 1, n, dy1.get(),
                        ld, nullptr)
                    .ok());
    KVD_CUDA_SYNC();
    std::vector<float> y, y1;
    KVD_CUDA_ASSERT(dy.Download(&y));
    KVD_CUDA_ASSERT(dy1.Download(&y1));
    std::vector<float> packed(rows * n);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(&packed[r * n], &y[r * ld], n * 4);
      for (int64_t i = n; i < ld; ++i) ASSERT_TRUE(std::isnan(y[r * ld + i]));
    }
    EXPECT_LT(testing::RelativeError(packed.data(), want.data(), packed.size()),
              1e-6);
    ASSERT_EQ(std::memcmp(&y[7 * ld], y1.data(), n * 4), 0);

    // In place (y aliases x) gives the same bits.
    ASSERT_TRUE(
        RmsNorm(dx.get(), ld, dw.get(), eps, rows, n, dx.get(), ld, nullptr)
            .ok());
    KVD_CUDA_SYNC();
    std::vector<float> inplace;
    KVD_CUDA_ASSERT(dx.Download(&inplace));
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_EQ(std::memcmp(&inplace[r * ld], &y[r * ld], n * 4), 0);
    }
  }
}

TEST(CudaGatedActivation, SiluAndGeluMatchFloat64) {
  KVD_REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed());
  const int64_t rows = 9, n = 1537, ld = 1600;
  const std::vector<float> g = testing::RandomFloats(rows * ld, &rng, -12, 12);
  const std::vector<float> u = testing::RandomFloats(rows * ld, &rng, -2, 2);
  DeviceBuffer<float> dg(g.size()), du(u.size()), dout(rows * ld);
  KVD_CUDA_ASSERT(dg.status());
  KVD_CUDA_ASSERT(du.status());
  KVD_CUDA_ASSERT(dout.status());
  KVD_CUDA_ASSERT(dg.Upload(g));
  KVD_CUDA_ASSERT(du.Upload(u));
  for (GatedAct act : {GatedAct::kSilu, GatedAct::kGeluTanh}) {
    SCOPED_TRACE(static_cast<int>(act));
    std::vector<double> want(rows * n);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        const double x = g[r * ld + i];
        const double a =
            act == GatedAct::kSilu
                ? x / (1.0 + std::exp(-x))
                : 0.5 * x *
                      (1.0 + std::tanh(0.7978845608028654 *
                                       (x + 0.044715 * x * x * x)));
        want[r * n + i] = a * u[r * ld + i];
      }
    }
    KVD_CUDA_ASSERT(dout.Poison());
    ASSERT_TRUE(GatedActivation(act, dg.get(), ld, du.get(), ld, rows, n,
                                dout.get(), ld, nullptr)
                    .ok());
    KVD_CUDA_SYNC();
    std::vector<float> out;
    KVD_CUDA_ASSERT(dout.Download(&out));
    std::vector<float> packed(rows * n);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(&packed[r * n], &out[r * ld], n * 4);
      for (int64_t i = n; i < ld; ++i) ASSERT_TRUE(std::isnan(out[r * ld + i]));
    }
    EXPECT_LT(testing::RelativeError(packed.data(), want.data(), packed.size()),
              1e-6);
  }
}

TEST(CudaRope, BothStylesMatchFloat64) {
  KVD_REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed());
  const int64_t rows = 11, n_heads = 5, head_dim = 64, rot_dim = 48;
  const int64_t ld = n_heads * head_dim + 4;
  const float base = 10000.0f;
  std::vector<int32_t> pos(rows);
  std::uniform_int_distribution<int32_t> upos(0, 40000);
  for (int32_t& p : pos) p = upos(rng);
  pos[0] = 0;
  const std::vector<float> x = testing::RandomFloats(rows * ld, &rng, -3, 3);
  DeviceBuffer<float> dx(x.size());
  DeviceBuffer<int32_t> dpos(rows);
  KVD_CUDA_ASSERT(dx.status());
  KVD_CUDA_ASSERT(dpos.status());
  KVD_CUDA_ASSERT(dpos.Upload(pos));
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    SCOPED_TRACE(static_cast<int>(style));
    std::vector<double> want(x.begin(), x.end());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < n_heads; ++h) {
        for (int64_t i = 0; i < rot_dim / 2; ++i) {
          const double theta =
              pos[r] * std::pow(double{base}, -2.0 * i / rot_dim);
          const int64_t a = r * ld + h * head_dim +
                            (style == RopeStyle::kInterleaved ? 2 * i : i);
          const int64_t b =
              r * ld + h * head_dim +
              (style == RopeStyle::kInterleaved ? 2 * i + 1 : i + rot_dim / 2);
          want[a] = x[a] * std::cos(theta) - x[b] * std::sin(theta);
          want[b] = x[a] * std::sin(theta) + x[b] * std::cos(theta);
        }
      }
    }
    KVD_CUDA_ASSERT(dx.Upload(x));
    ASSERT_TRUE(Rope(dx.get(), ld, rows, n_heads, head_dim, rot_dim, dpos.get(),
                     base, style, nullptr)
                    .ok());
    KVD_CUDA_SYNC();
    std::vector<float> got;
    KVD_CUDA_ASSERT(dx.Download(&got));
    // Dims past rot_dim and the row padding are untouched (want holds x there).
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = n_heads * head_dim; i < ld; ++i)
        ASSERT_EQ(got[r * ld + i], x[r * ld + i]);
    }
    EXPECT_LT(testing::RelativeError(got.data(), want.data(), got.size()),
              1e-6);
  }
}

}  // namespace
}  // namespace kvd::kernels::cuda
