// Helpers for the device tests: RAII device buffers, NaN poisoning, fresh
// random inputs and host bf16 rounding. Test-only; every CUDA call is checked.
#ifndef KVD_KERNELS_CUDA_INTERNAL_TEST_UTIL_H_
#define KVD_KERNELS_CUDA_INTERNAL_TEST_UTIL_H_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvd::kernels::cuda::testing {

#define KVD_CUDA_ASSERT(expr)                             \
  do {                                                    \
    const cudaError_t kvd_err_ = (expr);                  \
    ASSERT_EQ(kvd_err_, cudaSuccess)                      \
        << #expr << ": " << cudaGetErrorString(kvd_err_); \
  } while (0)

// Skips the test, with the reason, where the CUDA runtime sees no device (no
// GPU, or no driver): device tests then pass as skipped, never as run.
inline bool CudaDeviceAvailable(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err);
    cudaGetLastError();
    return false;
  }
  if (n == 0) *why = "cudaGetDeviceCount: 0 devices";
  return n > 0;
}
#define KVD_REQUIRE_GPU()                                               \
  do {                                                                  \
    std::string kvd_why_;                                               \
    if (!::kvd::kernels::cuda::testing::CudaDeviceAvailable(&kvd_why_)) \
      GTEST_SKIP() << "no CUDA device (" << kvd_why_ << ")";            \
  } while (0)

// Synchronizes and fails the test on any asynchronous fault of earlier
// launches.
#define KVD_CUDA_SYNC() KVD_CUDA_ASSERT(cudaDeviceSynchronize())

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    err_ = cudaMalloc(&ptr_, n * sizeof(T) + 16);
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  cudaError_t status() const { return err_; }
  T* get() const { return static_cast<T*>(ptr_); }
  size_t size() const { return n_; }
  cudaError_t Upload(const std::vector<T>& h) {
    return cudaMemcpy(ptr_, h.data(), h.size() * sizeof(T),
                      cudaMemcpyHostToDevice);
  }
  cudaError_t Download(std::vector<T>* h) const {
    h->resize(n_);
    return cudaMemcpy(h->data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
  }
  // 0xff bytes: NaN for float, NaN for bf16 and -1 for int32.
  cudaError_t Poison() { return cudaMemset(ptr_, 0xff, n_ * sizeof(T) + 16); }

 private:
  void* ptr_ = nullptr;
  size_t n_;
  cudaError_t err_ = cudaSuccess;
};

inline uint16_t HostToBf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (b >> 16) | 0x40;
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}
inline float HostBf16ToFloat(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// A fresh seed per run (tests must hold on any input); printed so a failure
// can be replayed with KVD_TEST_SEED.
inline uint64_t TestSeed() {
  if (const char* s = std::getenv("KVD_TEST_SEED"))
    return std::strtoull(s, nullptr, 10);
  const uint64_t seed = std::random_device{}();
  std::printf("[ seed ] KVD_TEST_SEED=%llu\n",
              static_cast<unsigned long long>(seed));
  return seed;
}

inline std::vector<float> RandomFloats(size_t n, std::mt19937_64* rng,
                                       float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(*rng);
  return v;
}

inline std::vector<uint16_t> RandomBf16(size_t n, std::mt19937_64* rng,
                                        float lo = -1.0f, float hi = 1.0f) {
  std::vector<uint16_t> v(n);
  std::uniform_real_distribution<float> u(lo, hi);
  for (uint16_t& x : v) x = HostToBf16(u(*rng));
  return v;
}

// ||got - want|| / ||want|| over n values; +inf if any value is not finite.
inline double RelativeError(const float* got, const double* want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double d = got[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

}  // namespace kvd::kernels::cuda::testing

#endif  // KVD_KERNELS_CUDA_INTERNAL_TEST_UTIL_H_
