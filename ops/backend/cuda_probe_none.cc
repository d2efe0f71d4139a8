// The probe for builds without the CUDA toolkit (see cuda_probe.h).
#include "ops/backend/cuda_probe.h"

namespace kvd::ops {

bool BuiltWithCuda() { return false; }

DeviceProbe ProbeCudaDevices() {
  DeviceProbe p;
  p.detail =
      "this kvd was built without the CUDA toolkit (/usr/local/cuda or "
      "$CUDA_PATH at build time)";
  return p;
}

}  // namespace kvd::ops
