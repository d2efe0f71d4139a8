// The sessions whose K/V stay in memory between turns: the engine's fastest
// tier. A session is hot from the end of a turn until it is demoted, least
// recently used first, when there are more than `max_sessions` of them, when
// their K/V rows together exceed `max_kv_bytes`, or when the K/V pool needs
// blocks (DemoteOneIdle, the scheduler's reclaim hook). A demoted session
// loses only memory: its checkpoint is committed, and its next turn
// restores from the tiers (restorer.h). A session in a turn is never
// demoted: BeginTurn marks it under the same lock that finds it.
//
//   std::shared_ptr<SessionRecord> r = hot.BeginTurn(key, intact);
//   if (r == nullptr) { r = Restore(...); hot.MarkInTurn(*r); }
//   ... run the turn ...
//   ok ? hot.Keep(key, std::move(r)) : (hot.EndTurn(*r), hot.Drop(key));
//
// Thread-safety: every method may be called from any thread.
#ifndef KVD_SERVICES_ENGINE_HOT_SESSIONS_H_
#define KVD_SERVICES_ENGINE_HOT_SESSIONS_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "services/engine/session_record.h"

namespace kvd::engine {

class HotSessions {
 public:
  using Key = SessionKey;

  struct Limits {
    int64_t max_sessions = 8;  // < 0 reads as 0
    int64_t max_kv_bytes = 0;  // 0 = no limit
  };
  struct Stats {
    int64_t sessions = 0;
    int64_t kv_bytes = 0;        // K/V rows they hold
    int64_t residual_bytes = 0;  // their residual stores
    int64_t demoted = 0;         // ever, for any reason
    int64_t demoted_for_kv = 0;  // of those, to free K/V pool blocks
  };

  explicit HotSessions(Limits limits) : limits_(limits) {}

  // The session's hot record, marked in a turn, or null when it is not hot.
  // A record `usable` refuses (the backend lost its K/V) is dropped, and
  // null returned: the turn restores the session as if it were demoted.
  std::shared_ptr<SessionRecord> BeginTurn(
      const Key& key, const std::function<bool(const SessionRecord&)>& usable);
  // Marks a record that is not listed here (just restored) as in a turn.
  void MarkInTurn(SessionRecord& record);
  // Ends a turn that keeps nothing new: a listed record is idle again.
  void EndTurn(SessionRecord& record);
  // Ends the record's turn and lists it as the most recently used, then
  // demotes least recently used idle sessions beyond the limits (the one
  // just kept included, if it alone is over the byte limit).
  void Keep(const Key& key, std::shared_ptr<SessionRecord> record);
  // Demotes the least recently used idle session, returning its K/V blocks
  // to the pool; false if every hot session is in a turn.
  bool DemoteOneIdle();
  // Pool blocks idle hot sessions hold: what DemoteOneIdle can free in all.
  int64_t IdleKvBlocks() const;
  // Forgets the session's hot state (its checkpoint stays in the tiers).
  void Drop(const Key& key);
  bool Contains(const Key& key) const;
  Stats stats() const;

 private:
  const Limits limits_;
  mutable absl::Mutex mu_;
  // Most recently used first.
  std::list<Key> lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Key, std::shared_ptr<SessionRecord>> hot_
      ABSL_GUARDED_BY(mu_);
  int64_t demoted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t demoted_for_kv_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvd::engine

#endif  // KVD_SERVICES_ENGINE_HOT_SESSIONS_H_
