// Test-only scaffolding shared by the engine's tests: a fixture holding a
// tiny model of the test parameter's family and precision with its
// tokenizer, and a bit-for-bit comparison of per-step logits. An engine and
// its store over that model come from EngineTest (engine_fixture.h).
//
// Thread-safety: the members are set in SetUp on the test thread and only
// read afterwards, so the test's threads may share them.
//
// Usage:
//   class MyTest : public testing::TinyModelTest {
//    protected:
//     void SetUp() override { LoadModel(ops::testing::TinyModelSpec()); }
//   };
//   TEST_P(MyTest, Works) {
//     ops::KvCache cache = model_->NewCache();
//     Generate(*model_, *tokenizer_, request, &cache, nullptr);
//   }
//   INSTANTIATE_TEST_SUITE_P(Families, MyTest,
//       ::testing::ValuesIn(ops::testing::AllFamilyCases()),
//       ops::testing::FamilyCaseName);
#ifndef KVD_SERVICES_ENGINE_TESTING_MODEL_FIXTURE_H_
#define KVD_SERVICES_ENGINE_TESTING_MODEL_FIXTURE_H_

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "ops/model/model.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"
#include "ops/tokenizer/tokenizer.h"

namespace kvd::engine::testing {

// Success if both hold the same number of steps and every step's logits have
// the same length and the same bits; otherwise says which step differs.
::testing::AssertionResult LogitsBitIdentical(
    const std::vector<std::vector<float>>& want,
    const std::vector<std::vector<float>>& got);

// Parameterized by model family and precision (ops::testing::AllFamilyCases).
class TinyModelTest
    : public ::testing::TestWithParam<ops::testing::FamilyCase> {
 protected:
  // Loads model_ and tokenizer_: `spec` with the parameter's family, at the
  // parameter's precision. Fails the test fatally if either cannot load.
  void LoadModel(ops::testing::TinyModelSpec spec);

  std::unique_ptr<ops::Model> model_;
  std::unique_ptr<ops::Tokenizer> tokenizer_;
};

}  // namespace kvd::engine::testing

#endif  // KVD_SERVICES_ENGINE_TESTING_MODEL_FIXTURE_H_
