// Device dequantization (dequant.h). Each thread computes one output element
// with internal/dequant_element.h, the arithmetic of kernels/quant/dequant.cc's
// loop for that element with every operation rounded separately.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/dequant.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "kernels/cuda/internal/dequant_element.h"

namespace kvd::kernels::cuda {
namespace {

namespace dq = internal::dequant;

struct Geometry {
  int block_elems = 0;  // 0: unsupported
  int block_bytes = 0;
};

Geometry GeometryOf(uint32_t id) {
  return {dq::BlockElems(id), dq::BlockBytes(id)};
}

template <uint32_t kType>
__global__ void DequantKernel(const uint8_t* src, int64_t row_bytes,
                              int64_t rows, int64_t cols, uint16_t* dst,
                              int64_t ld_dst) {
  constexpr int kBlockElems = dq::BlockElems(kType);
  constexpr int kBlockBytes = dq::BlockBytes(kType);
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const uint8_t* b = src + r * row_bytes + (c / kBlockElems) * kBlockBytes;
    const int j = static_cast<int>(c % kBlockElems);
    const uint16_t out = dq::ElementBf16<kType>(b, j);
    dst[r * ld_dst + c] = out;
  }
}

template <uint32_t kType>
absl::Status Launch(const void* src, int64_t row_bytes, int64_t rows,
                    int64_t cols, uint16_t* dst, int64_t ld_dst,
                    cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t total = rows * cols;
  // Grid-stride loop: a bounded grid covers any tensor size.
  const int64_t blocks =
      std::min<int64_t>((total + kThreads - 1) / kThreads, int64_t{1} << 20);
  DequantKernel<kType><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(src), row_bytes, rows, cols, dst, ld_dst);
  return internal::LastLaunchStatus("DequantKernel");
}

absl::Status CheckArgs(GgmlType type, int64_t row_bytes, int64_t rows,
                       int64_t cols, int64_t ld_dst, bool null_ptr) {
  const uint32_t id = static_cast<uint32_t>(type);
  const Geometry g = GeometryOf(id);
  if (g.block_elems == 0) {
    return absl::UnimplementedError(absl::StrCat(
        "device dequantization of GGML type id ", id,
        " is not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, "
        "Q4_K, Q5_K, Q6_K are)"));
  }
  if (rows < 0 || cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dequantize: negative shape ", rows, " x ", cols));
  }
  if (cols % g.block_elems != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dequantize: row length ", cols, " of GGML type id ", id,
                     " is not a multiple of its block size ", g.block_elems));
  }
  const int64_t need = cols / g.block_elems * g.block_bytes;
  if (row_bytes < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("dequantize: row_bytes ", row_bytes, " < ", need,
                     " needed for ", cols, " elements of GGML type id ", id));
  }
  if (ld_dst < cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("dequantize: ld_dst ", ld_dst, " < cols ", cols));
  }
  if (rows > 0 && cols > 0 && null_ptr) {
    return absl::InvalidArgumentError("dequantize: null src or dst");
  }
  return absl::OkStatus();
}

}  // namespace

bool IsDeviceDequantizeSupported(GgmlType type) {
  return GeometryOf(static_cast<uint32_t>(type)).block_elems != 0;
}

absl::Status DequantizeToBf16(GgmlType type, const void* src, int64_t row_bytes,
                              int64_t rows, int64_t cols, uint16_t* dst,
                              int64_t ld_dst, void* stream) {
  absl::Status s = CheckArgs(type, row_bytes, rows, cols, ld_dst,
                             src == nullptr || dst == nullptr);
  if (!s.ok()) return s;
  if (rows == 0 || cols == 0) return absl::OkStatus();
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  switch (static_cast<uint32_t>(type)) {
    case dq::kF32:
      return Launch<dq::kF32>(src, row_bytes, rows, cols, dst, ld_dst, st);
    case dq::kF16:
      return Launch<dq::kF16>(src, row_bytes, rows, cols, dst, ld_dst, st);
    case dq::kBF16:
      return Launch<dq::kBF16>(src, row_bytes, rows, cols, dst, ld_dst, st);
    case dq::kQ4_0:
      return Launch<dq::kQ4_0>(src, row_bytes, rows, cols, dst, ld_dst, st);
    case dq::kQ4_1:
      return Launch<dq::kQ4_1>(src, row_bytes, rows, cols, dst, ld_dst, st);
    case dq::kQ5_0:
      return Launch<dq::kQ5_0>(src, row_bytes, rows, cols, dst, ld_dst, st);
    case dq::kQ5_1:
      return Launch<dq::kQ5_1>(src, row_bytes, rows, cols, dst, ld_dst, st);
    case dq::kQ8_0:
      return Launch<dq::kQ8_0>(src, row_bytes, rows, cols, dst, ld_dst, st);
    case dq::kQ4_K:
      return Launch<dq::kQ4_K>(src, row_bytes, rows, cols, dst, ld_dst, st);
    case dq::kQ5_K:
      return Launch<dq::kQ5_K>(src, row_bytes, rows, cols, dst, ld_dst, st);
    case dq::kQ6_K:
      return Launch<dq::kQ6_K>(src, row_bytes, rows, cols, dst, ld_dst, st);
  }
  return absl::InternalError("dequantize: supported type without a kernel");
}

absl::Status UploadDequantizedBf16(GgmlType type, const void* host_src,
                                   size_t src_bytes, int64_t rows, int64_t cols,
                                   uint16_t* dst, int64_t ld_dst,
                                   void* stream) {
  const Geometry g = GeometryOf(static_cast<uint32_t>(type));
  const int64_t row_bytes =
      g.block_elems == 0 ? 0 : cols / g.block_elems * g.block_bytes;
  absl::Status s = CheckArgs(type, row_bytes, rows, cols, ld_dst,
                             host_src == nullptr || dst == nullptr);
  if (!s.ok()) return s;
  if (static_cast<uint64_t>(src_bytes) !=
      static_cast<uint64_t>(rows) * static_cast<uint64_t>(row_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "upload: ", src_bytes, " bytes given for ", rows, " rows of ",
        row_bytes, " bytes (", cols, " elements of GGML type id ",
        static_cast<uint32_t>(type), ")"));
  }
  if (rows == 0 || cols == 0) return absl::OkStatus();
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  void* staging = nullptr;
  const absl::Status alloc = internal::CudaStatus(
      cudaMalloc(&staging, src_bytes), "upload: staging buffer");
  if (!alloc.ok()) return alloc;
  const absl::Status copy = internal::CudaStatus(
      cudaMemcpyAsync(staging, host_src, src_bytes, cudaMemcpyHostToDevice, st),
      "upload: copy to device");
  const absl::Status run =
      copy.ok() ? DequantizeToBf16(type, staging, row_bytes, rows, cols, dst,
                                   ld_dst, stream)
                : copy;
  // Wait even after an error: the staging buffer may still be in use.
  const absl::Status sync =
      internal::CudaStatus(cudaStreamSynchronize(st), "upload: dequantize");
  const absl::Status freed =
      internal::CudaStatus(cudaFree(staging), "upload: free staging buffer");
  if (!run.ok()) return run;
  if (!sync.ok()) return sync;
  return freed;
}

}  // namespace kvd::kernels::cuda
