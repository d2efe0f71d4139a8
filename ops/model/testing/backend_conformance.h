// The conformance suite every ops::ModelBackend registers into
// (model_backend.h): what the engine relies on, checked only through the
// interface, so the same cases run on the CPU backend in CI and on the CUDA
// backend on a GPU. Bits are compared between runs of the same backend
// (logits of a decode step after each way of filling a cache), never
// between backends, and never by reading cache rows, which a device
// backend's host cannot touch. Test-only.
//
// A backend registers a factory per case:
//
//   INSTANTIATE_TEST_SUITE_P(
//       Cpu, ModelBackendConformanceTest,
//       ::testing::Values(BackendCase{"llama_bf16", [] { ... }}),
//       BackendCaseName);
//
// The library is alwayslink: its TEST_Ps exist in every binary that links
// it, and run for each case the binary registers.
#ifndef KVD_OPS_MODEL_TESTING_BACKEND_CONFORMANCE_H_
#define KVD_OPS_MODEL_TESTING_BACKEND_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "ops/model/model.h"
#include "ops/model/model_backend.h"

namespace kvd::ops::testing {

// What a factory returns: the backend under test, and whatever it needs kept
// alive (the CPU model a GPU backend was uploaded from, or the backend
// itself when it is the CPU model).
struct BackendUnderTest {
  std::unique_ptr<Model> cpu_model;
  std::unique_ptr<ModelBackend> owned;
  const ModelBackend* backend = nullptr;
};

struct BackendCase {
  std::string name;  // a test-name suffix: [A-Za-z0-9_]
  // Builds the backend; a skip reason (e.g. no device) as FAILED_PRECONDITION
  // starting "skip: " makes the case skip instead of fail.
  std::function<absl::StatusOr<BackendUnderTest>()> make;
};

std::string BackendCaseName(const ::testing::TestParamInfo<BackendCase>& info);

class ModelBackendConformanceTest
    : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override;

  BackendUnderTest under_test_;
  const ModelBackend* backend_ = nullptr;
  std::unique_ptr<KvBlockPool> pool_;
};

}  // namespace kvd::ops::testing

#endif  // KVD_OPS_MODEL_TESTING_BACKEND_CONFORMANCE_H_
