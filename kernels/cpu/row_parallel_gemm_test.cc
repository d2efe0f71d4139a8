#include "kernels/cpu/row_parallel_gemm.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/testing/gemm_contract.h"
#include "kernels/cpu/thread_pool.h"

namespace kvd::kernels::cpu {
namespace {

using testing::ContractDot;
using testing::ContractGrouped;
using testing::RandomVector;

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// SmolLM2-135M's W_down: 576 outputs from 1536 inputs, 3 groups (its K/V
// heads); m rows of a batch.
constexpr int64_t kM = 5, kN = 576, kK = 1536, kGroups = 3;

// Every ISA, decode (one row) and batch shapes, fp32 and bf16 weights.
TEST(RowParallelGemm, FollowsTheContractBitForBit) {
  const std::vector<float> x = RandomVector(kM * kK, 1);
  const std::vector<float> wf = RandomVector(kN * kK, 2);
  std::vector<uint16_t> wb(wf.size());
  std::vector<float> wb_wide(wf.size());  // the bf16 weights as floats
  for (size_t i = 0; i < wf.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &wf[i], 4);
    wb[i] = static_cast<uint16_t>(u >> 16);
    u = static_cast<uint32_t>(wb[i]) << 16;
    std::memcpy(&wb_wide[i], &u, 4);
  }
  ThreadPool pool(2);
  const Isa saved = ActiveIsa();
  int64_t differs_from_ungrouped = 0;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    ASSERT_TRUE(SetIsa(isa).ok());
    for (const bool bf16 : {false, true}) {
      const WeightView w =
          bf16 ? WeightView{WeightType::kBf16, wb.data(), kN, kK}
               : WeightView{WeightType::kF32, wf.data(), kN, kK};
      const std::vector<float>& wv = bf16 ? wb_wide : wf;
      for (const int64_t m : {int64_t{1}, kM}) {
        std::vector<float> y(m * kN);
        RowParallelGemm(x.data(), m, kK, w, kGroups, y.data(), kN, &pool);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < kN; ++j) {
            const float want =
                ContractGrouped(&x[i * kK], &wv[j * kK], kK, kGroups);
            ASSERT_EQ(std::memcmp(&y[i * kN + j], &want, 4), 0)
                << "isa " << static_cast<int>(isa) << " bf16 " << bf16 << " m "
                << m << " at " << i << "," << j << ": " << y[i * kN + j]
                << " vs " << want;
            const float plain = ContractDot(&x[i * kK], &wv[j * kK], kK);
            differs_from_ungrouped += std::memcmp(&plain, &want, 4) != 0;
          }
        }
      }
    }
  }
  ASSERT_TRUE(SetIsa(saved).ok());
  // The grouping is a different order: some elements must show it (else
  // this test could not tell grouped from plain).
  EXPECT_GT(differs_from_ungrouped, 0);
}

TEST(RowParallelGemm, OneGroupIsPlainGemm) {
  const std::vector<float> x = RandomVector(kM * kK, 3);
  const std::vector<float> w = RandomVector(kN * kK, 4);
  std::vector<float> a(kM * kN), b(kM * kN);
  RowParallelGemm(x.data(), kM, kK, {WeightType::kF32, w.data(), kN, kK}, 1,
                  a.data(), kN, nullptr);
  Gemm(x.data(), kM, kK, {WeightType::kF32, w.data(), kN, kK}, b.data(), kN,
       nullptr);
  EXPECT_TRUE(SameBits(a, b));
}

// Shards holding whole groups compute their partials alone; added in group
// order they give the unsharded result's bits, at every degree dividing the
// group count (here 6 groups: degrees 1, 2, 3, 6), for fp32 and bf16 weights.
TEST(RowParallelGemm, EveryDegreeDividingTheGroupsGivesTheSameBits) {
  constexpr int64_t groups = 6, k = 6 * 64, n = 40;
  const std::vector<float> x = RandomVector(kM * k, 5);
  const std::vector<float> wf = RandomVector(n * k, 6);
  std::vector<uint16_t> wb(n * k);
  for (size_t i = 0; i < wf.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &wf[i], 4);
    wb[i] = static_cast<uint16_t>(u >> 16);
  }
  for (const WeightView& w : {WeightView{WeightType::kF32, wf.data(), n, k},
                              WeightView{WeightType::kBf16, wb.data(), n, k}}) {
    std::vector<float> whole(kM * n);
    RowParallelGemm(x.data(), kM, k, w, groups, whole.data(), n, nullptr);
    for (int64_t degree : {1, 2, 3, 6}) {
      // Each shard's partials, one buffer per group, as a shard ships them.
      std::vector<std::vector<float>> partials(groups,
                                               std::vector<float>(kM * n));
      const int64_t per_shard = groups / degree;
      for (int64_t s = 0; s < degree; ++s) {
        for (int64_t g = s * per_shard; g < (s + 1) * per_shard; ++g) {
          GroupPartial(x.data(), kM, k, w, groups, g, partials[g].data(), n,
                       nullptr);
        }
      }
      std::vector<float> sum = partials[0];
      for (int64_t g = 1; g < groups; ++g) {
        AddPartial(partials[g].data(), kM, n, n, sum.data());
      }
      EXPECT_TRUE(SameBits(sum, whole))
          << "degree " << degree << ", weights "
          << (w.type == WeightType::kF32 ? "fp32" : "bf16");
    }
  }
}

TEST(RowParallelGemm, AgreesWithFloat64) {
  const std::vector<float> x = RandomVector(kM * kK, 7);
  const std::vector<float> w = RandomVector(kN * kK, 8);
  std::vector<float> y(kM * kN);
  RowParallelGemm(x.data(), kM, kK, {WeightType::kF32, w.data(), kN, kK},
                  kGroups, y.data(), kN, nullptr);
  for (int64_t i = 0; i < kM; ++i) {
    for (int64_t j = 0; j < kN; ++j) {
      double want = 0, scale = 0;
      for (int64_t q = 0; q < kK; ++q) {
        want += static_cast<double>(x[i * kK + q]) * w[j * kK + q];
        scale += std::fabs(static_cast<double>(x[i * kK + q]) * w[j * kK + q]);
      }
      EXPECT_NEAR(y[i * kN + j], want, 1e-6 * scale) << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace kvd::kernels::cpu
