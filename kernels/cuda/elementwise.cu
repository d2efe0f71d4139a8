#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "kernels/cuda/internal/device_math.cuh"

namespace kvd::kernels::cuda {
namespace {

// Fixed, never derived from the problem size: the reduction tree of a row
// must not change with the number of rows.
constexpr int kNormThreads = 256;
constexpr int kElementThreads = 256;

__global__ void __launch_bounds__(kNormThreads)
    RmsNormKernel(const float* x, int64_t ldx, const float* w, float eps,
                  int64_t n, float* y, int64_t ldy) {
  const float* xr = x + blockIdx.x * ldx;
  float* yr = y + blockIdx.x * ldy;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) {
    s = fmaf(xr[i], xr[i], s);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
  }
  __shared__ float warp_sums[kNormThreads / 32];
  __shared__ float scale;
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int i = 0; i < kNormThreads / 32; ++i) {
      total = __fadd_rn(total, warp_sums[i]);
    }
    const float mean = __fdiv_rn(total, static_cast<float>(n));
    scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
  }
  __syncthreads();
  // Every thread has read its inputs for the sum before the barrier, so y may
  // alias x.
  const float sc = scale;
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) {
    const float v = __fmul_rn(xr[i], sc);
    yr[i] = w == nullptr ? v : __fmul_rn(v, w[i]);
  }
}

template <GatedAct kAct>
__global__ void GatedKernel(const float* gate, int64_t ld_gate, const float* up,
                            int64_t ld_up, int64_t rows, int64_t n, float* out,
                            int64_t ld_out) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / n;
    const int64_t c = i % n;
    const float g = gate[r * ld_gate + c];
    const float a =
        kAct == GatedAct::kSilu ? internal::Silu(g) : internal::GeluTanh(g);
    out[r * ld_out + c] = __fmul_rn(a, up[r * ld_up + c]);
  }
}

// One thread per rotated pair (row, head, i).
__global__ void RopeKernel(float* x, int64_t ldx, int64_t rows, int64_t n_heads,
                           int64_t head_dim, int64_t rot_dim,
                           const int32_t* positions, float base,
                           RopeStyle style) {
  const int64_t half = rot_dim / 2;
  const int64_t total = rows * n_heads * half;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       t < total; t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = t % half;
    const int64_t h = (t / half) % n_heads;
    const int64_t r = t / (half * n_heads);
    const double inv_freq =
        pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / rot_dim);
    const double theta = static_cast<double>(positions[r]) * inv_freq;
    const float c = static_cast<float>(cos(theta));
    const float s = static_cast<float>(sin(theta));
    float* v = x + r * ldx + h * head_dim;
    const int64_t a = style == RopeStyle::kInterleaved ? 2 * i : i;
    const int64_t b = style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
    const float x0 = v[a];
    const float x1 = v[b];
    v[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    v[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
}

unsigned GridFor(int64_t total) {
  const int64_t blocks = (total + kElementThreads - 1) / kElementThreads;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

}  // namespace

absl::Status RmsNorm(const float* x, int64_t ldx, const float* w, float eps,
                     int64_t rows, int64_t n, float* y, int64_t ldy,
                     void* stream) {
  if (rows < 0 || n <= 0 || ldx < n || ldy < n || !(eps >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RmsNorm: need rows >= 0, n > 0, ldx/ldy >= n, eps >= 0; got rows=",
        rows, " n=", n, " ldx=", ldx, " ldy=", ldy, " eps=", eps));
  }
  if (rows == 0) return absl::OkStatus();
  if (x == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("RmsNorm: null device pointer x or y");
  }
  if (rows > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("RmsNorm: rows=", rows, " exceeds the grid"));
  }
  RmsNormKernel<<<static_cast<unsigned>(rows), kNormThreads, 0,
                  static_cast<cudaStream_t>(stream)>>>(x, ldx, w, eps, n, y,
                                                       ldy);
  return internal::LastLaunchStatus(
      absl::StrCat("RmsNorm rows=", rows, " n=", n));
}

absl::Status GatedActivation(GatedAct act, const float* gate, int64_t ld_gate,
                             const float* up, int64_t ld_up, int64_t rows,
                             int64_t n, float* out, int64_t ld_out,
                             void* stream) {
  if (rows < 0 || n <= 0 || ld_gate < n || ld_up < n || ld_out < n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GatedActivation: need rows >= 0, n > 0 and strides >= n; got rows=",
        rows, " n=", n, " ld_gate=", ld_gate, " ld_up=", ld_up,
        " ld_out=", ld_out));
  }
  if (rows == 0) return absl::OkStatus();
  if (gate == nullptr || up == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(
        "GatedActivation: null device pointer gate, up or out");
  }
  auto* s = static_cast<cudaStream_t>(stream);
  const unsigned grid = GridFor(rows * n);
  if (act == GatedAct::kSilu) {
    GatedKernel<GatedAct::kSilu><<<grid, kElementThreads, 0, s>>>(
        gate, ld_gate, up, ld_up, rows, n, out, ld_out);
  } else {
    GatedKernel<GatedAct::kGeluTanh><<<grid, kElementThreads, 0, s>>>(
        gate, ld_gate, up, ld_up, rows, n, out, ld_out);
  }
  return internal::LastLaunchStatus(
      absl::StrCat("GatedActivation rows=", rows, " n=", n));
}

absl::Status Rope(float* x, int64_t ldx, int64_t rows, int64_t n_heads,
                  int64_t head_dim, int64_t rot_dim, const int32_t* positions,
                  float base, RopeStyle style, void* stream) {
  if (rows < 0 || n_heads <= 0 || head_dim <= 0 || rot_dim <= 0 ||
      rot_dim % 2 != 0 || rot_dim > head_dim || ldx < n_heads * head_dim ||
      !(base > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Rope: need an even 0 < rot_dim <= head_dim, ldx >= n_heads * "
        "head_dim and base > 0; got rows=",
        rows, " n_heads=", n_heads, " head_dim=", head_dim,
        " rot_dim=", rot_dim, " ldx=", ldx, " base=", base));
  }
  if (rows == 0) return absl::OkStatus();
  if (x == nullptr || positions == nullptr) {
    return absl::InvalidArgumentError(
        "Rope: null device pointer x or positions");
  }
  RopeKernel<<<GridFor(rows * n_heads * (rot_dim / 2)), kElementThreads, 0,
               static_cast<cudaStream_t>(stream)>>>(
      x, ldx, rows, n_heads, head_dim, rot_dim, positions, base, style);
  return internal::LastLaunchStatus(absl::StrCat("Rope rows=", rows));
}

}  // namespace kvd::kernels::cuda
