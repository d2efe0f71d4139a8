// K/V recompute from stored residuals on the GPU (kv-direct's rebuild), for
// all K/V heads or for one tensor-parallel shard's heads [head_begin,
// head_end) from the replicated residual:
//
//   K[r, h] = RoPE(RMSNorm(x[r]) . Wk[h]^T + bk[h]),
//   V[r, h] = RMSNorm(x[r]) . Wv[h]^T + bv[h]
//
// for heads h in the range, stored bf16 (the GPU backend's cache dtype); the
// biases are optional (qwen2's k/v bias). The residual is bf16 (the
// checkpoint dtype in bf16 mode). Built from the batch-invariant kernels
// (bf16 -> fp32, RmsNorm, Gemm over the shard's rows of Wk/Wv, one IEEE add
// per biased element, Rope), so a shard's K/V are bit-identical to the same
// heads of a full recompute: each element's reduction order depends only on
// d_model, never on which or how many heads are computed (tested in
// kv_recompute_test). This is what lets a TP=4 node resume a session saved on
// a TP=2 node without any K/V difference. The bias is added exactly as the
// forward pass's AddBias (model_ops.h) adds it, between the projection and
// RoPE, so recomputed rows equal the rows the forward pass cached.
//
//   KvRecomputeArgs a{...};  // a.workspace: KvRecomputeWorkspaceFloats(...)
//   KVD_RETURN_IF_ERROR(RecomputeKv(a, stream));
//
// Thread-safety: enqueues kernels on `stream` and returns; buffers are device
// memory the caller keeps alive until the stream has run them. Argument
// errors (INVALID_ARGUMENT) are reported before any launch.
#ifndef KVD_KERNELS_CUDA_KV_RECOMPUTE_H_
#define KVD_KERNELS_CUDA_KV_RECOMPUTE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"

namespace kvd::kernels::cuda {

struct KvRecomputeArgs {
  // rows residual vectors of d_model bf16 values, row r at residual + r * ld.
  const uint16_t* residual = nullptr;
  int64_t rows = 0;
  int64_t d_model = 0;
  int64_t ld_residual = 0;
  const float* norm_weight = nullptr;  // d_model values, or null (no weight)
  float eps = 1e-5f;
  // Full (unsharded) bf16 weights: n_kv_heads * head_dim rows of d_model.
  const uint16_t* wk = nullptr;
  const uint16_t* wv = nullptr;
  // Optional full (unsharded) fp32 biases of n_kv_heads * head_dim values
  // (device memory); the shard adds its slice, from head_begin * head_dim.
  // Both or neither (INVALID_ARGUMENT otherwise); null: no bias.
  const float* bk = nullptr;
  const float* bv = nullptr;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t head_begin = 0;  // this shard's heads: [head_begin, head_end)
  int64_t head_end = 0;
  // RoPE on K: first rot_dim dims of each head, at positions[r] (device
  // int32[rows]).
  int64_t rot_dim = 0;
  float rope_base = 10000.0f;
  RopeStyle rope_style = RopeStyle::kHalfSplit;
  const int32_t* positions = nullptr;
  // Outputs: row r, shard head j (0-based) at out + r * ld_out + j * head_dim.
  uint16_t* k_out = nullptr;
  uint16_t* v_out = nullptr;
  int64_t ld_out = 0;  // >= (head_end - head_begin) * head_dim
  // Device scratch of KvRecomputeWorkspaceFloats(rows, d_model, width) floats.
  float* workspace = nullptr;
  // Which GEMM runs the K/V projections (gemm.h). Both give the same bits;
  // benchmarks set it to compare them.
  GemmImpl gemm_impl = GemmImpl::kAuto;
};

// Floats of scratch RecomputeKv needs: the normalised residual plus fp32 K
// and V for `width` = (head_end - head_begin) * head_dim columns.
int64_t KvRecomputeWorkspaceFloats(int64_t rows, int64_t d_model,
                                   int64_t width);

absl::Status RecomputeKv(const KvRecomputeArgs& a, void* stream);

}  // namespace kvd::kernels::cuda

#endif  // KVD_KERNELS_CUDA_KV_RECOMPUTE_H_
