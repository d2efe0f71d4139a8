// The per-row glue of a transformer forward pass on the GPU, besides the
// GEMM, norm, RoPE and attention kernels: embedding lookup, residual add (with
// the bf16 mode's rounding at layer boundaries), bias add, row gather, and the
// K/V write into the paged pool that PagedAttention reads.
//
// None of them reduces anything: each output element is a fixed function of
// the input elements at the same row and column (one IEEE-rounded operation,
// or a copy), so they are batch-invariant by construction and identical to
// the CPU's elementwise code (kernels/cpu/elementwise.h) for the same inputs.
// bf16 rounding is round-to-nearest-even with NaN kept quiet, exactly as
// kernels/cpu FloatToBf16.
//
//   KVD_RETURN_IF_ERROR(EmbedRows(table, d, tokens, m, 1.0f, true, h, d, s));
//   ...
//   KVD_RETURN_IF_ERROR(AddRows(h, d, o, d, m, d, /*round_bf16=*/true, s));
//
// Thread-safety: each call enqueues one kernel on `stream` (nullptr: the
// legacy default stream) and returns; pointers are device memory the caller
// keeps alive until the stream has run it. Argument errors (INVALID_ARGUMENT)
// are reported before any launch, launch failures are INTERNAL.
#ifndef KVD_KERNELS_CUDA_MODEL_OPS_H_
#define KVD_KERNELS_CUDA_MODEL_OPS_H_

#include <cstdint>

#include "absl/status/status.h"

namespace kvd::kernels::cuda {

// h[r][c] = bf16_to_float(table[tokens[r] * ld_table + c]) * scale for
// r < rows, c < n; rounded to bf16 again when round_bf16 (a scale != 1 makes
// it non-representable). tokens: device int32[rows], each < the table's
// rows (not checked on the device: validate ids before the call).
absl::Status EmbedRows(const uint16_t* table, int64_t ld_table,
                       const int32_t* tokens, int64_t rows, int64_t n,
                       float scale, bool round_bf16, float* h, int64_t ld_h,
                       void* stream);

// h[r][c] = h[r][c] + x[r][c] (one fp32 add), then rounded to bf16 when
// round_bf16 (the bf16 mode's residual at a layer boundary).
absl::Status AddRows(float* h, int64_t ld_h, const float* x, int64_t ld_x,
                     int64_t rows, int64_t n, bool round_bf16, void* stream);

// x[r][c] += bias[c] (a GEMM's bias, qwen2's q/k/v).
absl::Status AddBias(float* x, int64_t ld_x, const float* bias, int64_t rows,
                     int64_t n, void* stream);

// y[i][c] = x[index[i]][c] for i < rows (index: device int32[rows]).
absl::Status GatherRows(const float* x, int64_t ld_x, const int32_t* index,
                        int64_t rows, int64_t n, float* y, int64_t ld_y,
                        void* stream);

// Writes `rows` fp32 K and V rows (n values each), rounded to bf16, into a
// paged pool in paged_attention.h's layout: row r belongs to sequence
// row_seq[r] at position positions[r]; its K goes to pool row
// block_table[row_seq[r] * table_stride + positions[r] / block_rows] *
// 2 * block_rows + positions[r] % block_rows (times kv_stride values), its V
// block_rows rows further. Entries must name valid pool blocks (not checked
// on the device).
struct KvWriteArgs {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t ld = 0;  // of k and v, >= n
  int64_t rows = 0;
  int64_t n = 0;                     // n_kv_heads * head_dim
  const int32_t* row_seq = nullptr;  // device int32[rows]
  const int32_t* positions = nullptr;
  uint16_t* pool = nullptr;
  const int32_t* block_table = nullptr;
  int64_t table_stride = 0;
  int64_t block_rows = 0;
  int64_t kv_stride = 0;  // >= n
};
absl::Status WriteKvPaged(const KvWriteArgs& args, void* stream);

}  // namespace kvd::kernels::cuda

#endif  // KVD_KERNELS_CUDA_MODEL_OPS_H_
