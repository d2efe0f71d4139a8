// A shard worker: one process holding shard `rank` of a CPU tensor-parallel
// model (`kvd worker`, started by its leader, services/worker/shard_group.h).
// It loads the model, keeps its heads' slice (ops::Model::ShardOf), says
// hello on the stream whose address it was given, and then runs the leader's
// commands (proto/kvd/v1/shard_worker.proto) until told to stop or the
// leader is gone: twins of the leader's K/V caches holding its own heads'
// rows, forward steps in lockstep with the other shards (joined by the
// ordered all-reduce), and K/V recomputes from the residual rows the leader
// streams to it. No logits are computed here: the leader samples.
#ifndef KVD_SERVICES_WORKER_SHARD_WORKER_H_
#define KVD_SERVICES_WORKER_SHARD_WORKER_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ops/model/model_config.h"

namespace kvd::worker {

struct ShardWorkerOptions {
  std::string model_path;
  ops::Precision precision = ops::Precision::kBf16;
  int rank = 1;
  int degree = 2;
  int threads = 1;
  // The leader's inbox for this worker (hex of its transport address).
  std::string leader_inbox_hex;
  // How long a cross-shard sum waits for the other shards.
  absl::Duration timeout = absl::Seconds(30);
  std::string transport_tls = "tcp";
};

// Runs until the leader says shutdown (OK) or goes away (UNAVAILABLE);
// an error before the hello (the model, the transport) is returned too.
absl::Status RunShardWorker(const ShardWorkerOptions& options);

}  // namespace kvd::worker

#endif  // KVD_SERVICES_WORKER_SHARD_WORKER_H_
