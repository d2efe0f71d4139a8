#include "services/engine/scheduler.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
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
  bool closed = false;    // scheduler thread only: FinishJob ran
  bool admitted = false;  // scheduler thread only: counted in running_count_

  absl::Mutex mu;
  absl::CondVar cv;
  std::string pending_text ABSL_GUARDED_BY(mu);  // not yet given to on_text
  bool finished ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  GenerateResult result ABSL_GUARDED_BY(mu);
};

Scheduler::Scheduler(const ops::Model& model, SchedulerOptions options)
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

absl::StatusOr<GenerateResult> Scheduler::Run(
    const ops::Tokenizer& tokenizer, const GenerateRequest& request,
    ops::KvCache* cache, const std::function<void(std::string_view)>& on_text) {
  auto job = std::make_shared<Job>();
  job->observer = request.observer;
  job->sequence_id = request.sequence_id;
  Job* j = job.get();
  KVD_ASSIGN_OR_RETURN(
      job->seq, Sequence::Create(model_, tokenizer, request, cache,
                                 [j](std::string_view s) {
                                   absl::MutexLock lock(&j->mu);
                                   j->pending_text.append(s.data(), s.size());
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
  // Relay text to the caller's thread until the sequence is finished.
  std::string text;
  j->mu.Lock();
  while (true) {
    while (!j->finished && j->pending_text.empty()) j->cv.Wait(&j->mu);
    if (!j->pending_text.empty()) {
      text.swap(j->pending_text);
      j->mu.Unlock();
      if (on_text) on_text(text);
      text.clear();
      j->mu.Lock();
      continue;
    }
    break;  // finished, and every piece of text was delivered
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
  job.status = std::move(status);
  job.finished = true;
  job.cv.Signal();
}

void Scheduler::Loop() {
  std::vector<std::shared_ptr<Job>> running;
  const size_t max_running = std::max<int64_t>(1, options_.max_running);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && running.empty() && waiting_.empty()) work_cv_.Wait(&mu_);
      if (stop_) {
        running.insert(running.end(), waiting_.begin(), waiting_.end());
        waiting_.clear();
        break;
      }
      while (running.size() < max_running && !waiting_.empty()) {
        running.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
        running.back()->admitted = true;
        running_count_++;
      }
    }
    Step(running);
    running.erase(
        std::remove_if(running.begin(), running.end(),
                       [](const std::shared_ptr<Job>& j) { return j->closed; }),
        running.end());
  }
  for (const std::shared_ptr<Job>& job : running) {
    job->seq->Cancel();
    FinishJob(*job, absl::UnavailableError(
                        "the engine shut down before the request finished; "
                        "nothing of it was kept"));
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
    {
      absl::MutexLock lock(&model_mu_);
      status = model_.Forward(steps, &out, mux.any() ? &mux : nullptr);
    }
    if (status.ok()) {
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
        absl::Status s;
        {
          absl::MutexLock lock(&model_mu_);
          s = model_.Forward({&step, 1}, &out, one.any() ? &one : nullptr);
        }
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
