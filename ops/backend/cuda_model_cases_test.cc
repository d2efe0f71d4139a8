// CPU only (runs in CI): the cases cuda_model_test compares the GPU against
// are not degenerate (greedy decoding visits many different tokens, and few
// of its choices are near-ties), and the CPU's own bf16 mode sits well inside
// the tolerances the GPU is held to (testing/cuda_model_cases.h).
#include "ops/backend/testing/cuda_model_cases.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "gtest/gtest.h"

namespace kvd::ops::testing {
namespace {

class CudaModelCases : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaModelCases, GreedyIsNotDegenerateAndBf16IsCloseToFp32) {
  auto bf16 = LoadTinyModel(CudaCaseSpec(GetParam()), Precision::kBf16, 2);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  auto fp32 = LoadTinyModel(CudaCaseSpec(GetParam()), Precision::kF32, 2);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  std::set<int32_t> distinct;
  int tied = 0, steps = 0, diverged = 0;
  double worst_rel = 0, worst_diff = 0;
  for (const auto& prompt : CudaCasePrompts()) {
    std::vector<std::vector<float>> logits, ref_logits;
    auto tokens = CpuGreedy(**bf16, prompt, kCudaCaseNewTokens, &logits);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    std::set<int32_t> mine(tokens->begin(), tokens->end());
    // Not stuck repeating a token or two.
    EXPECT_GE(mine.size(), 8u) << "prompt of " << prompt.size();
    distinct.insert(mine.begin(), mine.end());
    for (const auto& l : logits) {
      ++steps;
      tied += Top2Margin(l) < 0.1f;
    }
    auto ref = CpuGreedy(**fp32, prompt, kCudaCaseNewTokens, &ref_logits);
    ASSERT_TRUE(ref.ok()) << ref.status();
    size_t same = 0;
    while (same < ref->size() && (*ref)[same] == (*tokens)[same]) ++same;
    for (size_t i = 0; i < std::min(same + 1, ref->size()); ++i)
      for (size_t j = 0; j < logits[i].size(); ++j)
        worst_diff = std::max<double>(
            worst_diff, std::fabs(logits[i][j] - ref_logits[i][j]));
    if (same < ref->size()) {
      // The only tolerated disagreement: a near-tie rounding can flip.
      ++diverged;
      EXPECT_LT(Top2Margin(ref_logits[same]), 2 * worst_diff)
          << "prompt of " << prompt.size() << ", token " << same;
    }
    auto a = CpuLogits(**bf16, prompt);
    auto b = CpuLogits(**fp32, prompt);
    ASSERT_TRUE(a.ok() && b.ok());
    worst_rel = std::max(worst_rel, RelL2(*a, *b));
  }
  std::printf(
      "%s: %zu distinct tokens, %d of %d steps with top-2 margin < 0.1; "
      "CPU bf16 vs fp32: %d of %zu prompts diverge (at near-ties), max "
      "|logit diff| %.4f, worst relative L2 %.5f\n",
      GetParam().c_str(), distinct.size(), tied, steps, diverged,
      CudaCasePrompts().size(), worst_diff, worst_rel);
  EXPECT_GE(distinct.size(), 64u);
  EXPECT_LT(worst_diff, kMaxLogitDiff / 2);
  EXPECT_LT(worst_rel, kCudaLogitTolerance / 3);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaModelCases,
                         ::testing::Values("llama", "qwen2"));

}  // namespace
}  // namespace kvd::ops::testing
