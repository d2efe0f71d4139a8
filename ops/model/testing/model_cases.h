// Shared parameters for tests that run every model family in both precision
// modes on tiny random models (ops/model/testing/tiny_model.h). Test-only.
//
//   INSTANTIATE_TEST_SUITE_P(Families, MyTest,
//   ::testing::ValuesIn(testing::AllFamilyCases()),
//                            testing::FamilyCaseName);
#ifndef KVD_OPS_MODEL_TESTING_MODEL_CASES_H_
#define KVD_OPS_MODEL_TESTING_MODEL_CASES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ops/model/model_config.h"

namespace kvd::ops::testing {

struct FamilyCase {
  std::string family;  // llama, qwen2 or gemma3
  Precision precision;
};

// llama, qwen2 and gemma3, each in fp32 and bf16.
std::vector<FamilyCase> AllFamilyCases();

// "llama_fp32", ...: a test-name suffix.
std::string FamilyCaseName(const ::testing::TestParamInfo<FamilyCase>& info);

// n token ids drawn uniformly from [0, vocab) by a seeded std::mt19937.
std::vector<int32_t> RandomTokens(int n, uint32_t seed, int64_t vocab);

}  // namespace kvd::ops::testing

#endif  // KVD_OPS_MODEL_TESTING_MODEL_CASES_H_
