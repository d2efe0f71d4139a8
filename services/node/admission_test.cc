#include "services/node/admission.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace kvd::node {
namespace {

TEST(Admission, RunsUpToTheLimitQueuesThenRefuses) {
  Admission a(/*max_inflight=*/1, /*max_queue=*/1);
  absl::StatusOr<Admission::Permit> first = a.Acquire();
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(a.inflight(), 1);

  std::atomic<bool> second_in{false};
  std::thread waiter([&] {
    absl::StatusOr<Admission::Permit> p = a.Acquire();
    ASSERT_TRUE(p.ok());
    second_in = true;
  });
  while (a.queued() != 1) absl::SleepFor(absl::Milliseconds(1));
  absl::StatusOr<Admission::Permit> third = a.Acquire();
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(second_in);

  *first = Admission::Permit();  // releases the slot
  waiter.join();
  EXPECT_TRUE(second_in);
  EXPECT_EQ(a.inflight(), 0);  // the waiter's permit died with its thread
  EXPECT_EQ(a.queued(), 0);
}

TEST(Admission, ManyThreadsNeverExceedTheLimit) {
  Admission a(/*max_inflight=*/2, /*max_queue=*/64);
  std::atomic<int> running{0}, peak{0}, done{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&] {
      absl::StatusOr<Admission::Permit> p = a.Acquire();
      ASSERT_TRUE(p.ok());
      const int now = ++running;
      int old = peak;
      while (now > old && !peak.compare_exchange_weak(old, now)) {
      }
      absl::SleepFor(absl::Milliseconds(2));
      --running;
      ++done;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(done, 16);
  EXPECT_LE(peak, 2);
  EXPECT_EQ(a.inflight(), 0);
}

TEST(Admission, ZeroQueueRefusesAtOnce) {
  Admission a(1, 0);
  absl::StatusOr<Admission::Permit> p = a.Acquire();
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(a.Acquire().status().code(), absl::StatusCode::kResourceExhausted);
}

// A waiter whose client gave up leaves the queue (CANCELLED) and frees its
// place, and the ones behind it are still served in order.
TEST(Admission, CancelledWaiterLeavesTheQueue) {
  Admission a(/*max_inflight=*/1, /*max_queue=*/2);
  absl::StatusOr<Admission::Permit> holder = a.Acquire();
  ASSERT_TRUE(holder.ok());
  std::atomic<bool> give_up{false};
  absl::Status cancelled_status;
  std::thread cancelled([&] {
    cancelled_status = a.Acquire([&] { return give_up.load(); }).status();
  });
  while (a.queued() < 1) absl::SleepFor(absl::Milliseconds(1));
  std::atomic<bool> third_in{false};
  std::thread third([&] {
    absl::StatusOr<Admission::Permit> p = a.Acquire();
    ASSERT_TRUE(p.ok());
    third_in = true;
  });
  while (a.queued() < 2) absl::SleepFor(absl::Milliseconds(1));
  give_up = true;
  cancelled.join();
  EXPECT_EQ(cancelled_status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(a.queued(), 1);
  EXPECT_FALSE(third_in);
  *holder = Admission::Permit();  // the slot frees: the third goes next
  third.join();
  EXPECT_TRUE(third_in);
  EXPECT_EQ(a.inflight(), 0);
}

}  // namespace
}  // namespace kvd::node
