// Per-tenant rate limits at the router: a token bucket per tenant, so one
// tenant minting sessions (each a directory entry in etcd) or migrations
// (each a whole session's bytes between nodes) cannot crowd out the others.
//
//   TenantRateLimiter creations(/*per_minute=*/600, /*burst=*/60);
//   KVD_RETURN_IF_ERROR(creations.Take(tenant, "new sessions"));
//
// Thread-safety: thread-safe.
#ifndef KVD_SERVICES_ROUTER_RATE_LIMIT_H_
#define KVD_SERVICES_ROUTER_RATE_LIMIT_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvd::router {

// The payload of Take's RESOURCE_EXHAUSTED: whole seconds until it would
// succeed (what a Retry-After header says).
inline constexpr char kRetryAfterPayload[] = "kvd.retry_after_s";

class TenantRateLimiter {
 public:
  // On average at most `per_minute` events a minute per tenant, up to
  // `burst` at once; per_minute <= 0: no limit.
  TenantRateLimiter(double per_minute, double burst);

  // Counts one event of `tenant`, or RESOURCE_EXHAUSTED (HTTP 429) naming
  // `what`, the limit and when one is allowed again (also as the
  // kRetryAfterPayload payload), counting nothing.
  absl::Status Take(const std::string& tenant, absl::string_view what,
                    absl::Time now = absl::Now());

  bool unlimited() const { return per_second_ <= 0; }

 private:
  struct Bucket {
    double tokens = 0;
    absl::Time at;
  };
  const double per_second_;
  const double burst_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvd::router

#endif  // KVD_SERVICES_ROUTER_RATE_LIMIT_H_
