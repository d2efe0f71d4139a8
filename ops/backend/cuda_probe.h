// Asks the CUDA runtime how many devices this process can use, without
// failing: a machine with no GPU, no driver, or a kvd built without the CUDA
// toolkit all answer "0 devices" with the reason in DeviceProbe::detail.
//
// Linking: when the toolkit is present at build time this links the CUDA
// runtime statically (libcudart_static.a), which loads the driver
// (libcuda.so.1) with dlopen at run time, so the kvd binary starts on
// machines with no CUDA installed at all. Without the toolkit a stub that
// reports "built without CUDA" is compiled instead (ops/backend/BUILD).
//
//   DeviceProbe p = ProbeCudaDevices();
//   if (p.device_count == 0) std::fprintf(stderr, "%s\n", p.detail.c_str());
//
// Thread-safety: safe to call from any thread; the first call initialises the
// CUDA runtime (tens of milliseconds with a driver, microseconds without).
#ifndef KVD_OPS_BACKEND_CUDA_PROBE_H_
#define KVD_OPS_BACKEND_CUDA_PROBE_H_

#include "ops/backend/backend.h"

namespace kvd::ops {

DeviceProbe ProbeCudaDevices();

// True if this binary was built with the CUDA toolkit.
bool BuiltWithCuda();

}  // namespace kvd::ops

#endif  // KVD_OPS_BACKEND_CUDA_PROBE_H_
