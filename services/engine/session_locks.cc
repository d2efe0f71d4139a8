#include "services/engine/session_locks.h"

#include "absl/strings/str_cat.h"
#include "services/engine/session_fence.h"
#include "services/engine/session_record.h"

namespace kvd::engine {
namespace {

absl::Status StillFrozen(const SessionLocks::Key& key, absl::Duration waited) {
  return MarkNotRun(
      absl::AbortedError(absl::StrCat(
          SessionName(key.first, key.second),
          " is being moved to another node (frozen for longer than ",
          absl::FormatDuration(waited), "); nothing was run, retry the turn")),
      "moving");
}

}  // namespace

SessionLocks::TurnLock::~TurnLock() {
  if (locks_ == nullptr) return;  // moved from
  {
    absl::MutexLock lock(&locks_->mu_);
    locks_->turning_.erase(key_);
  }
  mu_->Unlock();
}

std::shared_ptr<absl::Mutex> SessionLocks::MutexOf(const Key& key) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<absl::Mutex>& m = session_mu_[key];
  if (m == nullptr) m = std::make_shared<absl::Mutex>();
  return m;
}

absl::StatusOr<SessionLocks::TurnLock> SessionLocks::LockForTurn(
    const Key& key, bool fail_if_busy) {
  std::shared_ptr<absl::Mutex> session_mu = MutexOf(key);
  const absl::Time deadline = absl::Now() + frozen_wait_;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto thawed = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !frozen_.contains(key);
      };
      if (fail_if_busy && !thawed()) {
        return MarkNotRun(
            absl::AbortedError(absl::StrCat(
                SessionName(key.first, key.second),
                " is being moved to another node; nothing was run, retry "
                "the turn shortly")),
            "moving");
      }
      turns_held_frozen_ += !thawed();
      if (!mu_.AwaitWithDeadline(absl::Condition(&thawed), deadline)) {
        return StillFrozen(key, frozen_wait_);
      }
    }
    if (fail_if_busy) {
      // TryLock may fail spuriously on a free mutex ("with high
      // probability" it succeeds), so a few tries before calling it busy.
      bool locked = false;
      for (int attempt = 0; attempt < 3 && !locked; ++attempt) {
        locked = session_mu->TryLock();
      }
      if (!locked) {
        bool turn_running = false;
        {
          absl::MutexLock lock(&mu_);
          turn_running = turning_.contains(key);
        }
        if (turn_running) {
          return absl::AbortedError(absl::StrCat(
              SessionName(key.first, key.second),
              " is busy: another turn of it is running; send the next turn "
              "when that has finished"));
        }
        // Held briefly by something else (a delete, an import, a move's
        // bookkeeping): worth waiting for, unlike a turn.
        session_mu->Lock();
      }
    } else {
      session_mu->Lock();
    }
    // A freeze takes the session's mutex too, so it can only have frozen
    // the session between the wait above and this lock: then wait again.
    {
      absl::MutexLock lock(&mu_);
      if (!frozen_.contains(key)) {
        turning_.insert(key);
        return TurnLock(this, key, std::move(session_mu));
      }
    }
    session_mu->Unlock();
  }
}

absl::Status SessionLocks::AwaitThawed(const Key& key) {
  absl::MutexLock lock(&mu_);
  auto thawed = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !frozen_.contains(key);
  };
  if (!thawed()) turns_held_frozen_++;
  if (!mu_.AwaitWithTimeout(absl::Condition(&thawed), frozen_wait_)) {
    return StillFrozen(key, frozen_wait_);
  }
  return absl::OkStatus();
}

bool SessionLocks::MarkFrozen(const Key& key) {
  absl::MutexLock lock(&mu_);
  return frozen_.insert(key).second;
}

void SessionLocks::Unfreeze(const Key& key) {
  absl::MutexLock lock(&mu_);
  frozen_.erase(key);
}

bool SessionLocks::IsFrozen(const Key& key) const {
  absl::MutexLock lock(&mu_);
  return frozen_.contains(key);
}

bool SessionLocks::InTurn(const Key& key) const {
  absl::MutexLock lock(&mu_);
  return turning_.contains(key);
}

void SessionLocks::Forget(const Key& key) {
  absl::MutexLock lock(&mu_);
  // Copies are taken under mu_ (MutexOf), so the count cannot rise here;
  // the map's copy and the caller's make two.
  auto it = session_mu_.find(key);
  if (it != session_mu_.end() && it->second.use_count() == 2) {
    session_mu_.erase(it);
  }
}

int64_t SessionLocks::turns_held_frozen() const {
  absl::MutexLock lock(&mu_);
  return turns_held_frozen_;
}

}  // namespace kvd::engine
