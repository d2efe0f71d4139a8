#include "ops/backend/internal/cuda_layer.h"

#include "base/status_macros.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/paged_attention.h"

namespace kvd::ops::internal {
namespace {
namespace kc = ::kvd::kernels::cuda;
}  // namespace

absl::Status AttentionPartial(const ModelConfig& c, int64_t layer,
                              const CudaLayerWeights& lw,
                              const CudaShardDims& dims,
                              const CudaStepRows& rows,
                              const CudaStepBuffers& w, void* stream) {
  void* s = stream;
  const LayerConfig& lc = c.layers[layer];
  const int64_t d = c.d_model, hd = c.head_dim, m = rows.m;
  const int64_t qd = dims.qd, kvd = dims.kvd;
  const kc::RopeStyle rope = c.rope_style == kernels::cpu::RopeStyle::kHalfSplit
                                 ? kc::RopeStyle::kHalfSplit
                                 : kc::RopeStyle::kInterleaved;
  const kc::Activations x_act{w.x, kc::ActType::kF32, m, d};
  KVD_RETURN_IF_ERROR(
      kc::RmsNorm(w.h, d, lw.attn_norm, c.rms_eps, m, d, w.x, d, s));
  KVD_RETURN_IF_ERROR(kc::Gemm(x_act, lw.wq, w.q, qd, s));
  KVD_RETURN_IF_ERROR(kc::Gemm(x_act, lw.wk, w.k, kvd, s));
  KVD_RETURN_IF_ERROR(kc::Gemm(x_act, lw.wv, w.v, kvd, s));
  if (c.qkv_bias) {
    KVD_RETURN_IF_ERROR(kc::AddBias(w.q, qd, lw.bq, m, qd, s));
    KVD_RETURN_IF_ERROR(kc::AddBias(w.k, kvd, lw.bk, m, kvd, s));
    KVD_RETURN_IF_ERROR(kc::AddBias(w.v, kvd, lw.bv, m, kvd, s));
  }
  KVD_RETURN_IF_ERROR(kc::Rope(w.q, qd, m, dims.n_heads, hd, c.rope_dim,
                               rows.positions, lc.rope_base, rope, s));
  KVD_RETURN_IF_ERROR(kc::Rope(w.k, kvd, m, dims.n_kv_heads, hd, c.rope_dim,
                               rows.positions, lc.rope_base, rope, s));
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
  KVD_RETURN_IF_ERROR(kc::WriteKvPaged(kw, s));
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
  KVD_RETURN_IF_ERROR(kc::PagedAttention(a, s));
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
