// Device test (tag requires-gpu) of the mma.sync GEMM (GemmImpl::kMma,
// gemm_mma.cu): on fresh random inputs, its output equals the WMMA kernel's
// bit for bit for every tile, dtype, load path (16-byte copies or element
// copies) and stride; a row's bits do not depend on m; it matches a float64
// reference; and it writes exactly the [m x n] region of a NaN-poisoned y.
// kMmaGemmVerified (gemm.h) may be flipped only after this passes on the
// device.
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/internal/test_util.h"

namespace kvd::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::HostBf16ToFloat;
using testing::HostToBf16;

struct Shape {
  int64_t m, n, k;
};

// Strides: kPadded keeps every 16-byte load path eligible where k allows it
// (k % 8 == 0); kOdd forces the element-copy paths for x and W and an odd
// ldy (scalar stores).
enum class Strides { kPadded, kOdd };

struct Case {
  Shape s;
  Strides strides;
};

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "m" + std::to_string(c.s.m) + "_n" + std::to_string(c.s.n) + "_k" +
         std::to_string(c.s.k) +
         (c.strides == Strides::kPadded ? "_padded" : "_odd");
}

// y_ref in float64 from the operands the contract says the kernel multiplies:
// bf16 weights and activations rounded to bf16.
std::vector<double> Reference(const std::vector<float>& x, int64_t ldx,
                              const std::vector<uint16_t>& w, int64_t ldw,
                              const Shape& s) {
  std::vector<double> y(s.m * s.n);
  std::vector<double> xr(s.k);
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t kk = 0; kk < s.k; ++kk)
      xr[kk] = HostBf16ToFloat(HostToBf16(x[i * ldx + kk]));
    for (int64_t j = 0; j < s.n; ++j) {
      double acc = 0;
      for (int64_t kk = 0; kk < s.k; ++kk)
        acc += xr[kk] * HostBf16ToFloat(w[j * ldw + kk]);
      y[i * s.n + j] = acc;
    }
  }
  return y;
}

// Device copies of one random problem and an output with one spare row, so
// that writes past m, past n (ldy padding) and past the end all show up as
// changed poison.
class Problem {
 public:
  Problem(const Shape& s, int64_t ldx, int64_t ldw, int64_t ldy,
          std::mt19937_64* rng)
      : s_(s),
        ldx_(ldx),
        ldw_(ldw),
        ldy_(ldy),
        x_(testing::RandomFloats(s.m * ldx, rng)),
        w_(testing::RandomBf16(s.n * ldw, rng)),
        dx_(x_.size()),
        dxb_(x_.size()),
        dw_(w_.size()),
        dy_((s.m + 1) * ldy) {}

  ::testing::AssertionResult Init() {
    std::vector<uint16_t> xb(x_.size());
    for (size_t i = 0; i < x_.size(); ++i) xb[i] = HostToBf16(x_[i]);
    for (cudaError_t e :
         {dx_.status(), dxb_.status(), dw_.status(), dy_.status(),
          dx_.Upload(x_), dxb_.Upload(xb), dw_.Upload(w_)}) {
      if (e != cudaSuccess)
        return ::testing::AssertionFailure() << cudaGetErrorString(e);
    }
    return ::testing::AssertionSuccess();
  }

  const std::vector<float>& x() const { return x_; }
  const std::vector<uint16_t>& w() const { return w_; }

  // Runs Gemm on a poisoned y; returns the packed [m x n] result, failing
  // the test if anything outside it changed.
  void Run(ActType type, GemmTile tile, GemmImpl impl,
           std::vector<float>* packed) {
    KVD_CUDA_ASSERT(dy_.Poison());
    const void* xp = type == ActType::kF32 ? static_cast<const void*>(dx_.get())
                                           : dxb_.get();
    const absl::Status st =
        Gemm({xp, type, s_.m, ldx_}, {dw_.get(), s_.n, s_.k, ldw_}, dy_.get(),
             ldy_, nullptr, tile, impl);
    ASSERT_TRUE(st.ok()) << st;
    KVD_CUDA_SYNC();
    std::vector<float> y;
    KVD_CUDA_ASSERT(dy_.Download(&y));
    std::vector<uint8_t> tail(16);
    KVD_CUDA_ASSERT(cudaMemcpy(tail.data(), dy_.get() + y.size(), 16,
                               cudaMemcpyDeviceToHost));
    for (uint8_t b : tail) ASSERT_EQ(b, 0xff) << "wrote past the buffer";
    packed->assign(s_.m * s_.n, 0.0f);
    for (int64_t i = 0; i <= s_.m; ++i) {
      for (int64_t j = 0; j < ldy_; ++j) {
        const float v = y[i * ldy_ + j];
        if (i < s_.m && j < s_.n) {
          (*packed)[i * s_.n + j] = v;
        } else {
          uint32_t bits;
          std::memcpy(&bits, &v, 4);
          ASSERT_EQ(bits, 0xffffffffu)
              << "wrote outside [m x n] at row " << i << " column " << j;
        }
      }
    }
  }

 private:
  Shape s_;
  int64_t ldx_, ldw_, ldy_;
  std::vector<float> x_;
  std::vector<uint16_t> w_;
  DeviceBuffer<float> dx_;
  DeviceBuffer<uint16_t> dxb_, dw_;
  DeviceBuffer<float> dy_;
};

::testing::AssertionResult SameBits(const std::vector<float>& a,
                                    const std::vector<float>& b, int64_t n) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    if (x != y) {
      return ::testing::AssertionFailure()
             << "first difference at row " << i / n << " column " << i % n
             << ": " << a[i] << " (0x" << std::hex << x << ") vs " << b[i]
             << " (0x" << y << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

class GemmMmaTest : public ::testing::TestWithParam<Case> {};

TEST_P(GemmMmaTest, EqualsWmmaBitForBitAndMatchesFloat64) {
  KVD_REQUIRE_GPU();
  const Shape s = GetParam().s;
  const bool padded = GetParam().strides == Strides::kPadded;
  std::mt19937_64 rng(testing::TestSeed());
  // Padded: multiples of 8 above k (16-byte rows whenever k % 8 == 0); odd:
  // never a multiple of 4, so every operand takes the element-copy path.
  const int64_t ldx = padded ? (s.k + 15) / 8 * 8 : s.k + 3;
  const int64_t ldw = padded ? (s.k + 23) / 8 * 8 : s.k + 1;
  const int64_t ldy = padded ? s.n + 6 : s.n + 3;
  Problem p(s, ldx, ldw, ldy, &rng);
  ASSERT_TRUE(p.Init());
  const std::vector<double> want = Reference(p.x(), ldx, p.w(), ldw, s);

  for (ActType type : {ActType::kF32, ActType::kBf16}) {
    SCOPED_TRACE(::testing::Message() << "type=" << static_cast<int>(type));
    std::vector<float> wmma;
    p.Run(type, GemmTile::kAuto, GemmImpl::kWmma, &wmma);
    if (HasFatalFailure()) return;
    EXPECT_LT(testing::RelativeError(wmma.data(), want.data(), wmma.size()),
              1e-5);
    for (GemmTile tile :
         {GemmTile::kAuto, GemmTile::kDecode, GemmTile::kPrefill}) {
      SCOPED_TRACE(::testing::Message() << "tile=" << static_cast<int>(tile));
      std::vector<float> mma;
      p.Run(type, tile, GemmImpl::kMma, &mma);
      if (HasFatalFailure()) return;
      // The reference has the bf16-rounded operands, so what is left is fp32
      // accumulation error (~1e-7 per step); 1e-5 is far below the 1e-3 a
      // wrong rounding or a dropped k step would give.
      EXPECT_LT(testing::RelativeError(mma.data(), want.data(), mma.size()),
                1e-5);
      ASSERT_TRUE(SameBits(mma, wmma, s.n)) << "mma vs wmma";
    }
  }
}

std::vector<Case> Cases() {
  // m over decode and prefill sizes and their tile edges (16, 128) and more
  // than one 8-tile raster group (1300 rows: 11 m tiles); n and k with tails
  // (k % 16, k % 32 and k % 64 nonzero, k < 16), n not a multiple of 8, 16 or
  // 128.
  const Shape shapes[] = {
      {1, 64, 64},      {1, 100, 136},   {1, 1000, 4096},  {2, 33, 15},
      {7, 130, 77},     {16, 64, 4096},  {16, 257, 1000},  {17, 130, 88},
      {64, 512, 512},   {129, 200, 264}, {300, 257, 1000}, {1024, 136, 72},
      {1024, 264, 520}, {1300, 136, 56},
  };
  std::vector<Case> cases;
  for (const Shape& s : shapes) {
    cases.push_back({s, Strides::kPadded});
    cases.push_back({s, Strides::kOdd});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmMmaTest, ::testing::ValuesIn(Cases()),
                         Name);

// A row's bits are the same computed alone (m = 1: the decode tile), inside an
// m = 300 batch (the prefill tile, several raster positions) and inside a
// 37-row batch at another offset: bit for bit, and equal to WMMA's.
TEST(GemmMmaBatchInvariance, RowBitsDoNotDependOnBatch) {
  KVD_REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed());
  const int64_t m = 300, n = 1000 + 8, k = 1000;
  const std::vector<float> x = testing::RandomFloats(m * k, &rng);
  const std::vector<uint16_t> w = testing::RandomBf16(n * k, &rng);
  DeviceBuffer<float> dx(x.size()), dy(m * n), dy1(m * n);
  DeviceBuffer<uint16_t> dw(w.size());
  KVD_CUDA_ASSERT(dx.status());
  KVD_CUDA_ASSERT(dy.status());
  KVD_CUDA_ASSERT(dy1.status());
  KVD_CUDA_ASSERT(dw.status());
  KVD_CUDA_ASSERT(dx.Upload(x));
  KVD_CUDA_ASSERT(dw.Upload(w));
  const Bf16Weights wt{dw.get(), n, k, k};

  KVD_CUDA_ASSERT(dy.Poison());
  ASSERT_TRUE(Gemm({dx.get(), ActType::kF32, m, k}, wt, dy.get(), n, nullptr,
                   GemmTile::kAuto, GemmImpl::kMma)
                  .ok());
  KVD_CUDA_ASSERT(dy1.Poison());
  for (int64_t r = 0; r < m; ++r) {
    ASSERT_TRUE(Gemm({dx.get() + r * k, ActType::kF32, 1, k}, wt,
                     dy1.get() + r * n, n, nullptr, GemmTile::kAuto,
                     GemmImpl::kMma)
                    .ok());
  }
  KVD_CUDA_SYNC();
  std::vector<float> batch, single;
  KVD_CUDA_ASSERT(dy.Download(&batch));
  KVD_CUDA_ASSERT(dy1.Download(&single));
  ASSERT_TRUE(SameBits(batch, single, n)) << "m=1 rows vs the m=300 batch";

  KVD_CUDA_ASSERT(dy1.Poison());
  ASSERT_TRUE(Gemm({dx.get() + 11 * k, ActType::kF32, 37, k}, wt, dy1.get(), n,
                   nullptr, GemmTile::kAuto, GemmImpl::kMma)
                  .ok());
  KVD_CUDA_SYNC();
  KVD_CUDA_ASSERT(dy1.Download(&single));
  std::vector<float> a(batch.begin() + 11 * n, batch.begin() + 48 * n);
  std::vector<float> b(single.begin(), single.begin() + 37 * n);
  ASSERT_TRUE(SameBits(a, b, n)) << "rows 11..47 as a 37-row batch";

  KVD_CUDA_ASSERT(dy1.Poison());
  ASSERT_TRUE(Gemm({dx.get(), ActType::kF32, m, k}, wt, dy1.get(), n, nullptr,
                   GemmTile::kAuto, GemmImpl::kWmma)
                  .ok());
  KVD_CUDA_SYNC();
  KVD_CUDA_ASSERT(dy1.Download(&single));
  ASSERT_TRUE(SameBits(batch, single, n)) << "mma vs wmma at m=300";
}

// Llama-3-8B's K/V projection shape at recompute and decode sizes, bf16 and
// fp32 activations: the production shapes, bit for bit against WMMA (no
// float64 reference: too slow on the host at this size).
TEST(GemmMmaLargeShapes, EqualsWmmaAtModelShapes) {
  KVD_REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed());
  const int64_t n = 1024, k = 4096;
  for (int64_t m : {int64_t{1}, int64_t{4}, int64_t{2048}}) {
    SCOPED_TRACE(::testing::Message() << "m=" << m);
    Problem p({m, n, k}, k, k, n, &rng);
    ASSERT_TRUE(p.Init());
    for (ActType type : {ActType::kF32, ActType::kBf16}) {
      std::vector<float> wmma, mma;
      p.Run(type, GemmTile::kAuto, GemmImpl::kWmma, &wmma);
      if (HasFatalFailure()) return;
      p.Run(type, GemmTile::kAuto, GemmImpl::kMma, &mma);
      if (HasFatalFailure()) return;
      ASSERT_TRUE(SameBits(mma, wmma, n)) << "type " << static_cast<int>(type);
    }
  }
}

}  // namespace
}  // namespace kvd::kernels::cuda
