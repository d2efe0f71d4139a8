// The contiguous-cache entry point of the canonical attention fold; the fold
// itself (one block of 128 threads per (query, head), chunk by chunk) is
// internal/attention_core.cuh, shared with paged_attention.cu.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/internal/attention_core.cuh"
#include "kernels/cuda/internal/attention_index.h"
#include "kernels/cuda/internal/cuda_check.h"

namespace kvd::kernels::cuda {
namespace {

using internal::kAttnThreads;

__global__ void __launch_bounds__(kAttnThreads)
    AttentionKernel(AttentionArgs a) {
  const int64_t h = blockIdx.x;
  const int64_t qi = blockIdx.y;
  const int64_t kvh = h / (a.n_heads / a.n_kv_heads);
  const internal::KeySpan span =
      internal::LaunchSpan(a.last[qi], a.window, 0, INT64_MAX);
  internal::AttendSpan(a.q + qi * a.q_stride + h * a.head_dim,
                       static_cast<int>(a.head_dim), a.scale, kvh * a.head_dim,
                       span, internal::ContiguousRows{a.k, a.v, a.kv_stride},
                       nullptr, nullptr,
                       a.out + qi * a.out_stride + h * a.head_dim);
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
  AttentionKernel<<<grid, kAttnThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      a);
  return internal::LastLaunchStatus(
      absl::StrCat("Attention nq=", a.nq, " n_heads=", a.n_heads));
}

}  // namespace kvd::kernels::cuda
