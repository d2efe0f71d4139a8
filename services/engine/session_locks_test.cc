// A session's turns never overlap; a frozen session's turns wait for it to
// be unfrozen (or are refused at once when they must not wait); a busy
// session refuses a server's turn instead of queueing it.
#include "services/engine/session_locks.h"

#include <atomic>
#include <optional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/engine/session_fence.h"

namespace kvd::engine {
namespace {

using ::testing::HasSubstr;
using Key = SessionLocks::Key;

TEST(SessionLocksTest, TurnsOfOneSessionDoNotOverlap) {
  SessionLocks locks(absl::Seconds(30));
  const Key key("t", "s");
  std::atomic<int> inside{0};
  std::atomic<int> most{0};
  std::vector<std::thread> turns;
  for (int i = 0; i < 4; ++i) {
    turns.emplace_back([&] {
      for (int j = 0; j < 50; ++j) {
        absl::StatusOr<SessionLocks::TurnLock> turn =
            locks.LockForTurn(key, /*fail_if_busy=*/false);
        ASSERT_TRUE(turn.ok()) << turn.status();
        const int now = ++inside;
        most = std::max(most.load(), now);
        EXPECT_TRUE(locks.InTurn(key));
        --inside;
      }
    });
  }
  for (std::thread& t : turns) t.join();
  EXPECT_EQ(most.load(), 1);
  EXPECT_FALSE(locks.InTurn(key));
}

TEST(SessionLocksTest, ABusySessionRefusesAServersTurn) {
  SessionLocks locks(absl::Seconds(30));
  const Key key("t", "s");
  absl::StatusOr<SessionLocks::TurnLock> first = locks.LockForTurn(key, false);
  ASSERT_TRUE(first.ok());
  std::optional<absl::Status> second;
  std::thread([&] { second = locks.LockForTurn(key, true).status(); }).join();
  EXPECT_EQ(second->code(), absl::StatusCode::kAborted);
  EXPECT_THAT(second->message(), HasSubstr("is busy"));
  EXPECT_TRUE(locks.LockForTurn(Key("t", "other"), true).ok());
}

TEST(SessionLocksTest, AFrozenSessionHoldsTurnsUntilUnfrozen) {
  SessionLocks locks(absl::Seconds(30));
  const Key key("t", "s");
  ASSERT_TRUE(locks.MarkFrozen(key));
  EXPECT_FALSE(locks.MarkFrozen(key));  // frozen already
  // A server's turn is refused at once, marked as not run.
  const absl::Status refused = locks.LockForTurn(key, true).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(NotRunReason(refused), "moving");
  // Any other turn waits for the unfreeze.
  absl::Notification ran;
  std::thread held([&] {
    absl::StatusOr<SessionLocks::TurnLock> turn = locks.LockForTurn(key, false);
    EXPECT_TRUE(turn.ok()) << turn.status();
    ran.Notify();
  });
  EXPECT_FALSE(ran.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  EXPECT_GE(locks.turns_held_frozen(), 1);
  locks.Unfreeze(key);
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  held.join();
}

TEST(SessionLocksTest, AFreezeLongerThanTheWaitFailsTheTurnAsNotRun) {
  SessionLocks locks(absl::Milliseconds(50));
  const Key key("t", "s");
  ASSERT_TRUE(locks.MarkFrozen(key));
  const absl::Status waited = locks.LockForTurn(key, false).status();
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(NotRunReason(waited), "moving");
  EXPECT_THAT(waited.message(), HasSubstr("frozen for longer than 50ms"));
  EXPECT_EQ(NotRunReason(locks.AwaitThawed(key)), "moving");
  locks.Unfreeze(key);
  EXPECT_TRUE(locks.AwaitThawed(key).ok());
}

TEST(SessionLocksTest, AFreezeWaitsForTheRunningTurn) {
  SessionLocks locks(absl::Seconds(30));
  const Key key("t", "s");
  std::optional<absl::StatusOr<SessionLocks::TurnLock>> turn;
  turn.emplace(locks.LockForTurn(key, false));
  ASSERT_TRUE(turn->ok());
  ASSERT_TRUE(locks.MarkFrozen(key));
  absl::Notification frozen;
  std::thread freezer([&] {
    absl::MutexLock settled(locks.MutexOf(key).get());
    frozen.Notify();
  });
  EXPECT_FALSE(frozen.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  turn.reset();  // the turn ends: the freeze holds the session now
  EXPECT_TRUE(frozen.WaitForNotificationWithTimeout(absl::Seconds(30)));
  freezer.join();
}

TEST(SessionLocksTest, ForgetKeepsAMutexSomeoneStillHolds) {
  SessionLocks locks(absl::Seconds(30));
  const Key key("t", "s");
  std::shared_ptr<absl::Mutex> mine = locks.MutexOf(key);
  std::shared_ptr<absl::Mutex> waiter = locks.MutexOf(key);  // a second user
  locks.Forget(key);
  EXPECT_EQ(locks.MutexOf(key), mine);  // still the same: not forgotten
  waiter.reset();
  locks.Forget(key);  // only the map's copy and mine now
  EXPECT_NE(locks.MutexOf(key), mine);
}

}  // namespace
}  // namespace kvd::engine
