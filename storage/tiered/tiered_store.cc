#include "storage/tiered/tiered_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/checkpoint/codec.h"
#include "storage/checkpoint/ownership.h"

namespace kvd::storage {
namespace {

absl::Status ValidateNames(absl::string_view tenant,
                           absl::string_view session) {
  KVD_RETURN_IF_ERROR(ValidateName("tenant", tenant));
  return ValidateName("session id", session);
}

// RESOURCE_EXHAUSTED unless `committed` (RocksDB) plus `unspilled` (DRAM
// only) bytes, the turn being checked counted in one of them, fit the
// tenant's quota. Worded like SessionDb's quota error.
absl::Status CheckQuota(absl::string_view tenant, int64_t quota,
                        int64_t committed, int64_t unspilled) {
  if (committed + unspilled <= quota) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "tenant ", tenant, " would store ", committed + unspilled,
      " bytes of session checkpoints with this turn (", committed,
      " in RocksDB, ", unspilled,
      " in memory-mode turns not yet written there), over its quota of ", quota,
      " bytes; delete sessions or raise the tenant's quota (this turn was "
      "not applied)"));
}

}  // namespace

absl::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kDram:
      return "dram";
    case Tier::kRocksDb:
      return "rocksdb";
  }
  return "unknown";
}

absl::Status TieredStore::DbTier::Store(const SessionCheckpoint& checkpoint) {
  return db_->PutSession(checkpoint);
}

absl::StatusOr<SessionCheckpoint> TieredStore::DbTier::Load(
    absl::string_view tenant, absl::string_view session,
    LoadObserver* observer) {
  return db_->Load(tenant, session, SessionDb::Parts::kAll, observer);
}

absl::StatusOr<std::unique_ptr<TieredStore>> TieredStore::Create(
    std::unique_ptr<SessionDb> db, TieredStoreOptions options) {
  if (db == nullptr) {
    return absl::InvalidArgumentError("TieredStore needs an open SessionDb");
  }
  if (options.dram.budget_bytes < 0 || options.dram.spill_queue_bytes <= 0 ||
      options.dram.prefetch_queue_entries < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DRAM tier budget ", options.dram.budget_bytes, ", spill queue ",
        options.dram.spill_queue_bytes, " bytes and prefetch queue ",
        options.dram.prefetch_queue_entries,
        " entries must be >= 0, > 0 and >= 0"));
  }
  return std::unique_ptr<TieredStore>(
      new TieredStore(std::move(db), std::move(options)));
}

TieredStore::TieredStore(std::unique_ptr<SessionDb> db,
                         TieredStoreOptions options)
    : options_(std::move(options)),
      db_(std::move(db)),
      lower_(db_.get()),
      dram_(options_.dram, &lower_) {}

TieredStore::~TieredStore() = default;

absl::Status TieredStore::CheckQuotaBeforeWrite(const v1::SessionManifest& m) {
  // SessionDb checks its own bytes; the tenant's unspilled kMemory turns of
  // other sessions (this one's are synced or replaced by the write) must
  // still fit after it, or their spill would fail after being acknowledged.
  const int64_t quota = db_->QuotaBytes(m.tenant());
  if (quota <= 0) return absl::OkStatus();
  const int64_t unspilled =
      dram_.UnspilledStoredBytes(m.tenant()) -
      dram_.UnspilledStoredBytes(m.tenant(), m.session_id());
  if (unspilled <= 0) return absl::OkStatus();
  absl::StatusOr<v1::SessionManifest> old =
      db_->GetManifest(m.tenant(), m.session_id());
  if (!old.ok() && !absl::IsNotFound(old.status())) return old.status();
  const int64_t turn_bytes =
      m.stored_bytes() - (old.ok() ? old->stored_bytes() : 0);
  if (turn_bytes <= 0) return absl::OkStatus();
  return CheckQuota(m.tenant(), quota,
                    db_->TenantBytes(m.tenant()) + turn_bytes, unspilled);
}

absl::Status TieredStore::CommitTurn(const TurnUpdate& update) {
  return CommitTurn(update, options_.commit_mode);
}

absl::Status TieredStore::CommitTurn(const TurnUpdate& update,
                                     CommitMode mode) {
  const v1::SessionManifest& m = update.manifest;
  KVD_RETURN_IF_ERROR(ValidateNames(m.tenant(), m.session_id()));
  if (mode == CommitMode::kMemory) {
    const int64_t quota = db_->QuotaBytes(m.tenant());
    if (quota <= 0) return dram_.ApplyDirty(update);
    // Checked here, not when the turn spills: by then it was acknowledged.
    return dram_.ApplyDirty(
        update, [&](int64_t turn_bytes, int64_t unspilled_after) {
          if (turn_bytes <= 0)
            return absl::OkStatus();  // as SessionDb: shrinking
          return CheckQuota(m.tenant(), quota, db_->TenantBytes(m.tenant()),
                            unspilled_after);
        });
  }
  // Earlier kMemory turns of this session must reach RocksDB before this
  // one, which RocksDB applies on top of what it holds.
  KVD_RETURN_IF_ERROR(dram_.SyncSession(m.tenant(), m.session_id()));
  KVD_RETURN_IF_ERROR(CheckQuotaBeforeWrite(m));
  KVD_RETURN_IF_ERROR(db_->CommitTurn(update));
  absl::StatusOr<bool> applied = dram_.ApplyIfCached(update, /*dirty=*/false);
  if (!applied.ok()) {
    // RocksDB accepted what DRAM refused; drop the DRAM copy so the next
    // Load reads the committed state rather than a stale one.
    dram_.Erase(m.tenant(), m.session_id());
  }
  return absl::OkStatus();
}

absl::Status TieredStore::PutSession(SessionCheckpoint checkpoint) {
  const v1::SessionManifest& m = checkpoint.manifest();
  KVD_RETURN_IF_ERROR(ValidateNames(m.tenant(), m.session_id()));
  // Before the Erase, so a refused import leaves the session as it was.
  KVD_RETURN_IF_ERROR(CheckQuotaBeforeWrite(m));
  // Cancel any spill of an older version first, so it cannot land on top.
  dram_.Erase(m.tenant(), m.session_id());
  KVD_RETURN_IF_ERROR(db_->PutSession(checkpoint));
  dram_.Put(std::move(checkpoint), /*dirty=*/false);
  return absl::OkStatus();
}

absl::StatusOr<TieredStore::Loaded> TieredStore::Load(absl::string_view tenant,
                                                      absl::string_view session,
                                                      LoadObserver* observer) {
  KVD_RETURN_IF_ERROR(ValidateNames(tenant, session));
  KVD_ASSIGN_OR_RETURN(DramTier::Loaded got,
                       dram_.GetOrLoad(tenant, session, observer));
  return Loaded{std::move(got.checkpoint),
                got.from_dram ? Tier::kDram : Tier::kRocksDb, got.observed};
}

absl::StatusOr<v1::SessionManifest> TieredStore::GetManifest(
    absl::string_view tenant, absl::string_view session) {
  KVD_RETURN_IF_ERROR(ValidateNames(tenant, session));
  // DRAM first: under kMemory commits it holds turns RocksDB has not seen.
  if (std::shared_ptr<const SessionCheckpoint> cached =
          dram_.Get(tenant, session)) {
    return cached->manifest();
  }
  return db_->GetManifest(tenant, session);
}

void TieredStore::Prefetch(absl::string_view tenant,
                           absl::string_view session) {
  if (!ValidateNames(tenant, session).ok()) return;
  dram_.Prefetch(tenant, session);
}

absl::Status TieredStore::Delete(absl::string_view tenant,
                                 absl::string_view session) {
  KVD_RETURN_IF_ERROR(ValidateNames(tenant, session));
  const bool in_dram = dram_.Erase(tenant, session);
  absl::Status s = db_->DeleteSession(tenant, session);
  if (absl::IsNotFound(s) && in_dram) return absl::OkStatus();
  return s;
}

absl::StatusOr<SessionListPage> TieredStore::List(absl::string_view tenant,
                                                  absl::string_view page_token,
                                                  int64_t page_size) {
  // Taken before the RocksDB page: a session that spills in between is then
  // seen twice (merged below) rather than not at all.
  std::vector<v1::SessionManifest> dram =
      dram_.UnspilledManifests(tenant, page_token);
  KVD_ASSIGN_OR_RETURN(SessionListPage db,
                       db_->ListSessions(tenant, page_token, page_size));
  if (dram.empty()) return db;
  // Merge by id; DRAM's manifest is the newer one. The RocksDB page holds
  // the page_size smallest ids it has after the token, so the merged page's
  // page_size smallest ids are complete, and any id after the last one
  // comes on a later page.
  SessionListPage page;
  auto d = db.sessions.begin();
  auto m = dram.begin();
  while (static_cast<int64_t>(page.sessions.size()) < page_size &&
         (d != db.sessions.end() || m != dram.end())) {
    if (m == dram.end() ||
        (d != db.sessions.end() && d->session_id() < m->session_id())) {
      page.sessions.push_back(std::move(*d++));
      continue;
    }
    if (d != db.sessions.end() && d->session_id() == m->session_id()) ++d;
    page.sessions.push_back(std::move(*m++));
  }
  const bool more =
      d != db.sessions.end() || m != dram.end() || !db.next_page_token.empty();
  if (more && !page.sessions.empty()) {
    page.next_page_token = page.sessions.back().session_id();
  }
  // DRAM may hold a session's newer, replica manifest (released in memory
  // mode): not live here either.
  page.sessions.erase(
      std::remove_if(page.sessions.begin(), page.sessions.end(),
                     [](const v1::SessionManifest& s) { return IsReplica(s); }),
      page.sessions.end());
  return page;
}

absl::Status TieredStore::Flush() { return dram_.Flush(); }

TierBytes TieredStore::bytes() const {
  const DramTierStats s = dram_.stats();
  TierBytes b;
  b.dram_bytes = s.bytes;
  b.dram_spill_pending_bytes = s.spill_pending_bytes;
  b.rocksdb_disk_bytes = db_->DiskBytes();
  return b;
}

}  // namespace kvd::storage
