// The probe for builds with the CUDA toolkit (see cuda_probe.h).
#include <cuda_runtime.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "ops/backend/cuda_probe.h"

namespace kvd::ops {

bool BuiltWithCuda() { return true; }

DeviceProbe ProbeCudaDevices() {
  DeviceProbe p;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    int driver = 0;
    cudaDriverGetVersion(&driver);  // 0 when no driver could be loaded
    p.detail = absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(err), ": ",
                            cudaGetErrorString(err));
    if (driver == 0) absl::StrAppend(&p.detail, "; no NVIDIA driver loaded");
    cudaGetLastError();  // do not leave the error for a later CUDA call
    return p;
  }
  if (count <= 0) {
    p.detail = "cudaGetDeviceCount: 0 devices";
    return p;
  }
  p.device_count = count;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    p.device_name = prop.name;
    p.detail = absl::StrCat(
        count, " device(s); device 0: ", prop.name, ", compute capability ",
        prop.major, ".", prop.minor, ", ", prop.totalGlobalMem >> 20, " MiB");
  } else {
    cudaGetLastError();
    p.device_name = "CUDA device 0";
    p.detail = absl::StrCat(count, " device(s); properties unreadable");
  }
  return p;
}

}  // namespace kvd::ops
