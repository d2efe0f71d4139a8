#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>

#include <algorithm>

namespace kvd::kernels::cpu {
namespace {

// A short busy-wait, then yielding (so an oversubscribed machine still makes
// progress), then blocking on the condition variable.
constexpr int kSpinIterations = 2000;
constexpr int kPauseIterations = 100;

void Backoff(int spins) {
  if (spins < kPauseIterations) {
    _mm_pause();
  } else {
    std::this_thread::yield();
  }
}

}  // namespace

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
    stop_.store(true);
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  while (true) {
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen &&
           !stop_.load() && spins < kSpinIterations) {
      Backoff(spins++);
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] {
        return stop_.load() ||
               generation_.load(std::memory_order_acquire) != seen;
      });
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    const std::pair<int64_t, int64_t> range = ranges_[index];
    if (range.first < range.second) (*fn_)(range.first, range.second);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
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
  for (int i = 0; i < num_threads_; ++i) {
    ranges_[i] =
        i < used ? std::make_pair(std::min(n, units * i / used * align),
                                  std::min(n, units * (i + 1) / used * align))
                 : std::make_pair(int64_t{0}, int64_t{0});
  }
  fn_ = &fn;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  {
    // The lock orders this generation bump with workers that are about to
    // sleep.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  work_cv_.notify_all();
  fn(ranges_[0].first, ranges_[0].second);
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0 &&
         spins < kSpinIterations) {
    Backoff(spins++);
  }
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(
        lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
}

}  // namespace kvd::kernels::cpu
