#include "tools/kvd/bench_event.h"

#include <sys/wait.h>

#include <cstdlib>

namespace kvd::cli {
namespace {

double SecondsSince(EventGate::Clock::time_point t) {
  return std::chrono::duration<double>(EventGate::Clock::now() - t).count();
}

}  // namespace

int EventGate::Enter() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [this] { return !held_; });
  ++running_;
  return events_;
}

void EventGate::Leave() {
  std::lock_guard<std::mutex> l(mu_);
  --running_;
  cv_.notify_all();
}

void EventGate::Cancel() {
  std::lock_guard<std::mutex> l(mu_);
  cancelled_ = true;
  cv_.notify_all();
}

EventGate::Outcome EventGate::RunAt(Clock::time_point at,
                                    const std::string& command) {
  Outcome out;
  std::unique_lock<std::mutex> l(mu_);
  if (cv_.wait_until(l, at, [this] { return cancelled_; })) return out;
  const Clock::time_point held = Clock::now();
  held_ = true;
  cv_.wait(l, [this] { return running_ == 0; });
  l.unlock();
  const Clock::time_point started = Clock::now();
  const int status = std::system(command.c_str());
  out.ran = true;
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  out.command_s = SecondsSince(started);
  l.lock();
  ++events_;
  held_ = false;
  out.held_s = SecondsSince(held);
  cv_.notify_all();
  return out;
}

}  // namespace kvd::cli
