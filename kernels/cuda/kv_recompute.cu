#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "kernels/cuda/kv_recompute.h"
#include "kernels/cuda/model_ops.h"

namespace kvd::kernels::cuda {
namespace {

// base/status_macros.h is outside this nvcc-compiled package.
#define KVD_CUDA_RETURN_IF_ERROR(expr)   \
  do {                                   \
    const absl::Status status_ = (expr); \
    if (!status_.ok()) return status_;   \
  } while (0)

constexpr int kThreads = 256;

unsigned Grid(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 20)));
}

__global__ void Bf16RowsToFloat(const uint16_t* src, int64_t ld_src,
                                int64_t rows, int64_t n, float* dst) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / n, c = i - r * n;
    dst[i] = __uint_as_float(static_cast<uint32_t>(src[r * ld_src + c]) << 16);
  }
}

// Round to nearest even, NaN kept quiet (as bf16_convert.cu and the CPU).
__device__ uint16_t ToBf16(float x) {
  uint32_t b = __float_as_uint(x);
  if ((b & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((b >> 16) | 0x40);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

__global__ void FloatRowsToBf16(const float* src, int64_t rows, int64_t n,
                                uint16_t* dst, int64_t ld_dst) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / n, c = i - r * n;
    dst[r * ld_dst + c] = ToBf16(src[i]);
  }
}

}  // namespace

int64_t KvRecomputeWorkspaceFloats(int64_t rows, int64_t d_model,
                                   int64_t width) {
  return rows * d_model + 2 * rows * width;
}

absl::Status RecomputeKv(const KvRecomputeArgs& a, void* stream) {
  const int64_t heads = a.head_end - a.head_begin;
  const int64_t width = heads * a.head_dim;
  if (a.rows < 0 || a.d_model <= 0 || a.ld_residual < a.d_model ||
      a.n_kv_heads <= 0 || a.head_dim <= 0 || a.head_begin < 0 || heads <= 0 ||
      a.head_end > a.n_kv_heads || a.ld_out < width || a.rot_dim < 0 ||
      a.rot_dim > a.head_dim || a.rot_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RecomputeKv: need rows >= 0, d_model > 0, ld_residual >= d_model, "
        "0 <= head_begin < head_end <= n_kv_heads, ld_out >= shard width, "
        "even rot_dim <= head_dim; got rows=",
        a.rows, " d_model=", a.d_model, " ld_residual=", a.ld_residual,
        " heads=[", a.head_begin, ", ", a.head_end, ") of ", a.n_kv_heads,
        " head_dim=", a.head_dim, " ld_out=", a.ld_out,
        " rot_dim=", a.rot_dim));
  }
  // The forward pass biases K and V together (model_ops.h AddBias on both or
  // neither); a half-given pair is a caller's wiring bug that would silently
  // give K or V other bits than the cached rows.
  if ((a.bk == nullptr) != (a.bv == nullptr)) {
    return absl::InvalidArgumentError(
        "RecomputeKv: bk and bv must both be given or both be null");
  }
  if (a.rows == 0) return absl::OkStatus();
  if (a.residual == nullptr || a.wk == nullptr || a.wv == nullptr ||
      a.k_out == nullptr || a.v_out == nullptr || a.workspace == nullptr ||
      (a.rot_dim > 0 && a.positions == nullptr)) {
    return absl::InvalidArgumentError("RecomputeKv: null device pointer");
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  float* xn = a.workspace;
  float* k = xn + a.rows * a.d_model;
  float* v = k + a.rows * width;
  Bf16RowsToFloat<<<Grid(a.rows * a.d_model), kThreads, 0, s>>>(
      a.residual, a.ld_residual, a.rows, a.d_model, xn);
  KVD_CUDA_RETURN_IF_ERROR(internal::LastLaunchStatus("Bf16RowsToFloat"));
  KVD_CUDA_RETURN_IF_ERROR(RmsNorm(xn, a.d_model, a.norm_weight, a.eps, a.rows,
                                   a.d_model, xn, a.d_model, stream));
  // The shard's heads are a contiguous block of weight rows; each output
  // element's k order is the same whatever block is chosen (gemm.h).
  const int64_t row0 = a.head_begin * a.head_dim;
  const Activations x{xn, ActType::kF32, a.rows, a.d_model};
  KVD_CUDA_RETURN_IF_ERROR(
      Gemm(x, {a.wk + row0 * a.d_model, width, a.d_model, a.d_model}, k, width,
           stream, GemmTile::kAuto, a.gemm_impl));
  KVD_CUDA_RETURN_IF_ERROR(
      Gemm(x, {a.wv + row0 * a.d_model, width, a.d_model, a.d_model}, v, width,
           stream, GemmTile::kAuto, a.gemm_impl));
  // After the projection and before RoPE, with the forward pass's own
  // AddBias (model_ops.h), so a recomputed biased row is the row it made.
  if (a.bk != nullptr) {
    KVD_CUDA_RETURN_IF_ERROR(
        AddBias(k, width, a.bk + row0, a.rows, width, stream));
    KVD_CUDA_RETURN_IF_ERROR(
        AddBias(v, width, a.bv + row0, a.rows, width, stream));
  }
  if (a.rot_dim > 0) {
    KVD_CUDA_RETURN_IF_ERROR(Rope(k, width, a.rows, heads, a.head_dim,
                                  a.rot_dim, a.positions, a.rope_base,
                                  a.rope_style, stream));
  }
  FloatRowsToBf16<<<Grid(a.rows * width), kThreads, 0, s>>>(k, a.rows, width,
                                                            a.k_out, a.ld_out);
  KVD_CUDA_RETURN_IF_ERROR(internal::LastLaunchStatus("FloatRowsToBf16 (K)"));
  FloatRowsToBf16<<<Grid(a.rows * width), kThreads, 0, s>>>(v, a.rows, width,
                                                            a.v_out, a.ld_out);
  return internal::LastLaunchStatus("FloatRowsToBf16 (V)");
}

}  // namespace kvd::kernels::cuda
