#include "services/node/memory_trimmer.h"

#include <algorithm>

#include "base/process_memory.h"

namespace kvd::node {

MemoryTrimmer::MemoryTrimmer(MemoryTrimmerOptions options)
    : options_(options), thread_([this] { Loop(); }) {}

MemoryTrimmer::~MemoryTrimmer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void MemoryTrimmer::TrimOnce() {
  const ProcessMemory before = ReadProcessMemory();
  if (before.heap_free_bytes < options_.min_free_bytes) return;
  if (!ReturnFreeHeapToOs()) return;
  const ProcessMemory after = ReadProcessMemory();
  absl::MutexLock lock(&mu_);
  stats_.trims++;
  stats_.released_bytes +=
      std::max<int64_t>(0, before.rss_bytes - after.rss_bytes);
}

MemoryTrimmerStats MemoryTrimmer::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void MemoryTrimmer::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]()
                          ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.interval)) {
        return;
      }
    }
    TrimOnce();
  }
}

}  // namespace kvd::node
