// Device test (tag requires-gpu): the GPU's bf16 conversion equals the CPU's
// bit for bit on fresh random inputs and edge cases. Runs only on a machine
// with a GPU.
#include "kernels/cuda/bf16_convert.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/internal/test_util.h"

namespace {

#define CUDA_OK(expr) ASSERT_EQ(static_cast<int>(expr), 0) << #expr

TEST(CudaBf16, MatchesCpuBitForBit) {
  KVD_REQUIRE_GPU();
  std::vector<float> x(1 << 20);
  std::mt19937 rng(std::random_device{}());
  for (float& v : x) {
    uint32_t bits = rng();
    std::memcpy(&v, &bits, 4);
  }
  x[0] = std::numeric_limits<float>::infinity();
  x[1] = std::nanf("");
  x[2] = 1.0f + std::ldexp(1.0f, -8);
  float* d_x;
  uint16_t* d_y;
  CUDA_OK(cudaMalloc(&d_x, x.size() * 4));
  CUDA_OK(cudaMalloc(&d_y, x.size() * 2));
  CUDA_OK(cudaMemset(d_y, 0xff, x.size() * 2));  // poison
  CUDA_OK(cudaMemcpy(d_x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(kvd::kernels::cuda::LaunchFloatToBf16(d_x, d_y, x.size(), nullptr));
  std::vector<uint16_t> got(x.size());
  CUDA_OK(cudaMemcpy(got.data(), d_y, x.size() * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(got[i], kvd::kernels::cpu::FloatToBf16(x[i])) << i;
  }
  CUDA_OK(cudaFree(d_x));
  CUDA_OK(cudaFree(d_y));
}

}  // namespace
