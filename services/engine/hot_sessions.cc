#include "services/engine/hot_sessions.h"

#include <algorithm>
#include <vector>

namespace kvd::engine {

std::shared_ptr<SessionRecord> HotSessions::BeginTurn(
    const Key& key, const std::function<bool(const SessionRecord&)>& usable) {
  std::shared_ptr<SessionRecord> lost;  // destroyed after the lock
  absl::MutexLock lock(&mu_);
  auto it = hot_.find(key);
  if (it == hot_.end()) return nullptr;
  if (usable && !usable(*it->second)) {
    lost = std::move(it->second);
    hot_.erase(it);
    lru_.remove(key);
    return nullptr;
  }
  it->second->in_turn++;
  return it->second;
}

void HotSessions::MarkInTurn(SessionRecord& record) {
  // Not listed yet, so no other thread sees it; the lock orders the write
  // before Keep's.
  absl::MutexLock lock(&mu_);
  record.in_turn++;
}

void HotSessions::EndTurn(SessionRecord& record) {
  absl::MutexLock lock(&mu_);
  record.in_turn--;
}

void HotSessions::Keep(const Key& key, std::shared_ptr<SessionRecord> record) {
  std::vector<std::shared_ptr<SessionRecord>> demoted;  // freed unlocked
  absl::MutexLock lock(&mu_);
  record->in_turn--;
  if (hot_.contains(key)) lru_.remove(key);
  hot_[key] = std::move(record);
  lru_.push_front(key);
  int64_t kv_bytes = 0;
  for (const auto& [k, r] : hot_) kv_bytes += r->kv_bytes;
  auto over = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int64_t>(lru_.size()) >
               std::max<int64_t>(0, limits_.max_sessions) ||
           (limits_.max_kv_bytes > 0 && kv_bytes > limits_.max_kv_bytes);
  };
  // Least recently used first; sessions in a turn stay (their turn still
  // needs the state, and Keep lists them again when it ends).
  for (auto it = lru_.end(); over() && it != lru_.begin();) {
    --it;
    auto found = hot_.find(*it);
    if (found->second->in_turn > 0) continue;
    kv_bytes -= found->second->kv_bytes;
    demoted.push_back(std::move(found->second));
    hot_.erase(found);
    it = lru_.erase(it);
    demoted_++;
  }
}

bool HotSessions::DemoteOneIdle() {
  std::shared_ptr<SessionRecord> victim;  // destroyed after the lock
  absl::MutexLock lock(&mu_);
  for (auto it = lru_.end(); it != lru_.begin();) {
    --it;
    auto found = hot_.find(*it);
    if (found->second->in_turn > 0) continue;
    victim = std::move(found->second);
    hot_.erase(found);
    lru_.erase(it);
    demoted_++;
    demoted_for_kv_++;
    return true;
  }
  return false;
}

int64_t HotSessions::IdleKvBlocks() const {
  absl::MutexLock lock(&mu_);
  int64_t blocks = 0;
  // Idle caches change only in a turn, which BeginTurn marks under mu_.
  for (const auto& [key, record] : hot_) {
    if (record->in_turn == 0) blocks += record->cache.blocks_held();
  }
  return blocks;
}

void HotSessions::Drop(const Key& key) {
  std::shared_ptr<SessionRecord> dropped;  // destroyed after the lock
  absl::MutexLock lock(&mu_);
  auto it = hot_.find(key);
  if (it == hot_.end()) return;
  dropped = std::move(it->second);
  hot_.erase(it);
  lru_.remove(key);
}

bool HotSessions::Contains(const Key& key) const {
  absl::MutexLock lock(&mu_);
  return hot_.contains(key);
}

HotSessions::Stats HotSessions::stats() const {
  absl::MutexLock lock(&mu_);
  Stats s;
  s.sessions = static_cast<int64_t>(hot_.size());
  for (const auto& [key, record] : hot_) {
    s.kv_bytes += record->kv_bytes;
    s.residual_bytes += record->residual_bytes;
  }
  s.demoted = demoted_;
  s.demoted_for_kv = demoted_for_kv_;
  return s;
}

}  // namespace kvd::engine
