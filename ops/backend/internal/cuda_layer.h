// The kernel sequence of one transformer layer on the GPU, shared by
// CudaModel (cuda_model.h: the whole model is one shard) and TpCudaModel
// (tp_cuda_model.h: each shard's heads and MLP columns): the attention half
// up to W_o's (partial) output, and the MLP half up to W_down's. The caller
// adds the outputs into the residual (after an all-reduce, under tensor
// parallelism), so the two halves are exactly what each model ran before.
//
//   KVD_RETURN_IF_ERROR(AttentionPartial(c, l, lw, dims, rows, buf, s));
//   KVD_RETURN_IF_ERROR(kc::AddRows(buf.h, d, buf.o, d, m, d, false, s));
//   KVD_RETURN_IF_ERROR(MlpPartial(c, lw, dims, m, buf, s));
//
// Thread-safety: enqueues kernels on `stream`; the caller serialises steps.
#ifndef KVD_OPS_BACKEND_INTERNAL_CUDA_LAYER_H_
#define KVD_OPS_BACKEND_INTERNAL_CUDA_LAYER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/gemm.h"
#include "ops/model/model_config.h"

namespace kvd::ops::internal {

// One layer's device weights for one shard.
struct CudaLayerWeights {
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;  // if qkv_bias
  kernels::cuda::Bf16Weights wq, wk, wv, wo, w_gate, w_up, w_down;
};

// The shard's widths (the whole model's for CudaModel).
struct CudaShardDims {
  int64_t n_heads = 0, n_kv_heads = 0;
  int64_t qd = 0;   // n_heads * head_dim
  int64_t kvd = 0;  // n_kv_heads * head_dim, also the pool's row stride
  int64_t ff = 0;   // MLP columns
};

// Attention whose positions below a per-sequence hot boundary are
// recomputed from residuals inside the call (kernels/cuda paged_attention.h,
// PagedAttentionRecompute: RecomputeKv per group, folded in canonical
// order) instead of read from the pool. RecomputeKv runs Forward's K/V
// arithmetic (the k/v bias added with AddBias's single IEEE add, before
// RoPE), so the result is the bits attention over rows Forward cached would
// give, with or without q/k/v bias.
struct CudaColdRows {
  int64_t n_seqs = 0;
  // HOST int64[n_seqs]: multiples of the attention chunk; 0 where nothing
  // is recomputed.
  const int64_t* hot_begin = nullptr;
  // HOST [n_seqs] device pointers: sequence s's bf16 residual of position p
  // at residual[s] + p * d_model (null where hot_begin[s] is 0).
  const uint16_t* const* residual = nullptr;
  int64_t group_rows = 256;
  void* workspace = nullptr;  // PagedRecomputeWorkspaceBytes
  int64_t workspace_bytes = 0;
};

// The step's m rows and where their K/V go (cuda_step_plan.h's layout).
struct CudaStepRows {
  int64_t m = 0;
  const int32_t* positions = nullptr;  // device int32[m]
  const int32_t* row_seq = nullptr;    // device int32[m]
  const int32_t* table = nullptr;      // this layer's block table
  int64_t table_stride = 0;
  int64_t block_rows = 0;
  uint16_t* pool = nullptr;
  // Non-null: attention recomputes the cold positions (of the heads these
  // weights hold: the whole model's, or a tensor-parallel shard's).
  const CudaColdRows* cold = nullptr;
};

// Step buffers with at least m rows; the residual h is d_model wide.
struct CudaStepBuffers {
  float *h = nullptr, *x = nullptr, *q = nullptr, *k = nullptr, *v = nullptr,
        *attn = nullptr, *o = nullptr, *gate = nullptr, *up = nullptr;
};

// From x = RmsNorm(h) (already in w.x): the k, v projections (+ bias), RoPE
// on k, and the K/V rows written to the pool at rows.positions, rounded to
// bf16. Forward's K/V and a recompute from the same residuals run exactly
// these launches, so their rows are the same bits.
absl::Status KvPartial(const ModelConfig& c, int64_t layer,
                       const CudaLayerWeights& lw, const CudaShardDims& dims,
                       const CudaStepRows& rows, const CudaStepBuffers& w,
                       void* stream);

// x = RmsNorm(h); KvPartial; q projection (+ bias), RoPE; paged attention;
// o = attn W_o^T (this shard's partial sum).
absl::Status AttentionPartial(const ModelConfig& c, int64_t layer,
                              const CudaLayerWeights& lw,
                              const CudaShardDims& dims,
                              const CudaStepRows& rows,
                              const CudaStepBuffers& w, void* stream);

// x = RmsNorm(h) with ffn_norm; gate, up; gated activation; o = act W_down^T
// (this shard's partial sum).
absl::Status MlpPartial(const ModelConfig& c, const CudaLayerWeights& lw,
                        const CudaShardDims& dims, int64_t m,
                        const CudaStepBuffers& w, void* stream);

}  // namespace kvd::ops::internal

#endif  // KVD_OPS_BACKEND_INTERNAL_CUDA_LAYER_H_
