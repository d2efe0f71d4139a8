#include "services/router/rate_limit.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvd::router {

TenantRateLimiter::TenantRateLimiter(double per_minute, double burst)
    : per_second_(per_minute / 60.0), burst_(std::max(1.0, burst)) {}

absl::Status TenantRateLimiter::Take(const std::string& tenant,
                                     absl::string_view what, absl::Time now) {
  if (unlimited()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto [it, added] = buckets_.try_emplace(tenant, Bucket{burst_, now});
  Bucket& b = it->second;
  if (!added && now > b.at) {
    b.tokens = std::min(
        burst_, b.tokens + absl::ToDoubleSeconds(now - b.at) * per_second_);
    b.at = now;
  }
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return absl::OkStatus();
  }
  const double wait_s = std::ceil((1 - b.tokens) / per_second_);
  absl::Status refused = absl::ResourceExhaustedError(absl::StrFormat(
      "tenant '%s' is over its limit of %s (%g a minute, %g at once); "
      "retry in %g s",
      tenant, what, per_second_ * 60, burst_, wait_s));
  refused.SetPayload(kRetryAfterPayload,
                     absl::Cord(absl::StrCat(static_cast<int64_t>(wait_s))));
  return refused;
}

}  // namespace kvd::router
