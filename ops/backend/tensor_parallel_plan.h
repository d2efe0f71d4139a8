// Which slice of each layer a tensor-parallel shard owns (Megatron-style
// split of attention heads and MLP columns), as pure host arithmetic: no
// CUDA, tested on the CPU (tensor_parallel_plan_test) on the real configs.
//
// For TP degree S, shard s owns:
//   - K/V heads [kv_heads.begin, kv_heads.end): a contiguous, equal share of
//     the n_kv_heads; GQA groups stay whole, so it also owns their query heads
//     q_heads = kv_heads * (n_heads / n_kv_heads). S must divide n_kv_heads
//     (INVALID_ARGUMENT otherwise, naming the degrees that work).
//   - rows q_rows of Wq (q_heads * head_dim) and kv_rows of Wk / Wv, and the
//     same ranges of the q/k/v biases;
//   - the columns q_rows of W_o in GGUF layout (d_model x q_dim; the rows of
//     W_o in the y = a . W_o notation): its attention output is a partial sum
//     over the reduction, completed by an all-reduce;
//   - MLP intermediate columns ff: rows of W_gate / W_up and columns of
//     W_down in GGUF layout (rows of W_down in the y = a . W_down notation),
//     again completed by an all-reduce. d_ff need not divide by S: shard s
//     gets [s * d_ff / S, (s + 1) * d_ff / S).
// Norms, the embedding and the output matrix are replicated.
//
//   KVD_ASSIGN_OR_RETURN(TensorParallelPlan plan,
//                        TensorParallelPlan::Make(config, 4));
//   const ShardSlice& s = plan.shard(1);  // s.q_rows, s.kv_rows, s.ff ...
//
// Thread-safety: an immutable value.
#ifndef KVD_OPS_BACKEND_TENSOR_PARALLEL_PLAN_H_
#define KVD_OPS_BACKEND_TENSOR_PARALLEL_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ops/model/model_config.h"

namespace kvd::ops {

// [begin, end).
struct IndexRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  friend bool operator==(const IndexRange& a, const IndexRange& b) {
    return a.begin == b.begin && a.end == b.end;
  }
};

struct ShardSlice {
  int shard = 0;
  IndexRange kv_heads;  // K/V heads
  IndexRange q_heads;   // query heads (whole GQA groups of kv_heads)
  IndexRange q_rows;    // rows of Wq, bq; columns of W_o (GGUF layout)
  IndexRange kv_rows;   // rows of Wk, Wv, bk, bv
  IndexRange ff;        // rows of W_gate, W_up; columns of W_down
};

class TensorParallelPlan {
 public:
  // INVALID_ARGUMENT if degree < 1, the config has no heads, n_heads is not a
  // multiple of n_kv_heads, or degree does not divide n_kv_heads or exceeds
  // d_ff.
  static absl::StatusOr<TensorParallelPlan> Make(const ModelConfig& config,
                                                 int degree);

  // The degrees Make accepts for `config` (the divisors of n_kv_heads that
  // are <= d_ff), ascending.
  static std::vector<int> ValidDegrees(const ModelConfig& config);

  int degree() const { return static_cast<int>(shards_.size()); }
  const ShardSlice& shard(int s) const { return shards_[s]; }
  absl::Span<const ShardSlice> shards() const { return shards_; }

 private:
  std::vector<ShardSlice> shards_;
};

// Copies rows [r.begin, r.end) of a row-major rows x cols matrix (leading
// dimension ld) into dst (r.size() x cols, dense). T is any trivially
// copyable element (bf16 bits, float).
template <typename T>
std::vector<T> SliceRows(const T* m, int64_t cols, int64_t ld, IndexRange r) {
  std::vector<T> out(r.size() * cols);
  for (int64_t i = 0; i < r.size(); ++i)
    for (int64_t j = 0; j < cols; ++j)
      out[i * cols + j] = m[(r.begin + i) * ld + j];
  return out;
}

// Copies columns [c.begin, c.end) of a row-major rows x ld matrix into a
// dense rows x c.size() matrix.
template <typename T>
std::vector<T> SliceCols(const T* m, int64_t rows, int64_t ld, IndexRange c) {
  std::vector<T> out(rows * c.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < c.size(); ++j)
      out[i * c.size() + j] = m[i * ld + c.begin + j];
  return out;
}

}  // namespace kvd::ops

#endif  // KVD_OPS_BACKEND_TENSOR_PARALLEL_PLAN_H_
