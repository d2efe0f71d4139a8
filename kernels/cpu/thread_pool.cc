#include "kernels/cpu/thread_pool.h"

#include <algorithm>

namespace kvd::kernels::cpu {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) {
    num_threads =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  num_threads_ = num_threads;
  ranges_.resize(num_threads_);
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  while (true) {
    std::pair<int64_t, int64_t> range;
    const std::function<void(int64_t, int64_t)>* fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      range = ranges_[index];
      fn = fn_;
    }
    if (range.first < range.second) (*fn)(range.first, range.second);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n,
                             const std::function<void(int64_t, int64_t)>& fn,
                             int64_t align) {
  if (n <= 0) return;
  align = std::max<int64_t>(align, 1);
  const int64_t units = (n + align - 1) / align;
  const int used = static_cast<int>(std::min<int64_t>(num_threads_, units));
  if (used <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::pair<int64_t, int64_t>> ranges(num_threads_, {0, 0});
  for (int i = 0; i < used; ++i) {
    const int64_t b = std::min(n, units * i / used * align);
    const int64_t e = std::min(n, units * (i + 1) / used * align);
    ranges[i] = {b, e};
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ranges_ = ranges;
    fn_ = &fn;
    pending_ = num_threads_ - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  fn(ranges[0].first, ranges[0].second);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
}

}  // namespace kvd::kernels::cpu
