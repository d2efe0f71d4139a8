// Admission control for generation requests: at most `max_inflight` run at
// once, at most `max_queue` wait for a slot (first come, first served), and
// anyone beyond that is refused at once with RESOURCE_EXHAUSTED (HTTP 429
// with Retry-After, gRPC with grpc-retry-pushback-ms) instead of piling up
// threads and memory. `kvd serve` gives its HTTP and gRPC front ends one
// Admission, so --max-inflight and --max-queue bound both together.
//
//   Admission admission(/*max_inflight=*/2, /*max_queue=*/8);
//   KVD_ASSIGN_OR_RETURN(Admission::Permit permit, admission.Acquire());
//   ... generate ...   // the slot is released when `permit` dies
//
// Thread-safety: all methods may be called concurrently. A Permit must not
// outlive its Admission.
#ifndef KVD_SERVICES_NODE_ADMISSION_H_
#define KVD_SERVICES_NODE_ADMISSION_H_

#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kvd::node {

class Admission {
 public:
  // max_inflight >= 1 (smaller values are raised to 1); max_queue >= 0.
  Admission(int max_inflight, int max_queue);

  class Permit {
   public:
    Permit() = default;
    Permit(Permit&& other) noexcept : owner_(other.owner_) {
      other.owner_ = nullptr;
    }
    Permit& operator=(Permit&& other) noexcept;
    ~Permit();
    bool held() const { return owner_ != nullptr; }

   private:
    friend class Admission;
    explicit Permit(Admission* owner) : owner_(owner) {}
    Admission* owner_ = nullptr;
  };

  // A slot now, or after waiting in the queue; RESOURCE_EXHAUSTED when the
  // queue is full too. `cancelled` (may be empty) is polled while waiting:
  // when it turns true the request leaves the queue with CANCELLED (a
  // client gone, a deadline passed, the server stopping).
  absl::StatusOr<Permit> Acquire(
      const std::function<bool()>& cancelled = nullptr);

  int inflight() const;
  int queued() const;
  // Every slot taken and the queue full: the next Acquire is refused.
  bool full() const;

 private:
  void Release();
  // Moves serving_ past tickets whose holders gave up waiting.
  void SkipAbandonedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_inflight_;
  const int max_queue_;
  mutable absl::Mutex mu_;
  int inflight_ ABSL_GUARDED_BY(mu_) = 0;
  int queued_ ABSL_GUARDED_BY(mu_) = 0;
  // Tickets make the queue first come, first served.
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t serving_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<uint64_t> abandoned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_ADMISSION_H_
