#include "kernels/cpu/gemm.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/testing/gemm_contract.h"

namespace kvd::kernels::cpu {
namespace {

using testing::ContractDot;
using testing::ContractPairDot;
using testing::ContractPairGrouped;
using testing::IsaGuard;
using testing::RandomVector;
using testing::SameBits;
using testing::SupportedIsas;

std::vector<float> RunGemm(const std::vector<float>& x, int64_t m, int64_t k,
                           const WeightView& w, ThreadPool* pool) {
  std::vector<float> y(m * w.rows, std::nanf(""));
  Gemm(x.data(), m, k, w, y.data(), w.rows, pool);
  return y;
}

class GemmShapes
    : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(GemmShapes, FollowsContractBitForBitOnEveryIsaBatchAndThreadCount) {
  const auto [n, k] = GetParam();
  const int64_t m = 67;  // not a multiple of any tile height
  const std::vector<float> x = RandomVector(m * k, 1);
  const std::vector<float> wf = RandomVector(n * k, 2);
  std::vector<uint16_t> wb(n * k);
  FloatToBf16(wf.data(), wb.data(), n * k);
  std::vector<float> wb_as_f32(n * k);
  Bf16ToFloat(wb.data(), wb_as_f32.data(), n * k);

  for (const bool bf16 : {false, true}) {
    const std::vector<float>& w_values = bf16 ? wb_as_f32 : wf;
    const WeightView w = bf16 ? WeightView{WeightType::kBf16, wb.data(), n, k}
                              : WeightView{WeightType::kF32, wf.data(), n, k};
    std::vector<float> expected(m * n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        expected[i * n + j] = ContractDot(&x[i * k], &w_values[j * k], k);

    for (Isa isa : SupportedIsas()) {
      IsaGuard guard(isa);
      SCOPED_TRACE(std::string(IsaName(isa)) + (bf16 ? " bf16" : " f32"));
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        EXPECT_TRUE(SameBits(RunGemm(x, m, k, w, &pool), expected))
            << threads << " threads";
      }
      // Batch invariance: each row alone equals the row inside the batch of m.
      for (int64_t i = 0; i < m; i += 13) {
        std::vector<float> row(x.begin() + i * k, x.begin() + (i + 1) * k);
        std::vector<float> got = RunGemm(row, 1, k, w, nullptr);
        std::vector<float> want(expected.begin() + i * n,
                                expected.begin() + (i + 1) * n);
        EXPECT_TRUE(SameBits(got, want)) << "row " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmShapes,
    ::testing::Values(std::make_tuple(int64_t{37}, int64_t{576}),
                      std::make_tuple(int64_t{8}, int64_t{64}),
                      std::make_tuple(int64_t{19}, int64_t{100}),
                      std::make_tuple(int64_t{5}, int64_t{7}),
                      std::make_tuple(int64_t{64}, int64_t{1536})));

// The bf16 mode's pair contract (internal/gemm_pairs.h): every path (native
// vdpbf16ps where the machine has it, the AVX2 and scalar emulations) gives
// the contract's bits, whatever the batch, threads and row-parallel groups.
class PairShapes
    : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t>> {};

TEST_P(PairShapes, FollowPairContractBitForBitOnEveryIsaBatchAndThreadCount) {
  const auto [n, k, groups] = GetParam();
  const int64_t m = 67;
  const std::vector<float> x = RandomVector(m * k, 11);
  const std::vector<float> wf = RandomVector(n * k, 12);
  std::vector<uint16_t> wb(n * k);
  FloatToBf16(wf.data(), wb.data(), n * k);
  WeightView w{WeightType::kBf16, wb.data(), n, k};
  w.bf16_pairs = true;
  std::vector<float> expected(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      expected[i * n + j] =
          ContractPairGrouped(&x[i * k], &wb[j * k], k, groups);
  // Not the fp32 contract: the activations' rounding and the order show.
  std::vector<float> wb_as_f32(n * k);
  Bf16ToFloat(wb.data(), wb_as_f32.data(), n * k);
  int differ = 0;
  for (int64_t i = 0; i < m; ++i)
    differ += expected[i * n] != ContractDot(&x[i * k], &wb_as_f32[0], k);
  EXPECT_GT(differ, 0);

  for (Isa isa : SupportedIsas()) {
    IsaGuard guard(isa);
    SCOPED_TRACE(std::string(IsaName(isa)) +
                 (isa == Isa::kAvx512 && HasAvx512Bf16() ? " (vdpbf16ps)"
                                                         : " (emulated)"));
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      std::vector<float> y(m * n, std::nanf(""));
      GroupedGemm(x.data(), m, k, w, groups, y.data(), n, &pool);
      EXPECT_TRUE(SameBits(y, expected)) << threads << " threads";
    }
    for (int64_t i = 0; i < m; i += 13) {
      std::vector<float> y(n, std::nanf(""));
      GroupedGemm(&x[i * k], 1, k, w, groups, y.data(), n, nullptr);
      EXPECT_TRUE(
          SameBits(y, std::vector<float>(expected.begin() + i * n,
                                         expected.begin() + (i + 1) * n)))
          << "row " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PairShapes,
    ::testing::Values(std::make_tuple(int64_t{37}, int64_t{576}, int64_t{1}),
                      std::make_tuple(int64_t{37}, int64_t{576}, int64_t{3}),
                      std::make_tuple(int64_t{19}, int64_t{100}, int64_t{1}),
                      std::make_tuple(int64_t{5}, int64_t{7}, int64_t{1}),
                      std::make_tuple(int64_t{8}, int64_t{48}, int64_t{2}),
                      std::make_tuple(int64_t{64}, int64_t{1536}, int64_t{3})));

// Products and sums in the subnormal range: every path flushes them as
// vdpbf16ps does (bf16_pairs_hw_test checks the instruction itself).
TEST(GemmPairs, FlushesSubnormalsOnEveryIsa) {
  const int64_t m = 5, n = 7, k = 96;
  std::mt19937 rng(5);
  std::vector<float> x(m * k);
  std::vector<uint16_t> wb(n * k);
  for (float& v : x) {
    // Around 2^-60 .. 2^-70, some exactly subnormal once rounded to bf16.
    const int e = -(60 + static_cast<int>(rng() % 11));
    v = std::ldexp(1.0f + (rng() % 128) / 128.0f, e) * (rng() % 2 ? 1 : -1);
    if (rng() % 7 == 0) v = std::ldexp(1.0f, -130);
  }
  for (uint16_t& v : wb) {
    const int e = -(56 + static_cast<int>(rng() % 11));
    v = FloatToBf16(std::ldexp(1.0f + (rng() % 128) / 128.0f, e) *
                    (rng() % 2 ? 1 : -1));
    if (rng() % 9 == 0) v = static_cast<uint16_t>(rng() % 0x80);  // subnormal
  }
  WeightView w{WeightType::kBf16, wb.data(), n, k};
  w.bf16_pairs = true;
  std::vector<float> expected(m * n);
  int zeros = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      expected[i * n + j] = ContractPairDot(&x[i * k], &wb[j * k], k);
      zeros += expected[i * n + j] == 0.0f;
    }
  EXPECT_GT(zeros, 0) << "the data should reach the flushed range";
  for (Isa isa : SupportedIsas()) {
    IsaGuard guard(isa);
    SCOPED_TRACE(IsaName(isa));
    std::vector<float> y(m * n, std::nanf(""));
    Gemm(x.data(), m, k, w, y.data(), n, nullptr);
    EXPECT_TRUE(SameBits(y, expected));
  }
}

TEST(Gemm, AgreesWithFloat64Reference) {
  const int64_t m = 9, n = 33, k = 1000;
  const std::vector<float> x = RandomVector(m * k, 3);
  const std::vector<float> w = RandomVector(n * k, 4);
  ThreadPool pool(2);
  const std::vector<float> y =
      RunGemm(x, m, k, WeightView{WeightType::kF32, w.data(), n, k}, &pool);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0, mag = 0;
      for (int64_t t = 0; t < k; ++t) {
        ref += static_cast<double>(x[i * k + t]) * w[j * k + t];
        mag += std::fabs(static_cast<double>(x[i * k + t]) * w[j * k + t]);
      }
      // Summation error bound for fp32 accumulation of k terms, with a safety
      // factor.
      EXPECT_NEAR(y[i * n + j], ref, 1e-6 * mag + 1e-6) << i << "," << j;
    }
  }
}

TEST(Gemm, StridedInputsAndOutputs) {
  const int64_t m = 5, n = 6, k = 48, ldx = 64, ldy = 10, ldw = 50;
  const std::vector<float> x = RandomVector(m * ldx, 5);
  const std::vector<float> w = RandomVector(n * ldw, 6);
  std::vector<float> y(m * ldy, -7.0f);
  Gemm(x.data(), m, ldx, WeightView{WeightType::kF32, w.data(), n, k, ldw},
       y.data(), ldy, nullptr);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldy; ++j) {
      if (j < n) {
        EXPECT_EQ(y[i * ldy + j], ContractDot(&x[i * ldx], &w[j * ldw], k));
      } else {
        EXPECT_EQ(y[i * ldy + j], -7.0f) << "wrote past the output row";
      }
    }
  }
}

}  // namespace
}  // namespace kvd::kernels::cpu
