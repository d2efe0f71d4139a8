#include "ops/backend/tensor_parallel_plan.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvd::ops {

std::vector<int> TensorParallelPlan::ValidDegrees(const ModelConfig& c) {
  std::vector<int> out;
  for (int64_t s = 1; s <= c.n_kv_heads; ++s) {
    if (c.n_kv_heads % s == 0 && s <= c.d_ff)
      out.push_back(static_cast<int>(s));
  }
  return out;
}

absl::StatusOr<TensorParallelPlan> TensorParallelPlan::Make(
    const ModelConfig& c, int degree) {
  if (c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 || c.d_ff <= 0 ||
      c.n_heads % c.n_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor-parallel plan: the model config needs n_heads (", c.n_heads,
        ") a positive multiple of n_kv_heads (", c.n_kv_heads, "), head_dim (",
        c.head_dim, ") and d_ff (", c.d_ff, ") > 0"));
  }
  if (degree < 1 || c.n_kv_heads % degree != 0 || degree > c.d_ff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor-parallel degree ", degree, " does not divide the model's ",
        c.n_kv_heads,
        " K/V heads (a shard owns whole K/V heads and their query heads); "
        "degrees that work for this model: ",
        absl::StrJoin(ValidDegrees(c), ", ")));
  }
  const int64_t kv_per = c.n_kv_heads / degree;
  const int64_t group = c.n_heads / c.n_kv_heads;
  TensorParallelPlan plan;
  for (int s = 0; s < degree; ++s) {
    ShardSlice sl;
    sl.shard = s;
    sl.kv_heads = {s * kv_per, (s + 1) * kv_per};
    sl.q_heads = {sl.kv_heads.begin * group, sl.kv_heads.end * group};
    sl.q_rows = {sl.q_heads.begin * c.head_dim, sl.q_heads.end * c.head_dim};
    sl.kv_rows = {sl.kv_heads.begin * c.head_dim, sl.kv_heads.end * c.head_dim};
    sl.ff = {s * c.d_ff / degree, (s + 1) * c.d_ff / degree};
    plan.shards_.push_back(sl);
  }
  return plan;
}

}  // namespace kvd::ops
