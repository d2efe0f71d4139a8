#include "ops/backend/internal/device_memory.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/internal/cuda_check.h"

namespace kvd::ops::internal {

using kernels::cuda::internal::CudaStatus;

void DeviceMemory::Free() {
  if (allocations.empty()) return;
  cudaSetDevice(device);
  for (void* p : allocations) cudaFree(p);
  allocations.clear();
}

absl::StatusOr<void*> DeviceMemory::Alloc(size_t bytes,
                                          absl::string_view what) {
  void* p = nullptr;
  KVD_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, std::max<size_t>(bytes, 16)),
                                 absl::StrCat("cudaMalloc for ", what)));
  allocations.push_back(p);
  return p;
}

absl::StatusOr<const float*> DeviceMemory::Vector(const std::vector<float>& v,
                                                  IndexRange r,
                                                  absl::string_view what) {
  if (v.empty()) return nullptr;
  KVD_ASSIGN_OR_RETURN(void* p, Alloc(r.size() * 4, what));
  KVD_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(p, v.data() + r.begin, r.size() * 4, cudaMemcpyDefault),
      absl::StrCat("uploading ", what)));
  return static_cast<const float*>(p);
}

absl::StatusOr<const float*> DeviceMemory::Vector(const std::vector<float>& v,
                                                  absl::string_view what) {
  return Vector(v, {0, static_cast<int64_t>(v.size())}, what);
}

absl::StatusOr<DeviceMatrix> DeviceMemory::Matrix(const ops::Matrix& m,
                                                  IndexRange rows,
                                                  IndexRange cols,
                                                  absl::string_view what) {
  const kernels::cpu::WeightView v = m.view();
  if (v.type == kernels::cpu::WeightType::kGgmlBlocks && v.round_to_bf16) {
    // The bf16 mode's weights kept as the file's blocks: the device gets the
    // same bf16 values, rounded here row by row.
    std::vector<uint16_t> host(rows.size() * cols.size());
    std::vector<float> row(m.cols());
    for (int64_t r = 0; r < rows.size(); ++r) {
      m.RowToFloat(rows.begin + r, row.data());
      kernels::cpu::FloatToBf16(row.data() + cols.begin,
                                host.data() + r * cols.size(), cols.size());
    }
    KVD_ASSIGN_OR_RETURN(void* p, Alloc(host.size() * 2, what));
    KVD_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(p, host.data(), host.size() * 2, cudaMemcpyDefault),
        absl::StrCat("uploading ", what)));
    return DeviceMatrix{static_cast<const uint16_t*>(p), rows.size(),
                        cols.size()};
  }
  if (v.type != kernels::cpu::WeightType::kBf16) {
    return absl::UnimplementedError(absl::StrCat(
        "CUDA model: weight ", what,
        " is not bf16 in the loaded model; load it with precision bf16"));
  }
  const int64_t ld = v.stride();
  const uint16_t* src =
      static_cast<const uint16_t*>(v.data) + rows.begin * ld + cols.begin;
  KVD_ASSIGN_OR_RETURN(void* p, Alloc(rows.size() * cols.size() * 2, what));
  KVD_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpy2D(p, cols.size() * 2, src, ld * 2, cols.size() * 2,
                              rows.size(), cudaMemcpyDefault),
                 absl::StrCat("uploading ", what)));
  return DeviceMatrix{static_cast<const uint16_t*>(p), rows.size(),
                      cols.size()};
}

absl::StatusOr<DeviceMatrix> DeviceMemory::Matrix(const ops::Matrix& m,
                                                  absl::string_view what) {
  return Matrix(m, {0, m.rows()}, {0, m.cols()}, what);
}

void FreeOnDevice(int device, void* p) {
  int previous = 0;
  const bool restore = cudaGetDevice(&previous) == cudaSuccess;
  cudaSetDevice(device);
  cudaFree(p);
  if (restore) cudaSetDevice(previous);
}

PinnedHostFloats::~PinnedHostFloats() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

absl::StatusOr<float*> PinnedHostFloats::Get(
    int64_t floats, const std::function<absl::Status()>& wait_for_copies) {
  if (floats <= floats_) return data_;
  KVD_RETURN_IF_ERROR(wait_for_copies());
  const int64_t n = std::max(floats, 2 * floats_);
  if (data_ != nullptr) cudaFreeHost(data_);
  data_ = nullptr;
  floats_ = 0;
  void* p = nullptr;
  KVD_RETURN_IF_ERROR(CudaStatus(
      cudaMallocHost(&p, n * sizeof(float)),
      absl::StrCat("cudaMallocHost of ", n * sizeof(float),
                   " bytes for the residuals the observer is shown")));
  data_ = static_cast<float*>(p);
  floats_ = n;
  return data_;
}

}  // namespace kvd::ops::internal
