// Throughput of the canonical GEMM at decode (m = 1) and prefill (m = 512)
// shapes of SmolLM2-135M's projections.
//   bazel run -c opt //kernels/cpu:gemm_benchmark
#include <cstring>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/gemm.h"
#include "kernels/quant/ggml_type.h"
#include "kernels/quant/half.h"

namespace kvd::kernels::cpu {
namespace {

void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  // 0: fp32 weights; 1: bf16 weights, fp32 products; 2: the bf16 mode's pair
  // products (vdpbf16ps where the machine has it).
  const bool bf16 = state.range(4) != 0;
  std::vector<float> x(m * k, 0.5f), w(bf16 ? 0 : n * k, 0.25f), y(m * n);
  std::vector<uint16_t> wb(bf16 ? n * k : 0, 0x3e80);
  ThreadPool pool(threads);
  WeightView wv = bf16 ? WeightView{WeightType::kBf16, wb.data(), n, k}
                       : WeightView{WeightType::kF32, w.data(), n, k};
  wv.bf16_pairs = state.range(4) == 2;
  for (auto _ : state) {
    Gemm(x.data(), m, k, wv, y.data(), n, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>(n * k * (bf16 ? 2 : 4)) * state.iterations(),
      benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * m * n * k * state.iterations(), benchmark::Counter::kIsRate,
      benchmark::Counter::kIs1000);
}
// Args: m, n, k, threads, weights (0 fp32, 1 bf16, 2 bf16 pairs). The 49152 x
// 576 shapes are SmolLM2's output head (113 MB fp32): they stream from DRAM,
// like every weight matrix does at decode time.
BENCHMARK(BM_Gemm)
    ->ArgNames({"m", "n", "k", "threads", "weights"})
    ->Args({1, 1536, 576, 1, 0})
    ->Args({1, 49152, 576, 1, 0})
    ->Args({1, 49152, 576, 2, 0})
    ->Args({1, 49152, 576, 1, 1})
    ->Args({1, 49152, 576, 2, 1})
    ->Args({512, 1536, 576, 1, 0})
    ->Args({512, 1536, 576, 2, 0})
    ->Args({512, 1536, 576, 1, 1})
    ->Args({512, 576, 1536, 2, 0})
    ->Args({1, 49152, 576, 1, 2})
    ->Args({512, 1536, 576, 1, 2})
    ->Args({512, 576, 1536, 1, 2})
    ->Args({512, 1536, 576, 2, 2})
    ->UseRealTime();

// Weights kept as GGML blocks (the fp32 mode's default for quantized files):
// random blocks with small finite scales.
void BM_GemmBlocks(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  const auto type = static_cast<GgmlType>(state.range(4));
  std::mt19937 rng(1);
  std::vector<uint8_t> w(n * k / BlockSize(type) * BlockBytes(type));
  for (uint8_t& b : w) b = static_cast<uint8_t>(rng());
  const uint16_t scale = Fp32ToFp16(0.01f);
  for (size_t i = 0; i < w.size(); i += BlockBytes(type)) {
    const size_t at = type == GgmlType::kQ6_K ? i + 208 : i;
    std::memcpy(&w[at], &scale, 2);
    if (type == GgmlType::kQ4_1 || type == GgmlType::kQ4_K)
      std::memcpy(&w[at + 2], &scale, 2);
  }
  std::vector<uint8_t> packed(n * PackedRowBytes(type, k));
  const int64_t row_bytes = k / BlockSize(type) * BlockBytes(type);
  for (int64_t r = 0; r < n; ++r) {
    if (!PackRow(type, &w[r * row_bytes], row_bytes, k,
                 &packed[r * PackedRowBytes(type, k)])
             .ok()) {
      state.SkipWithError("cannot pack");
      return;
    }
  }
  std::vector<float> x(m * k, 0.5f), y(m * n);
  ThreadPool pool(threads);
  WeightView wv{WeightType::kGgmlBlocks, packed.data(), n, k, 0, type};
  wv.round_to_bf16 = state.range(5) != 0;
  wv.bf16_pairs = state.range(5) == 2;
  for (auto _ : state) {
    Gemm(x.data(), m, k, wv, y.data(), n, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>(packed.size()) * state.iterations(),
      benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * m * n * k * state.iterations(), benchmark::Counter::kIsRate,
      benchmark::Counter::kIs1000);
}
// Args: m, n, k, threads, GGML type id (3 = Q4_1, 8 = Q8_0, 12 = Q4_K,
// 14 = Q6_K), bf16 (0: fp32 mode; 1: weights rounded to bf16, fp32 products;
// 2: the bf16 mode, pair products). SmolLM2's MLP and output head at decode
// and prefill.
BENCHMARK(BM_GemmBlocks)
    ->ArgNames({"m", "n", "k", "threads", "type", "bf16"})
    ->Args({1, 1536, 576, 1, 3, 0})
    ->Args({1, 1536, 576, 1, 3, 1})
    ->Args({1, 576, 1536, 1, 3, 0})
    ->Args({1, 49152, 576, 1, 8, 0})
    ->Args({1, 49152, 576, 1, 8, 1})
    ->Args({1, 49152, 576, 1, 3, 0})
    ->Args({1, 1536, 1024, 1, 12, 0})
    ->Args({1, 1536, 1024, 1, 14, 0})
    ->Args({4, 1536, 576, 1, 3, 0})
    ->Args({512, 1536, 576, 1, 3, 0})
    ->Args({1, 1536, 576, 1, 3, 2})
    ->Args({512, 1536, 576, 1, 3, 2})
    ->Args({512, 576, 1536, 1, 3, 2})
    ->Args({512, 1536, 576, 2, 3, 2})
    ->Args({512, 576, 1536, 2, 3, 2})
    ->UseRealTime();

}  // namespace
}  // namespace kvd::kernels::cpu
