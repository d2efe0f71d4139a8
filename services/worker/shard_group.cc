#include "services/worker/shard_group.h"

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "services/collective/ordered_all_reduce.h"
#include "services/transport/ucx_transport.h"
#include "services/worker/collective_shard_reducer.h"
#include "services/worker/worker_protocol.h"

namespace kvd::worker {

// The mirror attached to every cache the group hands out: tells the
// workers' twins of the cache's bookkeeping calls, while they live.
class ShardGroup::Twin final : public ops::KvCacheMirror {
 public:
  Twin(const ShardGroup* group, int64_t block_rows)
      : group_(group), block_rows_(block_rows) {
    id_ = group_->NewTwin(block_rows_, false, &generation_);
  }
  ~Twin() override {
    absl::MutexLock lock(&group_->journal_mu_);
    if (generation_ == group_->generation_)
      group_->JournalLocked(id_, kCacheDropped, -1, 0);
  }

  void Record(const ops::KvCacheOp& op) override {
    absl::MutexLock lock(&group_->journal_mu_);
    if (op.kind == ops::KvCacheOp::kKeepPastWindow) keep_past_windows_ = true;
    if (generation_ != group_->generation_) {
      // The workers that held this twin died. A call that empties the
      // cache makes a new twin exact again; any other has nothing to do.
      const bool empties =
          op.kind == ops::KvCacheOp::kReset ||
          (op.kind == ops::KvCacheOp::kTruncate && op.value <= 0);
      if (!empties) return;
      ReviveLocked();
    }
    group_->JournalLocked(id_, op.kind, op.layer, op.value);
  }

  const ShardGroup* group() const { return group_; }

  // Whether the workers still hold this cache's rows: its twin is alive, or
  // it holds none (a new twin is then exact).
  bool Intact(const ops::KvCache& cache) const {
    absl::MutexLock lock(&group_->journal_mu_);
    return IntactLocked(cache);
  }

  // The twin's id, making a new twin for an empty cache whose old one died;
  // nullopt if it died holding rows.
  std::optional<uint64_t> Current(const ops::KvCache& cache) {
    absl::MutexLock lock(&group_->journal_mu_);
    if (!IntactLocked(cache)) return std::nullopt;
    if (generation_ != group_->generation_) ReviveLocked();
    return id_;
  }

 private:
  bool IntactLocked(const ops::KvCache& cache) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(group_->journal_mu_) {
    return generation_ == group_->generation_ ||
           (cache.length() == 0 && cache.blocks_held() == 0);
  }

  void ReviveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(group_->journal_mu_) {
    id_ = group_->NewTwinLocked(block_rows_, keep_past_windows_, &generation_);
  }

  const ShardGroup* const group_;
  const int64_t block_rows_;
  uint64_t id_ = 0;
  uint64_t generation_ = 0;
  bool keep_past_windows_ = false;
};

// Shard 0's reducer: the collective of the workers now connected.
class ShardGroup::Reducer final : public ops::ShardReducer {
 public:
  void Reduce(int64_t shard, const std::vector<const float*>& partials,
              int64_t n, float* out) override {
    current_->Reduce(shard, partials, n, out);
  }
  absl::Status status() const override {
    return current_ != nullptr
               ? current_->status()
               : absl::UnavailableError("no shard workers connected");
  }
  CollectiveShardReducer* current_ = nullptr;
};

namespace {

// One worker's commands, sent by a thread of their own: a send returns only
// once the worker took the chunk, that is once it finished the command
// before, and the leader should meanwhile go on with its own share (its
// checkpoint reads and shard 0's recompute during a restore). At most
// kMaxQueued commands wait, bounding the memory they hold.
class Outbox {
 public:
  explicit Outbox(transport::ChunkSender* to)
      : to_(to), thread_([this] { Loop(); }) {}
  ~Outbox() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  // Queues `bytes`, waiting while the queue is full. The first failed send
  // fails this and every later call.
  absl::Status Push(std::shared_ptr<const std::string> bytes) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Outbox::HasRoomOrFailed));
    if (!failed_.ok()) return failed_;
    queue_.push_back(std::move(bytes));
    return absl::OkStatus();
  }

  // Waits until every queued command was sent; the send error if one
  // failed, DEADLINE_EXCEEDED if the worker took nothing until `deadline`.
  absl::Status Drain(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    const bool done = mu_.AwaitWithDeadline(
        absl::Condition(this, &Outbox::SentAllOrFailed), deadline);
    if (!failed_.ok()) return failed_;
    return done ? absl::OkStatus()
                : absl::DeadlineExceededError("it took no command");
  }

 private:
  static constexpr size_t kMaxQueued = 4;

  // Await conditions, as members so the thread-safety analysis sees mu_ held.
  bool HasRoomOrFailed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.size() < kMaxQueued || !failed_.ok();
  }
  bool SentAllOrFailed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (queue_.empty() && !sending_) || !failed_.ok();
  }
  bool StoppedOrQueued() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !queue_.empty();
  }

  void Loop() {
    while (true) {
      std::shared_ptr<const std::string> next;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &Outbox::StoppedOrQueued));
        if (stop_ || !failed_.ok()) return;
        next = std::move(queue_.front());
        queue_.pop_front();
        sending_ = true;
      }
      absl::Status sent = to_->Send(*next);
      absl::MutexLock lock(&mu_);
      sending_ = false;
      if (!sent.ok()) {
        failed_ = sent;
        queue_.clear();
        return;
      }
    }
  }

  transport::ChunkSender* const to_;
  absl::Mutex mu_;
  std::deque<std::shared_ptr<const std::string>> queue_ ABSL_GUARDED_BY(mu_);
  bool sending_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts once the rest is ready
};

}  // namespace

struct ShardGroup::Link {
  int rank = 0;
  pid_t pid = 0;
  std::unique_ptr<transport::ChunkReceiver> replies;
  std::unique_ptr<transport::ChunkSender> commands;
  std::unique_ptr<Outbox> outbox;  // sends `commands`; destroyed before it
  int64_t answered = 0;            // id of the last command it replied to
  v1::WorkerStats stats;

  absl::Status Push(const std::shared_ptr<const std::string>& bytes) {
    absl::Status s = outbox->Push(bytes);
    if (s.ok()) return s;
    return absl::Status(
        s.code(), absl::StrCat("shard worker rank ", rank, ": ", s.message()));
  }
};

struct ShardGroup::Session {
  std::unique_ptr<transport::UcxTransport> ucx;
  std::unique_ptr<collective::OrderedAllReduce> all_reduce;
  std::unique_ptr<CollectiveShardReducer> reducer;
  std::vector<Link> links;  // ranks 1 .. degree - 1
  int64_t last_sent = 0;
};

namespace {

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

// fork + exec, with the arguments laid out before the fork (the child of a
// threaded process may only make async-signal-safe calls). The worker gets
// no signal blocked (kvd serve blocks SIGINT and SIGTERM to wait for them),
// none of the leader's files but stdio (its listening sockets), and a
// process group of its own, so a Ctrl-C meant for the leader does not kill
// the shards under a turn the leader is still finishing: they exit when
// told to, or when their leader is gone.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.data()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::UnavailableError(
        absl::StrCat("fork for a shard worker: ", std::strerror(errno)));
  }
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    setpgid(0, 0);
    if (syscall(SYS_close_range, 3u, ~0u, 0u) != 0) {
      for (int fd = 3; fd < 4096; ++fd) close(fd);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// Whether `pid` has exited (and reaped it), with how, for messages.
std::optional<std::string> Exited(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) != pid) return std::nullopt;
  if (WIFSIGNALED(status))
    return absl::StrCat("killed by signal ", WTERMSIG(status));
  return absl::StrCat("exited with status ", WEXITSTATUS(status));
}

int ThreadsPerShard(const ShardGroupOptions& o) {
  if (o.threads_per_shard > 0) return o.threads_per_shard;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, cores / o.degree);
}

}  // namespace

ShardGroup::ShardGroup(const ShardGroupOptions& options)
    : options_(options), reducer_(std::make_unique<Reducer>()) {}

absl::StatusOr<std::unique_ptr<ShardGroup>> ShardGroup::Start(
    const ops::Model& full, const ShardGroupOptions& options) {
  const int64_t groups = full.config().row_parallel_groups();
  if (options.degree < 2 || groups % options.degree != 0) {
    std::string fits;
    for (int64_t d = 2; d <= groups; ++d) {
      if (groups % d == 0) absl::StrAppend(&fits, fits.empty() ? "" : ", ", d);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensor-parallel-size ", options.degree, ": model ",
        full.config().name, " splits into ", groups,
        " row-parallel groups (its K/V heads and d_ff), so the size must "
        "divide ",
        groups, fits.empty() ? "" : absl::StrCat(" (", fits, ")"),
        options.degree < 2 ? "; 1 runs without workers" : ""));
  }
  std::unique_ptr<ShardGroup> group(new ShardGroup(options));
  group->config_ = full.config();
  KVD_ASSIGN_OR_RETURN(
      group->shard0_,
      ops::Model::ShardOf(full, 0, options.degree, group->reducer_.get(),
                          ThreadsPerShard(options)));
  absl::MutexLock lock(&group->mu_);
  if (absl::Status s = group->Connect(); !s.ok()) {
    group->Teardown(/*graceful=*/false);
    return s;
  }
  return group;
}

ShardGroup::~ShardGroup() {
  absl::MutexLock lock(&mu_);
  Teardown(/*graceful=*/true);
}

absl::Status ShardGroup::Connect() const {
  // Held from the start: Teardown kills whatever was spawned if a later
  // step fails.
  session_ = std::make_unique<Session>();
  Session* session = session_.get();
  transport::UcxOptions uo;
  uo.tls = options_.transport_tls;
  uo.send_timeout = options_.timeout;
  KVD_ASSIGN_OR_RETURN(session->ucx, transport::UcxTransport::Create(uo));
  KVD_ASSIGN_OR_RETURN(session->all_reduce,
                       collective::OrderedAllReduce::Create(
                           session->ucx.get(), 0, options_.degree));
  const std::string binary =
      options_.worker_binary.empty() ? SelfExe() : options_.worker_binary;
  const std::string threads = std::to_string(ThreadsPerShard(options_));
  const std::string timeout =
      std::to_string(absl::ToInt64Seconds(options_.timeout));
  for (int rank = 1; rank < options_.degree; ++rank) {
    Link link;
    link.rank = rank;
    KVD_ASSIGN_OR_RETURN(link.replies,
                         session->ucx->Listen({.max_chunk_bytes = 1 << 20}));
    session->links.push_back(std::move(link));
    Link& added = session->links.back();
    KVD_ASSIGN_OR_RETURN(
        added.pid,
        Spawn({binary, "worker", "--leader",
               absl::BytesToHexString(added.replies->address()), "--rank",
               std::to_string(rank), "--tensor-parallel-size",
               std::to_string(options_.degree), "--model", options_.model_path,
               "--precision", ops::PrecisionName(shard0_->precision()),
               "--threads", threads, "--timeout-s", timeout, "--transport-tls",
               options_.transport_tls}));
  }

  // Each worker says hello once its model is loaded.
  std::vector<v1::WorkerHello> hellos(options_.degree);
  const absl::Time give_up = absl::Now() + options_.start_timeout;
  for (Link& link : session_->links) {
    std::string chunk;
    while (true) {
      absl::StatusOr<bool> got =
          link.replies->Receive(&chunk, absl::Now() + absl::Seconds(1));
      if (got.ok() && *got) break;
      if (std::optional<std::string> how = Exited(link.pid)) {
        link.pid = 0;
        return absl::UnavailableError(
            absl::StrCat("shard worker rank ", link.rank, " ", *how,
                         " before it was ready (its message is above)"));
      }
      if (absl::Now() > give_up ||
          (!got.ok() && !absl::IsDeadlineExceeded(got.status()))) {
        return absl::UnavailableError(absl::StrCat(
            "shard worker rank ", link.rank, " did not start: ",
            got.ok() ? "it closed its stream" : got.status().ToString()));
      }
    }
    v1::WorkerHello& hello = hellos[link.rank];
    if (!hello.ParseFromString(chunk) || hello.rank() != link.rank ||
        hello.all_reduce_inboxes_size() != options_.degree) {
      return absl::UnavailableError(absl::StrCat(
          "shard worker rank ", link.rank, " sent an unreadable hello"));
    }
    KVD_ASSIGN_OR_RETURN(link.commands,
                         session_->ucx->Connect(hello.command_inbox()));
    link.outbox = std::make_unique<Outbox>(link.commands.get());
  }

  // The mesh: rank p sends its partials to the inbox rank q opened for it.
  v1::WorkerCommand connect;
  connect.set_id(next_command_++);
  for (Link& link : session_->links) {
    v1::WorkerCommand::Connect* c = connect.mutable_connect();
    c->Clear();
    c->add_all_reduce_inboxes(session_->all_reduce->InboxFor(link.rank));
    for (int q = 1; q < options_.degree; ++q)
      c->add_all_reduce_inboxes(hellos[q].all_reduce_inboxes(link.rank));
    KVD_RETURN_IF_ERROR(link.Push(
        std::make_shared<const std::string>(connect.SerializeAsString())));
  }
  session_->last_sent = connect.id();
  std::vector<std::string> mine(options_.degree);
  for (int q = 1; q < options_.degree; ++q)
    mine[q] = hellos[q].all_reduce_inboxes(0);
  KVD_RETURN_IF_ERROR(session_->all_reduce->Connect(mine));
  KVD_RETURN_IF_ERROR(WaitAll());
  session_->reducer = std::make_unique<CollectiveShardReducer>(
      session_->all_reduce.get(), options_.timeout);
  reducer_->current_ = session_->reducer.get();
  return absl::OkStatus();
}

void ShardGroup::Teardown(bool graceful) const {
  reducer_->current_ = nullptr;
  if (session_ == nullptr) return;
  if (graceful) {
    v1::WorkerCommand bye;
    bye.set_id(next_command_++);
    bye.mutable_shutdown();
    const auto bytes =
        std::make_shared<const std::string>(bye.SerializeAsString());
    for (Link& link : session_->links) {
      if (link.outbox == nullptr) continue;
      if (link.outbox->Push(bytes).ok())
        link.outbox->Drain(absl::Now() + absl::Seconds(2)).IgnoreError();
    }
  }
  for (Link& link : session_->links) {
    if (link.pid <= 0) continue;
    const absl::Time give_up =
        absl::Now() + (graceful ? absl::Seconds(5) : absl::ZeroDuration());
    while (!Exited(link.pid).has_value()) {
      if (absl::Now() >= give_up) {
        kill(link.pid, SIGKILL);
        waitpid(link.pid, nullptr, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    link.pid = 0;
  }
  session_.reset();
  PublishWorkers();
}

absl::Status ShardGroup::Fail(const absl::Status& why) const {
  Teardown(/*graceful=*/false);
  {
    absl::MutexLock lock(&journal_mu_);
    journal_.clear();
    generation_++;  // every twin died with its worker
  }
  return absl::UnavailableError(
      absl::StrCat("tensor-parallel shard group failed (", why.message(),
                   "); its workers are being restarted: retry the request"));
}

absl::Status ShardGroup::EnsureUp() const {
  if (session_ != nullptr) return absl::OkStatus();
  {
    absl::MutexLock lock(&info_mu_);
    restarts_++;
  }
  if (absl::Status s = Connect(); !s.ok()) {
    Teardown(/*graceful=*/false);
    return absl::UnavailableError(absl::StrCat(
        "tensor-parallel shard workers could not be restarted: ", s.message()));
  }
  return absl::OkStatus();
}

void ShardGroup::JournalLocked(uint64_t cache, int32_t kind, int64_t layer,
                               int64_t value) const {
  v1::CacheOp& op = journal_.emplace_back();
  op.set_cache(cache);
  op.set_kind(kind);
  op.set_layer(layer);
  op.set_value(value);
}

uint64_t ShardGroup::NewTwinLocked(int64_t block_rows, bool keep_past_windows,
                                   uint64_t* generation) const {
  const uint64_t id = next_twin_++;
  JournalLocked(id, kCacheCreated, -1, block_rows);
  if (keep_past_windows)
    JournalLocked(id, ops::KvCacheOp::kKeepPastWindow, -1, 0);
  *generation = generation_;
  return id;
}

uint64_t ShardGroup::NewTwin(int64_t block_rows, bool keep_past_windows,
                             uint64_t* generation) const {
  absl::MutexLock lock(&journal_mu_);
  return NewTwinLocked(block_rows, keep_past_windows, generation);
}

absl::StatusOr<ops::KvCache> ShardGroup::NewCache(
    ops::KvBlockPool* pool) const {
  KVD_ASSIGN_OR_RETURN(ops::KvCache cache, shard0_->NewCache(pool));
  cache.AttachMirror(std::make_unique<Twin>(this, cache.block_rows()));
  return cache;
}

bool ShardGroup::CacheIntact(const ops::KvCache& cache) const {
  auto* twin = dynamic_cast<const Twin*>(cache.mirror());
  return twin == nullptr || twin->group() != this || twin->Intact(cache);
}

absl::StatusOr<uint64_t> ShardGroup::TwinOf(const ops::KvCache* cache) const {
  auto* twin =
      cache == nullptr ? nullptr : dynamic_cast<Twin*>(cache->mirror());
  if (twin == nullptr || twin->group() != this) {
    return absl::InvalidArgumentError(
        "a tensor-parallel step needs caches made by its shard group's "
        "NewCache");
  }
  std::optional<uint64_t> id = twin->Current(*cache);
  if (!id.has_value()) {
    return absl::UnavailableError(
        "the tensor-parallel shard workers were restarted after this "
        "sequence's K/V was built, and their rows are gone; retry: a "
        "session resumes from its checkpoint");
  }
  return *id;
}

absl::Status ShardGroup::SendAll(v1::WorkerCommand& command) const {
  command.set_id(next_command_++);
  {
    absl::MutexLock lock(&journal_mu_);
    for (v1::CacheOp& op : journal_) *command.add_cache_ops() = std::move(op);
    journal_.clear();
  }
  const auto bytes =
      std::make_shared<const std::string>(command.SerializeAsString());
  for (Link& link : session_->links) KVD_RETURN_IF_ERROR(link.Push(bytes));
  session_->last_sent = command.id();
  return absl::OkStatus();
}

absl::Status ShardGroup::WaitAll() const {
  absl::Status first;
  const absl::Time deadline = absl::Now() + options_.timeout;
  for (Link& link : session_->links) {
    if (absl::Status s = link.outbox->Drain(deadline); !s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("shard worker rank ", link.rank, " (pid ", link.pid,
                       ") did not take its commands: ", s.ToString()));
    }
    while (link.answered < session_->last_sent) {
      std::string chunk;
      absl::StatusOr<bool> got = link.replies->Receive(&chunk, deadline);
      v1::WorkerReply reply;
      if (!got.ok() || !*got || !reply.ParseFromString(chunk)) {
        return absl::UnavailableError(absl::StrCat(
            "shard worker rank ", link.rank, " (pid ", link.pid,
            ") did not answer: ",
            !got.ok() ? got.status().ToString()
                      : (*got ? "unreadable reply" : "it closed its stream")));
      }
      link.answered = reply.id();
      link.stats = reply.stats();
      if (absl::Status s = ReplyStatus(reply); !s.ok() && first.ok()) {
        first = absl::Status(
            s.code(),
            absl::StrCat("shard worker rank ", link.rank, ": ", s.message()));
      }
    }
  }
  PublishWorkers();
  return first;
}

absl::Status ShardGroup::BoundedHotWindowSupport() const {
  return absl::UnimplementedError(
      "CPU tensor-parallel shards keep every K/V row they serve (the shard "
      "workers hold no residuals to rebuild older rows from)");
}

absl::Status ShardGroup::RunForward(absl::Span<const ops::SequenceStep> batch,
                                    ops::ForwardOutput* out,
                                    ops::ResidualObserver* observer,
                                    ops::ResidualPatcher* patcher) const {
  if (patcher != nullptr) {
    return absl::UnimplementedError(
        "residual patching runs in one process, not over tensor-parallel "
        "shard workers");
  }
  for (const ops::SequenceStep& step : batch) {
    if (step.kv_source != nullptr || step.key_selection != nullptr) {
      return absl::UnimplementedError(
          "a bounded hot window or key selection is not served by CPU "
          "tensor-parallel shards; use --hot-budget all");
    }
  }
  absl::MutexLock lock(&mu_);
  KVD_RETURN_IF_ERROR(EnsureUp());
  v1::WorkerCommand command;
  v1::WorkerCommand::Forward* forward = command.mutable_forward();
  for (const ops::SequenceStep& step : batch) {
    KVD_ASSIGN_OR_RETURN(uint64_t id, TwinOf(step.cache));
    v1::ForwardSequence* s = forward->add_sequences();
    s->set_cache(id);
    s->set_tokens(EncodeTokens(step.tokens));
  }
  // Refused here, the step never reaches the workers: every later failure
  // is a shard's, and fails the group.
  KVD_RETURN_IF_ERROR(
      ops::PrepareStepCaches(shard0_->config(), precision(), batch).status());
  return Lockstep(command,
                  [&] { return shard0_->Forward(batch, out, observer); });
}

absl::Status ShardGroup::Lockstep(
    v1::WorkerCommand& command,
    const std::function<absl::Status()>& local) const {
  if (absl::Status s = SendAll(command); !s.ok()) return Fail(s);
  const absl::Status mine = local();
  const absl::Status remote = WaitAll();
  if (!remote.ok()) return Fail(remote);
  if (!mine.ok()) return Fail(mine);
  return absl::OkStatus();
}

absl::Status ShardGroup::RunForwardLayers(ops::KvCache* cache, int64_t position,
                                          int64_t n, int64_t first_layer,
                                          int64_t end_layer, float* h,
                                          ops::ResidualObserver* observer,
                                          int64_t sequence_id) const {
  absl::MutexLock lock(&mu_);
  KVD_RETURN_IF_ERROR(EnsureUp());
  KVD_ASSIGN_OR_RETURN(uint64_t id, TwinOf(cache));
  KVD_ASSIGN_OR_RETURN(
      const bool run,
      ops::PrepareLayerRange(shard0_->config(), precision(), cache, position, n,
                             first_layer, end_layer, h));
  if (!run) return absl::OkStatus();
  v1::WorkerCommand command;
  v1::WorkerCommand::ForwardLayers* f = command.mutable_forward_layers();
  f->set_cache(id);
  f->set_position(position);
  f->set_n(n);
  f->set_first_layer(first_layer);
  f->set_end_layer(end_layer);
  EncodeResiduals(h, n, config_.d_model, f->mutable_h());
  return Lockstep(command, [&] {
    return shard0_->ForwardLayers(cache, position, n, first_layer, end_layer, h,
                                  observer, sequence_id);
  });
}

absl::Status ShardGroup::RecomputeKvIntoCache(int64_t layer,
                                              const float* residuals,
                                              int64_t position, int64_t n,
                                              ops::KvCache* cache) const {
  absl::MutexLock lock(&mu_);
  KVD_RETURN_IF_ERROR(EnsureUp());
  KVD_ASSIGN_OR_RETURN(uint64_t id, TwinOf(cache));
  KVD_RETURN_IF_ERROR(ops::CheckRecomputeTarget(shard0_->config(), precision(),
                                                layer, position, n, cache));
  v1::WorkerCommand command;
  v1::WorkerCommand::Recompute* r = command.mutable_recompute();
  r->set_cache(id);
  r->set_layer(layer);
  r->set_position(position);
  r->set_n(n);
  EncodeResiduals(residuals, n, config_.d_model, r->mutable_residuals());
  if (absl::Status s = SendAll(command); !s.ok()) return Fail(s);
  // The workers recompute their heads while this one does: their replies
  // are read with the next step's, which waits for them.
  const absl::Status local =
      shard0_->RecomputeKvIntoCache(layer, residuals, position, n, cache);
  if (!local.ok()) return Fail(local);
  return absl::OkStatus();
}

void ShardGroup::PublishWorkers() const {
  std::vector<ShardWorkerInfo> info;
  if (session_ != nullptr) {
    for (const Link& link : session_->links)
      info.push_back({link.rank, link.pid, link.stats});
  }
  absl::MutexLock lock(&info_mu_);
  info_ = std::move(info);
}

std::vector<ShardWorkerInfo> ShardGroup::workers() const {
  absl::MutexLock lock(&info_mu_);
  return info_;
}

int64_t ShardGroup::restarts() const {
  absl::MutexLock lock(&info_mu_);
  return restarts_;
}

}  // namespace kvd::worker
