#include "storage/tiered/dram_tier.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvd::storage {

DramTier::DramTier(DramTierOptions options, LowerTier* lower)
    : options_(options), lower_(lower) {
  spill_thread_ = std::thread([this] { SpillLoop(); });
  prefetch_thread_ = std::thread([this] { PrefetchLoop(); });
}

DramTier::~DramTier() {
  {
    Lock lock(mu_);
    stop_prefetch_ = true;
    prefetch_queue_.clear();
    changed_.notify_all();
  }
  prefetch_thread_.join();
  Flush().IgnoreError();  // documented: call Flush first to see failures
  {
    Lock lock(mu_);
    stop_spill_ = true;
    changed_.notify_all();
  }
  spill_thread_.join();
}

DramTier::Entry* DramTier::FindLocked(const Key& key) {
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return &it->second;
  }
  // Still on its way to the lower tier: bring it back as a dirty entry of
  // the same version, so the spill's completion marks it clean.
  auto p = pending_.find(key);
  if (p == pending_.end()) return nullptr;
  return InsertLocked(key, p->second.checkpoint, /*dirty=*/true, p->second.seq);
}

DramTier::Entry* DramTier::InsertLocked(const Key& key,
                                        std::shared_ptr<SessionCheckpoint> cp,
                                        bool dirty, uint64_t seq) {
  lru_.push_front(key);
  Entry& e = entries_[key];
  e.bytes = cp->bytes();
  e.checkpoint = std::move(cp);
  e.seq = seq != 0 ? seq : next_seq_++;
  e.dirty = dirty;
  e.lru = lru_.begin();
  bytes_ += e.bytes;
  return &e;
}

void DramTier::RemoveLocked(const Key& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

absl::Status DramTier::AdmitLocked(const Key& key, int64_t lower,
                                   int64_t previous, int64_t latest,
                                   const AdmitFn& admit) const {
  if (admit == nullptr) return absl::OkStatus();
  auto t = tenant_unspilled_.find(key.first);
  int64_t after = t != tenant_unspilled_.end() ? t->second : 0;
  auto u = unspilled_.find(key);
  if (u != unspilled_.end()) {
    after -= u->second.latest_stored - u->second.lower_stored;
    lower = u->second.lower_stored;
  }
  return admit(latest - previous, after + latest - lower);
}

void DramTier::SetUnspilledLocked(const Key& key, int64_t lower,
                                  int64_t latest) {
  Unspilled& u = unspilled_[key];
  tenant_unspilled_[key.first] +=
      (latest - lower) - (u.latest_stored - u.lower_stored);
  u.lower_stored = lower;
  u.latest_stored = latest;
}

void DramTier::RefreshUnspilledLocked(const Key& key) {
  auto e = entries_.find(key);
  if ((e != entries_.end() && e->second.dirty) || pending_.contains(key)) {
    return;
  }
  auto u = unspilled_.find(key);
  if (u == unspilled_.end()) return;
  auto t = tenant_unspilled_.find(key.first);
  t->second -= u->second.latest_stored - u->second.lower_stored;
  if (t->second == 0) tenant_unspilled_.erase(t);
  unspilled_.erase(u);
}

absl::Status DramTier::ApplyLocked(Entry* entry, const TurnUpdate& update,
                                   bool dirty, const AdmitFn& admit) {
  const Key key = *entry->lru;
  const int64_t previous = entry->checkpoint->manifest().stored_bytes();
  if (dirty) {
    // A clean entry holds what the lower tier holds.
    absl::Status a = AdmitLocked(key, previous, previous,
                                 update.manifest.stored_bytes(), admit);
    if (!a.ok()) return a;
  }
  // Copy-on-write: a reader or the spill thread may hold this snapshot (all
  // copies of the pointer are made under mu_, so a count of 1 is exact).
  std::shared_ptr<SessionCheckpoint> target = entry->checkpoint;
  if (target.use_count() > 2) {  // `entry` and `target` itself
    target = std::make_shared<SessionCheckpoint>(*target);
  }
  absl::Status s = target->Apply(update);
  if (!s.ok()) return s;
  bytes_ -= entry->bytes;
  entry->bytes = target->bytes();
  bytes_ += entry->bytes;
  entry->checkpoint = std::move(target);
  entry->seq = next_seq_++;
  entry->dirty = entry->dirty || dirty;
  const int64_t latest = entry->checkpoint->manifest().stored_bytes();
  auto u = unspilled_.find(key);
  if (dirty) {
    SetUnspilledLocked(
        key, u != unspilled_.end() ? u->second.lower_stored : previous, latest);
  } else if (u != unspilled_.end()) {
    // The caller committed this state to the lower tier itself.
    SetUnspilledLocked(key, latest, latest);
    RefreshUnspilledLocked(key);
  }
  return absl::OkStatus();
}

void DramTier::QueueSpillLocked(const Key& key,
                                std::shared_ptr<SessionCheckpoint> cp,
                                int64_t bytes, uint64_t seq, bool urgent) {
  Pending& p = pending_[key];
  if (p.checkpoint != nullptr) {
    pending_bytes_ -= p.bytes;
    if (p.queued) queued_bytes_ -= p.bytes;
  }
  p.checkpoint = std::move(cp);
  p.bytes = bytes;
  p.seq = seq;
  p.failure = absl::OkStatus();
  pending_bytes_ += bytes;
  queued_bytes_ += bytes;
  // A key already in the queue keeps its place unless urgent; the worker
  // skips the later, stale copy (it finds queued == false by then).
  if (!p.queued || urgent) {
    if (urgent) {
      spill_queue_.push_front(key);
    } else {
      spill_queue_.push_back(key);
    }
  }
  p.queued = true;
  changed_.notify_all();
}

void DramTier::EvictLocked(Lock& lock) {
  while (bytes_ > options_.budget_bytes && !lru_.empty()) {
    const Key key = lru_.back();
    Entry& e = entries_.find(key)->second;
    if (e.dirty) {
      auto p = pending_.find(key);
      const bool already = p != pending_.end() && p->second.seq == e.seq;
      if (!already) {
        if (queued_bytes_ > 0 &&
            queued_bytes_ + e.bytes > options_.spill_queue_bytes) {
          changed_.wait(lock);  // for the spill thread to make room
          continue;             // the LRU may have changed meanwhile
        }
        QueueSpillLocked(key, e.checkpoint, e.bytes, e.seq, /*urgent=*/false);
      }
    }
    RemoveLocked(key);
    RefreshUnspilledLocked(key);
    ++counters_.evictions;
  }
}

void DramTier::InvalidateFillsLocked(const Key& key) {
  auto it = fills_.find(key);
  if (it != fills_.end()) ++it->second.generation;
}

uint64_t DramTier::BeginFillLocked(const Key& key) {
  Fill& f = fills_[key];
  ++f.in_flight;
  return f.generation;
}

bool DramTier::EndFillLocked(const Key& key, uint64_t generation) {
  auto it = fills_.find(key);
  const bool unchanged = it->second.generation == generation;
  if (--it->second.in_flight == 0) fills_.erase(it);
  return unchanged;
}

absl::Status DramTier::AwaitSpillLocked(const Key& key, Lock& lock) {
  while (true) {
    auto p = pending_.find(key);
    if (p == pending_.end()) return absl::OkStatus();
    if (!p->second.queued && !p->second.in_flight) {
      const absl::Status& f = p->second.failure;
      return absl::Status(
          f.code(), absl::StrCat("writing session ", key.first, "/", key.second,
                                 " to the lower tier failed: ", f.message()));
    }
    changed_.wait(lock);
  }
}

std::shared_ptr<const SessionCheckpoint> DramTier::Get(
    absl::string_view tenant, absl::string_view session) {
  Lock lock(mu_);
  Entry* e = FindLocked(Key(tenant, session));
  if (e == nullptr) {
    ++counters_.misses;
    return nullptr;
  }
  ++counters_.hits;
  std::shared_ptr<const SessionCheckpoint> cp = e->checkpoint;
  EvictLocked(lock);
  return cp;
}

absl::StatusOr<DramTier::Loaded> DramTier::GetOrLoad(absl::string_view tenant,
                                                     absl::string_view session,
                                                     LoadObserver* observer) {
  const Key key(tenant, session);
  Lock lock(mu_);
  if (Entry* e = FindLocked(key)) {
    ++counters_.hits;
    Loaded hit{e->checkpoint, true};
    EvictLocked(lock);
    return hit;
  }
  ++counters_.misses;
  const uint64_t generation = BeginFillLocked(key);
  lock.unlock();
  absl::StatusOr<SessionCheckpoint> loaded =
      lower_->Load(tenant, session, observer);
  lock.lock();
  const bool unchanged = EndFillLocked(key, generation);
  if (!loaded.ok()) return loaded.status();
  if (!unchanged) {
    // Changed while we read it; what DRAM has now is newer than `loaded`.
    if (Entry* e = FindLocked(key)) return Loaded{e->checkpoint, false, false};
  }
  auto cp = std::make_shared<SessionCheckpoint>(*std::move(loaded));
  if (unchanged && !entries_.contains(key) && !pending_.contains(key)) {
    InsertLocked(key, cp, /*dirty=*/false);
    EvictLocked(lock);
  }
  return Loaded{std::move(cp), false, observer != nullptr};
}

void DramTier::Put(SessionCheckpoint checkpoint, bool dirty) {
  const Key key(checkpoint.manifest().tenant(),
                checkpoint.manifest().session_id());
  auto cp = std::make_shared<SessionCheckpoint>(std::move(checkpoint));
  const int64_t stored = cp->manifest().stored_bytes();
  Lock lock(mu_);
  InvalidateFillsLocked(key);
  auto old = entries_.find(key);
  // What the lower tier holds, if the tier knows it: a clean entry's bytes.
  const int64_t lower = old != entries_.end() && !old->second.dirty
                            ? old->second.checkpoint->manifest().stored_bytes()
                            : 0;
  RemoveLocked(key);
  if (!dirty) {
    // The caller wrote these bytes to the lower tier itself; an older
    // version still queued must not overwrite them.
    auto p = pending_.find(key);
    if (p != pending_.end() && !p->second.in_flight) {
      pending_bytes_ -= p->second.bytes;
      if (p->second.queued) queued_bytes_ -= p->second.bytes;
      pending_.erase(p);
      changed_.notify_all();
    }
  }
  InsertLocked(key, std::move(cp), dirty);
  auto u = unspilled_.find(key);
  if (dirty) {
    SetUnspilledLocked(
        key, u != unspilled_.end() ? u->second.lower_stored : lower, stored);
  } else if (u != unspilled_.end()) {
    SetUnspilledLocked(key, stored, stored);
    RefreshUnspilledLocked(key);
  }
  EvictLocked(lock);
}

absl::StatusOr<bool> DramTier::ApplyIfCached(const TurnUpdate& update,
                                             bool dirty) {
  const Key key(update.manifest.tenant(), update.manifest.session_id());
  Lock lock(mu_);
  InvalidateFillsLocked(key);
  Entry* e = FindLocked(key);
  if (e == nullptr) return false;
  absl::Status s = ApplyLocked(e, update, dirty);
  EvictLocked(lock);
  if (!s.ok()) return s;
  return true;
}

absl::Status DramTier::ApplyDirty(const TurnUpdate& update,
                                  const AdmitFn& admit) {
  const Key key(update.manifest.tenant(), update.manifest.session_id());
  Lock lock(mu_);
  InvalidateFillsLocked(key);
  if (Entry* e = FindLocked(key)) {
    absl::Status s = ApplyLocked(e, update, /*dirty=*/true, admit);
    EvictLocked(lock);
    return s;
  }
  lock.unlock();
  absl::StatusOr<SessionCheckpoint> base =
      lower_->Load(update.manifest.tenant(), update.manifest.session_id(),
                   /*observer=*/nullptr);
  lock.lock();
  if (!base.ok() && !absl::IsNotFound(base.status())) {
    return absl::Status(
        base.status().code(),
        absl::StrCat("loading session ", key.first, "/", key.second,
                     " to apply a turn to it: ", base.status().message()));
  }
  InvalidateFillsLocked(key);
  absl::Status s;
  if (Entry* e = FindLocked(key)) {  // a prefetch brought it in meanwhile
    s = ApplyLocked(e, update, /*dirty=*/true, admit);
  } else {
    const int64_t lower = base.ok() ? base->manifest().stored_bytes() : 0;
    s = AdmitLocked(key, lower, lower, update.manifest.stored_bytes(), admit);
    if (!s.ok()) return s;
    auto cp = base.ok() ? std::make_shared<SessionCheckpoint>(*std::move(base))
                        : std::make_shared<SessionCheckpoint>();
    s = cp->Apply(update);
    if (s.ok()) {
      const int64_t latest = cp->manifest().stored_bytes();
      InsertLocked(key, std::move(cp), /*dirty=*/true);
      auto u = unspilled_.find(key);
      SetUnspilledLocked(
          key, u != unspilled_.end() ? u->second.lower_stored : lower, latest);
    }
  }
  EvictLocked(lock);
  return s;
}

absl::Status DramTier::SyncSession(absl::string_view tenant,
                                   absl::string_view session) {
  const Key key(tenant, session);
  Lock lock(mu_);
  auto e = entries_.find(key);
  auto p = pending_.find(key);
  const bool idle = p != pending_.end() && !p->second.queued &&
                    !p->second.in_flight;  // a failed spill
  if (e != entries_.end() && e->second.dirty) {
    if (p == pending_.end() || p->second.seq != e->second.seq || idle) {
      QueueSpillLocked(key, e->second.checkpoint, e->second.bytes,
                       e->second.seq, /*urgent=*/true);
    }
  } else if (idle) {
    QueueSpillLocked(key, p->second.checkpoint, p->second.bytes, p->second.seq,
                     /*urgent=*/true);
  }
  return AwaitSpillLocked(key, lock);
}

bool DramTier::Contains(absl::string_view tenant,
                        absl::string_view session) const {
  const Key key(tenant, session);
  Lock lock(mu_);
  return entries_.contains(key);
}

bool DramTier::Erase(absl::string_view tenant, absl::string_view session) {
  const Key key(tenant, session);
  Lock lock(mu_);
  InvalidateFillsLocked(key);
  bool held = entries_.contains(key);
  RemoveLocked(key);
  while (true) {
    auto p = pending_.find(key);
    if (p == pending_.end()) break;
    if (p->second.in_flight) {
      changed_.wait(lock);
      continue;
    }
    pending_bytes_ -= p->second.bytes;
    if (p->second.queued) queued_bytes_ -= p->second.bytes;
    pending_.erase(p);
    held = true;
    changed_.notify_all();
    break;
  }
  RefreshUnspilledLocked(key);
  return held;
}

void DramTier::Prefetch(absl::string_view tenant, absl::string_view session) {
  Key key(tenant, session);
  Lock lock(mu_);
  if (entries_.contains(key) || pending_.contains(key) || stop_prefetch_ ||
      std::find(prefetch_queue_.begin(), prefetch_queue_.end(), key) !=
          prefetch_queue_.end()) {
    return;
  }
  if (static_cast<int>(prefetch_queue_.size()) >=
      options_.prefetch_queue_entries) {
    ++counters_.prefetch_dropped;
    return;
  }
  prefetch_queue_.push_back(std::move(key));
  changed_.notify_all();
}

absl::Status DramTier::Flush() {
  Lock lock(mu_);
  for (const auto& [key, e] : entries_) {
    if (!e.dirty) continue;
    auto p = pending_.find(key);
    if (p == pending_.end() || p->second.seq != e.seq ||
        (!p->second.queued && !p->second.in_flight)) {
      QueueSpillLocked(key, e.checkpoint, e.bytes, e.seq, /*urgent=*/false);
    }
  }
  for (auto& [key, p] : pending_) {
    if (!p.queued && !p.in_flight) {  // failed before: retry once
      QueueSpillLocked(key, p.checkpoint, p.bytes, p.seq, /*urgent=*/false);
    }
  }
  auto quiet = [this] {
    return spill_queue_.empty() && spills_in_flight_ == 0 &&
           prefetch_queue_.empty() && prefetches_in_flight_ == 0;
  };
  while (!quiet()) changed_.wait(lock);
  for (const auto& [key, p] : pending_) {
    if (!p.failure.ok()) return AwaitSpillLocked(key, lock);
  }
  return absl::OkStatus();
}

std::vector<v1::SessionManifest> DramTier::UnspilledManifests(
    absl::string_view tenant, absl::string_view after) const {
  std::map<std::string, const v1::SessionManifest*> found;
  Lock lock(mu_);
  auto wanted = [&](const Key& key) {
    return key.first == tenant && key.second > after;
  };
  for (const auto& [key, p] : pending_) {
    if (wanted(key)) found[key.second] = &p.checkpoint->manifest();
  }
  // A resident entry is the newest version (a revived pending one included).
  for (const auto& [key, e] : entries_) {
    if (wanted(key) && (e.dirty || pending_.contains(key))) {
      found[key.second] = &e.checkpoint->manifest();
    }
  }
  std::vector<v1::SessionManifest> out;
  out.reserve(found.size());
  for (const auto& [id, m] : found) out.push_back(*m);
  return out;
}

int64_t DramTier::UnspilledStoredBytes(absl::string_view tenant) const {
  Lock lock(mu_);
  auto t = tenant_unspilled_.find(std::string(tenant));
  return t != tenant_unspilled_.end() ? t->second : 0;
}

int64_t DramTier::UnspilledStoredBytes(absl::string_view tenant,
                                       absl::string_view session) const {
  Lock lock(mu_);
  auto u = unspilled_.find(Key(tenant, session));
  return u != unspilled_.end()
             ? u->second.latest_stored - u->second.lower_stored
             : 0;
}

DramTierStats DramTier::stats() const {
  Lock lock(mu_);
  DramTierStats s = counters_;
  s.bytes = bytes_;
  s.entries = static_cast<int64_t>(entries_.size());
  for (const auto& [key, e] : entries_) s.dirty_entries += e.dirty ? 1 : 0;
  s.spill_pending_bytes = pending_bytes_;
  s.spill_pending_entries = static_cast<int64_t>(pending_.size());
  return s;
}

void DramTier::SpillLoop() {
  Lock lock(mu_);
  while (true) {
    while (!stop_spill_ && spill_queue_.empty()) changed_.wait(lock);
    if (spill_queue_.empty()) break;  // stopping, and nothing left
    const Key key = std::move(spill_queue_.front());
    spill_queue_.pop_front();
    auto it = pending_.find(key);
    if (it == pending_.end() || !it->second.queued) continue;  // stale
    Pending& p = it->second;
    p.queued = false;
    p.in_flight = true;
    queued_bytes_ -= p.bytes;
    const std::shared_ptr<const SessionCheckpoint> cp = p.checkpoint;
    const uint64_t seq = p.seq;
    ++spills_in_flight_;
    changed_.notify_all();  // room in the queue
    lock.unlock();
    const absl::Status s = lower_->Store(*cp);
    lock.lock();
    --spills_in_flight_;
    // Erase waits for in_flight to clear, so the record is still here.
    Pending& done = pending_.find(key)->second;
    done.in_flight = false;
    if (s.ok()) {
      ++counters_.spills;
      auto e = entries_.find(key);
      if (e != entries_.end() && e->second.seq == seq) e->second.dirty = false;
      if (done.seq == seq && !done.queued) {
        pending_bytes_ -= done.bytes;
        pending_.erase(key);
      }
      auto u = unspilled_.find(key);
      if (u != unspilled_.end()) {
        SetUnspilledLocked(key, cp->manifest().stored_bytes(),
                           u->second.latest_stored);
        RefreshUnspilledLocked(key);
      }
    } else {
      ++counters_.spill_failures;
      if (done.seq == seq) done.failure = s;
    }
    changed_.notify_all();
  }
}

void DramTier::PrefetchLoop() {
  Lock lock(mu_);
  while (true) {
    while (!stop_prefetch_ && prefetch_queue_.empty()) changed_.wait(lock);
    if (stop_prefetch_) break;
    const Key key = std::move(prefetch_queue_.front());
    prefetch_queue_.pop_front();
    if (entries_.contains(key) || pending_.contains(key)) {
      changed_.notify_all();
      continue;
    }
    const uint64_t generation = BeginFillLocked(key);
    ++prefetches_in_flight_;
    lock.unlock();
    absl::StatusOr<SessionCheckpoint> loaded =
        lower_->Load(key.first, key.second, /*observer=*/nullptr);
    lock.lock();
    --prefetches_in_flight_;
    const bool unchanged = EndFillLocked(key, generation);
    // A failed prefetch costs nothing: the later Load reports the error.
    if (loaded.ok() && unchanged && !entries_.contains(key) &&
        !pending_.contains(key)) {
      InsertLocked(key, std::make_shared<SessionCheckpoint>(*std::move(loaded)),
                   /*dirty=*/false);
      ++counters_.prefetches;
      EvictLocked(lock);
    }
    changed_.notify_all();
  }
}

}  // namespace kvd::storage
