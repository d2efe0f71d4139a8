// The session store the engine calls: host DRAM (DramTier) over RocksDB
// (SessionDb), with write-through or memory-first commits (DESIGN.md
// section 5).
//
// Commit modes:
//   kWriteThrough: the turn goes to SessionDb first (durable as its
//     SessionDbOptions::durability says: kSync survives power loss, kWal a
//     process crash), then to the DRAM copy if one is cached.
//   kMemory: the turn is applied in DRAM only and acknowledged at once; it
//     reaches RocksDB when the session is evicted (background spill) or on
//     Flush. A crash loses every kMemory turn not yet spilled (List shows
//     them meanwhile, from DRAM). For clients that can replay a turn, in
//     exchange for no disk write on the critical path.
//
// Tenant quotas (SessionDbOptions::tenant_quota_bytes) cover both modes: a
// kMemory turn is refused up front (RESOURCE_EXHAUSTED, the session stays
// at its previous turn) when the tenant's bytes in RocksDB plus its
// not-yet-spilled kMemory bytes, this turn included, would exceed the
// quota, so a spill never fails for quota after the turn was acknowledged.
// Write-through commits and imports count the unspilled bytes too. While a
// spill is being written its bytes may count twice for a moment (RocksDB
// has reserved them, DRAM not yet released them): near the quota a turn can
// then be refused that would fit a moment later, never the reverse.
//
//   TieredStoreOptions opts;
//   opts.dram.budget_bytes = int64_t{8} << 30;
//   KVD_ASSIGN_OR_RETURN(std::unique_ptr<TieredStore> store,
//                        TieredStore::Create(std::move(db), opts));
//   KVD_RETURN_IF_ERROR(store->CommitTurn(turn));
//   KVD_ASSIGN_OR_RETURN(TieredStore::Loaded got, store->Load("acme", "c1"));
//   if (got.tier == Tier::kRocksDb) { ... }            // a cold resume
//
// Thread-safety: all methods may be called concurrently; a session's
// commits, imports and deletes must be ordered by the caller (the engine
// serializes a session's turns).
#ifndef KVD_STORAGE_TIERED_TIERED_STORE_H_
#define KVD_STORAGE_TIERED_TIERED_STORE_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/checkpoint/session_checkpoint.h"
#include "storage/rocksdb/session_db.h"
#include "storage/tiered/dram_tier.h"

namespace kvd::storage {

enum class Tier { kDram, kRocksDb };
absl::string_view TierName(Tier tier);

enum class CommitMode { kWriteThrough, kMemory };

struct TieredStoreOptions {
  CommitMode commit_mode = CommitMode::kWriteThrough;
  DramTierOptions dram;
};

// Bytes per tier, for metrics.
struct TierBytes {
  int64_t dram_bytes = 0;  // resident in DRAM
  int64_t dram_spill_pending_bytes = 0;
  int64_t rocksdb_disk_bytes = 0;  // SessionDb::DiskBytes
};

class TieredStore {
 public:
  static absl::StatusOr<std::unique_ptr<TieredStore>> Create(
      std::unique_ptr<SessionDb> db, TieredStoreOptions options);
  // Spills every kMemory turn (Flush) before closing; call Flush first to
  // learn of a failure.
  ~TieredStore();

  // Commits one turn in the configured mode, or in `mode`. Errors as
  // SessionDb::CommitTurn / SessionCheckpoint::Apply (INVALID_ARGUMENT for
  // a bad update, RESOURCE_EXHAUSTED for a quota (see above), UNAVAILABLE
  // for I/O); nothing of a refused turn is applied.
  absl::Status CommitTurn(const TurnUpdate& update);
  absl::Status CommitTurn(const TurnUpdate& update, CommitMode mode);

  // Replaces a whole session (an import): RocksDB first, then DRAM.
  // Taken by value: moved in, the checkpoint becomes the DRAM copy without
  // being copied (an import then holds the session once).
  absl::Status PutSession(SessionCheckpoint checkpoint);

  struct Loaded {
    std::shared_ptr<const SessionCheckpoint> checkpoint;  // never null
    Tier tier = Tier::kDram;                              // where it came from
    // The checkpoint is the one Load's observer saw streamed
    // (DramTier::Loaded::observed).
    bool observed = false;
  };
  // The session's checkpoint, from DRAM if cached, else from RocksDB (then
  // kept in DRAM). INVALID_ARGUMENT for a malformed name, NOT_FOUND,
  // DATA_LOSS naming the bad chunk. `observer` sees a load from RocksDB
  // stream by stream as it is read (DramTier::GetOrLoad), nothing on a hit.
  absl::StatusOr<Loaded> Load(absl::string_view tenant,
                              absl::string_view session,
                              LoadObserver* observer = nullptr);

  // The session's latest committed manifest without loading its chunks:
  // DRAM's copy if cached (kMemory turns may not be in RocksDB yet), else
  // RocksDB's. NOT_FOUND if neither has it.
  absl::StatusOr<v1::SessionManifest> GetManifest(absl::string_view tenant,
                                                  absl::string_view session);

  // Starts loading the session into DRAM (a client reconnected) and returns
  // at once; a later Load is then a DRAM hit. Unknown sessions are ignored.
  void Prefetch(absl::string_view tenant, absl::string_view session);

  // Removes the session from both tiers. NOT_FOUND if neither had it.
  absl::Status Delete(absl::string_view tenant, absl::string_view session);

  // Sessions of a tenant ordered by id, as SessionDb::ListSessions pages
  // them (same tokens and bounds), including kMemory sessions that only
  // DRAM holds yet, with their latest manifest.
  absl::StatusOr<SessionListPage> List(absl::string_view tenant,
                                       absl::string_view page_token,
                                       int64_t page_size);

  // Returns once every kMemory turn committed before the call is in
  // RocksDB and queued prefetches are done; the first spill error.
  absl::Status Flush();

  TierBytes bytes() const;
  // Bytes the tenant's kMemory turns will add to SessionDb::TenantBytes once
  // spilled (DramTier::UnspilledStoredBytes).
  int64_t UnspilledBytes(absl::string_view tenant) const {
    return dram_.UnspilledStoredBytes(tenant);
  }
  DramTierStats dram_stats() const { return dram_.stats(); }
  // Whether the DRAM tier holds the session (its next load is a DRAM hit).
  bool InDram(absl::string_view tenant, absl::string_view session) const {
    return dram_.Contains(tenant, session);
  }
  SessionDb& db() { return *db_; }

  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

 private:
  // SessionDb seen as the DRAM tier's lower tier.
  class DbTier : public LowerTier {
   public:
    explicit DbTier(SessionDb* db) : db_(db) {}
    absl::Status Store(const SessionCheckpoint& checkpoint) override;
    absl::StatusOr<SessionCheckpoint> Load(absl::string_view tenant,
                                           absl::string_view session,
                                           LoadObserver* observer) override;

   private:
    SessionDb* db_;
  };

  TieredStore(std::unique_ptr<SessionDb> db, TieredStoreOptions options);
  // The quota check a write of `m` to RocksDB needs beyond SessionDb's own:
  // the tenant's unspilled kMemory bytes of other sessions must fit too.
  absl::Status CheckQuotaBeforeWrite(const v1::SessionManifest& m);

  const TieredStoreOptions options_;
  std::unique_ptr<SessionDb> db_;
  DbTier lower_;
  DramTier dram_;  // last: its destructor spills into db_
};

}  // namespace kvd::storage

#endif  // KVD_STORAGE_TIERED_TIERED_STORE_H_
