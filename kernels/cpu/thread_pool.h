// A fixed-size pool of worker threads for data-parallel kernels.
//
// Kernels split work over output rows, columns or heads -- never over a
// reduction -- so the number of threads never changes a result bit (numerics
// contract, README.md).
//
//   ThreadPool pool(2);
//   pool.ParallelFor(n_rows, [&](int64_t begin, int64_t end) { ... });
//
// Thread-safety: ParallelFor may be called from one thread at a time per pool
// (the engine's step loop); the calling thread takes part in the work.
#ifndef KVD_KERNELS_CPU_THREAD_POOL_H_
#define KVD_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvd::kernels::cpu {

class ThreadPool {
 public:
  // num_threads >= 1 counts the calling thread; 0 means the number of hardware
  // threads.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Splits [0, n) into num_threads() contiguous ranges whose boundaries are
  // multiples of `align` (except the end) and runs fn(begin, end) on each;
  // returns when all are done.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                   int64_t align = 1);

 private:
  void WorkerLoop(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  // A step of a forward pass issues hundreds of short parallel sections; waking
  // threads through a condition variable each time costs tens of microseconds,
  // so workers and the caller spin briefly on these atomics before they sleep.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
};

}  // namespace kvd::kernels::cpu

#endif  // KVD_KERNELS_CPU_THREAD_POOL_H_
