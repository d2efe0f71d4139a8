#include "tools/kvd/bench_event.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace kvd::cli {
namespace {

using Clock = EventGate::Clock;

TEST(EventGate, WaitsForRunningRequestsAndHoldsNewOnesUntilTheCommandEnds) {
  EventGate gate;
  EXPECT_EQ(gate.Enter(), 0);  // a request running when the event is due
  const std::string marker =
      std::string(std::getenv("TEST_TMPDIR")) + "/event-ran";
  EventGate::Outcome out;
  std::thread event(
      [&] { out = gate.RunAt(Clock::now(), "sleep 0.2; touch " + marker); });
  std::atomic<bool> entered{false};
  std::atomic<int> seen{-1};
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    seen = gate.Enter();  // held while the event runs
    entered = true;
    gate.Leave();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(entered) << "a request started while the event was pending";
  EXPECT_EQ(std::system(("test -e " + marker).c_str()), 256)
      << "the command ran before the running request finished";
  gate.Leave();
  event.join();
  late.join();
  EXPECT_TRUE(out.ran);
  EXPECT_EQ(out.exit_code, 0);
  EXPECT_GE(out.command_s, 0.2);
  EXPECT_GE(out.held_s, out.command_s);
  EXPECT_EQ(seen, 1) << "the held request counts as after the event";
  EXPECT_EQ(std::system(("test -e " + marker).c_str()), 0);
}

TEST(EventGate, ReportsAFailingCommandAndACancelledEvent) {
  EventGate gate;
  EXPECT_EQ(gate.RunAt(Clock::now(), "exit 3").exit_code, 3);
  EventGate idle;
  std::thread cancel([&] { idle.Cancel(); });
  const EventGate::Outcome none =
      idle.RunAt(Clock::now() + std::chrono::hours(1), "true");
  cancel.join();
  EXPECT_FALSE(none.ran);
  EXPECT_EQ(idle.Enter(), 0);
  idle.Leave();
}

}  // namespace
}  // namespace kvd::cli
