// Device allocations of the CUDA model code (cuda_forward.h, TpCudaModel):
// weights uploaded from a loaded CPU model, and step buffers, owned by one
// DeviceMemory per device that frees them with that device current.
//
//   DeviceMemory mem;
//   mem.device = 0;
//   KVD_ASSIGN_OR_RETURN(DeviceMatrix wq, mem.Matrix(lw.wq, "blk.0.attn_q"));
//   float* h = nullptr;
//   KVD_RETURN_IF_ERROR(mem.Alloc(&h, rows * d_model, "step buffers"));
//
// Thread-safety: none; the owning model serialises its use. The caller
// makes `device` current before allocating.
#ifndef KVD_OPS_BACKEND_INTERNAL_DEVICE_MEMORY_H_
#define KVD_OPS_BACKEND_INTERNAL_DEVICE_MEMORY_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/gemm.h"
#include "ops/backend/tensor_parallel_plan.h"
#include "ops/model/weights.h"

namespace kvd::ops::internal {

// A bf16 matrix on the device in the GEMM's layout (rows x cols, dense).
struct DeviceMatrix {
  const uint16_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  kernels::cuda::Bf16Weights view() const { return {data, rows, cols, cols}; }
};

struct DeviceMemory {
  int device = 0;
  std::vector<void*> allocations;

  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() { Free(); }
  // Frees every allocation (with `device` current).
  void Free();

  // At least 16 bytes; RESOURCE_EXHAUSTED or INTERNAL naming `what`.
  absl::StatusOr<void*> Alloc(size_t bytes, absl::string_view what);
  template <typename T>
  absl::Status Alloc(T** p, int64_t n, absl::string_view what) {
    absl::StatusOr<void*> raw =
        Alloc(std::max<int64_t>(n, 1) * sizeof(T), what);
    if (!raw.ok()) return raw.status();
    *p = static_cast<T*>(*raw);
    return absl::OkStatus();
  }
  // Elements `r` of `v` on the device; null for an empty vector.
  absl::StatusOr<const float*> Vector(const std::vector<float>& v, IndexRange r,
                                      absl::string_view what);
  absl::StatusOr<const float*> Vector(const std::vector<float>& v,
                                      absl::string_view what);
  // Rows `rows` and columns `cols` of a bf16 matrix, dense on the device;
  // UNIMPLEMENTED if the loaded model's weight is not bf16.
  absl::StatusOr<DeviceMatrix> Matrix(const ops::Matrix& m, IndexRange rows,
                                      IndexRange cols, absl::string_view what);
  absl::StatusOr<DeviceMatrix> Matrix(const ops::Matrix& m,
                                      absl::string_view what);
};

// cudaFree(p) on `device`, leaving the calling thread's current device as it
// was (memory may be freed on any thread, after its model).
void FreeOnDevice(int device, void* p);

// Page-locked host memory for asynchronous downloads, grown on demand
// (at least doubling) and reused; freed when destroyed.
class PinnedHostFloats {
 public:
  PinnedHostFloats() = default;
  PinnedHostFloats(const PinnedHostFloats&) = delete;
  PinnedHostFloats& operator=(const PinnedHostFloats&) = delete;
  ~PinnedHostFloats();
  // At least `floats` floats. Before growing it calls `wait_for_copies`
  // (the old buffer may still be the target of an enqueued copy);
  // RESOURCE_EXHAUSTED or INTERNAL if the memory cannot be had.
  absl::StatusOr<float*> Get(
      int64_t floats, const std::function<absl::Status()>& wait_for_copies);

 private:
  float* data_ = nullptr;
  int64_t floats_ = 0;
};

}  // namespace kvd::ops::internal

#endif  // KVD_OPS_BACKEND_INTERNAL_DEVICE_MEMORY_H_
