// Canonical attention over contiguous vs paged K/V (ops/model/kv_cache.h's
// layout: rows in blocks of block_rows, K then V per block), at decode (one
// query) and prefill (a 64-query block) shapes of SmolLM2-135M (group 3,
// head_dim 64, kv_dim 192). Paging adds one table lookup per 32-key chunk;
// this shows whether that costs anything.
//   bazel run -c opt //kernels/cpu:attention_benchmark
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/attention.h"

namespace kvd::kernels::cpu {
namespace {

constexpr int64_t kGroup = 3, kHeadDim = 64, kKvDim = 192;

void BM_Attention(benchmark::State& state) {
  const int64_t keys = state.range(0), nq = state.range(1);
  const int64_t block_rows = state.range(2);  // 0: contiguous
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> k(keys * kKvDim), v(keys * kKvDim);
  std::vector<float> q(nq * kGroup * kHeadDim), out(nq * kGroup * kHeadDim);
  for (float& x : k) x = d(rng);
  for (float& x : v) x = d(rng);
  for (float& x : q) x = d(rng);
  KvRows kr{WeightType::kF32, k.data(), kKvDim};
  KvRows vr{WeightType::kF32, v.data(), kKvDim};
  // Paged copy: separately allocated blocks, K rows then V rows.
  std::vector<std::vector<float>> blocks;
  std::vector<const uint8_t*> table;
  if (block_rows > 0) {
    for (int64_t b = 0; b * block_rows < keys; ++b) {
      blocks.emplace_back(2 * block_rows * kKvDim);
      const int64_t n = std::min(block_rows, keys - b * block_rows);
      std::memcpy(blocks.back().data(), k.data() + b * block_rows * kKvDim,
                  n * kKvDim * 4);
      std::memcpy(blocks.back().data() + block_rows * kKvDim,
                  v.data() + b * block_rows * kKvDim, n * kKvDim * 4);
      table.push_back(reinterpret_cast<const uint8_t*>(blocks.back().data()));
    }
    kr = KvRows{WeightType::kF32, nullptr, kKvDim, table.data(), block_rows};
    vr = kr;
    vr.offset_bytes = block_rows * kKvDim * 4;
  }
  const int64_t pos0 = keys - nq;
  for (auto _ : state) {
    AttendCausalBlock(q.data(), kGroup * kHeadDim, nq, kGroup, kHeadDim, 0.125f,
                      kr, vr, pos0, 0, out.data(), kGroup * kHeadDim);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["keys/s"] =
      benchmark::Counter(static_cast<double>(keys * nq) * state.iterations(),
                         benchmark::Counter::kIsRate);
}
// Args: keys, queries, block rows (0: contiguous).
BENCHMARK(BM_Attention)
    ->ArgNames({"keys", "nq", "block"})
    ->Args({2048, 1, 0})
    ->Args({2048, 1, 32})
    ->Args({2048, 1, 256})
    ->Args({2048, 64, 0})
    ->Args({2048, 64, 32})
    ->Args({2048, 64, 64})
    ->Args({2048, 64, 128})
    ->Args({2048, 64, 256});

}  // namespace
}  // namespace kvd::kernels::cpu
