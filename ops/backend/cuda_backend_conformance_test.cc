// The CUDA backend (CudaBackendModel) in the ModelBackend conformance suite
// (ops/model/testing/backend_conformance.h), on the random-weight llama and
// qwen2 cases of the CUDA model tests. Device test: skips without a device.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ops/backend/cuda_backend_model.h"
#include "ops/backend/cuda_probe.h"
#include "ops/backend/testing/cuda_model_cases.h"
#include "ops/model/testing/backend_conformance.h"

namespace kvd::ops::testing {
namespace {

std::vector<BackendCase> CudaCases() {
  std::vector<BackendCase> cases;
  for (const std::string family : {"llama", "qwen2"}) {
    BackendCase bc;
    bc.name = family + "_bf16_cuda";
    bc.make = [family]() -> absl::StatusOr<BackendUnderTest> {
      const DeviceProbe probe = ProbeCudaDevices();
      if (probe.device_count == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("skip: no CUDA device (", probe.detail, ")"));
      }
      absl::StatusOr<std::unique_ptr<Model>> cpu =
          LoadTinyModel(CudaCaseSpec(family), Precision::kBf16);
      if (!cpu.ok()) return cpu.status();
      absl::StatusOr<std::unique_ptr<CudaBackendModel>> gpu =
          CudaBackendModel::Create(**cpu);
      if (!gpu.ok()) return gpu.status();
      BackendUnderTest t;
      t.cpu_model = std::move(*cpu);
      t.owned = std::move(*gpu);
      t.backend = t.owned.get();
      return t;
    };
    cases.push_back(std::move(bc));
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cuda, ModelBackendConformanceTest,
                         ::testing::ValuesIn(CudaCases()), BackendCaseName);

}  // namespace
}  // namespace kvd::ops::testing
