#include "services/node/runtime.h"

#include <chrono>
#include <filesystem>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/model/fingerprint.h"
#include "ops/tokenizer/gguf_tokenizer.h"
#include "services/planner/auto_policy.h"

namespace kvd::node {

absl::StatusOr<std::unique_ptr<storage::TieredStore>> NodeRuntime::OpenStore(
    const NodeOptions& options) {
  if (options.data_dir.empty())
    return absl::InvalidArgumentError("no data directory given");
  std::error_code ec;
  std::filesystem::create_directories(options.data_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the data directory ", options.data_dir,
                     ": ", ec.message(), "; choose a writable one"));
  }
  storage::SessionDbOptions db_options;
  db_options.path = absl::StrCat(options.data_dir, "/sessions");
  db_options.durability = options.durability;
  db_options.disk_space = options.disk_space_for_test;
  storage::TieredStoreOptions store_options;
  store_options.commit_mode = options.memory_commits
                                  ? storage::CommitMode::kMemory
                                  : storage::CommitMode::kWriteThrough;
  store_options.dram.budget_bytes = options.dram_budget_bytes;
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<storage::SessionDb> db,
                       storage::SessionDb::Open(db_options));
  return storage::TieredStore::Create(std::move(db), store_options);
}

absl::Status NodeRuntime::StartShardGroup(const NodeOptions& options) {
  if (options.tensor_parallel.simulate) {
    return absl::InvalidArgumentError(
        "--tensor-parallel-simulate is for GPU shards; CPU shards are "
        "processes");
  }
  worker::ShardGroupOptions so;
  so.model_path = options.model_path;
  so.degree = options.tensor_parallel.degree;
  so.threads_per_shard = options.num_threads;
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<worker::ShardGroup> group,
                       worker::ShardGroup::Start(*model_, so));
  std::string pids;
  for (const worker::ShardWorkerInfo& w : group->workers())
    absl::StrAppend(&pids, pids.empty() ? "" : ", ", w.pid);
  shard_group_ = group.get();
  backend_.kind = ops::Backend::kCpu;
  backend_.owned = std::move(group);
  backend_.backend = backend_.owned.get();
  backend_.notice = absl::StrCat(
      "kvd: tensor parallel over ", so.degree,
      " CPU shards: this process (shard 0) and 'kvd worker' processes ", pids,
      " (UCX)");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NodeRuntime>> NodeRuntime::Open(
    const NodeOptions& options, const std::function<void(int, int)>& progress) {
  std::unique_ptr<NodeRuntime> rt(new NodeRuntime());
  rt->model_path_ = options.model_path;
  rt->create_sessions_on_first_use_ = options.create_sessions_on_first_use;
  KVD_ASSIGN_OR_RETURN(rt->store_, OpenStore(options));
  ops::LoadOptions load;
  load.precision = options.precision;
  load.num_threads = options.num_threads;
  if (progress) load.progress = progress;
  const auto start = std::chrono::steady_clock::now();
  KVD_ASSIGN_OR_RETURN(rt->model_, ops::Model::Load(options.model_path, load));
  if (!rt->model_->has_gguf()) {
    return absl::UnimplementedError(absl::StrCat(
        options.model_path,
        " is a Hugging Face checkpoint; serving needs its tokenizer, which is "
        "only read from GGUF files so far"));
  }
  KVD_ASSIGN_OR_RETURN(rt->tokenizer_,
                       ops::TokenizerFromGguf(rt->model_->file()));
  std::optional<std::string_view> jinja;
  if (const ops::GgufValue* v =
          rt->model_->file().Find("tokenizer.chat_template")) {
    jinja = v->AsString();
  }
  absl::StatusOr<ops::ChatTemplate> tmpl =
      ops::ChatTemplate::Detect(rt->model_->file().architecture(), jinja);
  if (tmpl.ok()) rt->chat_template_ = std::move(*tmpl);
  KVD_ASSIGN_OR_RETURN(std::string fingerprint,
                       ops::FingerprintModelFiles(options.model_path));
  rt->load_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  rt->model_id_ =
      options.model_id.empty() ? rt->model_->config().name : options.model_id;
  // The options are checked before a GPU backend uploads the weights; the
  // engine checks them again against the backend it gets.
  KVD_RETURN_IF_ERROR(
      engine::SessionEngine::ValidateOptions(*rt->model_, options.engine));
  if (options.backend == ops::BackendRequest::kCpu &&
      options.tensor_parallel.degree > 1) {
    KVD_RETURN_IF_ERROR(rt->StartShardGroup(options));
  } else {
    KVD_ASSIGN_OR_RETURN(rt->backend_,
                         ops::OpenBackend(options.backend, *rt->model_,
                                          options.tensor_parallel));
  }
  engine::SessionEngineOptions engine_options = options.engine;
  // Measured on the host model, before another backend takes its weights.
  if (options.auto_policy &&
      options.engine.hot_budget != ops::ResidualKvSource::kAll) {
    // Only kv-direct sessions keep a bounded number of K/V rows in memory.
    engine_options.policy = ops::CheckpointPolicy{};
    rt->policy_notice_ =
        "kvd: policy auto: kv-direct (the only policy a bounded --hot-budget "
        "applies to)";
    rt->policy_measured_now_ = true;
  } else if (options.auto_policy) {
    planner::AutoPolicyOptions auto_options;
    auto_options.calibration_path =
        (std::filesystem::path(options.data_dir) / "calibration.json").string();
    auto_options.storage_dir = options.data_dir;
    auto_options.tokens = options.auto_policy_tokens;
    auto_options.kv_candidate = rt->backend_.backend->KvRowAccess().ok();
    absl::StatusOr<planner::AutoPolicy> chosen =
        planner::ChooseCheckpointPolicy(*rt->model_, auto_options);
    if (chosen.ok()) {
      engine_options.policy = chosen->policy;
      rt->policy_notice_ = "kvd: " + chosen->summary;
      rt->policy_measured_now_ = chosen->measured_now;
    } else {
      engine_options.policy = ops::CheckpointPolicy{};  // kv-direct
      rt->policy_notice_ = absl::StrCat(
          "kvd: policy auto could not measure this machine (",
          chosen.status().message(), "); new sessions use kv-direct");
      rt->policy_measured_now_ = true;
    }
  }
  rt->policy_ = engine_options.policy;
  // A GPU backend or a shard group holds its own copy of the weights.
  if (rt->backend_.kind == ops::Backend::kCuda || rt->shard_group_ != nullptr)
    rt->model_->ReleaseWeights();
  const ops::ModelBackend& backend = *rt->backend_.backend;
  KVD_ASSIGN_OR_RETURN(
      rt->engine_, engine::SessionEngine::Create(
                       backend, engine::ModelIdentityOf(backend, fingerprint),
                       rt->store_.get(), engine_options));
  if (options.trim_free_memory) {
    rt->trimmer_ = std::make_unique<MemoryTrimmer>(MemoryTrimmerOptions{});
  }
  return rt;
}

}  // namespace kvd::node
