// CPU tensor parallelism as processes: the leader's side. A ShardGroup is
// the ModelBackend a node's engine runs on with `kvd serve
// --tensor-parallel-size N --backend cpu`. The leader process keeps the
// sessions, scheduler, storage, tokenizer and sampling, and shard 0 of the
// model; it spawns N - 1 shard workers (`kvd worker`, shard_worker.h), each
// holding its heads' slice of attention and its slice of the MLP with its own
// K/V rows, joined by the ordered all-reduce (services/collective) over UCX.
// Every step runs on all N shards in lockstep and gives the bits one process
// gives (the numerics contract's row-parallel groups, DESIGN.md section 7),
// so sessions move between TP degrees and nodes unchanged.
//
//   KVD_ASSIGN_OR_RETURN(auto model, ops::Model::Load(path, load));
//   KVD_ASSIGN_OR_RETURN(auto group, ShardGroup::Start(*model, {...}));
//   model->ReleaseWeights();  // shard 0 holds its own slice
//   SessionEngine::Create(*group, ...);
//
// What crosses the wire: the step's token ids, the leader's cache
// bookkeeping calls (each worker keeps a twin of every cache: its own heads'
// rows at the same positions), and for a restore the residual rows each
// shard recomputes its heads' K/V from (KV-Direct). No K/V crosses it.
//
// Failures: a worker that dies or stalls past `timeout` fails the step in
// progress with UNAVAILABLE (clients retry); the group kills the other
// workers and starts them again at the next call. K/V built before that is
// gone from the workers: a cache that held rows then answers UNAVAILABLE
// until it is emptied (the engine drops a session's hot state when its turn
// fails, and the retry resumes it from its checkpoint), so no committed turn
// is lost and no step runs on rows a shard lacks.
//
// Not supported (refused, naming the reason): a bounded hot window
// (--hot-budget; the workers hold no residuals), ResidualPatcher and
// KeySelection (experiments).
//
// Thread-safety: every call is serialised (all shards must run the same
// steps in the same order); the caches' own bookkeeping calls may come from
// any thread.
#ifndef KVD_SERVICES_WORKER_SHARD_GROUP_H_
#define KVD_SERVICES_WORKER_SHARD_GROUP_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ops/model/model.h"
#include "ops/model/model_backend.h"
#include "proto/kvd/v1/shard_worker.pb.h"

namespace kvd::worker {

struct ShardGroupOptions {
  // The model file the workers load (the leader's own is passed to Start).
  std::string model_path;
  int degree = 2;
  // Threads of each shard (the leader's included); 0: the machine's cores
  // divided among the shards, at least 1.
  int threads_per_shard = 0;
  // The kvd binary the workers run (`kvd worker`); empty: this process's.
  std::string worker_binary;
  // How long a step waits for the other shards before the group is failed.
  absl::Duration timeout = absl::Seconds(30);
  // How long the workers may take to load the model and say hello.
  absl::Duration start_timeout = absl::Seconds(300);
  std::string transport_tls = "tcp";
};

// One worker as the leader last heard of it.
struct ShardWorkerInfo {
  int rank = 0;
  pid_t pid = 0;
  v1::WorkerStats stats;
};

class ShardGroup final : public ops::ModelBackend {
 public:
  // Cuts shard 0 from `full` (which may release its weights afterwards),
  // spawns the workers and connects the group. INVALID_ARGUMENT for a
  // degree that does not divide the model's row-parallel groups (naming the
  // ones that do); UNAVAILABLE if a worker fails to start (its own message
  // is on stderr).
  static absl::StatusOr<std::unique_ptr<ShardGroup>> Start(
      const ops::Model& full, const ShardGroupOptions& options);
  ~ShardGroup() override;

  const char* backend_name() const override { return "cpu"; }
  const ops::ModelConfig& config() const override { return config_; }
  ops::Precision precision() const override { return shard0_->precision(); }
  uint32_t numerics_version() const override {
    return shard0_->numerics_version();
  }
  absl::Status BoundedHotWindowSupport() const override;
  absl::StatusOr<std::unique_ptr<ops::KvBlockPool>> NewBlockPool(
      const ops::KvBlockPool::Options& options) const override {
    return shard0_->NewBlockPool(options);
  }
  absl::StatusOr<ops::KvCache> NewCache(ops::KvBlockPool* pool) const override;
  // False for a cache that holds rows whose twins died with the workers.
  bool CacheIntact(const ops::KvCache& cache) const override;
  absl::Status RecomputeKvIntoCache(int64_t layer, const float* residuals,
                                    int64_t position, int64_t n,
                                    ops::KvCache* cache) const override;

  int degree() const { return options_.degree; }
  // Workers 1..degree-1 as of their last replies (empty while the group is
  // down). Does not wait for a step in progress.
  std::vector<ShardWorkerInfo> workers() const;
  // How many times the workers were started again after a failure.
  int64_t restarts() const;

 protected:
  absl::Status RunForward(absl::Span<const ops::SequenceStep> batch,
                          ops::ForwardOutput* out,
                          ops::ResidualObserver* observer,
                          ops::ResidualPatcher* patcher) const override;
  absl::Status RunForwardLayers(ops::KvCache* cache, int64_t position,
                                int64_t n, int64_t first_layer,
                                int64_t end_layer, float* h,
                                ops::ResidualObserver* observer,
                                int64_t sequence_id) const override;

 private:
  class Twin;      // a cache's KvCacheMirror
  struct Link;     // one worker's process and streams
  struct Session;  // the transport, the collective and the links
  class Reducer;   // shard 0's ShardReducer: the current session's
  explicit ShardGroup(const ShardGroupOptions& options);

  // Spawns and connects the workers (the group is down on entry).
  absl::Status Connect() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restarts a group that failed; OK if it is up.
  absl::Status EnsureUp() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Kills the workers and marks every cache's twins as gone; returns
  // UNAVAILABLE saying what failed and that a retry will work.
  absl::Status Fail(const absl::Status& why) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Teardown(bool graceful) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The id of the twin of `cache` on the workers; INVALID_ARGUMENT for a
  // cache this group did not make, UNAVAILABLE for one whose twins died.
  absl::StatusOr<uint64_t> TwinOf(const ops::KvCache* cache) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `command` (with the journal of cache calls) to every worker.
  absl::Status SendAll(v1::WorkerCommand& command) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every worker's replies up to the last command sent; the first error.
  absl::Status WaitAll() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A step every shard runs together: `command` to the workers, `local` on
  // shard 0, then the workers' replies; any failure fails the group.
  absl::Status Lockstep(v1::WorkerCommand& command,
                        const std::function<absl::Status()>& local) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Twins: the journal of cache calls not yet sent, and the generation
  // (bumped when the workers die; a twin of an older one is gone).
  void JournalLocked(uint64_t cache, int32_t kind, int64_t layer,
                     int64_t value) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(journal_mu_);
  uint64_t NewTwinLocked(int64_t block_rows, bool keep_past_windows,
                         uint64_t* generation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(journal_mu_);
  uint64_t NewTwin(int64_t block_rows, bool keep_past_windows,
                   uint64_t* generation) const;

  const ShardGroupOptions options_;
  ops::ModelConfig config_;
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<ops::Model> shard0_;

  mutable absl::Mutex mu_;
  mutable std::unique_ptr<Session> session_ ABSL_GUARDED_BY(mu_);
  // What workers() and restarts() report, apart from mu_ so that a metrics
  // scrape does not wait for a step.
  void PublishWorkers() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable absl::Mutex info_mu_;
  mutable std::vector<ShardWorkerInfo> info_ ABSL_GUARDED_BY(info_mu_);
  mutable int64_t restarts_ ABSL_GUARDED_BY(info_mu_) = 0;
  mutable int64_t next_command_ ABSL_GUARDED_BY(mu_) = 1;

  mutable absl::Mutex journal_mu_;
  mutable std::vector<v1::CacheOp> journal_ ABSL_GUARDED_BY(journal_mu_);
  mutable uint64_t generation_ ABSL_GUARDED_BY(journal_mu_) = 1;
  mutable uint64_t next_twin_ ABSL_GUARDED_BY(journal_mu_) = 1;
};

}  // namespace kvd::worker

#endif  // KVD_SERVICES_WORKER_SHARD_GROUP_H_
