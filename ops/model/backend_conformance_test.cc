// The CPU backend (ops::Model) in the ModelBackend conformance suite
// (testing/backend_conformance.h): every family, both precisions.
#include "ops/model/testing/backend_conformance.h"

#include <memory>
#include <vector>

#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::ops::testing {
namespace {

std::vector<BackendCase> CpuCases() {
  std::vector<BackendCase> cases;
  for (const FamilyCase& f : AllFamilyCases()) {
    BackendCase bc;
    bc.name = f.family + (f.precision == Precision::kBf16 ? "_bf16" : "_fp32");
    bc.make = [f]() -> absl::StatusOr<BackendUnderTest> {
      TinyModelSpec spec;
      spec.family = f.family;
      spec.n_layers = 4;
      absl::StatusOr<std::unique_ptr<Model>> model =
          LoadTinyModel(spec, f.precision);
      if (!model.ok()) return model.status();
      BackendUnderTest t;
      t.cpu_model = std::move(*model);
      t.backend = t.cpu_model.get();
      return t;
    };
    cases.push_back(std::move(bc));
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cpu, ModelBackendConformanceTest,
                         ::testing::ValuesIn(CpuCases()), BackendCaseName);

}  // namespace
}  // namespace kvd::ops::testing
