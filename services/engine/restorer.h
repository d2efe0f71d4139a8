// Bringing a session that is not hot back into memory from the fastest tier
// that has it, and saying how it came back:
//   dram       checkpoint in the host-DRAM tier, then K/V copied (policy kv)
//              or rebuilt from residuals;
//   rocksdb    the same from disk; residual layers are rebuilt as soon as
//              each is read (streamed), overlapping the read;
//   reprefill  token ids only (policy tokens, a damaged residual chunk, a
//              checkpoint of other numerics): the model runs over the tokens.
// Every recompute is a restore job of the scheduler (Scheduler::RunRestore):
// it runs in units between Forward steps under the per-step budget, so a
// session coming back neither stalls the running ones nor waits a whole step
// per unit, and its bits are those of a restore run alone. A full K/V pool
// demotes idle hot sessions and retries.
//
//   Restorer restorer(parts);
//   RestoreOutcome how;
//   KVD_ASSIGN_OR_RETURN(std::shared_ptr<SessionRecord> r,
//                        restorer.Restore("acme", "chat-1", false, &how));
//
// Thread-safety: Restore may run on many threads at once, for different
// sessions (the caller holds the session's turn lock).
#ifndef KVD_SERVICES_ENGINE_RESTORER_H_
#define KVD_SERVICES_ENGINE_RESTORER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ops/kvdirect/rebuild.h"
#include "ops/model/model_backend.h"
#include "proto/kvd/v1/checkpoint.pb.h"
#include "services/engine/hot_sessions.h"
#include "services/engine/scheduler.h"
#include "services/engine/session_record.h"
#include "services/engine/streamed_load.h"
#include "storage/tiered/tiered_store.h"

namespace kvd::engine {

enum class StatePath { kNew, kHot, kDram, kRocksDb, kReprefill };
const char* StatePathName(StatePath path);

struct RestoreOutcome {
  StatePath path = StatePath::kNew;
  std::string detail;     // why, when it re-prefilled
  bool streamed = false;  // rebuilt layer by layer while RocksDB was read
};

class Restorer {
 public:
  // What a restore works with; everything must outlive the restorer.
  struct Parts {
    const ops::ModelBackend* model = nullptr;
    const v1::ModelIdentity* identity = nullptr;  // checkpoints must match
    storage::TieredStore* store = nullptr;
    ops::KvBlockPool* pool = nullptr;  // restored caches draw from it
    Scheduler* scheduler = nullptr;    // runs every recompute
    HotSessions* hot = nullptr;        // demoted when the pool is full
    int64_t hot_budget = ops::ResidualKvSource::kAll;
    NewSessionDefaults defaults;  // a session a turn starts; the node id
  };

  explicit Restorer(Parts parts) : parts_(std::move(parts)) {}

  // The session's record, its K/V in memory, or a new empty one for an
  // unknown session when `create_if_missing` (nothing is stored until its
  // first turn commits). NOT_FOUND for an unknown session otherwise;
  // ABORTED when this node may not commit to the stored copy (a replica,
  // another owner); FAILED_PRECONDITION for another model or precision;
  // DATA_LOSS when neither the residuals nor the token ids are readable.
  absl::StatusOr<std::shared_ptr<SessionRecord>> Restore(
      const std::string& tenant, const std::string& session,
      bool create_if_missing, RestoreOutcome* outcome);

 private:
  // A residual policy's resume from RocksDB with reading and recomputing
  // overlapped: layer l's K/V are rebuilt while later layers are still
  // being read. Null when the session is not such a case: Restore's
  // whole-checkpoint path then decides (and explains) what to do, as it does
  // after DATA_LOSS (a damaged chunk); other errors are the restore's.
  absl::StatusOr<std::shared_ptr<SessionRecord>> RestoreStreamed(
      const v1::SessionManifest& m, StreamedLoad& load);
  std::shared_ptr<SessionRecord> NewRecord(
      const ops::CheckpointPolicy& policy) const;
  // Runs ops::RebuildKv(spec) into `record`'s cache as a restore job of the
  // scheduler, its units charged to the per-step restore budget. `prepare`,
  // if set, runs first on the scheduler thread (hooks that need the job's
  // context).
  absl::Status Rebuild(
      ops::RebuildSpec& spec, SessionRecord& record,
      const std::function<void(Scheduler::RestoreContext&)>& prepare = {});
  // Runs the model over every committed token, refilling residuals, into an
  // empty cache and store, as a restore job of the scheduler.
  absl::Status Reprefill(SessionRecord& record);
  // One attempt of Reprefill, on the scheduler thread.
  absl::Status ReprefillOnce(SessionRecord& record,
                             Scheduler::RestoreContext& context);

  const Parts parts_;
};

}  // namespace kvd::engine

#endif  // KVD_SERVICES_ENGINE_RESTORER_H_
