// A scheduled event in the middle of a `kvd bench serve` run: at a given
// second the users stop starting requests, the ones running finish, a shell
// command runs (restart the server, drain a node, kill one), and the users
// go on. What a returning user then meets is the point of the measurement:
// its first turn after the event has to find its session wherever the event
// left it. The time the users were held is reported, never folded into a
// request's latency.
//
//   EventGate gate(...);            // one per run
//   gate.Enter(); ...request...; gate.Leave();   // per request, any thread
//   gate.RunAt(t0 + seconds, cmd);  // its own thread
//
// Thread-safety: every member may be called from any thread.
#ifndef KVD_TOOLS_KVD_BENCH_EVENT_H_
#define KVD_TOOLS_KVD_BENCH_EVENT_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

namespace kvd::cli {

class EventGate {
 public:
  using Clock = std::chrono::steady_clock;

  struct Outcome {
    bool ran = false;
    int exit_code = -1;
    double held_s = 0;  // users held: running requests drained + the command
    double command_s = 0;
  };

  // Blocks while an event holds the users; returns how many events have run
  // (a request started after the first event sees 1).
  int Enter();
  void Leave();

  // Sleeps until `at` (or Cancel), holds the users, waits for the running
  // requests, runs `command` with /bin/sh and releases the users.
  Outcome RunAt(Clock::time_point at, const std::string& command);
  // Ends a pending RunAt without running its command (the run ended first).
  void Cancel();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
  bool cancelled_ = false;
  int running_ = 0;
  int events_ = 0;
};

}  // namespace kvd::cli

#endif  // KVD_TOOLS_KVD_BENCH_EVENT_H_
