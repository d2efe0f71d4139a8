// Gives memory that glibc's malloc keeps free in its arenas back to the
// kernel, from a background thread, so a server's resident memory follows
// what it uses (budgets for K/V, the DRAM tier and memtables) instead of the
// high-water mark of every arena. Sessions come and go in a serving node:
// without this, residual stores and checkpoint buffers freed by demotion and
// eviction stay resident per thread arena (measured in docs/BENCHMARKS.md).
// K/V blocks are not among them: the K/V pool keeps released blocks for
// reuse, within its own budget.
//
//   MemoryTrimmer trimmer({.interval = absl::Seconds(5)});
//   ...                       // trims while alive; stats() for /metrics
//
// Thread-safety: stats() may be called from any thread.
#ifndef KVD_SERVICES_NODE_MEMORY_TRIMMER_H_
#define KVD_SERVICES_NODE_MEMORY_TRIMMER_H_

#include <cstdint>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvd::node {

struct MemoryTrimmerOptions {
  absl::Duration interval = absl::Seconds(5);
  // Trim only when malloc holds at least this many free bytes. malloc counts
  // pages already trimmed as free too, so once this much has been freed the
  // heap is walked every interval (a few ms per walk for a GiB-sized heap);
  // below it, never.
  int64_t min_free_bytes = int64_t{32} << 20;
};

struct MemoryTrimmerStats {
  int64_t trims = 0;           // malloc_trim calls that released memory
  int64_t released_bytes = 0;  // resident bytes they gave back (VmRSS drop)
};

class MemoryTrimmer {
 public:
  explicit MemoryTrimmer(MemoryTrimmerOptions options);
  ~MemoryTrimmer();  // stops the thread
  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

  // One check-and-trim now (what the thread runs each interval).
  void TrimOnce();
  MemoryTrimmerStats stats() const;

 private:
  void Loop();

  const MemoryTrimmerOptions options_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  MemoryTrimmerStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_MEMORY_TRIMMER_H_
