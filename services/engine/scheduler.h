// Continuous batching: one thread owns the model's forward loop and runs every
// in-flight sequence in the same Forward batch.
//
// Each iteration builds one batch from the running sequences: every decoding
// sequence contributes its one new token, and prefilling sequences contribute
// prompt chunks under a per-iteration token budget (oldest first), so long
// prompts are interleaved with other sequences' decode steps instead of
// stalling them. Sequences leave the batch when they finish or are cancelled,
// and waiting ones (FIFO) take their places. Because the kernels are
// batch-invariant (DESIGN.md section 3), a sequence's tokens and logits are
// bit-identical to running it alone with Generate.
//
// Admission control: at most `max_running` sequences are in the batch and
// at most `max_waiting` wait for a place; Run returns RESOURCE_EXHAUSTED at
// once beyond that (the front ends map it to HTTP 429 / gRPC
// RESOURCE_EXHAUSTED). `Saturated()` lets a caller refuse before doing any
// work of its own (e.g. restoring a session). With a K/V block pool
// (SchedulerOptions::kv_pool) memory is admitted too: a waiting sequence
// enters the batch only when the pool's free blocks cover its prompt
// (reclaiming idle blocks with reclaim_kv only when that can make room, else
// waiting for running sequences to finish; a prompt larger than the whole
// pool is refused with OUT_OF_RANGE), and a step the pool cannot serve first
// reclaims idle blocks, then stops the youngest sequence of the batch with
// RESOURCE_EXHAUSTED; the refused Forward wrote nothing, so the others
// continue bit-identically.
//
//   Scheduler scheduler(backend, {.max_running = 16});
//   KVD_ASSIGN_OR_RETURN(KvCache cache, backend.NewCache(pool));
//   KVD_ASSIGN_OR_RETURN(GenerateResult r,
//                        scheduler.Run(tokenizer, request, &cache, on_delta));
//
// Restores are scheduler work too: one thread drives the model. A session
// coming back (K/V recomputed from residuals, a partial or full re-prefill)
// is a job given to RunRestore; the scheduler thread runs it between
// Forward steps, and the job reports each unit of work it is about to run
// (RestoreContext::BeforeUnit, in prompt-token equivalents). Restore units
// share a per-iteration budget (restore_tokens_per_step) like prefill
// chunks do: once a job has spent it, the running sequences take one step
// before the job goes on. A K/V recompute is cheap in those units (a 1,000-
// token SmolLM2 session is about 60 prompt tokens of work), so a returning
// user's restore usually finishes within one or two steps instead of being
// paced at one unit per step:
//   scheduler.RunRestore([&](Scheduler::RestoreContext& ctx) {
//     spec.between_units = [&](const ops::RebuildUnit& u) {
//       ctx.BeforeUnit(u.PromptTokens(model.config()));
//     };
//     return ops::RebuildKv(model, spec, &cache, nullptr);
//   });
//
// Threads: Run and RunRestore block their caller until the work is done;
// `on_delta` is called on the caller's thread (a slow client never stalls the
// batch), while the request's `on_logits` and `cancelled`, and restore jobs,
// run on the scheduler thread. Nothing else may use the model while the
// scheduler exists.
// All methods are thread-safe.
#ifndef KVD_SERVICES_ENGINE_SCHEDULER_H_
#define KVD_SERVICES_ENGINE_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "ops/model/model_backend.h"
#include "ops/tokenizer/tokenizer.h"
#include "services/engine/generator.h"

namespace kvd::engine {

struct SchedulerOptions {
  // Sequences in the Forward batch at once (>= 1). More raise aggregate
  // throughput and every sequence's latency.
  int64_t max_running = 16;
  // Sequences waiting for a place in the batch (>= 0); Run refuses more with
  // RESOURCE_EXHAUSTED.
  int64_t max_waiting = 256;
  // Prompt tokens all prefilling sequences together may run per iteration
  // (>= 1): bounds how long decoding sequences wait for each new token.
  int64_t prefill_tokens_per_step = 256;
  // The K/V block pool every Run cache draws from (not owned; outlives the
  // scheduler), or null for no pool-aware admission. With a pool, a waiting
  // sequence is admitted only when the pool's free blocks cover its prompt
  // (on top of what admitted prompts still need); a step that cannot get
  // its blocks first calls reclaim_kv, then fails the youngest running
  // sequence with RESOURCE_EXHAUSTED while the others continue.
  ops::KvBlockPool* kv_pool = nullptr;
  // Frees pool blocks held outside the scheduler (an engine demoting one
  // idle hot session); true if it freed something. Called on the scheduler
  // thread with no scheduler lock held. Optional.
  std::function<bool()> reclaim_kv;
  // Pool blocks reclaim_kv could free in all (blocks of the idle hot
  // sessions), so a waiting prompt that would not fit even then waits for
  // running sequences instead of demoting every idle session for nothing.
  // Same thread and locking as reclaim_kv. Optional: without it reclaim_kv
  // is always tried.
  std::function<int64_t()> reclaimable_kv_blocks;
  // Restore work (RunRestore) per iteration while sequences are running, in
  // prompt-token equivalents (ops::RebuildUnit::PromptTokens), on top of
  // prefill_tokens_per_step. A job always runs at least one unit between two
  // steps, and runs unpaced when nothing else is running.
  int64_t restore_tokens_per_step = 256;
};

struct SchedulerStats {
  int64_t running = 0;              // sequences in the batch now
  int64_t waiting = 0;              // sequences queued for a place now
  int64_t steps = 0;                // Forward batches run so far
  int64_t decode_tokens = 0;        // single-token decode rows run so far
  int64_t prefill_tokens = 0;       // prompt tokens run so far
  int64_t rejected = 0;             // Run calls refused with RESOURCE_EXHAUSTED
  int64_t max_batch_sequences = 0;  // largest batch so far
  int64_t restores = 0;             // restore jobs run so far
  // Steps the batch took in the middle of a restore job (its budget spent).
  int64_t restore_pauses = 0;
  double restore_tokens = 0;  // restore work run, prompt-token equivalents
};

class Scheduler {
 public:
  // The model must outlive the scheduler. Starts the scheduler thread.
  Scheduler(const ops::ModelBackend& model, SchedulerOptions options);
  // Stops the thread; sequences still queued or running end with
  // UNAVAILABLE (callers of Run must not outlive the scheduler).
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Runs `request` (its prompt follows what `cache` holds; its observer and
  // kv_source, if any, are used with its sequence_id) in the shared batch and
  // returns when it finishes. INVALID_ARGUMENT for a bad request (before
  // anything runs), RESOURCE_EXHAUSTED if the queue is full (nothing ran) or
  // the K/V pool is (a prompt refused at admission leaves `cache` alone; a
  // sequence stopped in the batch has `cache` emptied, its blocks returned),
  // OUT_OF_RANGE if the prompt needs more blocks than the whole pool has
  // (retrying cannot help; nothing ran),
  // UNAVAILABLE if the scheduler is shutting down, or Forward's error. A
  // cancelled sequence returns OK with finish_reason kCancelled, like
  // Generate. `cache` and the tokenizer must stay alive until Run returns.
  // With keep_cache false the caller does not want `cache` afterwards (a
  // stateless completion): it is emptied on the scheduler thread as the
  // sequence finishes, so its pool blocks are free before the next waiting
  // prompt is considered rather than whenever the caller gets to destroy it.
  absl::StatusOr<GenerateResult> Run(const ops::Tokenizer& tokenizer,
                                     const GenerateRequest& request,
                                     ops::KvCache* cache,
                                     const DeltaCallback& on_delta,
                                     bool keep_cache = true);

  // True when Run would refuse a new sequence right now.
  bool Saturated() const;
  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return options_; }

  // Given to a restore job (RunRestore); valid while the job runs, on the
  // scheduler thread only.
  class RestoreContext {
   public:
    // Call before each unit of the job's work but the first, with its cost
    // in prompt-token equivalents: when the unit would overrun the
    // iteration's restore budget, the running sequences (and any waiting
    // ones it can admit) take one step first.
    void BeforeUnit(double cost);
    // Call while the job waits for something outside the model (a
    // checkpoint layer still being read): lets the batch take a step if any
    // sequence is running, else waits up to `max_wait` for work to arrive.
    void Idle(absl::Duration max_wait);

   private:
    friend class Scheduler;
    explicit RestoreContext(Scheduler* s) : scheduler_(s) {}
    Scheduler* scheduler_;
  };
  using RestoreJob = std::function<absl::Status(RestoreContext&)>;
  // Runs `job` on the scheduler thread, between Forward steps, and returns
  // its status. Jobs run one at a time, in arrival order, ahead of waiting
  // sequences (a returning user's turn waits for its restore). UNAVAILABLE
  // if the scheduler is shutting down (the job did not run). The job may
  // use the model freely but must not call Run or RunRestore.
  absl::Status RunRestore(RestoreJob job);

 private:
  struct Job;
  struct Restore;
  void Loop();
  // Runs one restore job to its end (scheduler thread).
  void RunRestoreJob(Restore& restore);
  // Admits what it can and, if anything is running, takes one step
  // (scheduler thread); true if a step ran. `restore_pause`: the step lets
  // a restore job's batch go on (SchedulerStats::restore_pauses).
  bool StepBatch(bool restore_pause);
  // Moves waiting jobs into `running` (FIFO) while there is room and, with a
  // pool, blocks for their prompts, demoting idle sessions only when that
  // can make room; fails a prompt that cannot fit even with nothing running
  // (OUT_OF_RANGE if it exceeds the whole pool, RESOURCE_EXHAUSTED if blocks
  // held outside the scheduler are in the way).
  void Admit(std::vector<std::shared_ptr<Job>>& running);
  // Blocks `job`'s prompt still needs from the pool (no drops counted).
  int64_t PromptBlocks(const Job& job) const;
  // Whether reclaim_kv can bring the pool's free blocks up to `wanted`.
  bool ReclaimCanCover(int64_t wanted) const;
  // Whether the pool really lacks the blocks `steps` need (an upper bound:
  // no drops counted), i.e. a RESOURCE_EXHAUSTED from Forward is the pool's.
  bool PoolShortFor(absl::Span<const ops::SequenceStep> steps) const;
  // One Forward batch over `running`; finishes the jobs that are done.
  void Step(std::vector<std::shared_ptr<Job>>& running);
  // RESOURCE_EXHAUSTED for a sequence the full pool cannot serve.
  absl::Status PoolFull(absl::string_view why) const;
  void FinishJob(Job& job, absl::Status status);

  const ops::ModelBackend& model_;
  const SchedulerOptions options_;

  mutable absl::Mutex mu_;
  absl::CondVar work_cv_;  // signalled when work arrives or stop_ is set
  std::deque<std::shared_ptr<Job>> waiting_ ABSL_GUARDED_BY(mu_);
  std::deque<Restore*> restores_ ABSL_GUARDED_BY(mu_);
  int64_t running_count_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  SchedulerStats stats_ ABSL_GUARDED_BY(mu_);
  // Scheduler thread only: the batch, and the restore work run since its
  // last step.
  std::vector<std::shared_ptr<Job>> running_;
  double restore_spent_ = 0;
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace kvd::engine

#endif  // KVD_SERVICES_ENGINE_SCHEDULER_H_
