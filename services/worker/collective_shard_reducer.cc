#include "services/worker/collective_shard_reducer.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace kvd::worker {

void CollectiveShardReducer::Reduce(int64_t shard,
                                    const std::vector<const float*>& partials,
                                    int64_t n, float* out) {
  if (status_.ok()) {
    status_ = all_reduce_->Reduce(partials, n, out, absl::Now() + timeout_);
  }
  if (!status_.ok()) std::fill(out, out + n, 0.0f);
}

}  // namespace kvd::worker
