// One block of kThreads per (query, head). Per chunk:
//  1. scores: warp w computes keys j = w, w + 4, ...; lane l sums dims
//     l, l + 32, ... with FMA in increasing order, then a fixed xor butterfly;
//  2. threads j < 32 turn scores into p_j = exp(s_j - new_max) (kvd's exp);
//  3. every thread rescales and folds the chunk into its own dims
//     d = tid, tid + kThreads: acc = fma(p_j, v_j[d], acc) for j in order, and
//     the running sum adds p_j in the same order (redundantly in each thread,
//     so no cross-thread reduction can vary).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "kernels/cuda/internal/device_math.cuh"

namespace kvd::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = static_cast<int>(kAttentionChunk);
constexpr int kDimsPerThread = kMaxAttentionHeadDim / kThreads;

__device__ inline float Bf16At(const uint16_t* p, int64_t i) {
  return __uint_as_float(static_cast<uint32_t>(p[i]) << 16);
}

__global__ void __launch_bounds__(kThreads) AttentionKernel(AttentionArgs a) {
  const int64_t h = blockIdx.x;
  const int64_t qi = blockIdx.y;
  const int64_t kvh = h / (a.n_heads / a.n_kv_heads);
  const int hd = static_cast<int>(a.head_dim);
  __shared__ float q[kMaxAttentionHeadDim];
  __shared__ float s[kChunk];
  __shared__ float chunk_max;
  const float* qp = a.q + qi * a.q_stride + h * a.head_dim;
  for (int d = threadIdx.x; d < hd; d += kThreads) q[d] = qp[d];

  const int64_t last = a.last[qi];
  const int64_t first =
      a.window > 0 && last - a.window + 1 > 0 ? last - a.window + 1 : 0;
  float acc[kDimsPerThread];
#pragma unroll
  for (int t = 0; t < kDimsPerThread; ++t) acc[t] = 0.0f;
  float run_max = -__int_as_float(0x7f800000);
  float run_sum = 0.0f;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  __syncthreads();

  for (int64_t c = first / kChunk * kChunk; c <= last; c += kChunk) {
    const int64_t lo = c > first ? c : first;
    const int64_t hi = c + kChunk - 1 < last ? c + kChunk - 1 : last;
    const int n = static_cast<int>(hi - lo + 1);
    for (int j = warp; j < n; j += kWarps) {
      const uint16_t* kr = a.k + (lo + j) * a.kv_stride + kvh * a.head_dim;
      float dot = 0.0f;
      for (int d = lane; d < hd; d += 32) dot = fmaf(q[d], Bf16At(kr, d), dot);
#pragma unroll
      for (int off = 16; off > 0; off /= 2) {
        dot = __fadd_rn(dot, __shfl_xor_sync(0xffffffffu, dot, off));
      }
      if (lane == 0) s[j] = __fmul_rn(dot, a.scale);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float m = s[0];
      for (int j = 1; j < n; ++j) m = fmaxf(m, s[j]);
      chunk_max = m;
    }
    __syncthreads();
    const float new_max = fmaxf(run_max, chunk_max);
    if (threadIdx.x < n)
      s[threadIdx.x] = internal::Exp(s[threadIdx.x] - new_max);
    if (new_max != run_max) {
      const float alpha = run_max == -__int_as_float(0x7f800000)
                              ? 0.0f
                              : internal::Exp(run_max - new_max);
      run_sum = __fmul_rn(run_sum, alpha);
#pragma unroll
      for (int t = 0; t < kDimsPerThread; ++t)
        acc[t] = __fmul_rn(acc[t], alpha);
      run_max = new_max;
    }
    __syncthreads();
    for (int j = 0; j < n; ++j) {
      const float p = s[j];
      run_sum = __fadd_rn(run_sum, p);
      const uint16_t* vr = a.v + (lo + j) * a.kv_stride + kvh * a.head_dim;
#pragma unroll
      for (int t = 0; t < kDimsPerThread; ++t) {
        const int d = threadIdx.x + t * kThreads;
        if (d < hd) acc[t] = fmaf(p, Bf16At(vr, d), acc[t]);
      }
    }
    __syncthreads();  // s is rewritten by the next chunk
  }

  float* op = a.out + qi * a.out_stride + h * a.head_dim;
#pragma unroll
  for (int t = 0; t < kDimsPerThread; ++t) {
    const int d = threadIdx.x + t * kThreads;
    if (d < hd) op[d] = run_sum == 0.0f ? 0.0f : __fdiv_rn(acc[t], run_sum);
  }
}

}  // namespace

absl::Status Attention(const AttentionArgs& a, void* stream) {
  if (a.nq < 0 || a.n_heads <= 0 || a.n_kv_heads <= 0 ||
      a.n_heads % a.n_kv_heads != 0 || a.head_dim <= 0 ||
      a.head_dim > kMaxAttentionHeadDim || a.window < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention: need n_kv_heads dividing n_heads, 0 < head_dim <= ",
        kMaxAttentionHeadDim, ", window >= 0; got n_heads=", a.n_heads,
        " n_kv_heads=", a.n_kv_heads, " head_dim=", a.head_dim,
        " window=", a.window));
  }
  if (a.q_stride < a.n_heads * a.head_dim ||
      a.out_stride < a.n_heads * a.head_dim ||
      a.kv_stride < a.n_kv_heads * a.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention: strides too small: q_stride=", a.q_stride,
        " out_stride=", a.out_stride, " (need >= ", a.n_heads * a.head_dim,
        "), kv_stride=", a.kv_stride, " (need >= ", a.n_kv_heads * a.head_dim,
        ")"));
  }
  if (a.nq == 0) return absl::OkStatus();
  if (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.last == nullptr ||
      a.out == nullptr) {
    return absl::InvalidArgumentError(
        "Attention: null device pointer among q, k, v, last, out");
  }
  if (a.nq > 65535 || a.n_heads > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention: nq=", a.nq, " exceeds 65535 per launch; split the batch"));
  }
  const dim3 grid(static_cast<unsigned>(a.n_heads),
                  static_cast<unsigned>(a.nq));
  AttentionKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return internal::LastLaunchStatus(
      absl::StrCat("Attention nq=", a.nq, " n_heads=", a.n_heads));
}

}  // namespace kvd::kernels::cuda
