#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/bandwidth_probe.h"
#include "kernels/cuda/internal/cuda_check.h"

namespace kvd::kernels::cuda {
namespace {

using internal::CudaStatus;

#define KVD_CUDA_RETURN(expr)                        \
  do {                                               \
    absl::Status kvd_s_ = CudaStatus((expr), #expr); \
    if (!kvd_s_.ok()) return kvd_s_;                 \
  } while (0)

__global__ void FillKernel(uint4* p, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint32_t v = static_cast<uint32_t>(i) * 2654435761u + 1u;
    p[i] = make_uint4(v, v ^ 0x5bd1e995u, v + 7u, ~v);
  }
}

// Four independent 16-byte loads in flight per thread per iteration; the xor
// is written only if impossible, so the loads cannot be optimised away.
__global__ void ReadKernel(const uint4* __restrict__ p, size_t n,
                           uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride],
                d = p[i + 3 * stride];
    acc ^= a.x ^ b.y ^ c.z ^ d.w;
  }
  for (; i < n; i += stride) acc ^= p[i].x;
  if (acc == 0x12345678u) *sink = acc;
}

struct Events {
  cudaEvent_t start = nullptr, stop = nullptr;
  ~Events() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
};

struct DeviceAlloc {
  void* p = nullptr;
  ~DeviceAlloc() {
    if (p) cudaFree(p);
  }
};

template <typename Fn>
absl::StatusOr<double> MedianSeconds(int reps, Fn&& launch) {
  Events ev;
  KVD_CUDA_RETURN(cudaEventCreate(&ev.start));
  KVD_CUDA_RETURN(cudaEventCreate(&ev.stop));
  for (int i = 0; i < 3; ++i) KVD_CUDA_RETURN(launch());
  KVD_CUDA_RETURN(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    KVD_CUDA_RETURN(cudaEventRecord(ev.start));
    KVD_CUDA_RETURN(launch());
    KVD_CUDA_RETURN(cudaEventRecord(ev.stop));
    KVD_CUDA_RETURN(cudaEventSynchronize(ev.stop));
    float ms = 0;
    KVD_CUDA_RETURN(cudaEventElapsedTime(&ms, ev.start, ev.stop));
    t.push_back(ms * 1e-3);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int SmCount() {
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess) {
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  }
  return sms;
}

}  // namespace

absl::StatusOr<double> MeasureReadBandwidth(size_t bytes, int reps) {
  const size_t n = bytes / 16;
  DeviceAlloc buf, sink;
  KVD_CUDA_RETURN(cudaMalloc(&buf.p, n * 16));
  KVD_CUDA_RETURN(cudaMalloc(&sink.p, 4));
  auto* p = static_cast<uint4*>(buf.p);
  FillKernel<<<1024, 256>>>(p, n);
  KVD_CUDA_RETURN(cudaGetLastError());
  const int blocks = SmCount() * 8;
  auto secs = MedianSeconds(reps, [&] {
    ReadKernel<<<blocks, 256>>>(p, n, static_cast<uint32_t*>(sink.p));
    return cudaGetLastError();
  });
  if (!secs.ok()) return secs.status();
  return static_cast<double>(n * 16) / *secs;
}

absl::StatusOr<double> MeasureCopyBandwidth(size_t bytes, int reps) {
  const size_t n = bytes / 16;
  DeviceAlloc src, dst;
  KVD_CUDA_RETURN(cudaMalloc(&src.p, n * 16));
  KVD_CUDA_RETURN(cudaMalloc(&dst.p, n * 16));
  FillKernel<<<1024, 256>>>(static_cast<uint4*>(src.p), n);
  KVD_CUDA_RETURN(cudaGetLastError());
  auto secs = MedianSeconds(reps, [&] {
    return cudaMemcpy(dst.p, src.p, n * 16, cudaMemcpyDeviceToDevice);
  });
  if (!secs.ok()) return secs.status();
  return 2.0 * static_cast<double>(n * 16) / *secs;
}

}  // namespace kvd::kernels::cuda
