// `kvd worker`: one shard of a CPU tensor-parallel node
// (services/worker/shard_worker.h). Its leader, `kvd serve
// --tensor-parallel-size N --backend cpu`, starts N - 1 of them itself;
// there is no reason to run one by hand.
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "ops/model/model_config.h"
#include "services/worker/shard_worker.h"
#include "tools/kvd/args.h"
#include "tools/kvd/commands.h"

namespace kvd::cli {
namespace {

absl::Status Run(const Args& args) {
  worker::ShardWorkerOptions o;
  o.model_path = args.Get("model");
  KVD_ASSIGN_OR_RETURN(o.precision, ops::ParsePrecision(args.Get("precision")));
  KVD_ASSIGN_OR_RETURN(int64_t degree,
                       args.GetIntIn("tensor-parallel-size", 2, 64));
  KVD_ASSIGN_OR_RETURN(int64_t rank, args.GetIntIn("rank", 1, degree - 1));
  KVD_ASSIGN_OR_RETURN(int64_t threads, args.GetIntIn("threads", 1, 1024));
  KVD_ASSIGN_OR_RETURN(int64_t timeout, args.GetIntIn("timeout-s", 1, 86400));
  o.degree = static_cast<int>(degree);
  o.rank = static_cast<int>(rank);
  o.threads = static_cast<int>(threads);
  o.timeout = absl::Seconds(timeout);
  o.leader_inbox_hex = args.Get("leader");
  o.transport_tls = args.Get("transport-tls");
  return worker::RunShardWorker(o);
}

}  // namespace

int WorkerCommand(const std::vector<std::string>& argv) {
  Args args("kvd worker",
            "One tensor-parallel shard of a CPU node: its heads' slice of "
            "attention, its slice of the MLP and its own K/V rows, in "
            "lockstep with the other shards. Started by 'kvd serve "
            "--tensor-parallel-size N --backend cpu' (N - 1 of them); not "
            "meant to be run by hand.");
  args.Flag("leader", "", "the leader's inbox for this worker (hex)");
  args.Flag("rank", "1", "this shard's rank, 1 .. size - 1 (0 is the leader)");
  args.Flag("tensor-parallel-size", "2", "shards in the group");
  args.Flag("model", "", "the GGUF file the leader serves");
  args.Flag("precision", "bf16", "the leader's --precision");
  args.Flag("threads", "1", "compute threads of this shard");
  args.Flag("timeout-s", "30",
            "how long a cross-shard sum waits for the other shards");
  args.Flag("transport-tls", "tcp", "UCX transports (UCX_TLS syntax)");
  return args.Main(argv, Run);
}

}  // namespace kvd::cli
