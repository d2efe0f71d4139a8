#include "kernels/cpu/row_parallel_gemm.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/testing/gemm_contract.h"
#include "kernels/cpu/thread_pool.h"

namespace kvd::kernels::cpu {
namespace {

using testing::ContractDot;
using testing::ContractGrouped;
using testing::IsaGuard;
using testing::RandomVector;
using testing::SameBits;
using testing::SupportedIsas;

// SmolLM2-135M's W_down: 576 outputs from 1536 inputs, 3 groups (its K/V
// heads); m rows of a batch.
constexpr int64_t kM = 5, kN = 576, kK = 1536, kGroups = 3;

// Every ISA, decode (one row) and batch shapes, fp32 and bf16 weights.
TEST(GroupedGemm, FollowsTheContractBitForBit) {
  const std::vector<float> x = RandomVector(kM * kK, 1);
  const std::vector<float> wf = RandomVector(kN * kK, 2);
  std::vector<uint16_t> wb(wf.size());
  FloatToBf16(wf.data(), wb.data(), wf.size());
  std::vector<float> wb_wide(wf.size());  // the bf16 weights as floats
  Bf16ToFloat(wb.data(), wb_wide.data(), wb.size());
  ThreadPool pool(2);
  int64_t differs_from_ungrouped = 0;
  for (Isa isa : SupportedIsas()) {
    IsaGuard guard(isa);
    for (const bool bf16 : {false, true}) {
      const WeightView w =
          bf16 ? WeightView{WeightType::kBf16, wb.data(), kN, kK}
               : WeightView{WeightType::kF32, wf.data(), kN, kK};
      const std::vector<float>& wv = bf16 ? wb_wide : wf;
      for (const int64_t m : {int64_t{1}, kM}) {
        std::vector<float> y(m * kN);
        GroupedGemm(x.data(), m, kK, w, kGroups, y.data(), kN, &pool);
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
  // The grouping is a different order: some elements must show it (else
  // this test could not tell grouped from plain).
  EXPECT_GT(differs_from_ungrouped, 0);
}

TEST(GroupedGemm, OneGroupIsPlainGemm) {
  const std::vector<float> x = RandomVector(kM * kK, 3);
  const std::vector<float> w = RandomVector(kN * kK, 4);
  std::vector<float> a(kM * kN), b(kM * kN);
  GroupedGemm(x.data(), kM, kK, {WeightType::kF32, w.data(), kN, kK}, 1,
              a.data(), kN, nullptr);
  Gemm(x.data(), kM, kK, {WeightType::kF32, w.data(), kN, kK}, b.data(), kN,
       nullptr);
  EXPECT_TRUE(SameBits(a, b));
}

// What a shard computes (GroupPartial: its groups' partials, each apart),
// added in group order where the shards meet (AddPartial), equals the
// one-pass grouped kernel bit for bit, for fp32 and bf16 weights. Which shard
// holds which groups does not enter: every degree dividing the group count
// adds the same partials in the same order (ops/model:shard_test runs them).
TEST(GroupedGemm, PartialsComputedApartAddUpToTheSameBits) {
  constexpr int64_t groups = 6, k = 6 * 64, n = 40;
  const std::vector<float> x = RandomVector(kM * k, 5);
  const std::vector<float> wf = RandomVector(n * k, 6);
  std::vector<uint16_t> wb(n * k);
  FloatToBf16(wf.data(), wb.data(), n * k);
  for (const WeightView& w : {WeightView{WeightType::kF32, wf.data(), n, k},
                              WeightView{WeightType::kBf16, wb.data(), n, k}}) {
    std::vector<float> whole(kM * n);
    GroupedGemm(x.data(), kM, k, w, groups, whole.data(), n, nullptr);
    std::vector<float> sum(kM * n), partial(kM * n);
    GroupPartial(x.data(), kM, k, w, groups, 0, sum.data(), n, nullptr);
    for (int64_t g = 1; g < groups; ++g) {
      GroupPartial(x.data(), kM, k, w, groups, g, partial.data(), n, nullptr);
      AddPartial(partial.data(), kM, n, n, sum.data());
    }
    EXPECT_TRUE(SameBits(sum, whole))
        << (w.type == WeightType::kF32 ? "fp32" : "bf16") << " weights";
  }
}

}  // namespace
}  // namespace kvd::kernels::cpu
