// Throughput of the canonical GEMM at decode (m = 1) and prefill (m = 512)
// shapes of SmolLM2-135M's projections.
//   bazel run -c opt //kernels/cpu:gemm_benchmark
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/gemm.h"

namespace kvd::kernels::cpu {
namespace {

void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  std::vector<float> x(m * k, 0.5f), w(n * k, 0.25f), y(m * n);
  ThreadPool pool(threads);
  const WeightView wv{WeightType::kF32, w.data(), n, k};
  for (auto _ : state) {
    Gemm(x.data(), m, k, wv, y.data(), n, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * m * n * k * state.iterations(), benchmark::Counter::kIsRate,
      benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Gemm)
    ->Args({1, 1536, 576, 1})
    ->Args({1, 1536, 576, 2})
    ->Args({512, 1536, 576, 1})
    ->Args({512, 1536, 576, 2})
    ->Args({512, 576, 1536, 2});

}  // namespace
}  // namespace kvd::kernels::cpu
