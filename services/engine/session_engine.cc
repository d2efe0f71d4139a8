#include "services/engine/session_engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "ops/kvdirect/residual_store.h"
#include "services/engine/session_chunks.h"
#include "storage/checkpoint/codec.h"
#include "storage/checkpoint/ownership.h"

namespace kvd::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t)
      .count();
}

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace

v1::ModelIdentity ModelIdentityOf(const ops::ModelBackend& model,
                                  const std::string& fingerprint) {
  v1::ModelIdentity id;
  id.set_model_name(model.config().name);
  id.set_fingerprint(fingerprint);
  id.set_precision(ops::PrecisionName(model.precision()));
  id.set_numerics_version(model.numerics_version());
  return id;
}

namespace {

ops::KvBlockPool::Options PoolOptions(const ops::ModelBackend& model,
                                      const SessionEngineOptions& o) {
  ops::KvBlockPool::Options po;
  po.block_rows = o.kv_pool_block_rows;
  const size_t block =
      2 * static_cast<size_t>(std::max<int64_t>(1, po.block_rows)) *
      ops::KvCache::RowBytes(model.config(), model.precision());
  po.budget_bytes =
      o.kv_pool_bytes <= 0 ? 0 : std::max<size_t>(o.kv_pool_bytes, block);
  return po;
}

// The constructor cannot fail, so options ValidateOptions would refuse fall
// back to defaults here, loudly, rather than aborting the process.
std::unique_ptr<ops::KvBlockPool> MakePool(const ops::ModelBackend& model,
                                           const SessionEngineOptions& o) {
  SessionEngineOptions fixed = o;
  if (o.kv_pool_bytes < 0) {
    std::fprintf(stderr,
                 "kvd: warning: kv_pool_bytes %lld is negative; using the "
                 "default %lld (validate options with "
                 "SessionEngine::ValidateOptions)\n",
                 static_cast<long long>(o.kv_pool_bytes),
                 static_cast<long long>(SessionEngineOptions().kv_pool_bytes));
    fixed.kv_pool_bytes = SessionEngineOptions().kv_pool_bytes;
  }
  absl::StatusOr<std::unique_ptr<ops::KvBlockPool>> pool =
      model.NewBlockPool(PoolOptions(model, fixed));
  if (pool.ok()) return *std::move(pool);
  std::fprintf(stderr,
               "kvd: warning: K/V pool options refused (%s); using blocks of "
               "%lld rows (validate options with "
               "SessionEngine::ValidateOptions)\n",
               std::string(pool.status().message()).c_str(),
               static_cast<long long>(ops::KvBlockPool::kDefaultBlockRows));
  fixed.kv_pool_block_rows = ops::KvBlockPool::kDefaultBlockRows;
  pool = model.NewBlockPool(PoolOptions(model, fixed));
  if (pool.ok()) return *std::move(pool);
  // Default-size blocks and a budget of at least one block are valid for
  // every model (its K/V rows are never empty): reaching this is our bug.
  std::fprintf(stderr, "kvd: K/V pool cannot be created: %s\n",
               std::string(pool.status().message()).c_str());
  std::abort();
}

SchedulerOptions SchedulerWithPool(SchedulerOptions o, ops::KvBlockPool* pool,
                                   std::function<bool()> reclaim,
                                   std::function<int64_t()> reclaimable) {
  o.kv_pool = pool;
  o.reclaim_kv = std::move(reclaim);
  o.reclaimable_kv_blocks = std::move(reclaimable);
  return o;
}

}  // namespace

SessionEngine::SessionEngine(const ops::ModelBackend& model,
                             v1::ModelIdentity identity,
                             storage::TieredStore* store,
                             SessionEngineOptions options)
    : SessionEngine(model, std::move(identity), store, options,
                    MakePool(model, options)) {}

absl::StatusOr<std::unique_ptr<SessionEngine>> SessionEngine::Create(
    const ops::ModelBackend& model, v1::ModelIdentity identity,
    storage::TieredStore* store, SessionEngineOptions options) {
  KVD_RETURN_IF_ERROR(ValidateOptions(model, options));
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<ops::KvBlockPool> pool,
                       model.NewBlockPool(PoolOptions(model, options)));
  return std::unique_ptr<SessionEngine>(new SessionEngine(
      model, std::move(identity), store, std::move(options), std::move(pool)));
}

SessionEngine::SessionEngine(const ops::ModelBackend& model,
                             v1::ModelIdentity identity,
                             storage::TieredStore* store,
                             SessionEngineOptions options,
                             std::unique_ptr<ops::KvBlockPool> kv_pool)
    : model_(model),
      identity_(std::move(identity)),
      store_(store),
      options_(std::move(options)),
      kv_pool_(std::move(kv_pool)),
      hot_(HotSessions::Limits{options_.max_hot_sessions,
                               options_.max_hot_kv_bytes}),
      locks_(options_.frozen_turn_wait),
      scheduler_(std::make_unique<Scheduler>(
          model, SchedulerWithPool(
                     options_.scheduler, kv_pool_.get(),
                     [this] { return hot_.DemoteOneIdle(); },
                     [this] { return hot_.IdleKvBlocks(); }))) {
  Restorer::Parts parts;
  parts.model = &model_;
  parts.identity = &identity_;
  parts.store = store_;
  parts.pool = kv_pool_.get();
  parts.scheduler = scheduler_.get();
  parts.hot = &hot_;
  parts.hot_budget = options_.hot_budget;
  parts.defaults = Defaults();
  restorer_ = std::make_unique<Restorer>(std::move(parts));
}

NewSessionDefaults SessionEngine::Defaults() const {
  return NewSessionDefaults{options_.policy, options_.chunk_tokens,
                            options_.node_id};
}

SessionEngine::~SessionEngine() = default;

absl::Status SessionEngine::ValidateOptions(
    const ops::ModelBackend& model, const SessionEngineOptions& options) {
  if (options.kv_pool_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_pool_bytes (--kv-pool-mb) is ", options.kv_pool_bytes,
                     "; use 0 for an unlimited K/V pool or a positive budget"));
  }
  ops::KvBlockPool::Options po = PoolOptions(model, options);
  po.budget_bytes = 0;  // only the block size is checked here
  // A host pool with the backend's rows runs the same checks as the
  // backend's own, without reserving device memory for them.
  if (absl::Status s =
          ops::KvBlockPool::Create(
              ops::KvCache::RowBytes(model.config(), model.precision()), po)
              .status();
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_pool_block_rows is ", options.kv_pool_block_rows,
                     ", which the K/V pool refuses (", s.message(),
                     "); use a positive multiple of the attention chunk, e.g. ",
                     ops::KvBlockPool::kDefaultBlockRows));
  }
  if (options.hot_budget != ops::ResidualKvSource::kAll) {
    if (absl::Status s = model.BoundedHotWindowSupport(); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("hot_budget (--hot-budget) is ", options.hot_budget,
                       ", but ", s.message(), "; use --hot-budget all here"));
    }
  }
  if (options.policy.kind == ops::CheckpointPolicy::Kind::kKv) {
    if (absl::Status s = model.KvRowAccess(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "policy kv (--policy kv) stores K/V rows, but ", s.message()));
    }
  }
  if (options.chunk_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_tokens is ", options.chunk_tokens,
                     "; stored chunks need at least one position"));
  }
  if (options.max_hot_sessions < 0 || options.max_hot_kv_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_hot_sessions (", options.max_hot_sessions,
                     ") and max_hot_kv_bytes (", options.max_hot_kv_bytes,
                     ") must not be negative"));
  }
  return absl::OkStatus();
}

absl::Status SessionEngine::CheckAbsent(const std::string& tenant,
                                        const std::string& session) {
  // Ask the database first: loading into DRAM just to see that the session
  // exists would make its next restore look like a DRAM hit. Only a kMemory
  // session not yet spilled is in DRAM alone.
  absl::Status exists = store_->db().GetManifest(tenant, session).status();
  if (exists.code() == absl::StatusCode::kNotFound)
    exists = store_->Load(tenant, session).status();
  if (exists.ok() || exists.code() == absl::StatusCode::kDataLoss) {
    return absl::AlreadyExistsError(
        absl::StrCat(SessionName(tenant, session), " already exists"));
  }
  if (exists.code() != absl::StatusCode::kNotFound) return exists;
  return absl::OkStatus();
}

absl::Status SessionEngine::CreateSession(
    const std::string& tenant, const std::string& session,
    const std::map<std::string, std::string>& labels) {
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(storage::ValidateName("session id", session));
  KVD_ASSIGN_OR_RETURN(v1::SessionManifest m,
                       NewSessionManifest(model_, identity_, Defaults(), tenant,
                                          session, labels));
  // Under the session's lock: a first turn that is starting the session
  // (create_if_missing) holds it until it commits, so this waits and then
  // finds the session instead of being overwritten by that commit.
  const std::shared_ptr<absl::Mutex> session_mu =
      locks_.MutexOf(Key(tenant, session));
  absl::MutexLock session_lock(session_mu.get());
  KVD_RETURN_IF_ERROR(CheckAbsent(tenant, session));
  if (options_.fence != nullptr) {
    KVD_ASSIGN_OR_RETURN(uint64_t epoch,
                         options_.fence->OwnedEpoch(tenant, session));
    if (epoch != storage::kFirstEpoch) return NoCopyAt(tenant, session, epoch);
    KVD_RETURN_IF_ERROR(options_.fence->MayCommit(tenant, session, epoch));
  }
  storage::TurnUpdate update;
  update.manifest = std::move(m);
  return store_->CommitTurn(update);
}

absl::StatusOr<bool> SessionEngine::ClaimForTurn(const Key& key) {
  const auto& [tenant, session] = key;
  absl::StatusOr<uint64_t> owned = options_.fence->OwnedEpoch(tenant, session);
  if (owned.status().code() == absl::StatusCode::kAborted) {
    return MarkNotRun(owned.status(), "moved");  // another node owns it
  }
  KVD_ASSIGN_OR_RETURN(uint64_t epoch, std::move(owned));
  absl::StatusOr<v1::SessionManifest> stored =
      store_->GetManifest(tenant, session);
  if (stored.status().code() == absl::StatusCode::kNotFound) {
    if (epoch != storage::kFirstEpoch) return NoCopyAt(tenant, session, epoch);
    KVD_ASSIGN_OR_RETURN(bool elsewhere,
                         options_.fence->HasCommitsElsewhere(tenant, session));
    if (elsewhere) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the cluster directory gives ", SessionName(tenant, session),
          " to this node and lists replicas of it, so it has committed "
          "turns, but this node holds no copy (was its data directory "
          "lost or replaced?); nothing was written. The node hands such "
          "sessions to their replica within seconds (replication's refill "
          "pass): retry then"));
    }
    return true;  // placed here by the directory: this turn starts it
  }
  // A damaged manifest is the restore's to report (and salvage).
  if (!stored.ok()) return false;
  const uint64_t mine = storage::EpochOf(*stored);
  if (mine + 1 == epoch && storage::IsReplica(*stored)) {
    // A copy handed to this node (StoreReplica) before the directory moved
    // the session here: the move committed it, so this node takes it up.
    // The directory moves a session only to a node that holds its whole
    // committed state, which makes this copy current.
    KVD_RETURN_IF_ERROR(
        ChangeOwner(key, options_.node_id, epoch, v1::SESSION_ROLE_PRIMARY));
    absl::MutexLock lock(&mu_);
    stats_.replicas_adopted++;
    return false;
  }
  if (mine < epoch) {
    // The session moved on and came back: the copy here may be missing
    // turns committed elsewhere meanwhile. Only a move that brings the
    // current copy (an import, or a future migration's Adopt) may raise it.
    return absl::FailedPreconditionError(absl::StrCat(
        "the cluster directory gives ", SessionName(tenant, session),
        " to this node at epoch ", epoch,
        ", but this node's copy is from epoch ", mine,
        " and may be missing later turns; nothing was written. Bring "
        "the current copy here (export from its last owner, import here)"));
  }
  if (mine > epoch) {
    return absl::AbortedError(absl::StrCat(
        SessionName(tenant, session), " is stored here at epoch ", mine,
        ", newer than the cluster directory's ", epoch,
        "; nothing was written. The directory is the authority: check it "
        "(kvd cluster status) before serving this session here"));
  }
  return false;
}

absl::Status SessionEngine::NoCopyAt(const std::string& tenant,
                                     const std::string& session,
                                     uint64_t epoch) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "the cluster directory gives ", SessionName(tenant, session),
      " to this node at epoch ", epoch,
      ", but this node has no copy of it (only a new session, epoch 1, "
      "starts empty); move its checkpoint here first (kvd sessions export / "
      "import)"));
}

absl::Status SessionEngine::ImportSession(
    storage::SessionCheckpoint checkpoint) {
  const std::string& tenant = checkpoint.manifest().tenant();
  const std::string& session = checkpoint.manifest().session_id();
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(storage::ValidateName("session id", session));
  const std::shared_ptr<absl::Mutex> session_mu =
      locks_.MutexOf(Key(tenant, session));
  absl::MutexLock session_lock(session_mu.get());
  absl::Status absent = CheckAbsent(tenant, session);
  if (absent.code() == absl::StatusCode::kAlreadyExists) {
    return absl::AlreadyExistsError(absl::StrCat(
        absent.message(), "; delete it first or import under another name"));
  }
  KVD_RETURN_IF_ERROR(absent);
  // An import is a change of owner: a primary of this node, one epoch past
  // the exported copy; in a cluster, at the epoch the directory gives this
  // node (it must have placed the session here).
  v1::SessionManifest imported =
      storage::ImportedBy(checkpoint.manifest(), options_.node_id);
  if (options_.fence != nullptr) {
    KVD_ASSIGN_OR_RETURN(uint64_t epoch,
                         options_.fence->OwnedEpoch(tenant, session));
    imported.set_epoch(epoch);
    KVD_RETURN_IF_ERROR(options_.fence->MayCommit(tenant, session, epoch));
  }
  checkpoint.ReplaceManifest(std::move(imported));
  return store_->PutSession(std::move(checkpoint));
}

absl::Status SessionEngine::ReadyForTurn(const std::string& tenant,
                                         const std::string& session,
                                         bool check_owner) {
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(storage::ValidateName("session id", session));
  KVD_RETURN_IF_ERROR(locks_.AwaitThawed(Key(tenant, session)));
  if (!check_owner || options_.fence == nullptr) return absl::OkStatus();
  absl::Status owned = options_.fence->OwnedEpoch(tenant, session).status();
  if (owned.code() == absl::StatusCode::kAborted) {
    return MarkNotRun(owned, "moved");
  }
  return owned;
}

absl::Status SessionEngine::TakeUp(const std::string& tenant,
                                   const std::string& session) {
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(storage::ValidateName("session id", session));
  if (options_.fence == nullptr) return absl::OkStatus();
  const Key key(tenant, session);
  const std::shared_ptr<absl::Mutex> session_mu = locks_.MutexOf(key);
  absl::MutexLock session_lock(session_mu.get());
  return ClaimForTurn(key).status();
}

absl::Status SessionEngine::StoreReplica(storage::SessionCheckpoint checkpoint,
                                         const std::string& staged_by) {
  const v1::SessionManifest& m = checkpoint.manifest();
  const std::string& tenant = m.tenant();
  const std::string& session = m.session_id();
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(storage::ValidateName("session id", session));
  KVD_RETURN_IF_ERROR(storage::CheckCompatible(m.model(), identity_, session));
  const Key key(tenant, session);
  const std::shared_ptr<absl::Mutex> session_mu = locks_.MutexOf(key);
  absl::MutexLock session_lock(session_mu.get());
  const uint64_t epoch = storage::EpochOf(m);
  absl::StatusOr<v1::SessionManifest> mine =
      store_->GetManifest(tenant, session);
  if (mine.ok()) {
    const uint64_t my_epoch = storage::EpochOf(*mine);
    const bool live_here = !storage::IsReplica(*mine) &&
                           mine->owner_node() == options_.node_id &&
                           my_epoch >= epoch;
    if (my_epoch > epoch || live_here) {
      return absl::AbortedError(absl::StrCat(
          SessionName(tenant, session), " is stored here at epoch ", my_epoch,
          " as ", storage::IsReplica(*mine) ? "a replica" : "its primary",
          "; a copy from epoch ", epoch,
          " would replace a newer one. Nothing was written"));
    }
  } else if (mine.status().code() != absl::StatusCode::kNotFound &&
             mine.status().code() != absl::StatusCode::kDataLoss) {
    return mine.status();
  }
  v1::SessionManifest replica = m;
  replica.set_format_version(storage::kCheckpointFormatVersion);
  replica.set_role(v1::SESSION_ROLE_REPLICA);
  replica.set_epoch(epoch);
  replica.set_staged_by(staged_by);
  checkpoint.ReplaceManifest(std::move(replica));
  hot_.Drop(key);  // hot state of an older copy
  KVD_RETURN_IF_ERROR(store_->PutSession(std::move(checkpoint)));
  absl::MutexLock lock(&mu_);
  stats_.replicas_stored++;
  return absl::OkStatus();
}

absl::Status SessionEngine::ApplyReplicaUpdate(storage::TurnUpdate update) {
  const std::string tenant = update.manifest.tenant();
  const std::string session = update.manifest.session_id();
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(storage::ValidateName("session id", session));
  KVD_RETURN_IF_ERROR(
      storage::CheckCompatible(update.manifest.model(), identity_, session));
  const Key key(tenant, session);
  const std::shared_ptr<absl::Mutex> session_mu = locks_.MutexOf(key);
  absl::MutexLock session_lock(session_mu.get());
  KVD_RETURN_IF_ERROR(store_->GetManifest(tenant, session).status());
  update.manifest.set_format_version(storage::kCheckpointFormatVersion);
  update.manifest.set_epoch(storage::EpochOf(update.manifest));
  update.manifest.set_role(v1::SESSION_ROLE_REPLICA);
  update.manifest.clear_staged_by();  // committed: no transfer's to drop
  update.ownership_change = false;
  update.replica_update = true;
  return store_->CommitTurn(update, storage::CommitMode::kWriteThrough);
}

absl::StatusOr<v1::SessionManifest> SessionEngine::GetReplica(
    const std::string& tenant, const std::string& session) {
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(storage::ValidateName("session id", session));
  KVD_ASSIGN_OR_RETURN(v1::SessionManifest m,
                       store_->GetManifest(tenant, session));
  if (!storage::IsReplica(m)) {
    return absl::NotFoundError(absl::StrCat(SessionName(tenant, session),
                                            " has no replica copy here"));
  }
  return m;
}

absl::Status SessionEngine::DropReplica(const std::string& tenant,
                                        const std::string& session,
                                        const std::string& staged_by) {
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(storage::ValidateName("session id", session));
  const Key key(tenant, session);
  const std::shared_ptr<absl::Mutex> session_mu = locks_.MutexOf(key);
  absl::MutexLock session_lock(session_mu.get());
  absl::StatusOr<v1::SessionManifest> m = store_->GetManifest(tenant, session);
  if (m.status().code() == absl::StatusCode::kNotFound) {
    return absl::OkStatus();
  }
  KVD_RETURN_IF_ERROR(m.status());
  if (!storage::IsReplica(*m)) {
    return absl::FailedPreconditionError(absl::StrCat(
        SessionName(tenant, session),
        " is live here (a primary); only a replica copy is dropped"));
  }
  // Another transfer's copy, or one an update has made the session's since:
  // not the caller's to drop.
  if (!staged_by.empty() && m->staged_by() != staged_by)
    return absl::OkStatus();
  hot_.Drop(key);
  return store_->Delete(tenant, session);
}

absl::StatusOr<std::shared_ptr<SessionRecord>> SessionEngine::Acquire(
    const Key& key, bool create_if_missing, TurnResult* result) {
  // Marked in a turn under the lock that found it: DemoteOneIdle (the
  // scheduler thread) must not see it idle between here and the turn. A
  // session whose K/V the backend lost (a tensor-parallel shard worker
  // restarted) is resumed from its checkpoint, as if it were demoted.
  std::shared_ptr<SessionRecord> hot = hot_.BeginTurn(
      key,
      [this](const SessionRecord& r) { return model_.CacheIntact(r.cache); });
  if (hot != nullptr) {
    result->path = StatePath::kHot;
    CountRestore(StatePath::kHot);
  }
  if (hot != nullptr) {
    // Hot state is trusted only while the stored manifest is the one it was
    // committed under: the session may have been released, adopted or
    // replaced meanwhile (its owner, epoch or turns differ then).
    absl::StatusOr<v1::SessionManifest> stored =
        store_->GetManifest(key.first, key.second);
    absl::Status same = stored.status();
    if (same.ok()) same = CheckNodeMayCommit(*stored, options_.node_id);
    if (same.ok() &&
        (storage::EpochOf(*stored) != storage::EpochOf(hot->committed) ||
         stored->token_count() != hot->committed.token_count())) {
      same = absl::AbortedError(absl::StrCat(
          SessionName(key.first, key.second),
          " changed under this node's hot state; nothing was written, retry "
          "the turn"));
    }
    if (!same.ok()) {
      hot_.EndTurn(*hot);
      hot_.Drop(key);
      return same;
    }
    return hot;
  }
  const auto start = std::chrono::steady_clock::now();
  RestoreOutcome how;
  absl::StatusOr<std::shared_ptr<SessionRecord>> active =
      restorer_->Restore(key.first, key.second, create_if_missing, &how);
  result->restore_seconds = SecondsSince(start);
  result->path = how.path;
  result->path_detail = std::move(how.detail);
  if (active.ok()) {
    hot_.MarkInTurn(**active);
    CountRestore(result->path);
    if (how.streamed) {
      absl::MutexLock lock(&mu_);
      stats_.restores_streamed++;
    }
  }
  return active;
}

absl::StatusOr<TurnResult> SessionEngine::RunTurn(
    const TurnRequest& request, const ops::Tokenizer& tokenizer,
    const DeltaCallback& on_delta) {
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", request.tenant));
  KVD_RETURN_IF_ERROR(storage::ValidateName("session id", request.session));
  const Key key(request.tenant, request.session);
  // Refuse before restoring anything: a full queue would refuse the turn's
  // sequence anyway.
  if (scheduler_->Saturated()) {
    absl::MutexLock lock(&mu_);
    stats_.turns_rejected++;
    return absl::ResourceExhaustedError(
        absl::StrCat("the engine is busy (", scheduler_->options().max_running,
                     " sequences running, ", scheduler_->options().max_waiting,
                     " waiting); retry ",
                     SessionName(request.tenant, request.session), " later"));
  }
  KVD_ASSIGN_OR_RETURN(SessionLocks::TurnLock turn_lock,
                       locks_.LockForTurn(key, request.fail_if_busy));

  // A hot session whose K/V the backend lost while the turn started (a
  // tensor-parallel shard worker died and was restarted between the check
  // in Acquire and the first step) fails with nothing run or sent; it is
  // run once more, from its checkpoint, as if it had been demoted.
  bool delivered = false;
  DeltaCallback counted;
  if (on_delta) {
    counted = [&delivered, &on_delta](const GenerateDelta& d) {
      delivered = true;
      on_delta(d);
    };
  }
  bool kv_lost = false;
  absl::StatusOr<TurnResult> result =
      RunTurnLocked(key, request, tokenizer, counted, &kv_lost);
  if (!result.ok() && kv_lost && !delivered) {
    result = RunTurnLocked(key, request, tokenizer, counted, &kv_lost);
  }
  return result;
}

absl::StatusOr<TurnResult> SessionEngine::RunTurnLocked(
    const Key& key, const TurnRequest& request, const ops::Tokenizer& tokenizer,
    const DeltaCallback& on_delta, bool* kv_lost) {
  *kv_lost = false;
  bool create_if_missing = request.create_if_missing;
  if (options_.fence != nullptr) {
    KVD_ASSIGN_OR_RETURN(create_if_missing, ClaimForTurn(key));
  }
  TurnResult result;
  KVD_ASSIGN_OR_RETURN(std::shared_ptr<SessionRecord> active,
                       Acquire(key, create_if_missing, &result));
  SessionRecord& a = *active;  // in a turn (Acquire): never demoted meanwhile
  if (options_.before_turn) {
    if (absl::Status ready = options_.before_turn(a.committed); !ready.ok()) {
      hot_.EndTurn(a);
      return MarkNotRun(ready, "replicas");
    }
  }
  if (!request.request_id.empty() &&
      a.committed.last_request_id() == request.request_id &&
      a.committed.has_last_reply()) {
    absl::StatusOr<TurnResult> replayed =
        ReplayLastReply(a, std::move(result), on_delta);
    hot_.EndTurn(a);
    if (replayed.ok()) {
      absl::MutexLock lock(&mu_);
      stats_.turns_replayed++;
    }
    return replayed;
  }
  if (!request.request_id.empty() &&
      a.committed.last_request_id() == request.request_id) {
    // Committed before replies were stored with turns: nothing to resend.
    hot_.EndTurn(a);
    return absl::AlreadyExistsError(absl::StrCat(
        "request '", request.request_id, "' already committed turn ",
        a.committed.turn_ends_size(), " of ",
        SessionName(request.tenant, request.session),
        "; it was not run again (read the session to see its reply, or send "
        "a new request id for a new turn)"));
  }
  std::vector<int32_t> turn_tokens = request.tokens;
  if (request.make_tokens) {
    absl::StatusOr<std::vector<int32_t>> made = request.make_tokens(a.tokens);
    if (!made.ok()) {
      hot_.EndTurn(a);
      return made.status();
    }
    turn_tokens = std::move(*made);
  }
  // The turn runs the session's pending tokens (the last sampled one, not
  // yet seen by the model) and then the new ones.
  GenerateRequest g = request.generate;
  g.prompt.assign(a.tokens.begin() + a.cache.length(), a.tokens.end());
  g.prompt.insert(g.prompt.end(), turn_tokens.begin(), turn_tokens.end());
  g.kv_source = a.source.get();
  g.observer = &a.store;
  g.sequence_id = 0;
  const int64_t cache_before = a.cache.length();
  const int64_t store_before = a.store.length(0);
  const int64_t context_tokens =
      static_cast<int64_t>(a.tokens.size() + turn_tokens.size());
  absl::StatusOr<GenerateResult> gen =
      scheduler_->Run(tokenizer, g, &a.cache, on_delta);
  if (gen.status().code() == absl::StatusCode::kResourceExhausted &&
      a.cache.length() == cache_before && a.store.length(0) == store_before) {
    // Refused before anything ran: the hot state is intact. (Stopped by a
    // full K/V pool after running, the state is partial and dropped below.)
    hot_.EndTurn(a);
    absl::MutexLock lock(&mu_);
    stats_.turns_rejected++;
    return gen.status();
  }
  absl::Status status = gen.ok() ? a.store.status() : gen.status();
  if (status.ok() && gen->finish_reason == FinishReason::kCancelled) {
    status = absl::CancelledError("turn cancelled; nothing was committed");
  }
  if (!status.ok()) {
    *kv_lost = result.path == StatePath::kHot && !model_.CacheIntact(a.cache);
    hot_.EndTurn(a);
    hot_.Drop(key);  // the next turn resumes from the last commit
    absl::MutexLock lock(&mu_);
    stats_.turns_failed++;
    return status;
  }

  // Residual rows no later step or rebuild can read (past a sliding window)
  // are dropped, at chunk boundaries so stored chunks stay whole.
  const int64_t c = a.committed.chunk_tokens();
  for (int64_t layer : a.store.layers()) {
    const int64_t keep = ops::ResidualKeepBegin(model_.config(), a.policy,
                                                layer, a.cache.length());
    if (keep / c * c > a.store.first_kept(0, layer))
      a.store.DropBelow(0, layer, keep / c * c);
  }

  // Commit: tokens, residual rows and manifest in one atomic update.
  const auto commit_start = std::chrono::steady_clock::now();
  std::vector<int32_t> tokens = a.tokens;
  tokens.insert(tokens.end(), turn_tokens.begin(), turn_tokens.end());
  tokens.insert(tokens.end(), gen->tokens.begin(), gen->tokens.end());
  v1::SessionManifest next = a.committed;
  next.set_format_version(storage::kCheckpointFormatVersion);
  next.set_owner_node(options_.node_id);
  next.set_epoch(storage::EpochOf(a.committed));
  next.set_role(v1::SESSION_ROLE_PRIMARY);
  next.set_last_request_id(request.request_id);
  if (request.request_id.empty()) {
    next.clear_last_reply();  // nothing could ask for it again
  } else {
    v1::TurnReply* reply = next.mutable_last_reply();
    reply->set_text(gen->text);
    reply->set_finish_reason(FinishReasonName(gen->finish_reason));
    reply->set_generated_tokens(static_cast<int64_t>(gen->tokens.size()));
    reply->set_context_tokens(context_tokens);
    reply->set_cached_tokens(
        result.path == StatePath::kReprefill ? 0 : cache_before);
  }
  // Every residual is rewritten: under this node's numerics from now on.
  if (a.rewrite_all) *next.mutable_model() = identity_;
  next.set_token_count(tokens.size());
  next.set_length(a.cache.length());
  next.add_turn_ends(tokens.size());
  next.set_updated_unix_ms(NowMs());
  const v1::SessionManifest from =
      a.rewrite_all ? v1::SessionManifest() : a.committed;
  absl::StatusOr<storage::TurnUpdate> built =
      a.policy.kind == ops::CheckpointPolicy::Kind::kKv
          ? BuildTurnUpdate(from, std::move(next), tokens,
                            CacheKvRows(model_, a.cache, c))
          : BuildTurnUpdate(from, std::move(next), tokens,
                            ResidualRows(a.store, 0));
  absl::Status committed = built.status();
  if (committed.ok() && options_.fence != nullptr) {
    // The last word before anything is written: a node whose lease lapsed
    // or whose session moved meanwhile commits nothing.
    committed = options_.fence->MayCommit(request.tenant, request.session,
                                          storage::EpochOf(built->manifest));
  }
  if (committed.ok()) committed = store_->CommitTurn(*built);
  if (!committed.ok()) {
    hot_.EndTurn(a);
    hot_.Drop(key);
    absl::MutexLock lock(&mu_);
    stats_.turns_failed++;
    return committed;
  }
  storage::TurnUpdate& update = *built;
  const absl::Status replicated =
      options_.on_commit ? options_.on_commit(update) : absl::OkStatus();
  result.commit_seconds = SecondsSince(commit_start);
  a.committed = std::move(update.manifest);
  a.tokens = std::move(tokens);
  a.rewrite_all = false;
  a.kv_bytes = a.cache.allocated_bytes();
  a.residual_bytes = a.store.size_bytes();
  result.generation = std::move(*gen);
  result.session_tokens = a.committed.token_count();
  result.turn = a.committed.turn_ends_size();
  result.context_tokens = context_tokens;
  result.cached_tokens =
      result.path == StatePath::kReprefill ? 0 : cache_before;
  hot_.Keep(key, std::move(active));
  absl::MutexLock lock(&mu_);
  stats_.turns_committed++;
  if (!replicated.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "turn ", result.turn, " of ",
        SessionName(request.tenant, request.session),
        " committed on this node, but its replicas could not be confirmed "
        "to hold it (",
        replicated.message(),
        "), so it may or may not have committed: send it again with the "
        "same X-Request-Id, which never runs a turn twice"));
  }
  return result;
}

absl::StatusOr<TurnResult> SessionEngine::ReplayLastReply(
    const SessionRecord& a, TurnResult result, const DeltaCallback& on_delta) {
  const v1::TurnReply& reply = a.committed.last_reply();
  const int64_t generated = reply.generated_tokens();
  if (generated < 0 || generated > static_cast<int64_t>(a.tokens.size())) {
    return absl::DataLossError(absl::StrCat(
        "the stored reply of ",
        SessionName(a.committed.tenant(), a.committed.session_id()), "'s turn ",
        a.committed.turn_ends_size(), " claims ", generated,
        " generated tokens of ", a.tokens.size(),
        "; send a new request id to run a new turn"));
  }
  GenerateResult& g = result.generation;
  g.tokens.assign(a.tokens.end() - generated, a.tokens.end());
  g.text = reply.text();
  g.finish_reason =
      reply.finish_reason() == FinishReasonName(FinishReason::kStop)
          ? FinishReason::kStop
          : FinishReason::kLength;
  g.prompt_tokens = reply.context_tokens();
  result.session_tokens = a.committed.token_count();
  result.turn = a.committed.turn_ends_size();
  result.context_tokens = reply.context_tokens();
  result.cached_tokens = reply.cached_tokens();
  result.replayed = true;
  if (on_delta) {
    GenerateDelta delta;
    delta.text = g.text;
    delta.tokens = g.tokens;
    on_delta(delta);
  }
  return result;
}

absl::StatusOr<SessionEngine::FrozenSession> SessionEngine::Freeze(
    const std::string& tenant, const std::string& session) {
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(storage::ValidateName("session id", session));
  const Key key(tenant, session);
  const std::shared_ptr<absl::Mutex> session_mu = locks_.MutexOf(key);
  {
    // Frozen first, so turns that come now wait instead of taking the
    // session's mutex ahead of this call again and again.
    if (!locks_.MarkFrozen(key)) {
      return absl::FailedPreconditionError(
          absl::StrCat(SessionName(tenant, session), " is frozen already"));
    }
  }
  absl::StatusOr<v1::SessionManifest> m;
  {
    // Waits for a running turn: its commit is part of what is frozen.
    absl::MutexLock session_lock(session_mu.get());
    m = store_->GetManifest(tenant, session);
    if (m.ok()) {
      if (absl::Status mine = CheckNodeMayCommit(*m, options_.node_id);
          !mine.ok())
        m = mine;
    }
  }
  if (!m.ok()) {
    Unfreeze(tenant, session);
    return m.status();
  }
  return FrozenSession{static_cast<uint64_t>(m->turn_ends_size()),
                       m->token_count(), storage::EpochOf(*m), m->owner_node()};
}

void SessionEngine::Unfreeze(const std::string& tenant,
                             const std::string& session) {
  locks_.Unfreeze(Key(tenant, session));
}

absl::Status SessionEngine::ChangeOwner(const Key& key,
                                        const std::string& owner,
                                        uint64_t epoch, v1::SessionRole role) {
  KVD_ASSIGN_OR_RETURN(v1::SessionManifest m,
                       store_->GetManifest(key.first, key.second));
  storage::TurnUpdate update;
  update.manifest = std::move(m);
  update.manifest.set_format_version(storage::kCheckpointFormatVersion);
  update.manifest.set_owner_node(owner);
  update.manifest.set_epoch(epoch);
  update.manifest.set_role(role);
  update.manifest.clear_staged_by();  // adopted or released: settled
  update.manifest.set_updated_unix_ms(NowMs());
  update.ownership_change = true;
  // Hot state belongs to the old ownership; the next turn restores.
  hot_.Drop(key);
  // Never left in DRAM alone (memory commits): after a crash this node must
  // not come back as the owner it handed the session away from.
  return store_->CommitTurn(update, storage::CommitMode::kWriteThrough);
}

absl::Status SessionEngine::Release(const std::string& tenant,
                                    const std::string& session,
                                    const std::string& new_owner,
                                    uint64_t new_epoch) {
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(storage::ValidateName("session id", session));
  const Key key(tenant, session);
  const std::shared_ptr<absl::Mutex> session_mu = locks_.MutexOf(key);
  absl::Status released;
  {
    // Under the session's mutex, which a turn holds from its frozen check
    // to its commit: frozen here means no turn committed since Freeze.
    absl::MutexLock session_lock(session_mu.get());
    if (!locks_.IsFrozen(key)) {
      return absl::FailedPreconditionError(absl::StrCat(
          SessionName(tenant, session),
          " is not frozen: Freeze it first, so no turn commits while it is "
          "handed over"));
    }
    released = ChangeOwner(key, new_owner, new_epoch, v1::SESSION_ROLE_REPLICA);
  }
  if (released.ok()) Unfreeze(tenant, session);  // held turns now see it moved
  return released;
}

absl::Status SessionEngine::Adopt(const std::string& tenant,
                                  const std::string& session, uint64_t epoch) {
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(storage::ValidateName("session id", session));
  const Key key(tenant, session);
  const std::shared_ptr<absl::Mutex> session_mu = locks_.MutexOf(key);
  absl::Status adopted;
  {
    absl::MutexLock session_lock(session_mu.get());
    adopted =
        ChangeOwner(key, options_.node_id, epoch, v1::SESSION_ROLE_PRIMARY);
  }
  // Turns this node held for a move of its own now run here.
  if (adopted.ok()) Unfreeze(tenant, session);
  return adopted;
}

absl::StatusOr<GenerateResult> SessionEngine::Complete(
    const GenerateRequest& request, const ops::Tokenizer& tokenizer,
    const DeltaCallback& on_delta) {
  GenerateRequest g = request;
  g.kv_source = nullptr;
  g.observer = nullptr;
  KVD_ASSIGN_OR_RETURN(ops::KvCache cache, model_.NewCache(kv_pool_.get()));
  KVD_ASSIGN_OR_RETURN(GenerateResult result,
                       scheduler_->Run(tokenizer, g, &cache, on_delta,
                                       /*keep_cache=*/false));
  // As RunTurn: a stopped generation is an error, so no server can answer
  // it as a finished one.
  if (result.finish_reason == FinishReason::kCancelled) {
    return absl::CancelledError("generation cancelled; nothing was kept");
  }
  return result;
}

absl::StatusOr<v1::SessionManifest> SessionEngine::GetSession(
    const std::string& tenant, const std::string& session) {
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(storage::ValidateName("session id", session));
  // DRAM first: under memory commits it holds turns RocksDB has not seen.
  absl::StatusOr<v1::SessionManifest> m = store_->GetManifest(tenant, session);
  if (m.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(
        absl::StrCat(SessionName(tenant, session), " not found"));
  }
  if (m.ok() && storage::IsReplica(*m)) {
    return absl::NotFoundError(
        absl::StrCat(SessionName(tenant, session),
                     " is not live here: this node holds a "
                     "replica copy; its primary is ",
                     storage::OwnerName(m->owner_node())));
  }
  return m;
}

void SessionEngine::CountRestore(StatePath path) {
  absl::MutexLock lock(&mu_);
  stats_.restores_by_path[StatePathName(path)]++;
}

bool SessionEngine::IsHot(const std::string& tenant,
                          const std::string& session) const {
  return hot_.Contains(Key(tenant, session));
}

StatePath SessionEngine::ResidentTier(const std::string& tenant,
                                      const std::string& session) const {
  if (IsHot(tenant, session)) return StatePath::kHot;
  return store_->InDram(tenant, session) ? StatePath::kDram
                                         : StatePath::kRocksDb;
}

absl::StatusOr<storage::SessionListPage> SessionEngine::ListSessions(
    const std::string& tenant, const std::string& page_token,
    int64_t page_size) {
  return store_->List(tenant, page_token, page_size);
}

absl::StatusOr<std::shared_ptr<const storage::SessionCheckpoint>>
SessionEngine::ExportSession(const std::string& tenant,
                             const std::string& session) {
  KVD_RETURN_IF_ERROR(GetSession(tenant, session).status());
  KVD_ASSIGN_OR_RETURN(storage::TieredStore::Loaded loaded,
                       store_->Load(tenant, session));
  return loaded.checkpoint;
}

void SessionEngine::Prefetch(const std::string& tenant,
                             const std::string& session) {
  if (!storage::ValidateName("tenant", tenant).ok() ||
      !storage::ValidateName("session id", session).ok() ||
      IsHot(tenant, session)) {
    return;
  }
  store_->Prefetch(tenant, session);
}

absl::Status SessionEngine::WriteHealth() {
  if (options_.fence != nullptr) KVD_RETURN_IF_ERROR(options_.fence->Ready());
  return store_->db().WriteHealth();
}

bool SessionEngine::InTurn(const std::string& tenant,
                           const std::string& session) const {
  return locks_.InTurn(Key(tenant, session));
}

void SessionEngine::Suspend(const std::string& tenant,
                            const std::string& session) {
  hot_.Drop({tenant, session});
}

absl::Status SessionEngine::DeleteSession(const std::string& tenant,
                                          const std::string& session) {
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(storage::ValidateName("session id", session));
  const Key key(tenant, session);
  const std::shared_ptr<absl::Mutex> session_mu = locks_.MutexOf(key);
  absl::MutexLock session_lock(session_mu.get());
  // Under the session's mutex: Freeze marks the session before it takes
  // the mutex, so a freeze cannot slip in after this check.
  if (locks_.IsFrozen(key)) {
    return absl::FailedPreconditionError(absl::StrCat(
        SessionName(tenant, session),
        " is being moved to another node; delete it where it lands, or "
        "give up the move first"));
  }
  hot_.Drop(key);
  const absl::Status s = store_->Delete(tenant, session);
  locks_.Forget(key);
  return s;
}

EngineStats SessionEngine::stats() const {
  absl::MutexLock lock(&mu_);
  EngineStats s = stats_;
  s.scheduler = scheduler_->stats();
  s.restore_pauses = s.scheduler.restore_pauses;
  const ops::KvBlockPool::Stats pool = kv_pool_->stats();
  s.kv_pool_blocks_used = pool.blocks_in_use;
  s.kv_pool_blocks_total = pool.capacity_blocks;
  s.kv_pool_blocks_peak = pool.peak_blocks_in_use;
  s.kv_pool_block_bytes = pool.block_bytes;
  const HotSessions::Stats hot = hot_.stats();
  s.hot_sessions = hot.sessions;
  s.hot_kv_bytes = hot.kv_bytes;
  s.hot_residual_bytes = hot.residual_bytes;
  s.sessions_demoted = hot.demoted;
  s.sessions_demoted_for_kv = hot.demoted_for_kv;
  s.turns_held_frozen = locks_.turns_held_frozen();
  return s;
}

}  // namespace kvd::engine
