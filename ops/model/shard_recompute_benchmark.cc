// What a tensor-parallel shard pays to resume a session from its residual
// checkpoint: every shard receives the whole checkpoint (the residuals are
// replicated) and recomputes only its own K/V heads. Prints, for a 4k-token
// SmolLM2-135M session in bf16, the residual bytes each shard receives and
// the time one shard (one thread) takes to recompute its K/V for every
// layer, at TP = 1 and TP = 3.
//
//   bazel run -c opt //ops/model:shard_recompute_benchmark [-- TOKENS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "base/model_dir.h"
#include "ops/model/model.h"
#include "ops/model/shard_reducer.h"

namespace kvd::ops {
namespace {

double RecomputeSeconds(const Model& m, const std::vector<float>& h,
                        const std::vector<int64_t>& pos) {
  const int64_t n = pos.size();
  const size_t row = m.NewCache().row_bytes();
  std::vector<uint8_t> k(n * row), v(n * row);
  double best = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t l = 0; l < m.config().n_layers; ++l) {
      absl::Status s =
          m.RecomputeKv(l, h.data(), pos.data(), n, k.data(), v.data());
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        std::exit(1);
      }
    }
    best = std::min(best, std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - t0)
                              .count());
  }
  return best;
}

int Main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 4096;
  LoadOptions o;
  o.precision = Precision::kBf16;
  o.num_threads = 1;
  absl::StatusOr<std::unique_ptr<Model>> full =
      Model::Load(CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf"), o);
  if (!full.ok()) {
    std::fprintf(stderr, "%s\n", full.status().ToString().c_str());
    return 1;
  }
  const ModelConfig& c = (*full)->config();
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> h(n * c.d_model);
  for (float& x : h) {
    x = u(rng);
    uint32_t b;
    std::memcpy(&b, &x, 4);
    b &= 0xffff0000u;  // bf16 residuals, as the bf16 mode stores them
    std::memcpy(&x, &b, 4);
  }
  std::vector<int64_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = i;
  const double bytes = static_cast<double>(n) * c.n_layers * c.d_model * 2;
  std::printf("SmolLM2-135M bf16, %lld tokens, one thread per shard\n\n",
              static_cast<long long>(n));
  std::printf(
      "| TP | residual MiB each shard receives | K/V heads per shard | "
      "recompute s per shard | vs TP=1 |\n|---:|---:|---:|---:|---:|\n");
  const double one = RecomputeSeconds(**full, h, pos);
  std::printf("| 1 | %.1f | %lld | %.2f | 1.00 |\n", bytes / (1 << 20),
              static_cast<long long>(c.n_kv_heads), one);
  ThreadShardReducer reducer(3);
  absl::StatusOr<std::unique_ptr<Model>> shard =
      Model::ShardOf(**full, 0, 3, &reducer, 1);
  if (!shard.ok()) return 1;
  const double three = RecomputeSeconds(**shard, h, pos);
  std::printf("| 3 | %.1f | %lld | %.2f | %.2f |\n", bytes / (1 << 20),
              static_cast<long long>((*shard)->config().n_kv_heads), three,
              three / one);
  return 0;
}

}  // namespace
}  // namespace kvd::ops

int main(int argc, char** argv) { return kvd::ops::Main(argc, argv); }
