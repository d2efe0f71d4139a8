#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/internal/attention_index.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "kernels/cuda/model_ops.h"

namespace kvd::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// kernels/cpu FloatToBf16: round to nearest even, NaN kept (quiet).
__device__ __forceinline__ uint16_t ToBf16(float x) {
  uint32_t b = __float_as_uint(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (b >> 16) | 0x40;
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}
__device__ __forceinline__ float FromBf16(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}
__device__ __forceinline__ float RoundBf16(float x) {
  return FromBf16(ToBf16(x));
}

int Blocks(int64_t total) {
  return static_cast<int>(
      std::min<int64_t>((total + kThreads - 1) / kThreads, int64_t{1} << 16));
}

#define KVD_GRID_LOOP(i, total)                                         \
  for (int64_t i =                                                      \
           blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; \
       i < (total); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void EmbedKernel(const uint16_t* table, int64_t ld_table,
                            const int32_t* tokens, int64_t rows, int64_t n,
                            float scale, bool round_bf16, float* h,
                            int64_t ld_h) {
  KVD_GRID_LOOP(i, rows * n) {
    const int64_t r = i / n, c = i % n;
    float v = FromBf16(table[tokens[r] * ld_table + c]);
    if (scale != 1.0f) v = __fmul_rn(v, scale);
    h[r * ld_h + c] = round_bf16 ? RoundBf16(v) : v;
  }
}

__global__ void AddKernel(float* h, int64_t ld_h, const float* x, int64_t ld_x,
                          int64_t rows, int64_t n, bool round_bf16) {
  KVD_GRID_LOOP(i, rows * n) {
    const int64_t r = i / n, c = i % n;
    const float v = __fadd_rn(h[r * ld_h + c], x[r * ld_x + c]);
    h[r * ld_h + c] = round_bf16 ? RoundBf16(v) : v;
  }
}

__global__ void BiasKernel(float* x, int64_t ld_x, const float* bias,
                           int64_t rows, int64_t n) {
  KVD_GRID_LOOP(i, rows * n) {
    const int64_t r = i / n, c = i % n;
    x[r * ld_x + c] = __fadd_rn(x[r * ld_x + c], bias[c]);
  }
}

__global__ void GatherKernel(const float* x, int64_t ld_x, const int32_t* index,
                             int64_t rows, int64_t n, float* y, int64_t ld_y) {
  KVD_GRID_LOOP(i, rows * n) {
    const int64_t r = i / n, c = i % n;
    y[r * ld_y + c] = x[index[r] * ld_x + c];
  }
}

__global__ void KvWriteKernel(KvWriteArgs a) {
  KVD_GRID_LOOP(i, a.rows * a.n) {
    const int64_t r = i / a.n, c = i % a.n;
    // The read side's own arithmetic (PagedAttention), so writer and reader
    // cannot disagree on where a row lives.
    uint16_t* krow = a.pool + internal::PagedKRowOffset(
                                  a.block_table + a.row_seq[r] * a.table_stride,
                                  {a.block_rows, a.kv_stride}, a.positions[r]);
    krow[c] = ToBf16(a.k[r * a.ld + c]);
    krow[a.block_rows * a.kv_stride + c] = ToBf16(a.v[r * a.ld + c]);
  }
}

absl::Status CheckRows(absl::string_view what, int64_t rows, int64_t n,
                       int64_t ld_in, int64_t ld_out) {
  if (rows < 0 || n <= 0 || ld_in < n || ld_out < n) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": need rows >= 0, n > 0 and row strides >= n; got rows ", rows,
        ", n ", n, ", strides ", ld_in, " and ", ld_out));
  }
  return absl::OkStatus();
}

absl::Status NullArg(absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": a device pointer argument is null"));
}

}  // namespace

absl::Status EmbedRows(const uint16_t* table, int64_t ld_table,
                       const int32_t* tokens, int64_t rows, int64_t n,
                       float scale, bool round_bf16, float* h, int64_t ld_h,
                       void* stream) {
  if (auto s = CheckRows("EmbedRows", rows, n, ld_table, ld_h); !s.ok())
    return s;
  if (rows == 0) return absl::OkStatus();
  if (table == nullptr || tokens == nullptr || h == nullptr)
    return NullArg("EmbedRows");
  EmbedKernel<<<Blocks(rows * n), kThreads, 0,
                static_cast<cudaStream_t>(stream)>>>(
      table, ld_table, tokens, rows, n, scale, round_bf16, h, ld_h);
  return internal::LastLaunchStatus("EmbedKernel");
}

absl::Status AddRows(float* h, int64_t ld_h, const float* x, int64_t ld_x,
                     int64_t rows, int64_t n, bool round_bf16, void* stream) {
  if (auto s = CheckRows("AddRows", rows, n, ld_x, ld_h); !s.ok()) return s;
  if (rows == 0) return absl::OkStatus();
  if (h == nullptr || x == nullptr) return NullArg("AddRows");
  AddKernel<<<Blocks(rows * n), kThreads, 0,
              static_cast<cudaStream_t>(stream)>>>(h, ld_h, x, ld_x, rows, n,
                                                   round_bf16);
  return internal::LastLaunchStatus("AddKernel");
}

absl::Status AddBias(float* x, int64_t ld_x, const float* bias, int64_t rows,
                     int64_t n, void* stream) {
  if (auto s = CheckRows("AddBias", rows, n, ld_x, ld_x); !s.ok()) return s;
  if (rows == 0) return absl::OkStatus();
  if (x == nullptr || bias == nullptr) return NullArg("AddBias");
  BiasKernel<<<Blocks(rows * n), kThreads, 0,
               static_cast<cudaStream_t>(stream)>>>(x, ld_x, bias, rows, n);
  return internal::LastLaunchStatus("BiasKernel");
}

absl::Status GatherRows(const float* x, int64_t ld_x, const int32_t* index,
                        int64_t rows, int64_t n, float* y, int64_t ld_y,
                        void* stream) {
  if (auto s = CheckRows("GatherRows", rows, n, ld_x, ld_y); !s.ok()) return s;
  if (rows == 0) return absl::OkStatus();
  if (x == nullptr || index == nullptr || y == nullptr)
    return NullArg("GatherRows");
  GatherKernel<<<Blocks(rows * n), kThreads, 0,
                 static_cast<cudaStream_t>(stream)>>>(x, ld_x, index, rows, n,
                                                      y, ld_y);
  return internal::LastLaunchStatus("GatherKernel");
}

absl::Status WriteKvPaged(const KvWriteArgs& a, void* stream) {
  if (auto s = CheckRows("WriteKvPaged", a.rows, a.n, a.ld, a.kv_stride);
      !s.ok())
    return s;
  if (a.block_rows <= 0 || a.table_stride <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WriteKvPaged: block_rows (", a.block_rows, ") and table_stride (",
        a.table_stride, ") must be positive"));
  }
  if (a.rows == 0) return absl::OkStatus();
  if (a.k == nullptr || a.v == nullptr || a.row_seq == nullptr ||
      a.positions == nullptr || a.pool == nullptr || a.block_table == nullptr)
    return NullArg("WriteKvPaged");
  KvWriteKernel<<<Blocks(a.rows * a.n), kThreads, 0,
                  static_cast<cudaStream_t>(stream)>>>(a);
  return internal::LastLaunchStatus("KvWriteKernel");
}

}  // namespace kvd::kernels::cuda
