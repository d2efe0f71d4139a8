#include "ops/model/testing/model_cases.h"

#include <random>

namespace kvd::ops::testing {

std::vector<FamilyCase> AllFamilyCases() {
  std::vector<FamilyCase> cases;
  for (const char* family : {"llama", "qwen2", "gemma3"}) {
    for (Precision p : {Precision::kF32, Precision::kBf16})
      cases.push_back({family, p});
  }
  return cases;
}

std::string FamilyCaseName(const ::testing::TestParamInfo<FamilyCase>& info) {
  return info.param.family + "_" + PrecisionName(info.param.precision);
}

std::vector<int32_t> RandomTokens(int n, uint32_t seed, int64_t vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

}  // namespace kvd::ops::testing
