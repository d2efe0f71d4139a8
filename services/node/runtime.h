// One node's serving state: the model, its tokenizer and chat template, the
// tiered session store under a data directory, and the SessionEngine over
// them. `kvd chat` builds one in-process; `kvd serve` builds one and puts the
// gRPC and HTTP front ends on it.
//
//   NodeOptions options;                      // defaults run on a laptop
//   options.model_path = "/models/smollm2.gguf";
//   KVD_ASSIGN_OR_RETURN(std::unique_ptr<NodeRuntime> node,
//                        NodeRuntime::Open(options, /*progress=*/nullptr));
//   node->engine().RunTurn(...);
//
// Thread-safety: members are as thread-safe as their types (the model,
// tokenizer and template are immutable; store and engine are thread-safe).
#ifndef KVD_SERVICES_NODE_RUNTIME_H_
#define KVD_SERVICES_NODE_RUNTIME_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "ops/backend/open_backend.h"
#include "ops/chat/chat_template.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/model/model.h"
#include "ops/tokenizer/tokenizer.h"
#include "services/engine/session_engine.h"
#include "services/node/memory_trimmer.h"
#include "services/worker/shard_group.h"
#include "storage/rocksdb/session_db.h"
#include "storage/tiered/tiered_store.h"

namespace kvd::node {

struct NodeOptions {
  std::string model_path;  // a GGUF file
  // The name clients use for the model (/v1/models); empty: the file's
  // general.name.
  std::string model_id;
  ops::Precision precision = ops::Precision::kBf16;
  int num_threads = 0;   // 0 = all cores
  std::string data_dir;  // sessions live in data_dir/sessions
  storage::Durability durability = storage::Durability::kSync;
  bool memory_commits = false;  // storage::CommitMode::kMemory
  int64_t dram_budget_bytes = int64_t{1} << 30;
  engine::SessionEngineOptions engine;
  // `--policy auto`: engine.policy is chosen at start by the rebuild planner
  // from this machine's measured rates (services/planner/auto_policy.h),
  // cached in data_dir/calibration.json; policy_notice() says what it chose.
  bool auto_policy = false;
  int64_t auto_policy_tokens = 4096;  // session length planned for
  // Which backend runs the engine (ops/backend/open_backend.h); the notice
  // saying why the CPU, or which device, is backend_notice().
  ops::BackendRequest backend = ops::BackendRequest::kCpu;
  // Tensor-parallel shards (above 1: a CUDA backend over several GPUs, or
  // simulated on one; with backend kCpu, this process as shard 0 and
  // degree - 1 `kvd worker` processes, services/worker/shard_group.h).
  ops::TensorParallelRequest tensor_parallel;
  // Return memory malloc keeps free to the kernel every few seconds
  // (memory_trimmer.h), so resident memory tracks the budgets above.
  bool trim_free_memory = true;
  // Whether a turn for an unknown session starts it (HTTP's session_id, as
  // users of a standalone server expect), or is NOT_FOUND until the session
  // is created (CreateSession): a node in a cluster creates only what the
  // directory assigned to it.
  bool create_sessions_on_first_use = true;
  // Test hook: the data disk's size and free space, as the session database
  // sees them (storage::SessionDbOptions::disk_space); null = the real disk.
  std::function<absl::StatusOr<storage::DiskSpace>(const std::string&)>
      disk_space_for_test;
};

class NodeRuntime {
 public:
  // Opens the store (creating data_dir), loads the model, fingerprints it.
  // `progress` (may be null) sees model-load progress.
  static absl::StatusOr<std::unique_ptr<NodeRuntime>> Open(
      const NodeOptions& options,
      const std::function<void(int done, int total)>& progress);

  // Opens only the session store (for offline tools: no model).
  static absl::StatusOr<std::unique_ptr<storage::TieredStore>> OpenStore(
      const NodeOptions& options);

  // The loaded model on the host: its config, GGUF file and tokenizer data.
  // The engine runs on backend(), which is this model for the CPU backend.
  const ops::Model& model() const { return *model_; }
  const ops::ModelBackend& backend() const { return *backend_.backend; }
  // One line for the user about the backend choice, or empty.
  const std::string& backend_notice() const { return backend_.notice; }
  // With NodeOptions::auto_policy: the policy chosen and why; and whether it
  // measured this machine now (first start) rather than reading the file.
  const std::string& policy_notice() const { return policy_notice_; }
  bool policy_measured_now() const { return policy_measured_now_; }
  const ops::CheckpointPolicy& policy() const { return policy_; }
  const ops::Tokenizer& tokenizer() const { return *tokenizer_; }
  // None for models without a recognised chat template: raw prompts only.
  const std::optional<ops::ChatTemplate>& chat_template() const {
    return chat_template_;
  }
  storage::TieredStore& store() { return *store_; }
  engine::SessionEngine& engine() { return *engine_; }
  const std::string& model_id() const { return model_id_; }
  const std::string& model_path() const { return model_path_; }
  double load_seconds() const { return load_seconds_; }
  bool create_sessions_on_first_use() const {
    return create_sessions_on_first_use_;
  }
  // The CPU tensor-parallel shard group the engine runs on; null unless
  // tensor_parallel.degree > 1 with the CPU backend.
  const worker::ShardGroup* shard_group() const { return shard_group_; }
  // Null when NodeOptions::trim_free_memory is off.
  const MemoryTrimmer* memory_trimmer() const { return trimmer_.get(); }

 private:
  NodeRuntime() = default;
  // backend_ as a ShardGroup of model_ (the CPU with tensor_parallel).
  absl::Status StartShardGroup(const NodeOptions& options);

  std::unique_ptr<ops::Model> model_;
  ops::OpenedBackend backend_;  // may own a GPU backend made from model_
  const worker::ShardGroup* shard_group_ = nullptr;  // owned by backend_
  std::unique_ptr<ops::Tokenizer> tokenizer_;
  std::optional<ops::ChatTemplate> chat_template_;
  std::unique_ptr<storage::TieredStore> store_;
  std::unique_ptr<engine::SessionEngine> engine_;  // uses the others
  std::unique_ptr<MemoryTrimmer> trimmer_;
  std::string model_id_, model_path_;
  double load_seconds_ = 0;
  std::string policy_notice_;
  bool policy_measured_now_ = false;
  ops::CheckpointPolicy policy_;
  bool create_sessions_on_first_use_ = true;
};

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_RUNTIME_H_
