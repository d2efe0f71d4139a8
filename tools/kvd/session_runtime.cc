#include "tools/kvd/session_runtime.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "ops/backend/open_backend.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "tools/kvd/backend_flag.h"
#include "tools/kvd/model_source.h"
#include "tools/kvd/progress.h"

namespace kvd::cli {

std::string DefaultDataDir() {
  if (const char* d = std::getenv("KVD_DATA_DIR"); d != nullptr && *d) return d;
  if (const char* x = std::getenv("XDG_DATA_HOME"); x != nullptr && *x)
    return absl::StrCat(x, "/kvd");
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr ? home : ".", "/.local/share/kvd");
}

void DeclareModelFlags(Args& a) {
  a.Flag("model", "smollm2",
         "GGUF file, or a cached model name: smollm2, gemma3");
  DeclarePrecisionFlag(a);
  a.Flag("threads", "0", "worker threads; 0 = all cores");
  DeclareBackendFlag(a);
}

void DeclareStoreFlags(Args& a) {
  a.Flag("data-dir", DefaultDataDir(),
         "where sessions are stored (RocksDB under DATA_DIR/sessions); "
         "default from $KVD_DATA_DIR or $XDG_DATA_HOME");
  a.Flag("tenant", "local", "owner of the sessions");
  a.Flag("durability", "sync",
         "sync: a turn is on disk (fsync) before it is acknowledged; wal: "
         "written to the log, survives a process crash but not power loss; "
         "memory: kept in DRAM and written later, lost on a crash");
  a.Flag("dram-budget-mb", "1024",
         "host-DRAM bytes for cached session checkpoints (MiB)");
}

void DeclareSessionFlags(Args& a) {
  a.Flag("policy", "auto",
         "what new sessions checkpoint: auto (default: the planner picks the "
         "fastest to resume from this machine's measured rates, measured "
         "once, in about 2 s, into DATA_DIR/calibration.json; "
         "docs/PLANNER.md; kv for both models kvd ships), kv-direct "
         "(residual at every layer: moves between tensor-parallel degrees, "
         "and a bounded --hot-budget keeps memory flat), stride:K (every "
         "K-th layer), kv (the K/V rows themselves: no compute to resume, "
         "smaller than residuals on GQA models), or tokens (token ids only: "
         "resume re-prefills)");
  a.Flag("hot-budget", "all",
         "K/V rows kept in memory per kv-direct session; older ones are "
         "recomputed from residuals. 'all' keeps every row");
  a.Flag("chunk-tokens", "64", "positions per stored chunk");
  a.Flag("kv-pool-mb", "1024",
         "K/V block pool shared by every running and hot session (MiB, "
         "taken as sessions need it): sessions stay hot between turns while "
         "it has room (SmolLM2: ~45k positions in bf16, ~23k in fp32), and "
         "a full pool demotes the least recently used idle ones to their "
         "checkpoints, then refuses work with RESOURCE_EXHAUSTED / 429. 0 = "
         "no limit");
  a.Flag("max-hot-sessions", "1024",
         "idle sessions whose K/V stay in memory between turns, least "
         "recently used demoted first; the pool's bytes bound them too");
  a.Flag("node-id", "",
         "this node's name as the owner of the sessions it commits (a "
         "cluster sets it); empty = a standalone node. A session owned by "
         "another node is refused (it moved), never overwritten");
}

absl::StatusOr<node::NodeOptions> NodeOptionsFromFlags(const Args& args) {
  node::NodeOptions o;
  o.data_dir = args.Get("data-dir");
  const std::string durability = args.Get("durability");
  if (durability == "sync") {
    o.durability = storage::Durability::kSync;
  } else if (durability == "wal") {
    o.durability = storage::Durability::kWal;
  } else if (durability == "memory") {
    o.durability = storage::Durability::kWal;
    o.memory_commits = true;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--durability must be sync, wal or memory, not '", durability, "'"));
  }
  KVD_ASSIGN_OR_RETURN(int64_t budget_mb, args.GetInt("dram-budget-mb"));
  if (budget_mb < 0 || budget_mb > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        "--dram-budget-mb must be between 0 and 16777216");
  }
  o.dram_budget_bytes = budget_mb << 20;
  return o;
}

namespace {

absl::Status AddModelAndSessionFlags(const Args& args, node::NodeOptions& o) {
  KVD_ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads"));
  if (threads < 0 || threads > 1024)
    return absl::InvalidArgumentError("--threads must be between 0 and 1024");
  o.num_threads = static_cast<int>(threads);
  if (args.Get("policy") == "auto") {
    o.auto_policy = true;
  } else {
    KVD_ASSIGN_OR_RETURN(o.engine.policy,
                         ops::ParseCheckpointPolicy(args.Get("policy")));
  }
  if (args.Get("hot-budget") != "all") {
    KVD_ASSIGN_OR_RETURN(o.engine.hot_budget, args.GetInt("hot-budget"));
    if (o.engine.hot_budget < 0) {
      return absl::InvalidArgumentError(
          "--hot-budget must be 'all' or a number of tokens >= 0");
    }
  }
  KVD_ASSIGN_OR_RETURN(int64_t pool_mb, args.GetInt("kv-pool-mb"));
  if (pool_mb < 0 || pool_mb > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        "--kv-pool-mb must be between 0 and 16777216");
  }
  o.engine.kv_pool_bytes = pool_mb << 20;
  KVD_ASSIGN_OR_RETURN(o.engine.max_hot_sessions,
                       args.GetIntIn("max-hot-sessions", 0, 1 << 20));
  KVD_ASSIGN_OR_RETURN(o.engine.chunk_tokens, args.GetInt("chunk-tokens"));
  if (o.engine.chunk_tokens < 1 || o.engine.chunk_tokens > 65536) {
    return absl::InvalidArgumentError(
        "--chunk-tokens must be between 1 and 65536");
  }
  o.engine.node_id = args.Get("node-id");
  if (!o.engine.node_id.empty()) {
    KVD_RETURN_IF_ERROR(storage::ValidateName("--node-id", o.engine.node_id));
  }
  KVD_ASSIGN_OR_RETURN(o.model_path, ResolveModel(args.Get("model")));
  // The name clients send as "model": what the user called it (smollm2,
  // gemma3, or the file name without its directory and extension).
  std::string id = args.Get("model");
  if (const size_t slash = id.find_last_of('/'); slash != std::string::npos)
    id = id.substr(slash + 1);
  if (id.size() > 5 && id.substr(id.size() - 5) == ".gguf")
    id = id.substr(0, id.size() - 5);
  o.model_id = id;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<storage::TieredStore>> OpenStore(
    const Args& args) {
  KVD_ASSIGN_OR_RETURN(node::NodeOptions o, NodeOptionsFromFlags(args));
  return node::NodeRuntime::OpenStore(o);
}

absl::StatusOr<std::unique_ptr<node::NodeRuntime>> OpenSessionRuntime(
    const Args& args, bool show_progress,
    const std::function<absl::Status(node::NodeOptions&)>& adjust) {
  KVD_ASSIGN_OR_RETURN(node::NodeOptions o, NodeOptionsFromFlags(args));
  if (adjust) KVD_RETURN_IF_ERROR(adjust(o));
  KVD_RETURN_IF_ERROR(AddModelAndSessionFlags(args, o));
  KVD_ASSIGN_OR_RETURN(o.backend, BackendRequestFromFlag(args));
  KVD_ASSIGN_OR_RETURN(o.tensor_parallel, TensorParallelFromFlags(args));
  KVD_ASSIGN_OR_RETURN(const PrecisionChoice precision,
                       PrecisionFromFlags(args));
  o.precision = precision.precision;
  KVD_RETURN_IF_ERROR(ops::PrecheckBackend(o.backend, o.tensor_parallel));
  ProgressBar bar("loading " + o.model_path, show_progress);
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<node::NodeRuntime> rt,
                       node::NodeRuntime::Open(o, [&bar](int done, int total) {
                         bar.Update(done, total);
                       }));
  bar.Finish();
  if (!rt->backend_notice().empty())
    std::fprintf(stderr, "%s\n", rt->backend_notice().c_str());
  // Said once, when the machine was measured; later starts read the file.
  if (rt->policy_measured_now())
    std::fprintf(stderr, "%s\n", rt->policy_notice().c_str());
  return rt;
}

}  // namespace kvd::cli
