// Who may touch a session right now. Each session has one mutex that its
// turns hold from their start to their commit, and that every other change
// of its stored state (create, import, delete, replica writes, ownership
// changes) takes too, so none of them interleave. A session can also be
// frozen for a move: its committed state stays put while the move copies
// it, and new turns wait until it is released or unfrozen.
//
//   KVD_ASSIGN_OR_RETURN(SessionLocks::TurnLock turn,
//                        locks.LockForTurn(key, /*fail_if_busy=*/true));
//   ... the turn runs; `turn` unlocks when it goes out of scope ...
//
//   if (!locks.MarkFrozen(key)) return ...;  // frozen already
//   { absl::MutexLock l(locks.MutexOf(key).get()); ... }  // a turn finished
//   ...
//   locks.Unfreeze(key);
//
// Thread-safety: every method may be called from any thread.
#ifndef KVD_SERVICES_ENGINE_SESSION_LOCKS_H_
#define KVD_SERVICES_ENGINE_SESSION_LOCKS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/engine/session_record.h"

namespace kvd::engine {

class SessionLocks {
 public:
  using Key = SessionKey;

  // A turn's hold on its session's mutex, released when it is destroyed.
  class TurnLock {
   public:
    TurnLock(TurnLock&& other) noexcept
        : locks_(std::exchange(other.locks_, nullptr)),
          key_(std::move(other.key_)),
          mu_(std::move(other.mu_)) {}
    TurnLock& operator=(TurnLock&&) = delete;
    ~TurnLock() ABSL_NO_THREAD_SAFETY_ANALYSIS;

   private:
    friend class SessionLocks;
    TurnLock(SessionLocks* locks, Key key, std::shared_ptr<absl::Mutex> mu)
        : locks_(locks), key_(std::move(key)), mu_(std::move(mu)) {}

    SessionLocks* locks_;
    Key key_;
    std::shared_ptr<absl::Mutex> mu_;
  };

  // `frozen_wait`: how long a turn waits for a frozen session.
  explicit SessionLocks(absl::Duration frozen_wait)
      : frozen_wait_(frozen_wait) {}

  // The session's mutex (made on first use). Copies stay valid after
  // Forget: whoever holds one may lock it.
  std::shared_ptr<absl::Mutex> MutexOf(const Key& key);

  // Takes the session's mutex for a turn once the session is not frozen,
  // waiting up to frozen_wait. ABORTED, marked MarkNotRun "moving", when it
  // stays frozen that long, or at once when frozen and `fail_if_busy` (a
  // server's turn must not hold its admission slot through a move); ABORTED
  // "busy" when `fail_if_busy` and another turn of the session runs.
  absl::StatusOr<TurnLock> LockForTurn(const Key& key, bool fail_if_busy)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Waits while the session is frozen (up to frozen_wait): what LockForTurn
  // waits for, without taking the mutex. ABORTED "moving" as there.
  absl::Status AwaitThawed(const Key& key);

  // Marks the session frozen; false if it is frozen already. Turns that
  // start from now on wait; a running one is waited for by taking MutexOf.
  bool MarkFrozen(const Key& key);
  void Unfreeze(const Key& key);
  bool IsFrozen(const Key& key) const;
  // Whether a turn holds the session's mutex now.
  bool InTurn(const Key& key) const;
  // Forgets the session's mutex (a deleted session) unless someone besides
  // the map and the caller's one copy holds it: a turn waiting on it would
  // otherwise run beside a later turn that got a fresh mutex.
  void Forget(const Key& key);
  // Turns (and ReadyForTurn checks) that found their session frozen.
  int64_t turns_held_frozen() const;

 private:
  const absl::Duration frozen_wait_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, std::shared_ptr<absl::Mutex>> session_mu_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<Key> frozen_ ABSL_GUARDED_BY(mu_);
  // Sessions whose turn holds their mutex (LockForTurn to the turn's end):
  // a fail_if_busy turn is refused only for these.
  absl::flat_hash_set<Key> turning_ ABSL_GUARDED_BY(mu_);
  int64_t turns_held_frozen_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvd::engine

#endif  // KVD_SERVICES_ENGINE_SESSION_LOCKS_H_
