#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/internal/bench_kernels.h"
#include "kernels/cuda/internal/cuda_check.h"

namespace kvd::kernels::cuda::bench {
namespace {

constexpr int kThreads = 256;

unsigned Grid(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 20)));
}

__device__ uint64_t SplitMix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__device__ float Uniform(uint64_t seed, uint64_t i) {
  const uint64_t h = SplitMix(seed * 0x100000001b3ull ^ i);
  // 24 random bits -> [-1, 1), never exactly 0 (odd numerator).
  return (static_cast<float>((h >> 40) | 1) * (1.0f / 8388608.0f)) - 1.0f;
}

__device__ uint16_t ToBf16(float x) {
  uint32_t b = __float_as_uint(x);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

__global__ void FillBf16Kernel(uint16_t* p, size_t n, uint64_t seed,
                               float scale, float offset) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    p[i] = ToBf16(offset + scale * Uniform(seed, i));
}

__global__ void FillF32Kernel(float* p, size_t n, uint64_t seed, float scale,
                              float offset) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    p[i] = offset + scale * Uniform(seed, i);
}

__global__ void AddKernel(float* x, const float* y, int64_t rows, int64_t n,
                          int64_t ld) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / n, c = i - r * n;
    x[r * ld + c] += y[r * ld + c];
  }
}

__global__ void StoreKvKernel(const float* kv, int64_t ld, int64_t rows,
                              int64_t w, const int32_t* dest, uint16_t* k,
                              uint16_t* v) {
  const int64_t total = rows * 2 * w;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / (2 * w), c = i - r * 2 * w;
    const int64_t row = dest[r];
    const uint16_t val = ToBf16(kv[r * ld + c]);
    if (c < w) {
      k[row * w + c] = val;
    } else {
      v[row * w + c - w] = val;
    }
  }
}

}  // namespace

absl::Status FillBf16(uint16_t* p, size_t n, uint64_t seed, float scale,
                      float offset, void* stream) {
  FillBf16Kernel<<<Grid(static_cast<int64_t>(n)), kThreads, 0,
                   static_cast<cudaStream_t>(stream)>>>(p, n, seed, scale,
                                                        offset);
  return internal::LastLaunchStatus("FillBf16");
}

absl::Status FillF32(float* p, size_t n, uint64_t seed, float scale,
                     float offset, void* stream) {
  FillF32Kernel<<<Grid(static_cast<int64_t>(n)), kThreads, 0,
                  static_cast<cudaStream_t>(stream)>>>(p, n, seed, scale,
                                                       offset);
  return internal::LastLaunchStatus("FillF32");
}

absl::Status AddInPlace(float* x, const float* y, int64_t rows, int64_t n,
                        int64_t ld, void* stream) {
  AddKernel<<<Grid(rows * n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, y, rows, n, ld);
  return internal::LastLaunchStatus("AddInPlace");
}

absl::Status StoreKv(const float* kv, int64_t ld, int64_t rows,
                     int64_t kv_width, const int32_t* dest, uint16_t* k,
                     uint16_t* v, void* stream) {
  StoreKvKernel<<<Grid(rows * 2 * kv_width), kThreads, 0,
                  static_cast<cudaStream_t>(stream)>>>(kv, ld, rows, kv_width,
                                                       dest, k, v);
  return internal::LastLaunchStatus("StoreKv");
}

}  // namespace kvd::kernels::cuda::bench
