// Aggregate decode throughput of the continuous-batching Scheduler with 1, 8
// and 16 concurrent sequences on SmolLM2-135M. Each sequence is a
// thread calling Scheduler::Run with its own short random prompt and 64
// greedy tokens (EOG ignored); the figure is every generated token divided
// by the wall time from the first Run to the last return, so it includes the
// short prefills. No timing is asserted anywhere.
//
//   bazel run -c opt //services/engine:scheduler_benchmark -- [fp32|bf16]
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/model_dir.h"
#include "ops/model/model.h"
#include "ops/tokenizer/gguf_tokenizer.h"
#include "services/engine/scheduler.h"

namespace kvd::engine {
namespace {

constexpr char kModelFile[] = "SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr int kPromptTokens = 32;
constexpr int kNewTokens = 64;

int Main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "bf16";
  ops::LoadOptions load;
  load.precision =
      mode == "fp32" ? ops::Precision::kF32 : ops::Precision::kBf16;
  absl::StatusOr<std::unique_ptr<ops::Model>> model =
      ops::Model::Load(CachedModelPath(kModelFile), load);
  if (!model.ok()) {
    std::fprintf(stderr, "%s (run tools/fetch_models.sh)\n",
                 std::string(model.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<ops::Tokenizer>> tokenizer =
      ops::TokenizerFromGguf((*model)->file());
  if (!tokenizer.ok()) return 1;
  std::printf(
      "| precision | threads | sequences | tokens | wall s | "
      "aggregate tok/s | largest batch |\n|---|---|---|---|---|---|---|\n");
  for (int n : {1, 8, 16}) {
    Scheduler scheduler(**model, {.max_running = 16});
    std::vector<int64_t> generated(n, 0);
    std::vector<std::thread> threads;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        std::mt19937 rng(1000 + i);
        GenerateRequest r;
        for (int t = 0; t < kPromptTokens; ++t)
          r.prompt.push_back(rng() % (*model)->config().vocab_size);
        r.max_tokens = kNewTokens;
        r.ignore_eos = true;
        r.sampling.temperature = 0;
        ops::KvCache cache = (*model)->NewCache();
        absl::StatusOr<GenerateResult> g =
            scheduler.Run(**tokenizer, r, &cache, nullptr);
        if (g.ok()) generated[i] = g->tokens.size();
      });
    }
    for (std::thread& t : threads) t.join();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    int64_t total = 0;
    for (int64_t g : generated) total += g;
    std::printf("| %s | %d | %d | %lld | %.2f | %.1f | %lld |\n", mode.c_str(),
                (*model)->pool()->num_threads(), n,
                static_cast<long long>(total), wall, total / wall,
                static_cast<long long>(scheduler.stats().max_batch_sequences));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace kvd::engine

int main(int argc, char** argv) { return kvd::engine::Main(argc, argv); }
