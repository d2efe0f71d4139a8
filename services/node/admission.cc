#include "services/node/admission.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvd::node {

Admission::Admission(int max_inflight, int max_queue)
    : max_inflight_(std::max(1, max_inflight)),
      max_queue_(std::max(0, max_queue)) {}

Admission::Permit& Admission::Permit::operator=(Permit&& other) noexcept {
  if (this != &other) {
    if (owner_ != nullptr) owner_->Release();
    owner_ = other.owner_;
    other.owner_ = nullptr;
  }
  return *this;
}

Admission::Permit::~Permit() {
  if (owner_ != nullptr) owner_->Release();
}

absl::StatusOr<Admission::Permit> Admission::Acquire(
    const std::function<bool()>& cancelled) {
  absl::MutexLock lock(&mu_);
  // Waiting requests go first: a newcomer only takes a free slot directly
  // when nobody is queued.
  if (queued_ == 0 && inflight_ < max_inflight_) {
    ++inflight_;
    return Permit(this);
  }
  if (queued_ >= max_queue_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the node is busy: ", inflight_, " generations running and ", queued_,
        " waiting (limits ", max_inflight_, " and ", max_queue_,
        "); retry after a short back-off"));
  }
  const uint64_t ticket = next_ticket_++;
  ++queued_;
  auto my_turn = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return serving_ == ticket && inflight_ < max_inflight_;
  };
  while (!mu_.AwaitWithTimeout(absl::Condition(&my_turn),
                               absl::Milliseconds(20))) {
    if (cancelled && cancelled()) {
      // Leave the queue: tickets behind this one must still be served in
      // order, so this one is marked given up and skipped when reached.
      abandoned_.insert(ticket);
      --queued_;
      SkipAbandonedLocked();
      return absl::CancelledError(
          "the request was cancelled while it waited for a generation slot");
    }
  }
  --queued_;
  ++serving_;
  SkipAbandonedLocked();
  ++inflight_;
  return Permit(this);
}

void Admission::SkipAbandonedLocked() {
  while (abandoned_.erase(serving_) > 0) ++serving_;
}

void Admission::Release() {
  absl::MutexLock lock(&mu_);
  --inflight_;
}

int Admission::inflight() const {
  absl::MutexLock lock(&mu_);
  return inflight_;
}

int Admission::queued() const {
  absl::MutexLock lock(&mu_);
  return queued_;
}

bool Admission::full() const {
  absl::MutexLock lock(&mu_);
  return inflight_ >= max_inflight_ && queued_ >= max_queue_;
}

}  // namespace kvd::node
