#include "ops/backend/internal/cuda_layer.h"

#include "base/status_macros.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/paged_attention.h"

namespace kvd::ops::internal {
namespace {
namespace kc = ::kvd::kernels::cuda;
}  // namespace

namespace {

kc::RopeStyle CudaRopeStyle(const ModelConfig& c) {
  return c.rope_style == kernels::cpu::RopeStyle::kHalfSplit
             ? kc::RopeStyle::kHalfSplit
             : kc::RopeStyle::kInterleaved;
}

}  // namespace

absl::Status KvPartial(const ModelConfig& c, int64_t layer,
                       const CudaLayerWeights& lw, const CudaShardDims& dims,
                       const CudaStepRows& rows, const CudaStepBuffers& w,
                       void* stream) {
  void* s = stream;
  const int64_t d = c.d_model, m = rows.m, kvd = dims.kvd;
  const kc::Activations x_act{w.x, kc::ActType::kF32, m, d};
  KVD_RETURN_IF_ERROR(kc::Gemm(x_act, lw.wk, w.k, kvd, s));
  KVD_RETURN_IF_ERROR(kc::Gemm(x_act, lw.wv, w.v, kvd, s));
  if (c.qkv_bias) {
    KVD_RETURN_IF_ERROR(kc::AddBias(w.k, kvd, lw.bk, m, kvd, s));
    KVD_RETURN_IF_ERROR(kc::AddBias(w.v, kvd, lw.bv, m, kvd, s));
  }
  KVD_RETURN_IF_ERROR(kc::Rope(w.k, kvd, m, dims.n_kv_heads, c.head_dim,
                               c.rope_dim, rows.positions,
                               c.layers[layer].rope_base, CudaRopeStyle(c), s));
  kc::KvWriteArgs kw;
  kw.k = w.k;
  kw.v = w.v;
  kw.ld = kvd;
  kw.rows = m;
  kw.n = kvd;
  kw.row_seq = rows.row_seq;
  kw.positions = rows.positions;
  kw.pool = rows.pool;
  kw.block_table = rows.table;
  kw.table_stride = rows.table_stride;
  kw.block_rows = rows.block_rows;
  kw.kv_stride = kvd;
  return kc::WriteKvPaged(kw, s);
}

absl::Status AttentionPartial(const ModelConfig& c, int64_t layer,
                              const CudaLayerWeights& lw,
                              const CudaShardDims& dims,
                              const CudaStepRows& rows,
                              const CudaStepBuffers& w, void* stream) {
  void* s = stream;
  const LayerConfig& lc = c.layers[layer];
  const int64_t d = c.d_model, hd = c.head_dim, m = rows.m;
  const int64_t qd = dims.qd, kvd = dims.kvd;
  KVD_RETURN_IF_ERROR(
      kc::RmsNorm(w.h, d, lw.attn_norm, c.rms_eps, m, d, w.x, d, s));
  // K/V first: the same launches RecomputeKvIntoCache makes. Each kernel is
  // a fixed function of its inputs, so their order on the stream does not
  // change a bit.
  KVD_RETURN_IF_ERROR(KvPartial(c, layer, lw, dims, rows, w, s));
  KVD_RETURN_IF_ERROR(
      kc::Gemm({w.x, kc::ActType::kF32, m, d}, lw.wq, w.q, qd, s));
  if (c.qkv_bias) KVD_RETURN_IF_ERROR(kc::AddBias(w.q, qd, lw.bq, m, qd, s));
  KVD_RETURN_IF_ERROR(kc::Rope(w.q, qd, m, dims.n_heads, hd, c.rope_dim,
                               rows.positions, lc.rope_base, CudaRopeStyle(c),
                               s));
  kc::PagedAttentionArgs a;
  a.q = w.q;
  a.nq = m;
  a.q_stride = qd;
  a.n_heads = dims.n_heads;
  a.n_kv_heads = dims.n_kv_heads;
  a.head_dim = hd;
  a.scale = c.attn_scale();
  a.kv = {rows.pool, rows.table, rows.table_stride, rows.block_rows, kvd};
  a.query_seq = rows.row_seq;
  a.last = rows.positions;
  a.window = lc.sliding_window;
  a.out = w.attn;
  a.out_stride = qd;
  if (rows.cold == nullptr) {
    KVD_RETURN_IF_ERROR(kc::PagedAttention(a, s));
  } else {
    const CudaColdRows& cold = *rows.cold;
    kc::PagedRecomputeArgs r;
    r.attn = a;
    r.n_seqs = cold.n_seqs;
    r.hot_begin = cold.hot_begin;
    r.residual = cold.residual;
    r.ld_residual = d;
    r.d_model = d;
    r.norm_weight = lw.attn_norm;
    r.eps = c.rms_eps;
    // RecomputeKv reads every K/V head's rows of these weights and biases:
    // the whole model's, or a tensor-parallel shard's slice (its own heads,
    // a.n_kv_heads of them), so it recomputes exactly the heads this pool
    // holds, with KvPartial's arithmetic. Without the biases a biased
    // model's recomputed K/V would not be the rows Forward cached.
    r.wk = lw.wk.data;
    r.wv = lw.wv.data;
    r.bk = c.qkv_bias ? lw.bk : nullptr;
    r.bv = c.qkv_bias ? lw.bv : nullptr;
    r.rot_dim = c.rope_dim;
    r.rope_base = lc.rope_base;
    r.rope_style = CudaRopeStyle(c);
    r.group_rows = cold.group_rows;
    r.workspace = cold.workspace;
    r.workspace_bytes = cold.workspace_bytes;
    KVD_RETURN_IF_ERROR(kc::PagedAttentionRecompute(r, s));
  }
  return kc::Gemm({w.attn, kc::ActType::kF32, m, qd}, lw.wo, w.o, d, s);
}

absl::Status MlpPartial(const ModelConfig& c, const CudaLayerWeights& lw,
                        const CudaShardDims& dims, int64_t m,
                        const CudaStepBuffers& w, void* stream) {
  void* s = stream;
  const int64_t d = c.d_model, ff = dims.ff;
  const kc::Activations x_act{w.x, kc::ActType::kF32, m, d};
  KVD_RETURN_IF_ERROR(
      kc::RmsNorm(w.h, d, lw.ffn_norm, c.rms_eps, m, d, w.x, d, s));
  KVD_RETURN_IF_ERROR(kc::Gemm(x_act, lw.w_gate, w.gate, ff, s));
  KVD_RETURN_IF_ERROR(kc::Gemm(x_act, lw.w_up, w.up, ff, s));
  KVD_RETURN_IF_ERROR(kc::GatedActivation(
      c.activation == Activation::kSilu ? kc::GatedAct::kSilu
                                        : kc::GatedAct::kGeluTanh,
      w.gate, ff, w.up, ff, m, ff, w.gate, ff, s));
  return kc::Gemm({w.gate, kc::ActType::kF32, m, ff}, lw.w_down, w.o, d, s);
}

}  // namespace kvd::ops::internal
