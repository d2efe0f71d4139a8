#include "services/engine/scheduler.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "services/engine/sequence.h"

namespace kvd::engine {
namespace {

// Routes the batch's residuals to each sequence's own observer: the batch
// numbers its steps 0..n-1, each observer knows its sequence by the id the
// caller gave it.
class MuxObserver : public ops::ResidualObserver {
 public:
  struct Route {
    ops::ResidualObserver* observer = nullptr;
    int64_t sequence_id = 0;
  };
  std::vector<Route> routes;

  void OnResidual(int64_t sequence_id, int64_t layer, int64_t position,
                  const float* residual) override {
    const Route& r = routes[sequence_id];
    if (r.observer != nullptr)
      r.observer->OnResidual(r.sequence_id, layer, position, residual);
  }

  bool any() const {
    return std::any_of(routes.begin(), routes.end(),
                       [](const Route& r) { return r.observer != nullptr; });
  }
};

}  // namespace

struct Scheduler::Job {
  std::unique_ptr<Sequence> seq;
  ops::ResidualObserver* observer = nullptr;
  int64_t sequence_id = 0;
  ops::KvCache* cache = nullptr;  // the caller's, while Run waits
  bool keep_cache = true;         // false: emptied by FinishJob
  bool closed = false;            // scheduler thread only: FinishJob ran
  bool admitted = false;  // scheduler thread only: counted in running_count_

  absl::Mutex mu;
  absl::CondVar cv;
  GenerateDelta pending ABSL_GUARDED_BY(mu);  // not yet given to on_delta
  bool finished ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  GenerateResult result ABSL_GUARDED_BY(mu);
};

Scheduler::Scheduler(const ops::ModelBackend& model, SchedulerOptions options)
    : model_(model), options_(options) {
  thread_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    work_cv_.SignalAll();
  }
  thread_.join();
}

bool Scheduler::Saturated() const {
  absl::MutexLock lock(&mu_);
  return stop_ || running_count_ + static_cast<int64_t>(waiting_.size()) >=
                      std::max<int64_t>(1, options_.max_running) +
                          std::max<int64_t>(0, options_.max_waiting);
}

SchedulerStats Scheduler::stats() const {
  absl::MutexLock lock(&mu_);
  SchedulerStats s = stats_;
  s.running = running_count_;
  s.waiting = waiting_.size();
  return s;
}

struct Scheduler::Restore {
  RestoreJob job;
  bool done = false;  // guarded by the scheduler's mu_
  absl::Status status;
};

absl::Status Scheduler::RunRestore(RestoreJob job) {
  Restore restore{std::move(job)};
  absl::MutexLock lock(&mu_);
  if (stop_) {
    return absl::UnavailableError(
        "the engine is shutting down; retry on another node");
  }
  restores_.push_back(&restore);
  work_cv_.Signal();
  mu_.Await(absl::Condition(&restore.done));
  return restore.status;
}

void Scheduler::RunRestoreJob(Restore& restore) {
  // A job's first unit is not charged by BeforeUnit: jobs queued back to
  // back still let the batch step once the budget is spent.
  if (restore_spent_ >= options_.restore_tokens_per_step)
    StepBatch(/*restore_pause=*/false);
  RestoreContext context(this);
  absl::Status status = restore.job(context);
  absl::MutexLock lock(&mu_);
  stats_.restores++;
  restore.status = std::move(status);
  restore.done = true;
}

void Scheduler::RestoreContext::BeforeUnit(double cost) {
  Scheduler& s = *scheduler_;
  if (s.restore_spent_ + cost > s.options_.restore_tokens_per_step)
    s.StepBatch(/*restore_pause=*/true);
  s.restore_spent_ += cost;
  absl::MutexLock lock(&s.mu_);
  s.stats_.restore_tokens += cost;
}

void Scheduler::RestoreContext::Idle(absl::Duration max_wait) {
  Scheduler& s = *scheduler_;
  if (s.StepBatch(/*restore_pause=*/true)) return;
  absl::MutexLock lock(&s.mu_);
  // Woken early by a new sequence (the next Idle admits it) or by stop.
  s.work_cv_.WaitWithTimeout(&s.mu_, max_wait);
}

bool Scheduler::StepBatch(bool restore_pause) {
  Admit(running_);
  restore_spent_ = 0;
  if (running_.empty()) return false;
  if (restore_pause) {
    // Counted before the step, so the step's callbacks see it.
    absl::MutexLock lock(&mu_);
    stats_.restore_pauses++;
  }
  Step(running_);
  running_.erase(
      std::remove_if(running_.begin(), running_.end(),
                     [](const std::shared_ptr<Job>& j) { return j->closed; }),
      running_.end());
  return true;
}

absl::StatusOr<GenerateResult> Scheduler::Run(const ops::Tokenizer& tokenizer,
                                              const GenerateRequest& request,
                                              ops::KvCache* cache,
                                              const DeltaCallback& on_delta,
                                              bool keep_cache) {
  auto job = std::make_shared<Job>();
  job->keep_cache = keep_cache;
  job->observer = request.observer;
  job->sequence_id = request.sequence_id;
  job->cache = cache;
  Job* j = job.get();
  KVD_ASSIGN_OR_RETURN(job->seq,
                       Sequence::Create(model_, tokenizer, request, cache,
                                        [j](const GenerateDelta& d) {
                                          absl::MutexLock lock(&j->mu);
                                          j->pending.Append(GenerateDelta(d));
                                          j->cv.Signal();
                                        }));
  {
    absl::MutexLock lock(&mu_);
    if (stop_) {
      return absl::UnavailableError(
          "the engine is shutting down; retry on another node");
    }
    const int64_t capacity = std::max<int64_t>(1, options_.max_running) +
                             std::max<int64_t>(0, options_.max_waiting);
    if (running_count_ + static_cast<int64_t>(waiting_.size()) >= capacity) {
      stats_.rejected++;
      return absl::ResourceExhaustedError(absl::StrCat(
          "the engine is busy: ", running_count_, " sequences running and ",
          waiting_.size(), " waiting (max_running ", options_.max_running,
          ", max_waiting ", options_.max_waiting, "); retry later"));
    }
    waiting_.push_back(job);
    work_cv_.Signal();
  }
  // Relay deltas to the caller's thread until the sequence is finished; a
  // caller slower than the batch gets the deltas it missed merged into one.
  GenerateDelta delta;
  j->mu.Lock();
  while (true) {
    while (!j->finished && j->pending.empty()) j->cv.Wait(&j->mu);
    if (!j->pending.empty()) {
      std::swap(delta, j->pending);
      j->mu.Unlock();
      on_delta(delta);
      delta = GenerateDelta();
      j->mu.Lock();
      continue;
    }
    break;  // finished, and every delta was delivered
  }
  absl::Status status = j->status;
  GenerateResult result = std::move(j->result);
  j->mu.Unlock();
  if (!status.ok()) return status;
  return result;
}

void Scheduler::FinishJob(Job& job, absl::Status status) {
  if (job.closed) return;
  job.closed = true;
  if (job.admitted) {
    // Before the caller wakes: it may look at stats() right away.
    absl::MutexLock lock(&mu_);
    running_count_--;
  }
  absl::MutexLock lock(&job.mu);
  if (status.ok()) job.result = job.seq->TakeResult();
  // The blocks are back before Loop admits the next prompt; a caller that
  // destroyed the cache itself would race with that admission.
  if (!job.keep_cache) job.cache->Reset(0);
  job.status = std::move(status);
  job.finished = true;
  job.cv.Signal();
}

void Scheduler::Loop() {
  std::deque<Restore*> unrun;
  while (true) {
    Restore* restore = nullptr;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && running_.empty() && waiting_.empty() &&
             restores_.empty()) {
        work_cv_.Wait(&mu_);
      }
      if (stop_) {
        running_.insert(running_.end(), waiting_.begin(), waiting_.end());
        waiting_.clear();
        unrun.swap(restores_);
        break;
      }
      if (!restores_.empty()) {
        restore = restores_.front();
        restores_.pop_front();
      }
    }
    if (restore != nullptr) {
      RunRestoreJob(*restore);
    } else {
      StepBatch(/*restore_pause=*/false);
    }
  }
  for (const std::shared_ptr<Job>& job : running_) {
    job->seq->Cancel();
    FinishJob(*job, absl::UnavailableError(
                        "the engine shut down before the request finished; "
                        "nothing of it was kept"));
  }
  running_.clear();
  absl::MutexLock lock(&mu_);
  for (Restore* restore : unrun) {
    restore->status = absl::UnavailableError(
        "the engine shut down before the session was restored");
    restore->done = true;
  }
}

absl::Status Scheduler::PoolFull(absl::string_view why) const {
  const ops::KvBlockPool& pool = *options_.kv_pool;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "K/V pool of %.0f MiB is full (%d of %d blocks in use): %s; raise "
      "--kv-pool-mb, or lower --max-inflight (kvd serve)",
      pool.budget_bytes() / (1024.0 * 1024.0), pool.stats().blocks_in_use,
      pool.capacity_blocks(), std::string(why)));
}

int64_t Scheduler::PromptBlocks(const Job& job) const {
  const ops::KvCache& cache = *job.cache;
  std::vector<int64_t> keep(cache.n_layers());
  for (int64_t l = 0; l < cache.n_layers(); ++l) keep[l] = cache.first_kept(l);
  return cache.BlocksToPrepare(keep,
                               cache.length() + job.seq->prefill_remaining());
}

bool Scheduler::ReclaimCanCover(int64_t wanted) const {
  if (!options_.reclaim_kv) return false;
  const int64_t available = options_.kv_pool->available_blocks();
  if (available >= wanted) return false;  // nothing to reclaim for
  if (!options_.reclaimable_kv_blocks) return true;
  return available + options_.reclaimable_kv_blocks() >= wanted;
}

bool Scheduler::PoolShortFor(absl::Span<const ops::SequenceStep> steps) const {
  const ops::KvBlockPool* pool = options_.kv_pool;
  int64_t need = 0;
  for (const ops::SequenceStep& step : steps) {
    const ops::KvCache& cache = *step.cache;
    // A cache of another pool is not ours to make room in.
    if (cache.pool() != pool) continue;
    std::vector<int64_t> keep(cache.n_layers());
    for (int64_t l = 0; l < cache.n_layers(); ++l)
      keep[l] = cache.first_kept(l);
    need += cache.BlocksToPrepare(
        keep, cache.length() + static_cast<int64_t>(step.tokens.size()));
  }
  return need > 0 && pool->available_blocks() < need;
}

void Scheduler::Admit(std::vector<std::shared_ptr<Job>>& running) {
  const size_t max_running = std::max<int64_t>(1, options_.max_running);
  ops::KvBlockPool* pool = options_.kv_pool;
  while (running.size() < max_running) {
    std::shared_ptr<Job> next;
    {
      absl::MutexLock lock(&mu_);
      if (stop_ || waiting_.empty()) return;
      next = waiting_.front();  // only this thread pops
    }
    if (pool != nullptr && pool->capacity_blocks() > 0) {
      // Blocks the admitted prompts still need are spoken for.
      int64_t promised = 0;
      for (const std::shared_ptr<Job>& job : running) {
        if (!job->closed && job->seq->prefilling())
          promised += PromptBlocks(*job);
      }
      const int64_t need = PromptBlocks(*next);
      if (pool->available_blocks() < promised + need) {
        // Demote an idle session only if demoting them all would make room;
        // otherwise the blocks the running sequences hold are in the way and
        // demoting would only thrash the hot sessions.
        if (ReclaimCanCover(promised + need) && options_.reclaim_kv()) continue;
        if (!running.empty()) return;  // waits for running ones to finish
        {
          absl::MutexLock lock(&mu_);
          waiting_.pop_front();
        }
        const int64_t held = next->cache->blocks_held();
        if (held + need > pool->capacity_blocks()) {
          // Not even an empty pool holds it: retrying cannot help, so it is
          // not RESOURCE_EXHAUSTED (HTTP 429, retried by clients forever).
          FinishJob(*next,
                    absl::OutOfRangeError(absl::StrFormat(
                        "the prompt needs %d K/V blocks (%d held by its "
                        "cache, %d more) but the whole K/V pool of %.0f MiB "
                        "has %d; shorten the prompt or the session, or raise "
                        "--kv-pool-mb",
                        held + need, held, need,
                        pool->budget_bytes() / (1024.0 * 1024.0),
                        pool->capacity_blocks())));
        } else {
          // Blocks held outside the scheduler (a restore in progress, a
          // session in the middle of a turn) are in the way: transient.
          FinishJob(
              *next,
              PoolFull(absl::StrCat(
                  "the prompt needs ", need, " more blocks and only ",
                  pool->available_blocks(), " are free with nothing running")));
        }
        continue;
      }
    }
    absl::MutexLock lock(&mu_);
    waiting_.pop_front();
    next->admitted = true;
    running_count_++;
    running.push_back(std::move(next));
  }
}

void Scheduler::Step(std::vector<std::shared_ptr<Job>>& running) {
  std::vector<ops::SequenceStep> steps;
  std::vector<Job*> members;
  MuxObserver mux;
  int64_t budget = std::max<int64_t>(1, options_.prefill_tokens_per_step);
  int64_t decode_tokens = 0, prefill_tokens = 0;
  for (const std::shared_ptr<Job>& job : running) {
    Sequence& seq = *job->seq;
    if (seq.PollCancelled()) continue;
    const bool prefill = seq.prefilling();
    if (prefill && budget <= 0) continue;  // waits for a later iteration
    ops::SequenceStep step = seq.NextStep(budget);
    if (prefill) {
      budget -= step.tokens.size();
      prefill_tokens += step.tokens.size();
    } else {
      decode_tokens++;
    }
    step.sequence_id = steps.size();
    mux.routes.push_back({job->observer, job->sequence_id});
    steps.push_back(step);
    members.push_back(job.get());
  }
  if (!steps.empty()) {
    ops::ForwardOutput out;
    absl::Status status;
    status = model_.Forward(steps, &out, mux.any() ? &mux : nullptr);
    // A full pool: free idle blocks elsewhere, else fail the youngest member
    // (its cache emptied, so its blocks go back) and retry without it. The
    // refused Forward touched no cache, so the others' bits are unaffected.
    // Any other RESOURCE_EXHAUSTED (say a cache of another, private pool)
    // goes to the one-step-at-a-time path below, which fails only the
    // sequence at fault, with its own error.
    while (options_.kv_pool != nullptr &&
           status.code() == absl::StatusCode::kResourceExhausted &&
           !steps.empty() && PoolShortFor(steps)) {
      if (!options_.reclaim_kv || !options_.reclaim_kv()) {
        Job& youngest = *members.back();
        youngest.cache->Reset(0);
        FinishJob(youngest, PoolFull(absl::StrCat(
                                "a step of ", steps.size(),
                                " sequences could not get its blocks; the "
                                "youngest sequence was stopped")));
        steps.pop_back();
        members.pop_back();
        mux.routes.pop_back();
        if (steps.empty()) break;
      }
      status = model_.Forward(steps, &out, mux.any() ? &mux : nullptr);
    }
    if (steps.empty()) {
      // Every member was stopped; nothing ran.
    } else if (status.ok()) {
      for (size_t i = 0; i < steps.size(); ++i) {
        members[i]->seq->OnStepDone(steps[i].logits == ops::LogitsMode::kNone
                                        ? nullptr
                                        : out.Logits(i));
      }
    } else {
      // Forward refused the batch without touching any cache: run each step
      // alone so only the sequence at fault fails.
      for (size_t i = 0; i < steps.size(); ++i) {
        MuxObserver one;
        one.routes.push_back(mux.routes[i]);
        ops::SequenceStep step = steps[i];
        step.sequence_id = 0;
        const absl::Status s =
            model_.Forward({&step, 1}, &out, one.any() ? &one : nullptr);
        if (!s.ok()) {
          FinishJob(*members[i], s);
          continue;
        }
        members[i]->seq->OnStepDone(
            step.logits == ops::LogitsMode::kNone ? nullptr : out.Logits(0));
      }
    }
    absl::MutexLock lock(&mu_);
    stats_.steps++;
    stats_.decode_tokens += decode_tokens;
    stats_.prefill_tokens += prefill_tokens;
    stats_.max_batch_sequences =
        std::max<int64_t>(stats_.max_batch_sequences, steps.size());
  }
  for (const std::shared_ptr<Job>& job : running) {
    if (job->seq->done()) FinishJob(*job, absl::OkStatus());
  }
}

}  // namespace kvd::engine
