#include <cuda_runtime.h>

#include "kernels/cuda/bf16_convert.h"

namespace kvd::kernels::cuda {
namespace {

__global__ void FloatToBf16Kernel(const float* src, uint16_t* dst, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  uint32_t b = __float_as_uint(src[i]);
  if ((b & 0x7fffffffu) > 0x7f800000u) {
    dst[i] = static_cast<uint16_t>((b >> 16) | 0x40);
    return;
  }
  b += 0x7fffu + ((b >> 16) & 1u);
  dst[i] = static_cast<uint16_t>(b >> 16);
}

__global__ void Bf16ToFloatKernel(const uint16_t* src, float* dst, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) dst[i] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16);
}

constexpr int kThreads = 256;

unsigned Blocks(int64_t n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

}  // namespace

int LaunchFloatToBf16(const float* src, uint16_t* dst, int64_t n,
                      void* stream) {
  if (n <= 0) return 0;
  FloatToBf16Kernel<<<Blocks(n), kThreads, 0,
                      static_cast<cudaStream_t>(stream)>>>(src, dst, n);
  return static_cast<int>(cudaGetLastError());
}

int LaunchBf16ToFloat(const uint16_t* src, float* dst, int64_t n,
                      void* stream) {
  if (n <= 0) return 0;
  Bf16ToFloatKernel<<<Blocks(n), kThreads, 0,
                      static_cast<cudaStream_t>(stream)>>>(src, dst, n);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvd::kernels::cuda
