// How the shards of a tensor-parallel model meet after their row-parallel
// projections (W_o, W_down): each shard holds whole groups of the model's G
// (ModelConfig::row_parallel_groups), computes one partial per group, and
// Reduce gives every shard the sum of all G partials added in group order
// (shard 0's groups first). That order is the unsharded model's
// (kernels/cpu/row_parallel_gemm.h), so any degree dividing G computes the
// same bits as one process.
//
// ThreadShardReducer joins shards running as threads of one process; shards
// as processes use services/collective.
//
// Thread-safety: Reduce is called by every shard of a step concurrently, each
// with its own index; the calls of one layer must not overlap the next's.
#ifndef KVD_OPS_MODEL_SHARD_REDUCER_H_
#define KVD_OPS_MODEL_SHARD_REDUCER_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/status.h"

namespace kvd::ops {

class ShardReducer {
 public:
  virtual ~ShardReducer() = default;
  // `partials`: this shard's groups' partials in group order, `n` floats
  // each. Writes the ordered sum of every shard's partials to `out` (n).
  // A reducer that fails (a peer process died or stalled) writes zeros and
  // keeps the error in status(), which fails the forward pass.
  virtual void Reduce(int64_t shard, const std::vector<const float*>& partials,
                      int64_t n, float* out) = 0;
  virtual absl::Status status() const { return absl::OkStatus(); }
};

class ThreadShardReducer final : public ShardReducer {
 public:
  explicit ThreadShardReducer(int64_t degree);
  void Reduce(int64_t shard, const std::vector<const float*>& partials,
              int64_t n, float* out) override;

 private:
  // Blocks until every shard arrived at this barrier (generation counted).
  void Barrier(std::unique_lock<std::mutex>& lock);

  const int64_t degree_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<std::vector<const float*>> posted_;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_MODEL_SHARD_REDUCER_H_
