// The one adapter from cudaError_t to absl::Status (STYLE.md: foreign results
// are converted at the boundary). Included only by .cu files and device tests,
// which already depend on the CUDA runtime headers.
#ifndef KVD_KERNELS_CUDA_INTERNAL_CUDA_CHECK_H_
#define KVD_KERNELS_CUDA_INTERNAL_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvd::kernels::cuda::internal {

// Launch failures with bad configurations and sticky device errors are both
// reported; neither is retryable by the caller, so both map to INTERNAL except
// out-of-memory, which a caller can handle by shrinking the batch.
inline absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  // A failed runtime call (an allocation that did not fit, ...) stays the
  // thread's last error until read: clear it, or the next launch's check
  // (LastLaunchStatus) would report it again and fail a step that is fine.
  // Sticky errors (a faulted context) come back from every later call.
  (void)cudaGetLastError();
  const std::string msg =
      absl::StrCat(what, ": CUDA error ", static_cast<int>(err), " (",
                   cudaGetErrorName(err), ": ", cudaGetErrorString(err), ")");
  if (err == cudaErrorMemoryAllocation)
    return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

// Checks the launch just made (configuration errors surface here, not at the
// <<<>>> site). Asynchronous faults surface at the caller's next sync.
inline absl::Status LastLaunchStatus(absl::string_view kernel) {
  return CudaStatus(cudaGetLastError(), absl::StrCat("launching ", kernel));
}

}  // namespace kvd::kernels::cuda::internal

#endif  // KVD_KERNELS_CUDA_INTERNAL_CUDA_CHECK_H_
