// Model::ShardOf: one tensor-parallel shard's slice of a loaded model.
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "ops/model/model.h"

namespace kvd::ops {
namespace {

// Rows [r0, r1) and columns [c0, c1) of `m` as their own matrix: blocks stay
// blocks where the columns fall on block boundaries; otherwise bf16 in the
// bf16 mode (values go through fp32 and back unchanged) and fp32 in the fp32
// mode (same values).
absl::StatusOr<Matrix> Slice(const Matrix& m, int64_t r0, int64_t r1,
                             int64_t c0, int64_t c1, Precision stored,
                             kernels::cpu::ThreadPool* pool) {
  if (std::optional<Matrix> blocks = m.SliceBlocks(r0, r1, c0, c1)) {
    return std::move(*blocks);
  }
  return Matrix::FromRows(
      r1 - r0, c1 - c0, stored, pool, [&](int64_t r, float* dst) {
        std::vector<float> row(m.cols());
        m.RowToFloat(r0 + r, row.data());
        std::memcpy(dst, row.data() + c0, (c1 - c0) * sizeof(float));
        return absl::OkStatus();
      });
}

std::vector<float> SliceVector(const std::vector<float>& v, int64_t a,
                               int64_t b) {
  if (v.empty()) return v;
  return std::vector<float>(v.begin() + a, v.begin() + b);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::ShardOf(const Model& full,
                                                      int64_t index,
                                                      int64_t degree,
                                                      ShardReducer* reducer,
                                                      int num_threads) {
  KVD_RETURN_IF_ERROR(full.CheckWeights("ShardOf"));
  const ModelConfig& c = full.config_;
  const int64_t groups = c.row_parallel_groups();
  if (degree < 1 || groups % degree != 0 || index < 0 || index >= degree ||
      reducer == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a tensor-parallel degree must divide the model's ", groups,
        " row-parallel groups (its K/V heads and d_ff); got shard ", index,
        " of ", degree, reducer == nullptr ? " without a reducer" : ""));
  }
  std::unique_ptr<Model> s(new Model());
  s->config_ = c;
  s->config_.n_heads = c.n_heads / degree;
  s->config_.n_kv_heads = c.n_kv_heads / degree;
  s->config_.d_ff = c.d_ff / degree;
  s->precision_ = full.precision_;
  s->pool_ = std::make_unique<kernels::cpu::ThreadPool>(num_threads);
  s->shard_index_ = index;
  s->shard_degree_ = degree;
  s->shard_groups_ = groups / degree;
  s->reducer_ = reducer;

  const int64_t hd = c.head_dim;
  const int64_t q0 = index * s->config_.n_heads * hd,
                q1 = q0 + s->config_.n_heads * hd;
  const int64_t k0 = index * s->config_.n_kv_heads * hd,
                k1 = k0 + s->config_.n_kv_heads * hd;
  const int64_t f0 = index * s->config_.d_ff, f1 = f0 + s->config_.d_ff;
  const int64_t d = c.d_model;
  kernels::cpu::ThreadPool* pool = s->pool_.get();
  const ModelWeights& fw = full.weights_;
  ModelWeights& w = s->weights_;
  w.token_embedding = fw.token_embedding;
  w.output_norm = fw.output_norm;
  w.output = fw.output;
  for (const LayerWeights& fl : fw.layers) {
    LayerWeights l;
    l.attn_norm = fl.attn_norm;
    KVD_ASSIGN_OR_RETURN(l.wq,
                         Slice(fl.wq, q0, q1, 0, d, full.precision_, pool));
    KVD_ASSIGN_OR_RETURN(l.wk,
                         Slice(fl.wk, k0, k1, 0, d, full.precision_, pool));
    KVD_ASSIGN_OR_RETURN(l.wv,
                         Slice(fl.wv, k0, k1, 0, d, full.precision_, pool));
    KVD_ASSIGN_OR_RETURN(l.wo,
                         Slice(fl.wo, 0, d, q0, q1, full.precision_, pool));
    l.bq = SliceVector(fl.bq, q0, q1);
    l.bk = SliceVector(fl.bk, k0, k1);
    l.bv = SliceVector(fl.bv, k0, k1);
    l.q_norm = fl.q_norm;  // per head dimension: the same for every head
    l.k_norm = fl.k_norm;
    l.post_attn_norm = fl.post_attn_norm;
    l.ffn_norm = fl.ffn_norm;
    KVD_ASSIGN_OR_RETURN(l.w_gate,
                         Slice(fl.w_gate, f0, f1, 0, d, full.precision_, pool));
    KVD_ASSIGN_OR_RETURN(l.w_up,
                         Slice(fl.w_up, f0, f1, 0, d, full.precision_, pool));
    KVD_ASSIGN_OR_RETURN(l.w_down,
                         Slice(fl.w_down, 0, d, f0, f1, full.precision_, pool));
    l.post_ffn_norm = fl.post_ffn_norm;
    w.layers.push_back(std::move(l));
  }
  return s;
}

}  // namespace kvd::ops
