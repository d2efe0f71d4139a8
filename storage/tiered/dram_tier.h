// The host-DRAM tier: session checkpoints kept in memory under a byte budget,
// least recently used first out (DESIGN.md section 5). Below it is a
// LowerTier (RocksDB in production) that it spills to and loads from.
//
// An entry is clean (the lower tier holds the same bytes) or dirty (only
// DRAM has them: a kMemory commit). Evicting a clean entry drops it;
// evicting a dirty one hands it to a background spill thread through a
// bounded queue. Until that write finishes the entry stays findable (Get
// revives it), and writes for one session reach the lower tier in order, one
// at a time. Prefetch loads a session on a second background thread so a
// later Get is a hit.
//
//   DramTierOptions opts;
//   opts.budget_bytes = int64_t{8} << 30;
//   DramTier dram(opts, &lower);
//   dram.Prefetch("acme", "chat-1");            // client reconnected
//   ...
//   KVD_ASSIGN_OR_RETURN(DramTier::Loaded got, dram.GetOrLoad("acme",
//   "chat-1")); KVD_RETURN_IF_ERROR(dram.ApplyDirty(turn)); // kMemory commit
//   KVD_RETURN_IF_ERROR(dram.Flush());          // every dirty entry written
//
// Ownership: checkpoints are shared immutable snapshots; a Get result stays
// valid (and unchanged) however the tier changes afterwards. `lower` is not
// owned and must outlive the tier.
//
// Thread-safety: every method may be called concurrently. Updates to one
// session (Put/Apply*/Erase) must be ordered by the caller, as the engine
// does for a session's turns.
#ifndef KVD_STORAGE_TIERED_DRAM_TIER_H_
#define KVD_STORAGE_TIERED_DRAM_TIER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/checkpoint/session_checkpoint.h"
#include "storage/tiered/lower_tier.h"

namespace kvd::storage {

struct DramTierOptions {
  // Resident bytes (SessionCheckpoint::bytes() summed) the tier keeps; least
  // recently used entries are evicted beyond it. A session larger than the
  // whole budget is not kept (a dirty one is spilled at once).
  int64_t budget_bytes = int64_t{1} << 30;
  // Bytes of evicted dirty sessions that may wait for the spill thread. An
  // eviction that would exceed it waits for room, which slows the writer
  // down to the lower tier's speed instead of growing memory without bound.
  int64_t spill_queue_bytes = int64_t{256} << 20;
  // Prefetch requests waiting beyond this many are dropped (counted).
  int prefetch_queue_entries = 64;
};

struct DramTierStats {
  int64_t bytes = 0;    // resident (what the budget limits)
  int64_t entries = 0;  // resident sessions
  int64_t dirty_entries = 0;
  // Sessions handed to the spill thread and not yet written (queued, in
  // progress or failed); may overlap resident bytes when revived.
  int64_t spill_pending_bytes = 0;
  int64_t spill_pending_entries = 0;
  int64_t hits = 0;    // Get/GetOrLoad served from DRAM
  int64_t misses = 0;  // ... not in DRAM
  int64_t evictions = 0;
  int64_t spills = 0;  // successful writes to the lower tier
  int64_t spill_failures = 0;
  int64_t prefetches = 0;  // sessions a prefetch brought in
  int64_t prefetch_dropped = 0;
};

class DramTier {
 public:
  DramTier(DramTierOptions options, LowerTier* lower);
  // Writes every dirty session (Flush) and stops the threads. A failure is
  // lost here; call Flush first to see it.
  ~DramTier();

  // The cached checkpoint, or null on a miss. Promotes the entry.
  std::shared_ptr<const SessionCheckpoint> Get(absl::string_view tenant,
                                               absl::string_view session);

  struct Loaded {
    std::shared_ptr<const SessionCheckpoint> checkpoint;
    bool from_dram = false;  // false: loaded from the lower tier just now
    // The checkpoint is the one GetOrLoad's observer saw streamed (not a
    // newer copy that replaced it while it was read).
    bool observed = false;
  };
  // Get, or on a miss a load from the lower tier whose result is kept
  // (clean). The lower tier's error otherwise (NOT_FOUND, DATA_LOSS, ...).
  // `observer` sees a load from the lower tier as it happens (LowerTier::Load)
  // and nothing on a hit. If the session changed while it was read, the
  // newer copy is returned, not the one the observer saw (`observed` says
  // which).
  absl::StatusOr<Loaded> GetOrLoad(absl::string_view tenant,
                                   absl::string_view session,
                                   LoadObserver* observer = nullptr);

  // Inserts or replaces a whole session. `dirty`: the lower tier does not
  // have these bytes and must get them before the entry is dropped.
  void Put(SessionCheckpoint checkpoint, bool dirty);

  // Applies a committed turn to the cached copy, if there is one (after a
  // write-through commit; `dirty` false). Returns whether there was.
  // INVALID_ARGUMENT from SessionCheckpoint::Apply; nothing changes then.
  absl::StatusOr<bool> ApplyIfCached(const TurnUpdate& update, bool dirty);
  // Decides whether a kMemory turn may be applied, under the tier's lock (so
  // no other dirty apply runs in between): `turn_bytes` is how much the turn
  // grows the session's manifest stored_bytes (may be <= 0), and
  // `unspilled_bytes_after` what UnspilledStoredBytes(tenant) would be with
  // the turn applied. A non-OK status refuses the turn; it must not call
  // back into the tier.
  using AdmitFn = std::function<absl::Status(int64_t turn_bytes,
                                             int64_t unspilled_bytes_after)>;
  // Applies a turn held only in DRAM (kMemory commit), loading the session
  // from the lower tier first if it is not cached (NOT_FOUND there: a new
  // session). The entry is dirty afterwards. If `admit` refuses, its status
  // is returned and nothing changes.
  absl::Status ApplyDirty(const TurnUpdate& update,
                          const AdmitFn& admit = nullptr);

  // Returns once the lower tier holds the session's latest DRAM state: a
  // dirty entry is written now (ahead of the queue), a pending spill is
  // awaited. The spill's error if it fails.
  absl::Status SyncSession(absl::string_view tenant, absl::string_view session);

  // Drops the session and cancels its pending spill (waiting for a write in
  // progress, so it cannot land after the caller deletes the lower copy).
  // Returns whether DRAM held it.
  bool Erase(absl::string_view tenant, absl::string_view session);

  // Whether DRAM holds the session now, without promoting it or counting a
  // hit (for reporting where a session is).
  bool Contains(absl::string_view tenant, absl::string_view session) const;

  // Loads the session in the background unless it is cached; never blocks.
  void Prefetch(absl::string_view tenant, absl::string_view session);

  // Manifests of `tenant`'s sessions whose latest state only DRAM has (dirty
  // entries and sessions still on their way to the lower tier), with
  // session id > `after`, ordered by session id: what a listing of the lower
  // tier misses or shows stale.
  std::vector<v1::SessionManifest> UnspilledManifests(
      absl::string_view tenant, absl::string_view after) const;

  // Per tenant, how far the manifests' stored_bytes of its sessions that
  // only DRAM holds (dirty or spill pending) exceed what the lower tier holds
  // for them (0 for a session it lacks): what the tenant's stored bytes grow
  // by once everything is spilled. Negative if turns shrank sessions.
  // A session that Put(dirty=true) made dirty without the tier knowing the
  // lower copy counts whole (as if the lower tier lacked it).
  int64_t UnspilledStoredBytes(absl::string_view tenant) const;
  // The part of it that is one session's.
  int64_t UnspilledStoredBytes(absl::string_view tenant,
                               absl::string_view session) const;

  // Writes every dirty session to the lower tier (retrying failed spills)
  // and waits for queued prefetches; returns the first spill error.
  absl::Status Flush();

  DramTierStats stats() const;

  DramTier(const DramTier&) = delete;
  DramTier& operator=(const DramTier&) = delete;

 private:
  using Key = std::pair<std::string, std::string>;  // tenant, session
  // std::mutex rather than absl::Mutex so ThreadSanitizer (which intercepts
  // pthreads but not an uninstrumented Abseil) can check this class.
  using Lock = std::unique_lock<std::mutex>;
  struct Entry {
    std::shared_ptr<SessionCheckpoint> checkpoint;
    int64_t bytes = 0;
    uint64_t seq = 0;  // version, bumped by every change
    bool dirty = false;
    std::list<Key>::iterator lru;
  };
  // A version on its way to the lower tier.
  struct Pending {
    std::shared_ptr<SessionCheckpoint> checkpoint;
    int64_t bytes = 0;
    uint64_t seq = 0;
    bool queued = false;
    bool in_flight = false;
    absl::Status failure;  // of the last attempt, if it failed
  };
  // Loads from the lower tier in progress for a key; a change to the key
  // bumps `generation` so a load that started earlier is not cached.
  struct Fill {
    int in_flight = 0;
    uint64_t generation = 0;
  };

  // A session with state only DRAM has: the stored_bytes of its manifest in
  // the lower tier (as far as the tier knows) and of its newest version.
  struct Unspilled {
    int64_t lower_stored = 0;
    int64_t latest_stored = 0;
  };

  Entry* FindLocked(const Key& key);
  // Entry pointers are valid only until the next insertion or wait.
  Entry* InsertLocked(const Key& key, std::shared_ptr<SessionCheckpoint> cp,
                      bool dirty, uint64_t seq = 0);
  void RemoveLocked(const Key& key);
  absl::Status ApplyLocked(Entry* entry, const TurnUpdate& update, bool dirty,
                           const AdmitFn& admit = nullptr);
  // Asks `admit` about a dirty turn taking the key from `lower` (if the key
  // has no Unspilled record yet) to `latest` stored bytes.
  absl::Status AdmitLocked(const Key& key, int64_t lower, int64_t previous,
                           int64_t latest, const AdmitFn& admit) const;
  // Keeps unspilled_ and tenant_unspilled_ in step: Set records the key's
  // bytes; Refresh drops the record once nothing of the key is unspilled.
  void SetUnspilledLocked(const Key& key, int64_t lower, int64_t latest);
  void RefreshUnspilledLocked(const Key& key);
  void EvictLocked(Lock& lock);
  void QueueSpillLocked(const Key& key, std::shared_ptr<SessionCheckpoint> cp,
                        int64_t bytes, uint64_t seq, bool urgent);
  void InvalidateFillsLocked(const Key& key);
  uint64_t BeginFillLocked(const Key& key);
  // Ends a fill; true if nothing changed the key since it began.
  bool EndFillLocked(const Key& key, uint64_t generation);
  // Waits until the key has no spill queued or in progress; its failure.
  absl::Status AwaitSpillLocked(const Key& key, Lock& lock);
  void SpillLoop();
  void PrefetchLoop();

  const DramTierOptions options_;
  LowerTier* const lower_;

  // Everything below, up to the threads, is guarded by mu_; *Locked
  // methods require it held (those taking a Lock may wait, releasing it).
  mutable std::mutex mu_;
  std::condition_variable changed_;  // notified on every state change
  absl::flat_hash_map<Key, Entry> entries_;
  std::list<Key> lru_;  // front = most recent
  int64_t bytes_ = 0;
  uint64_t next_seq_ = 1;
  absl::flat_hash_map<Key, Pending> pending_;
  std::deque<Key> spill_queue_;  // may hold stale keys
  int64_t queued_bytes_ = 0;
  int64_t pending_bytes_ = 0;
  int spills_in_flight_ = 0;
  absl::flat_hash_map<Key, Fill> fills_;
  // Invariant: a key has a record iff it has a dirty entry or a Pending;
  // tenant_unspilled_ sums latest - lower over each tenant's records.
  absl::flat_hash_map<Key, Unspilled> unspilled_;
  absl::flat_hash_map<std::string, int64_t> tenant_unspilled_;
  std::deque<Key> prefetch_queue_;
  int prefetches_in_flight_ = 0;
  bool stop_prefetch_ = false;
  bool stop_spill_ = false;
  DramTierStats counters_;

  std::thread spill_thread_;
  std::thread prefetch_thread_;
};

}  // namespace kvd::storage

#endif  // KVD_STORAGE_TIERED_DRAM_TIER_H_
