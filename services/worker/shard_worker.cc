#include "services/worker/shard_worker.h"

#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "ops/model/model.h"
#include "proto/kvd/v1/shard_worker.pb.h"
#include "services/collective/ordered_all_reduce.h"
#include "services/transport/ucx_transport.h"
#include "services/worker/collective_shard_reducer.h"
#include "services/worker/worker_protocol.h"

namespace kvd::worker {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The commands' side of one worker: its shard, its twins and its counters.
class Worker {
 public:
  Worker(const ops::Model& shard)
      : shard_(shard), twins_(shard.config(), shard.precision()) {}

  // Runs one command (its cache ops first); the reply's status says how it
  // went. A failure is sticky: the leader rebuilds the group after one.
  void Run(const v1::WorkerCommand& command, v1::WorkerReply* reply) {
    reply->set_id(command.id());
    absl::Status status = failed_;
    if (status.ok()) status = Execute(command);
    if (!status.ok() && failed_.ok()) failed_ = status;
    SetReplyStatus(status, reply);
    stats_.set_caches(twins_.size());
    stats_.set_kv_bytes(static_cast<int64_t>(twins_.kv_bytes()));
    *reply->mutable_stats() = stats_;
  }

 private:
  absl::Status Execute(const v1::WorkerCommand& command) {
    for (const v1::CacheOp& op : command.cache_ops()) {
      KVD_RETURN_IF_ERROR(twins_.Apply(op));
    }
    const int64_t d = shard_.config().d_model;
    switch (command.op_case()) {
      case v1::WorkerCommand::kForward: {
        const auto start = Clock::now();
        std::vector<std::vector<int32_t>> tokens;
        std::vector<ops::SequenceStep> steps;
        tokens.reserve(command.forward().sequences_size());
        for (const v1::ForwardSequence& s : command.forward().sequences()) {
          KVD_ASSIGN_OR_RETURN(ops::KvCache * cache, twins_.Find(s.cache()));
          KVD_ASSIGN_OR_RETURN(tokens.emplace_back(), DecodeTokens(s.tokens()));
          ops::SequenceStep step;
          step.cache = cache;
          step.tokens = tokens.back();
          step.logits = ops::LogitsMode::kNone;  // the leader samples
          steps.push_back(step);
        }
        ops::ForwardOutput out;
        KVD_RETURN_IF_ERROR(shard_.Forward(steps, &out));
        stats_.set_forward_steps(stats_.forward_steps() + 1);
        stats_.set_forward_seconds(stats_.forward_seconds() +
                                   SecondsSince(start));
        return absl::OkStatus();
      }
      case v1::WorkerCommand::kForwardLayers: {
        const auto& f = command.forward_layers();
        KVD_ASSIGN_OR_RETURN(ops::KvCache * cache, twins_.Find(f.cache()));
        std::vector<float> h;
        KVD_RETURN_IF_ERROR(DecodeResiduals(f.h(), f.n(), d, &h));
        const auto start = Clock::now();
        KVD_RETURN_IF_ERROR(shard_.ForwardLayers(cache, f.position(), f.n(),
                                                 f.first_layer(), f.end_layer(),
                                                 h.data()));
        CountRecompute(f.h().data().size(),
                       f.n() * (f.end_layer() - f.first_layer()), start);
        return absl::OkStatus();
      }
      case v1::WorkerCommand::kRecompute: {
        const auto& r = command.recompute();
        KVD_ASSIGN_OR_RETURN(ops::KvCache * cache, twins_.Find(r.cache()));
        std::vector<float> h;
        KVD_RETURN_IF_ERROR(DecodeResiduals(r.residuals(), r.n(), d, &h));
        const auto start = Clock::now();
        KVD_RETURN_IF_ERROR(shard_.RecomputeKvIntoCache(
            r.layer(), h.data(), r.position(), r.n(), cache));
        CountRecompute(r.residuals().data().size(), r.n(), start);
        return absl::OkStatus();
      }
      case v1::WorkerCommand::kSync:
      case v1::WorkerCommand::kShutdown:
        return absl::OkStatus();
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "shard worker: unexpected command ", command.op_case()));
    }
  }

  // A recompute from `bytes` of residuals that wrote `rows` layer rows.
  void CountRecompute(size_t bytes, int64_t rows, Clock::time_point start) {
    stats_.set_residual_bytes_received(stats_.residual_bytes_received() +
                                       bytes);
    stats_.set_rows_recomputed(stats_.rows_recomputed() + rows);
    stats_.set_recompute_seconds(stats_.recompute_seconds() +
                                 SecondsSince(start));
  }

  const ops::Model& shard_;
  TwinCaches twins_;
  v1::WorkerStats stats_;
  absl::Status failed_;
};

}  // namespace

absl::Status RunShardWorker(const ShardWorkerOptions& options) {
  if (options.degree < 2 || options.rank < 1 ||
      options.rank >= options.degree) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvd worker: --rank must be in [1, ", options.degree,
                     ") (rank 0 is the leader); got ", options.rank));
  }
  const std::string& hex = options.leader_inbox_hex;
  const bool is_hex =
      !hex.empty() && hex.size() % 2 == 0 &&
      hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
  const std::string leader = is_hex ? absl::HexStringToBytes(hex) : "";
  if (leader.empty()) {
    return absl::InvalidArgumentError(
        "kvd worker: --leader must be the hex address its leader gave");
  }
  transport::UcxOptions uo;
  uo.tls = options.transport_tls;
  uo.send_timeout = options.timeout;
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<transport::UcxTransport> ucx,
                       transport::UcxTransport::Create(uo));
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<collective::OrderedAllReduce> all_reduce,
                       collective::OrderedAllReduce::Create(
                           ucx.get(), options.rank, options.degree));
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<transport::ChunkReceiver> commands,
                       ucx->Listen({.max_chunk_bytes = int64_t{1} << 30}));

  // The model first: the leader waits for the hello, not for the load.
  ops::LoadOptions lo;
  lo.precision = options.precision;
  lo.num_threads = options.threads;
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<ops::Model> full,
                       ops::Model::Load(options.model_path, lo));
  CollectiveShardReducer reducer(all_reduce.get(), options.timeout);
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<ops::Model> shard,
                       ops::Model::ShardOf(*full, options.rank, options.degree,
                                           &reducer, options.threads));
  full.reset();  // a worker keeps only its slice

  KVD_ASSIGN_OR_RETURN(std::unique_ptr<transport::ChunkSender> replies,
                       ucx->Connect(leader));
  v1::WorkerHello hello;
  hello.set_rank(options.rank);
  hello.set_command_inbox(commands->address());
  hello.set_pid(getpid());
  for (int p = 0; p < options.degree; ++p)
    hello.add_all_reduce_inboxes(all_reduce->InboxFor(p));
  KVD_RETURN_IF_ERROR(replies->Send(hello.SerializeAsString()));

  Worker worker(*shard);
  std::string chunk;
  bool connected = false;
  const pid_t parent = getppid();
  while (true) {
    absl::StatusOr<bool> more =
        commands->Receive(&chunk, absl::Now() + absl::Seconds(1));
    if (absl::IsDeadlineExceeded(more.status())) {
      // An idle leader, or a dead one: a worker is its leader's child, and
      // an orphan has nothing left to serve.
      if (getppid() != parent) {
        return absl::UnavailableError("the leader process is gone");
      }
      continue;
    }
    if (!more.ok()) return more.status();
    if (!*more) return absl::OkStatus();  // the leader closed the stream
    v1::WorkerCommand command;
    v1::WorkerReply reply;
    if (!command.ParseFromString(chunk)) {
      reply.set_id(-1);
      SetReplyStatus(absl::InvalidArgumentError("unreadable command"), &reply);
    } else if (command.has_connect()) {
      reply.set_id(command.id());
      std::vector<std::string> inboxes(
          command.connect().all_reduce_inboxes().begin(),
          command.connect().all_reduce_inboxes().end());
      absl::Status s = connected
                           ? absl::FailedPreconditionError("connected twice")
                           : all_reduce->Connect(inboxes);
      connected = s.ok();
      SetReplyStatus(s, &reply);
    } else {
      worker.Run(command, &reply);
    }
    KVD_RETURN_IF_ERROR(replies->Send(reply.SerializeAsString()));
    // No Close: it would wait for a leader that is no longer reading.
    if (command.has_shutdown()) return absl::OkStatus();
  }
}

}  // namespace kvd::worker
