// Device test (tag requires-gpu): the tensor-core GEMM against a float64 host
// reference on fresh random inputs, with NaN-poisoned outputs, and its batch
// invariance: a row's bits do not depend on m, the tile configuration, the
// load path (vector or scalar) or the activation dtype.
#include "kernels/cuda/gemm.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/internal/test_util.h"

namespace kvd::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::HostBf16ToFloat;
using testing::HostToBf16;

struct Shape {
  int64_t m, n, k;
};

// y_ref in float64 from the operands the contract says the kernel multiplies:
// bf16 weights and activations rounded to bf16.
std::vector<double> Reference(const std::vector<float>& x, int64_t ldx,
                              const std::vector<uint16_t>& w, int64_t ldw,
                              const Shape& s) {
  std::vector<double> y(s.m * s.n);
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double acc = 0;
      for (int64_t kk = 0; kk < s.k; ++kk) {
        acc +=
            static_cast<double>(HostBf16ToFloat(HostToBf16(x[i * ldx + kk]))) *
            HostBf16ToFloat(w[j * ldw + kk]);
      }
      y[i * s.n + j] = acc;
    }
  }
  return y;
}

class GemmTest : public ::testing::TestWithParam<Shape> {};

TEST_P(GemmTest, MatchesFloat64ReferenceWithEveryTileAndDtype) {
  KVD_REQUIRE_GPU();
  const Shape s = GetParam();
  std::mt19937_64 rng(testing::TestSeed());
  const int64_t ldx = s.k + 8, ldw = s.k + 16, ldy = s.n + 3;
  const std::vector<float> x = testing::RandomFloats(s.m * ldx, &rng);
  const std::vector<uint16_t> w = testing::RandomBf16(s.n * ldw, &rng);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = HostToBf16(x[i]);
  const std::vector<double> want = Reference(x, ldx, w, ldw, s);

  DeviceBuffer<float> dx(x.size());
  DeviceBuffer<uint16_t> dxb(xb.size()), dw(w.size());
  DeviceBuffer<float> dy(s.m * ldy);
  KVD_CUDA_ASSERT(dx.status());
  KVD_CUDA_ASSERT(dxb.status());
  KVD_CUDA_ASSERT(dw.status());
  KVD_CUDA_ASSERT(dy.status());
  KVD_CUDA_ASSERT(dx.Upload(x));
  KVD_CUDA_ASSERT(dxb.Upload(xb));
  KVD_CUDA_ASSERT(dw.Upload(w));

  std::vector<float> first;
  for (GemmTile tile :
       {GemmTile::kAuto, GemmTile::kDecode, GemmTile::kPrefill}) {
    for (ActType type : {ActType::kF32, ActType::kBf16}) {
      SCOPED_TRACE(::testing::Message() << "tile=" << static_cast<int>(tile)
                                        << " type=" << static_cast<int>(type));
      KVD_CUDA_ASSERT(dy.Poison());
      const void* xp = type == ActType::kF32
                           ? static_cast<const void*>(dx.get())
                           : dxb.get();
      ASSERT_TRUE(Gemm({xp, type, s.m, ldx}, {dw.get(), s.n, s.k, ldw},
                       dy.get(), ldy, nullptr, tile)
                      .ok());
      KVD_CUDA_SYNC();
      std::vector<float> y;
      KVD_CUDA_ASSERT(dy.Download(&y));
      std::vector<float> packed(s.m * s.n);
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < ldy; ++j) {
          if (j < s.n) {
            packed[i * s.n + j] = y[i * ldy + j];
          } else {
            uint32_t bits;
            std::memcpy(&bits, &y[i * ldy + j], 4);
            ASSERT_EQ(bits, 0xffffffffu) << "wrote past n at row " << i;
          }
        }
      }
      EXPECT_LT(
          testing::RelativeError(packed.data(), want.data(), packed.size()),
          1e-5);
      // All configurations and dtypes compute the same function in the same
      // order: identical bits.
      if (first.empty()) {
        first = packed;
      } else {
        ASSERT_EQ(std::memcmp(first.data(), packed.data(), packed.size() * 4),
                  0);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmTest,
    ::testing::Values(Shape{1, 64, 64}, Shape{1, 100, 136}, Shape{3, 257, 1000},
                      Shape{16, 64, 4096}, Shape{17, 130, 77},
                      Shape{64, 512, 512}, Shape{130, 200, 264},
                      Shape{7, 33, 15}));

// Row r of a 64-row product equals the same row computed alone (decode tile,
// m = 1), in a 37-row batch at another offset, and through the unaligned
// scalar load path: bit for bit.
TEST(GemmBatchInvariance, RowBitsDoNotDependOnBatch) {
  KVD_REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed());
  const int64_t m = 64, n = 4096 + 64 + 8, k = 2048;
  const std::vector<float> x = testing::RandomFloats(m * k + 8, &rng);
  const std::vector<uint16_t> w = testing::RandomBf16(n * k + 8, &rng);
  DeviceBuffer<float> dx(x.size()), dy(m * n), dy1(m * n);
  DeviceBuffer<uint16_t> dw(w.size());
  KVD_CUDA_ASSERT(dx.status());
  KVD_CUDA_ASSERT(dy.status());
  KVD_CUDA_ASSERT(dy1.status());
  KVD_CUDA_ASSERT(dw.status());
  KVD_CUDA_ASSERT(dx.Upload(x));
  KVD_CUDA_ASSERT(dw.Upload(w));
  KVD_CUDA_ASSERT(dy.Poison());
  ASSERT_TRUE(Gemm({dx.get(), ActType::kF32, m, k}, {dw.get(), n, k, k},
                   dy.get(), n, nullptr)
                  .ok());
  KVD_CUDA_ASSERT(dy1.Poison());
  for (int64_t r = 0; r < m; ++r) {
    ASSERT_TRUE(Gemm({dx.get() + r * k, ActType::kF32, 1, k},
                     {dw.get(), n, k, k}, dy1.get() + r * n, n, nullptr)
                    .ok());
  }
  KVD_CUDA_SYNC();
  std::vector<float> batch, single;
  KVD_CUDA_ASSERT(dy.Download(&batch));
  KVD_CUDA_ASSERT(dy1.Download(&single));
  ASSERT_EQ(std::memcmp(batch.data(), single.data(), batch.size() * 4), 0)
      << "m=1 rows differ from the m=64 batch";

  // 37 rows starting at row 11.
  KVD_CUDA_ASSERT(dy1.Poison());
  ASSERT_TRUE(Gemm({dx.get() + 11 * k, ActType::kF32, 37, k},
                   {dw.get(), n, k, k}, dy1.get(), n, nullptr)
                  .ok());
  KVD_CUDA_SYNC();
  KVD_CUDA_ASSERT(dy1.Download(&single));
  ASSERT_EQ(std::memcmp(batch.data() + 11 * n, single.data(), 37 * n * 4), 0);

  // Weights one element off 16-byte alignment force the scalar load path; the
  // same weights copied there must give the same bits.
  DeviceBuffer<uint16_t> dw_off(w.size() + 1);
  KVD_CUDA_ASSERT(dw_off.status());
  KVD_CUDA_ASSERT(cudaMemcpy(dw_off.get() + 1, dw.get(), n * k * 2,
                             cudaMemcpyDeviceToDevice));
  KVD_CUDA_ASSERT(dy1.Poison());
  ASSERT_TRUE(Gemm({dx.get(), ActType::kF32, m, k}, {dw_off.get() + 1, n, k, k},
                   dy1.get(), n, nullptr)
                  .ok());
  KVD_CUDA_SYNC();
  KVD_CUDA_ASSERT(dy1.Download(&single));
  ASSERT_EQ(std::memcmp(batch.data(), single.data(), batch.size() * 4), 0);
}

}  // namespace
}  // namespace kvd::kernels::cuda
