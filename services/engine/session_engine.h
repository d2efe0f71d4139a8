// Durable sessions: a conversation's model state lives in the storage tiers
// as residual checkpoints and comes back bit-identically after an idle
// period, an eviction, a restart or a crash (DESIGN.md sections 4-5).
//
// Each turn appends the new tokens (a templated user message) to the
// session, generates, and commits the turn atomically: token ids, the
// residual rows of the policy's layers, and the manifest, in one
// TurnUpdate. A session's K/V stay hot in memory between turns for the most
// recently used sessions; any other session is restored on its next turn
// from the fastest tier that has it:
//   hot        K/V still in memory: nothing to do;
//   dram       checkpoint in the host-DRAM tier: rebuild K/V (RebuildKv);
//   rocksdb    checkpoint read from disk, then rebuild;
//   reprefill  token ids only (policy "tokens", or a corrupt residual chunk
//              detected by its checksum): run the model over the tokens.
// Every turn reports the path it took, so nothing re-prefills silently.
//
//   SessionEngine engine(model, identity, &store, options);
//   KVD_RETURN_IF_ERROR(engine.CreateSession("acme", "chat-1", {}));
//   TurnRequest turn{.tenant = "acme", .session = "chat-1", .tokens = ids};
//   KVD_ASSIGN_OR_RETURN(TurnResult r, engine.RunTurn(turn, tokenizer, cb));
//
// A failed or cancelled turn commits nothing: the session's hot state is
// dropped and its next turn resumes from the last committed one.
//
// The engine is a facade over four parts, each in its own file: the
// session's record (session_record.h: committed manifest, tokens, K/V cache,
// residual rows), the hot tier (hot_sessions.h: which records stay in
// memory, demoted least recently used first), the restorer (restorer.h:
// bringing a record back from DRAM or RocksDB as scheduler work), and the
// session locks (session_locks.h: one turn at a time per session, frozen
// while a move copies it). What stays here is a turn's course through them,
// its commit, and ownership: which node may commit a session, at which epoch
// (ClaimForTurn, Freeze / Release / Adopt, replica copies).
//
// Thread-safety: all methods may be called concurrently; turns of one
// session are serialized. Turns of different sessions and Complete calls run
// together: each one becomes a sequence of the engine's Scheduler
// (scheduler.h), which batches every running sequence into one Forward step
// (continuous batching). Their outputs are bit-identical to running them one
// at a time. A restore reads its checkpoint on the turn's thread, then
// rebuilds the K/V as a job of the scheduler (Scheduler::RunRestore): the
// scheduler thread runs its units (a block of one layer, a re-prefill
// block) between Forward steps under a per-step budget, so a session coming
// back neither stalls running ones nor waits a whole step per unit. Beyond
// options.scheduler's queue bound RunTurn and Complete return
// RESOURCE_EXHAUSTED at once, before restoring anything; front ends may also
// ask Saturated() (or stats().scheduler) to shed load earlier.
#ifndef KVD_SERVICES_ENGINE_SESSION_ENGINE_H_
#define KVD_SERVICES_ENGINE_SESSION_ENGINE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/rebuild.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/model/model_backend.h"
#include "ops/tokenizer/tokenizer.h"
#include "proto/kvd/v1/checkpoint.pb.h"
#include "services/engine/generator.h"
#include "services/engine/hot_sessions.h"
#include "services/engine/restorer.h"
#include "services/engine/scheduler.h"
#include "services/engine/session_fence.h"
#include "services/engine/session_locks.h"
#include "services/engine/session_record.h"
#include "services/engine/streamed_load.h"
#include "storage/tiered/tiered_store.h"

namespace kvd::engine {

struct SessionEngineOptions {
  // What new sessions checkpoint (a stored session keeps its own policy).
  ops::CheckpointPolicy policy;  // kv-direct
  // K/V rows kept in memory per active kv-direct session; older ones are
  // recomputed from residuals inside attention. kAll = keep everything.
  int64_t hot_budget = ops::ResidualKvSource::kAll;
  int64_t chunk_tokens = 64;  // positions per stored chunk
  // Sessions whose K/V stay in memory between turns (least recently used
  // ones are demoted to their checkpoints).
  int64_t max_hot_sessions = 8;
  // Bytes of K/V rows (KvCache::allocated_bytes) the hot sessions may hold
  // together between turns; 0 = no limit. When a turn ends above it, least
  // recently used idle sessions are demoted (their checkpoint is committed,
  // so only memory is lost), the session that just ran included if it alone
  // is over the budget. Sessions in the middle of a turn are never demoted,
  // and their K/V grow until the turn ends: the budget bounds memory between
  // turns, and max_running x the context bounds what turns add. Kept as a
  // finer knob for idle sessions' share; kv_pool_bytes is the hard limit.
  int64_t max_hot_kv_bytes = 0;
  // Bytes of the K/V block pool every hot session and running sequence draws
  // its cache from (ops/model/kv_block_pool.h); 0 = unlimited. A hard limit:
  // a waiting request is admitted only when its prompt's blocks are free,
  // idle hot sessions are demoted (least recently used first) when a step
  // needs blocks, and only then is the youngest running sequence failed with
  // RESOURCE_EXHAUSTED. 512 MiB holds ~23k positions of SmolLM2-135M in bf16
  // (23 KiB per position over 30 layers; 11k in fp32): 16 running sequences
  // of 1k tokens plus idle sessions, small enough for a laptop. Rounded up
  // to one block.
  int64_t kv_pool_bytes = int64_t{512} << 20;
  // Positions per pool block (a positive multiple of the attention chunk,
  // 32). See SessionEngine::ValidateOptions.
  int64_t kv_pool_block_rows = ops::KvBlockPool::kDefaultBlockRows;
  // Continuous batching: batch size, queue bound, prefill budget per step.
  SchedulerOptions scheduler;
  // The node this engine commits as (the manifest's owner_node; "" = a
  // standalone node). Sessions another node owns are refused (ABORTED).
  std::string node_id;
  // How long a turn waits for a frozen session (Freeze) to be released or
  // unfrozen before it is ABORTED.
  absl::Duration frozen_turn_wait = absl::Seconds(30);
  // A node in a cluster: which sessions it may serve, at which epoch, and
  // whether it may still commit (session_fence.h). A turn runs only when
  // the stored copy's epoch is the fence's (an older copy may be missing
  // turns committed elsewhere: FAILED_PRECONDITION); a session the fence
  // gives this node but the store lacks is started by the turn (epoch 1
  // only); an import is stored at the fence's epoch, and only if the fence
  // gives this node the session. Null: a standalone node.
  std::shared_ptr<SessionFence> fence;
  // Called after each committed turn with its update, under the session's
  // lock (so in commit order per session), before the turn is answered: a
  // cluster node replicates the turn here (services/migration/replicator.h).
  // An error: the turn stays committed here, but it is answered with
  // UNAVAILABLE saying it may or may not have committed (a resend with the
  // same request id then settles it). Null: nothing to do.
  std::function<absl::Status(const storage::TurnUpdate&)> on_commit;
  // Called under the session's lock before a turn runs, and before a resent
  // request id is answered as already committed, with what this node has
  // committed: a cluster node makes sure every replica it lists holds all of
  // it (replicator.h, Settle). An error: nothing runs. Null: nothing to do.
  std::function<absl::Status(const v1::SessionManifest& committed)> before_turn;
};

struct TurnRequest {
  std::string tenant;
  std::string session;
  // The turn's new tokens (e.g. a chat-templated user message); they follow
  // everything the session holds.
  std::vector<int32_t> tokens;
  // If set, used instead of `tokens`: computes the turn's tokens from the
  // session's committed ones (under the session's lock), e.g. a chat
  // follow-up whose text depends on whether the last reply was closed. It
  // runs before the engine reads `generate`, so it may still adjust it
  // (gRPC shrinks an unchosen max_tokens to the context left).
  std::function<absl::StatusOr<std::vector<int32_t>>(
      absl::Span<const int32_t> session_tokens)>
      make_tokens;
  // An unknown session is started by this turn (as CreateSession would with
  // no labels) instead of NOT_FOUND. Nothing is stored unless the turn
  // commits, so a first turn that fails or is cancelled leaves no empty
  // session behind.
  bool create_if_missing = false;
  // The client's id for this request (X-Request-Id), stored with the turn
  // and its reply: a request whose id is that of the session's last
  // committed turn runs nothing and gets that reply again
  // (TurnResult::replayed), so a retry after a lost reply neither commits
  // the turn twice nor fails. (ALREADY_EXISTS if that turn was committed
  // before replies were stored.) Only the last turn is remembered: a retry
  // that arrives after a later turn runs as a new one. Empty: no check.
  std::string request_id;
  // ABORTED at once when another turn of the session is running, instead of
  // waiting for it: a server must not let one client's queued turns hold
  // admission slots that other sessions' requests need.
  bool fail_if_busy = false;
  // Sampling, limits, stop strings, callbacks. Its prompt, kv_source,
  // observer and sequence_id are set by the engine.
  GenerateRequest generate;
};

struct TurnResult {
  GenerateResult generation;
  StatePath path = StatePath::kNew;  // how the session's state was obtained
  std::string path_detail;           // why, when it re-prefilled
  double restore_seconds = 0;        // loading + rebuilding K/V
  double commit_seconds = 0;
  int64_t session_tokens = 0;  // committed tokens after the turn
  uint64_t turn = 0;           // committed turns after this one
  // The tokens the reply follows (the session's before the turn plus the
  // turn's new ones), and how many of them came from the session's state
  // instead of being run through the model this turn (its K/V rows hot,
  // from DRAM or rebuilt from residuals; 0 when it was re-prefilled from
  // token ids). OpenAI's usage.prompt_tokens and cached_tokens.
  int64_t context_tokens = 0;
  int64_t cached_tokens = 0;
  // The request id was the session's last committed turn's: this is that
  // turn's stored reply (text, token ids, finish reason, usage), delivered
  // again as one delta; nothing ran or was committed. Logprobs are not
  // stored, so a replayed reply has none.
  bool replayed = false;
};

struct EngineStats {
  std::map<std::string, int64_t> restores_by_path;  // StatePathName -> count
  int64_t hot_sessions = 0;
  int64_t hot_kv_bytes = 0;        // K/V rows held by hot sessions
  int64_t hot_residual_bytes = 0;  // their residual stores
  int64_t turns_committed = 0;
  int64_t turns_failed = 0;      // errors and cancellations (nothing committed)
  int64_t turns_rejected = 0;    // RESOURCE_EXHAUSTED: the queue was full
  int64_t turns_replayed = 0;    // retried request ids answered from storage
  int64_t sessions_demoted = 0;  // hot state dropped by the LRU (count/bytes)
  // The K/V block pool: blocks held by caches, its capacity (0: unlimited),
  // the most ever held, and bytes per block.
  int64_t kv_pool_blocks_used = 0;
  int64_t kv_pool_blocks_total = 0;
  int64_t kv_pool_blocks_peak = 0;
  int64_t kv_pool_block_bytes = 0;
  int64_t sessions_demoted_for_kv = 0;  // of those, to free pool blocks
  // Times a restore (rebuild or re-prefill) had spent its share of a step
  // and let running sequences take one (SchedulerStats::restore_pauses).
  int64_t restore_pauses = 0;
  // Restores from RocksDB that rebuilt each layer as soon as it was read.
  int64_t restores_streamed = 0;
  // Turns that found their session frozen (a move) and waited.
  int64_t turns_held_frozen = 0;
  // Replica copies stored (StoreReplica) and adopted by a turn.
  int64_t replicas_stored = 0;
  int64_t replicas_adopted = 0;
  SchedulerStats scheduler;  // running / waiting sequences, steps, tokens
};

class SessionEngine {
 public:
  // `identity`: the loaded model's fingerprint, precision and numerics
  // version (ModelIdentityOf). Checkpoints of another model or precision are
  // refused; checkpoints of other numerics are re-prefilled from their
  // tokens (path kReprefill, saying why) and rewritten under `identity`.
  // The model (any ops::ModelBackend, used only through that interface) and
  // the store must outlive the engine.
  // Options that ValidateOptions refuses are not fatal here (a constructor
  // cannot return a status): an invalid K/V pool block size or a negative
  // pool budget falls back to the default with a warning on stderr. Callers
  // that take options from a user (NodeRuntime) should validate first.
  SessionEngine(const ops::ModelBackend& model, v1::ModelIdentity identity,
                storage::TieredStore* store, SessionEngineOptions options);
  ~SessionEngine();

  // The same engine for options from a user: ValidateOptions' errors, and
  // the backend's own error when it cannot make the K/V pool (a GPU backend
  // allocates its pool's device memory up front: RESOURCE_EXHAUSTED when it
  // does not fit), instead of the constructor's fallbacks.
  static absl::StatusOr<std::unique_ptr<SessionEngine>> Create(
      const ops::ModelBackend& model, v1::ModelIdentity identity,
      storage::TieredStore* store, SessionEngineOptions options);

  // INVALID_ARGUMENT naming the option (and its flag) for options this model
  // cannot use: kv_pool_block_rows not a positive multiple of the attention
  // chunk, kv_pool_bytes negative, chunk_tokens < 1, max_hot_sessions < 0,
  // max_hot_kv_bytes < 0.
  static absl::Status ValidateOptions(const ops::ModelBackend& model,
                                      const SessionEngineOptions& options);

  // INVALID_ARGUMENT for a bad name; ALREADY_EXISTS if the tenant has it.
  absl::Status CreateSession(const std::string& tenant,
                             const std::string& session,
                             const std::map<std::string, std::string>& labels);
  // Stores an imported checkpoint (already checked, e.g. by
  // ParseSessionFile, and named for its tenant) as a new session.
  // ALREADY_EXISTS if the tenant has one by that name, including one whose
  // first turn is running right now.
  // Taken by value: move a parsed import in, and its chunks are not copied.
  absl::Status ImportSession(storage::SessionCheckpoint checkpoint);

  // Restores the session if needed, runs the turn, commits it. NOT_FOUND for
  // an unknown session (or another tenant's) unless create_if_missing;
  // FAILED_PRECONDITION if its checkpoint belongs to another model or
  // precision; INVALID_ARGUMENT if the turn does not fit the context; the
  // store's code if the commit fails (nothing of the turn is kept then).
  absl::StatusOr<TurnResult> RunTurn(const TurnRequest& request,
                                     const ops::Tokenizer& tokenizer,
                                     const DeltaCallback& on_delta);

  // A stateless request (the plain OpenAI API): generates from `request`'s
  // prompt with a fresh cache and stores nothing. CANCELLED when
  // `request.cancelled` stopped it, as for RunTurn.
  absl::StatusOr<GenerateResult> Complete(const GenerateRequest& request,
                                          const ops::Tokenizer& tokenizer,
                                          const DeltaCallback& on_delta);

  // Committed state of a session without restoring it: its latest manifest
  // (DRAM's before RocksDB's). NOT_FOUND if unknown, and for a replica copy,
  // which is not a live session here.
  absl::StatusOr<v1::SessionManifest> GetSession(const std::string& tenant,
                                                 const std::string& session);

  // ---- Handing a session to another node (ownership: fencing epochs) ----
  //
  //   KVD_ASSIGN_OR_RETURN(FrozenSession f, engine.Freeze("acme", "c1"));
  //   ... copy the checkpoint to the new owner ...
  //   KVD_RETURN_IF_ERROR(engine.Release("acme", "c1", "n2", f.epoch + 1));
  //   // on n2:   engine.Adopt("acme", "c1", f.epoch + 1);

  struct FrozenSession {
    uint64_t turns = 0;      // committed turns
    int64_t tokens = 0;      // committed tokens
    uint64_t epoch = 0;      // the epoch it is frozen at
    std::string owner_node;  // its owner ("" = standalone)
  };
  // Lets a running turn of the session finish, then holds its next turns
  // until Release or Unfreeze: the committed state stays put while a move
  // copies it. Turns that must not wait (TurnRequest::fail_if_busy, a
  // server's) are ABORTED at once, the others wait up to frozen_turn_wait.
  // NOT_FOUND if unknown; ABORTED if this node does not own it;
  // FAILED_PRECONDITION if frozen already. A frozen session cannot be
  // deleted.
  absl::StatusOr<FrozenSession> Freeze(const std::string& tenant,
                                       const std::string& session);
  // Lets held turns run again (a move that was given up).
  void Unfreeze(const std::string& tenant, const std::string& session);
  // Hands a frozen session to `new_owner` at `new_epoch` (> its epoch): the
  // copy here becomes a replica (unlisted, refusing turns), its hot state is
  // dropped, and held turns are ABORTED with where the session went.
  // FAILED_PRECONDITION unless frozen; ABORTED for a stale epoch.
  absl::Status Release(const std::string& tenant, const std::string& session,
                       const std::string& new_owner, uint64_t new_epoch);
  // Makes this node (options.node_id) the session's primary at `epoch`:
  // above the stored epoch, or equal to it when the stored copy already
  // names this node (it was released to it). ABORTED for a stale epoch.
  absl::Status Adopt(const std::string& tenant, const std::string& session,
                     uint64_t epoch);

  // Stores `checkpoint`, another node's committed copy that the caller has
  // verified (a migration's target: services/migration), as a replica copy
  // here: unlisted and refusing turns, under the owner and epoch its manifest
  // names. Once the directory gives this node the session at that epoch + 1,
  // its next turn adopts the copy (see RunTurn). ABORTED if this node's own
  // copy is from a later epoch, or is the live primary at that epoch;
  // FAILED_PRECONDITION for another model or precision. `staged_by` (a
  // migration's transfer id, or empty) is kept in the manifest until an
  // update replaces it (SessionManifest.staged_by; see DropReplica).
  absl::Status StoreReplica(storage::SessionCheckpoint checkpoint,
                            const std::string& staged_by = "");
  // Applies `update`, turns another node committed (verified by the
  // caller), to this node's replica copy of the session, durably
  // (storage::CheckReplicaUpdate: the same owner and epoch, never
  // backwards). NOT_FOUND without a copy here; ABORTED if the copy here is
  // not such a replica.
  absl::Status ApplyReplicaUpdate(storage::TurnUpdate update);
  // The manifest of this node's replica copy of the session: what a
  // failover compares. NOT_FOUND if there is none (or the copy is live).
  absl::StatusOr<v1::SessionManifest> GetReplica(const std::string& tenant,
                                                 const std::string& session);
  // Deletes this node's replica copy of the session (a move that was given
  // up); OK if there is none. With `staged_by` set, only the copy that
  // transfer stored and nobody has updated since: a copy another transfer
  // stored or committed meanwhile is kept (OK). FAILED_PRECONDITION for a
  // live primary, which is never deleted this way.
  absl::Status DropReplica(const std::string& tenant,
                           const std::string& session,
                           const std::string& staged_by = "");
  // For a server, before it admits a turn of the session (and, for a
  // stream, before it answers 200): waits while the session is frozen for
  // a move (up to frozen_turn_wait), then, if `check_owner`, asks the fence
  // whether this node owns it. A session that moved, or is still moving,
  // gets ABORTED marked with MarkNotRun (session_fence.h): nothing ran, and
  // a router may send the turn to the session's new owner. The turn's own
  // checks still run; this only lets a refusal come before a stream starts.
  absl::Status ReadyForTurn(const std::string& tenant,
                            const std::string& session, bool check_owner);
  // Adopts the session as a turn would (the fence's checks, and a replica
  // copy the directory has given this node becomes its primary) without
  // running one: a session moved here and moved on before any turn used it.
  // OK for a standalone engine (no fence) and for a primary already here.
  absl::Status TakeUp(const std::string& tenant, const std::string& session);

  // ---- The rest of the session facade: front ends (HTTP, gRPC, kvd chat)
  // reach stored sessions only through the engine, so tiers, ownership and
  // hot state are judged in one place. ----

  // Live sessions of the tenant (replicas left out), DRAM's newest first.
  absl::StatusOr<storage::SessionListPage> ListSessions(
      const std::string& tenant, const std::string& page_token,
      int64_t page_size);
  // The session's committed checkpoint, for an export: its latest turn from
  // whichever tier holds it. NOT_FOUND if unknown or only a replica here.
  absl::StatusOr<std::shared_ptr<const storage::SessionCheckpoint>>
  ExportSession(const std::string& tenant, const std::string& session);
  // Starts loading a cold session's checkpoint into the DRAM tier (a client
  // is about to send a turn) and returns at once; nothing for a hot,
  // unknown or badly named one.
  void Prefetch(const std::string& tenant, const std::string& session);
  // Why turns cannot commit now (the fence's Ready, then
  // SessionDb::WriteHealth); OK when they can.
  absl::Status WriteHealth();

  // Whether the session's K/V are in memory (its next turn needs no restore).
  bool IsHot(const std::string& tenant, const std::string& session) const;
  // Where the session's state is now, as its next turn would find it: kHot
  // (its K/V in memory), kDram (its checkpoint in the host-DRAM tier) or
  // kRocksDb (on disk only). Reads no checkpoint and promotes nothing; an
  // unknown session reads as kRocksDb (GetSession says whether it exists).
  StatePath ResidentTier(const std::string& tenant,
                         const std::string& session) const;
  // Whether a turn of the session is running now (rebalancing moves only
  // idle sessions).
  bool InTurn(const std::string& tenant, const std::string& session) const;

  // Drops the session's hot state (its checkpoint stays in the tiers).
  void Suspend(const std::string& tenant, const std::string& session);
  // Removes the session everywhere. NOT_FOUND if unknown.
  absl::Status DeleteSession(const std::string& tenant,
                             const std::string& session);

  EngineStats stats() const;
  // True when a new turn or completion would be refused with
  // RESOURCE_EXHAUSTED right now (for a cheap 429 before parsing a body).
  bool Saturated() const { return scheduler_->Saturated(); }
  const v1::ModelIdentity& identity() const { return identity_; }

 private:
  SessionEngine(const ops::ModelBackend& model, v1::ModelIdentity identity,
                storage::TieredStore* store, SessionEngineOptions options,
                std::unique_ptr<ops::KvBlockPool> kv_pool);
  using Key = SessionKey;

  // What a new session's manifest holds on this node.
  NewSessionDefaults Defaults() const;
  // The session's record in a turn (HotSessions::BeginTurn or MarkInTurn):
  // its hot state, or restored from the tiers (Restorer). Hot state is
  // used only if the stored manifest is still the one it was committed
  // under. Ends with HotSessions::Keep or EndTurn.
  absl::StatusOr<std::shared_ptr<SessionRecord>> Acquire(const Key& key,
                                                         bool create_if_missing,
                                                         TurnResult* result);
  // OK if the session is stored nowhere; ALREADY_EXISTS (also for a damaged
  // one) if it is. Callers hold the session's lock.
  absl::Status CheckAbsent(const std::string& tenant,
                           const std::string& session);
  // RunTurn's work under the session's lock. `kv_lost`: it failed because
  // the backend lost the hot session's K/V (ModelBackend::CacheIntact).
  absl::StatusOr<TurnResult> RunTurnLocked(const Key& key,
                                           const TurnRequest& request,
                                           const ops::Tokenizer& tokenizer,
                                           const DeltaCallback& on_delta,
                                           bool* kv_lost);
  // The stored reply of the session's last turn, as a result and one delta.
  absl::StatusOr<TurnResult> ReplayLastReply(const SessionRecord& a,
                                             TurnResult result,
                                             const DeltaCallback& on_delta);
  // Under the session's lock, with a fence: checks what the cluster gives
  // this node against its copy; true if the turn starts the session.
  absl::StatusOr<bool> ClaimForTurn(const Key& key);
  absl::Status NoCopyAt(const std::string& tenant, const std::string& session,
                        uint64_t epoch) const;
  // Writes an ownership change of the session's stored manifest.
  absl::Status ChangeOwner(const Key& key, const std::string& owner,
                           uint64_t epoch, v1::SessionRole role);
  void CountRestore(StatePath path);

  const ops::ModelBackend& model_;
  const v1::ModelIdentity identity_;
  storage::TieredStore* const store_;
  const SessionEngineOptions options_;
  // Before everything holding caches, so it outlives them.
  std::unique_ptr<ops::KvBlockPool> kv_pool_;

  HotSessions hot_;
  SessionLocks locks_;
  mutable absl::Mutex mu_;
  EngineStats stats_ ABSL_GUARDED_BY(mu_);  // counters the parts do not keep
  std::unique_ptr<Restorer> restorer_;      // made once scheduler_ is
  // Last: its thread runs callbacks into the members above, so it stops
  // first.
  std::unique_ptr<Scheduler> scheduler_;
};

// The identity stored sessions are checked against: `fingerprint` from
// ops::FingerprintModelFiles (or any stable id for in-memory test models).
// The numerics version is the backend's (ModelBackend::numerics_version):
// the CPU's and the GPU's bits differ, so their checkpoints do too.
v1::ModelIdentity ModelIdentityOf(const ops::ModelBackend& model,
                                  const std::string& fingerprint);

}  // namespace kvd::engine

#endif  // KVD_SERVICES_ENGINE_SESSION_ENGINE_H_
