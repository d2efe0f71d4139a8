// Canonical attention over contiguous vs paged K/V (ops/model/kv_cache.h's
// layout: rows in blocks of block_rows, K then V per block), at decode (one
// query) and prefill (a 64-query block) shapes of SmolLM2-135M (group 3,
// head_dim 64, kv_dim 192). Paging adds one table lookup per 32-key chunk;
// this shows whether that costs anything. BM_DecodeAllHeads compares the
// two ways of spreading one decode query's attention over threads.
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

// Decode at depth as SmolLM2-135M's step does it: one query over `keys` keys
// for all 3 K/V heads of each of 30 layers, whose K/V (371 MB in fp32 at
// 8064 keys) come from DRAM. Mode 0: a task per K/V head on the pool (3
// tasks); mode 1: AttendRangeAcrossThreads. Args: keys, threads, mode, bf16.
void BM_DecodeAllHeads(benchmark::State& state) {
  const int64_t keys = state.range(0), threads = state.range(1);
  const bool across = state.range(2) != 0, bf16 = state.range(3) != 0;
  constexpr int64_t kLayers = 30, kKvHeads = 3;
  const size_t elem = bf16 ? 2 : 4;
  std::vector<std::vector<uint8_t>> k(kLayers), v(kLayers);
  uint32_t x = 1;
  for (int64_t l = 0; l < kLayers; ++l) {
    k[l].resize(keys * kKvDim * elem);
    v[l].resize(keys * kKvDim * elem);
    // Values of magnitude 1/8 to 1/2: random bytes except each value's top
    // one (sign and high exponent bits).
    for (auto* buf : {&k[l], &v[l]}) {
      for (size_t i = 0; i < buf->size(); ++i) {
        x = x * 1664525u + 1013904223u;
        (*buf)[i] = (i % elem == elem - 1) ? 0x3e : x >> 24;
      }
    }
  }
  std::vector<float> q(kKvHeads * kGroup * kHeadDim, 0.01f), out(q.size());
  ThreadPool pool(threads);
  const WeightType type = bf16 ? WeightType::kBf16 : WeightType::kF32;
  for (auto _ : state) {
    for (int64_t l = 0; l < kLayers; ++l) {
      const KvRows kr{type, k[l].data(), kKvDim}, vr{type, v[l].data(), kKvDim};
      if (across) {
        AttendRangeAcrossThreads(q.data(), kKvHeads, kGroup, kHeadDim, 0.125f,
                                 kr, vr, 0, keys - 1, out.data(), &pool);
      } else {
        pool.ParallelFor(kKvHeads, [&](int64_t b, int64_t e) {
          for (int64_t g = b; g < e; ++g) {
            AttendRange(q.data() + g * kGroup * kHeadDim, kGroup, kHeadDim,
                        0.125f, kr.Shifted(g * kHeadDim),
                        vr.Shifted(g * kHeadDim), 0, keys - 1,
                        out.data() + g * kGroup * kHeadDim);
          }
        });
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  // Per key and decoded token (all layers), as docs/BENCHMARKS.md's depth rows.
  state.counters["ns/key"] = benchmark::Counter(
      static_cast<double>(keys) * state.iterations(),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_DecodeAllHeads)
    ->ArgNames({"keys", "threads", "across", "bf16"})
    ->ArgsProduct({{8064}, {1, 2}, {0, 1}, {0, 1}})
    ->UseRealTime();

}  // namespace
}  // namespace kvd::kernels::cpu
