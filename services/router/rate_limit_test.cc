#include "services/router/rate_limit.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::router {
namespace {

using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

// A tenant flooding creations is refused past its burst, recovers at the
// rate, and never costs another tenant anything.
TEST(TenantRateLimiterTest, AFloodingTenantIsRefusedAndOthersAreNot) {
  TenantRateLimiter limit(/*per_minute=*/60, /*burst=*/3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(limit.Take("flood", "new sessions", kT0).ok()) << i;
  }
  const absl::Status refused = limit.Take("flood", "new sessions", kT0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("tenant 'flood'"));
  EXPECT_THAT(refused.message(), HasSubstr("new sessions"));
  EXPECT_THAT(refused.message(), HasSubstr("retry in 1 s"));
  EXPECT_EQ(refused.GetPayload(kRetryAfterPayload).value_or(absl::Cord()), "1");
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(limit.Take("calm", "new sessions", kT0).ok()) << i;
  }
  // One a second comes back, never more than the burst.
  EXPECT_TRUE(limit.Take("flood", "new sessions", kT0 + absl::Seconds(1)).ok());
  EXPECT_FALSE(
      limit.Take("flood", "new sessions", kT0 + absl::Seconds(1)).ok());
  const absl::Time later = kT0 + absl::Hours(1);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(limit.Take("flood", "new sessions", later).ok()) << i;
  }
  EXPECT_FALSE(limit.Take("flood", "new sessions", later).ok());
}

TEST(TenantRateLimiterTest, ZeroRateIsNoLimit) {
  TenantRateLimiter limit(/*per_minute=*/0, /*burst=*/1);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(limit.Take("t", "migrations", kT0).ok());
  }
}

}  // namespace
}  // namespace kvd::router
