// The CUDA backends in the ModelBackend conformance suite
// (ops/model/testing/backend_conformance.h), on the random-weight llama and
// qwen2 cases of the CUDA model tests: the single-GPU CudaBackendModel, and
// the tensor-parallel TpCudaBackendModel at degree 2 (two shards simulated on
// one GPU; its rebuild cases are the shard-local recompute). Device test:
// skips without a device.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ops/backend/cuda_backend_model.h"
#include "ops/backend/cuda_probe.h"
#include "ops/backend/testing/cuda_model_cases.h"
#include "ops/backend/tp_cuda_backend_model.h"
#include "ops/model/testing/backend_conformance.h"

namespace kvd::ops::testing {
namespace {

// degree 0: the single-GPU backend; otherwise the tensor-parallel one.
BackendCase CudaCase(const std::string& family, int degree) {
  BackendCase bc;
  bc.name = family + "_bf16_cuda" +
            (degree == 0 ? "" : "_tp" + std::to_string(degree));
  bc.make = [family, degree]() -> absl::StatusOr<BackendUnderTest> {
    const DeviceProbe probe = ProbeCudaDevices();
    if (probe.device_count == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("skip: no CUDA device (", probe.detail, ")"));
    }
    absl::StatusOr<std::unique_ptr<Model>> cpu =
        LoadTinyModel(CudaCaseSpec(family), Precision::kBf16);
    if (!cpu.ok()) return cpu.status();
    BackendUnderTest t;
    if (degree == 0) {
      absl::StatusOr<std::unique_ptr<CudaBackendModel>> gpu =
          CudaBackendModel::Create(**cpu);
      if (!gpu.ok()) return gpu.status();
      t.owned = std::move(*gpu);
    } else {
      TpCudaBackendOptions o;
      o.degree = degree;
      absl::StatusOr<std::unique_ptr<TpCudaBackendModel>> gpu =
          TpCudaBackendModel::Create(**cpu, o);
      if (!gpu.ok()) return gpu.status();
      t.owned = std::move(*gpu);
    }
    t.cpu_model = std::move(*cpu);
    t.backend = t.owned.get();
    return t;
  };
  return bc;
}

std::vector<BackendCase> CudaCases() {
  std::vector<BackendCase> cases;
  for (const std::string family : {"llama", "qwen2"}) {
    for (int degree : {0, 2}) cases.push_back(CudaCase(family, degree));
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cuda, ModelBackendConformanceTest,
                         ::testing::ValuesIn(CudaCases()), BackendCaseName);

}  // namespace
}  // namespace kvd::ops::testing
