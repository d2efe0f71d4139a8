#include "ops/model/shard_reducer.h"

#include <algorithm>

#include "kernels/cpu/row_parallel_gemm.h"

namespace kvd::ops {

ThreadShardReducer::ThreadShardReducer(int64_t degree)
    : degree_(degree), posted_(degree) {}

void ThreadShardReducer::Barrier(std::unique_lock<std::mutex>& lock) {
  const uint64_t gen = generation_;
  if (++arrived_ == degree_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen; });
}

void ThreadShardReducer::Reduce(int64_t shard,
                                const std::vector<const float*>& partials,
                                int64_t n, float* out) {
  std::unique_lock<std::mutex> lock(mu_);
  posted_[shard] = partials;
  Barrier(lock);
  // Every shard adds all partials itself, in the same order: the same bits
  // everywhere, no result to send back.
  std::vector<const float*> all;
  for (const auto& p : posted_) all.insert(all.end(), p.begin(), p.end());
  lock.unlock();
  std::copy(all[0], all[0] + n, out);
  for (size_t g = 1; g < all.size(); ++g) {
    kernels::cpu::AddPartial(all[g], 1, n, n, out);
  }
  lock.lock();
  // Nobody may reuse its partial buffers while another shard still reads.
  Barrier(lock);
}

}  // namespace kvd::ops
