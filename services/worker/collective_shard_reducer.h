// The ShardReducer of a shard running as its own process (ops/model/
// shard_reducer.h): the ordered all-reduce of services/collective over UCX
// (or any chunk-stream transport) joins its partials with the other shard
// processes'. A failed reduce (a peer died or stalled past `timeout`) fails
// the shard's forward pass with the collective's error, and every later one:
// the shard group must be rebuilt.
//
// Thread-safety: as the collective: one forward pass at a time.
#ifndef KVD_SERVICES_WORKER_COLLECTIVE_SHARD_REDUCER_H_
#define KVD_SERVICES_WORKER_COLLECTIVE_SHARD_REDUCER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ops/model/shard_reducer.h"
#include "services/collective/ordered_all_reduce.h"

namespace kvd::worker {

class CollectiveShardReducer final : public ops::ShardReducer {
 public:
  CollectiveShardReducer(collective::OrderedAllReduce* all_reduce,
                         absl::Duration timeout)
      : all_reduce_(all_reduce), timeout_(timeout) {}

  void Reduce(int64_t shard, const std::vector<const float*>& partials,
              int64_t n, float* out) override;
  absl::Status status() const override { return status_; }

 private:
  collective::OrderedAllReduce* const all_reduce_;
  const absl::Duration timeout_;
  absl::Status status_;
};

}  // namespace kvd::worker

#endif  // KVD_SERVICES_WORKER_COLLECTIVE_SHARD_REDUCER_H_
