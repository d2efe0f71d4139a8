// Per-operation latency of KV-Direct's two ways to bring one layer's old K/V
// into attention, on SmolLM2-135M (docs/BENCHMARKS.md "Recompute vs
// read"):
//   BM_Recompute  — read the residual rows from a cold DRAM pool (in the
//                   mode's dtype, widened to fp32 as ResidualStore does) and
//                   run Model::RecomputeKv over all n rows in one call;
//   BM_ReadDram   — copy the same n K/V rows from a cold DRAM pool into a
//                   scratch buffer (what reading a cached K/V costs);
//   BM_ReadDisk   — pread the same bytes from a file whose pages were dropped
//                   from the page cache (posix_fadvise DONTNEED) just before.
// n = seqs x chunk rows. The pools are 256 MiB (8x this machine's 32 MiB L3)
// and every iteration reads at the next offset, so rows come from DRAM.
//   bazel run -c opt //services/planner:recompute_benchmark
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/model_dir.h"
#include "benchmark/benchmark.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/thread_pool.h"
#include "ops/model/model.h"

namespace kvd::planner {
namespace {

using ops::Model;
using ops::ModelConfig;
using ops::Precision;

namespace cpu = kernels::cpu;

constexpr char kModelFile[] = "SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr size_t kPoolBytes = size_t{256} << 20;
constexpr size_t kAlign = 4096;
constexpr int64_t kLayer = 0;  // every SmolLM2 layer has the same shapes

// Loaded once per precision for the whole run (loading takes seconds); null
// (after printing why) if the file is missing.
const Model* GetModel(bool bf16) {
  static std::unique_ptr<Model> models[2];
  static bool tried[2] = {false, false};
  if (!tried[bf16]) {
    tried[bf16] = true;
    auto m =
        Model::Load(CachedModelPath(kModelFile),
                    {.precision = bf16 ? Precision::kBf16 : Precision::kF32,
                     .num_threads = 2});
    if (m.ok()) {
      models[bf16] = *std::move(m);
    } else {
      std::fprintf(stderr, "%s\n", std::string(m.status().message()).c_str());
    }
  }
  return models[bf16].get();
}

// Residual-like values (|x| < 2, no denormals), in fp32 or bf16: the pool
// both the residual and the K/V reads come from.
const std::vector<uint8_t>& ColdPool(bool bf16) {
  static std::vector<uint8_t> pools[2];
  std::vector<uint8_t>& p = pools[bf16];
  if (p.empty()) {
    p.resize(kPoolBytes);
    uint32_t s = 12345;
    auto next = [&s] {
      s = s * 1664525u + 1013904223u;
      return (static_cast<float>(s >> 8) / 16777216.0f - 0.5f) * 4.0f;
    };
    if (bf16) {
      auto* v = reinterpret_cast<uint16_t*>(p.data());
      for (size_t i = 0; i < kPoolBytes / 2; ++i)
        v[i] = cpu::FloatToBf16(next());
    } else {
      auto* v = reinterpret_cast<float*>(p.data());
      for (size_t i = 0; i < kPoolBytes / 4; ++i) v[i] = next();
    }
  }
  return p;
}

// Rotates through the pool so no iteration finds its rows in cache.
size_t NextOffset(size_t* offset, size_t bytes) {
  const size_t step = (bytes + kAlign - 1) / kAlign * kAlign;
  if (*offset + step > kPoolBytes) *offset = 0;
  const size_t at = *offset;
  *offset += step;
  return at;
}

struct Shape {
  int64_t n, d, kvd, elem;
  double residual_bytes() const { return double(n) * d * elem; }
  double kv_bytes() const { return 2.0 * n * kvd * elem; }
  // Two projections, plus RMSNorm (~4 FLOPs per value) and RoPE on K (~3 per
  // value); biases and q/k-norm do not apply to SmolLM2.
  double flops() const {
    return double(n) * (2.0 * d * 2 * kvd + 4.0 * d + 3.0 * kvd);
  }
};

Shape ShapeOf(const benchmark::State& state, const Model& m, bool bf16) {
  const ModelConfig& c = m.config();
  return Shape{state.range(1) * state.range(2), c.d_model, c.kv_dim(),
               bf16 ? 2 : 4};
}

void SetCounters(benchmark::State& state, const Shape& s, double cold_bytes,
                 double flops) {
  const double it = static_cast<double>(state.iterations());
  state.counters["rows"] = static_cast<double>(s.n);
  state.counters["cold_MB"] = cold_bytes / 1e6;
  state.counters["GB/s"] =
      benchmark::Counter(cold_bytes * it, benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
  if (flops > 0) {
    state.counters["MFLOP"] = flops / 1e6;
    state.counters["GFLOP/s"] = benchmark::Counter(
        flops * it, benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  }
}

// Args: bf16, seqs, chunk, threads.
void BM_Recompute(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;
  const Model* model = GetModel(bf16);
  if (model == nullptr) {
    state.SkipWithError("cannot load SmolLM2 (run tools/fetch_models.sh)");
    return;
  }
  const Shape s = ShapeOf(state, *model, bf16);
  const int64_t chunk = state.range(2);
  cpu::ThreadPool* pool = state.range(3) > 1 ? model->pool() : nullptr;
  const std::vector<uint8_t>& cold = ColdPool(bf16);
  std::vector<float> h(bf16 ? s.n * s.d : 0);
  std::vector<uint8_t> k_out(s.kv_bytes() / 2), v_out(s.kv_bytes() / 2);
  std::vector<int64_t> positions(s.n);
  for (int64_t r = 0; r < s.n; ++r) positions[r] = r % chunk;
  size_t offset = 0;
  for (auto _ : state) {
    const uint8_t* src = cold.data() + NextOffset(&offset, s.residual_bytes());
    const float* rows = reinterpret_cast<const float*>(src);
    if (bf16) {  // the store keeps bf16 rows; attention widens them
      const auto* b = reinterpret_cast<const uint16_t*>(src);
      auto widen = [&](int64_t r0, int64_t r1) {
        cpu::Bf16ToFloat(b + r0 * s.d, h.data() + r0 * s.d, (r1 - r0) * s.d);
      };
      if (pool != nullptr) {
        pool->ParallelFor(s.n, widen);
      } else {
        widen(0, s.n);
      }
      rows = h.data();
    }
    const absl::Status st = model->RecomputeKv(
        kLayer, rows, positions.data(), s.n, k_out.data(), v_out.data(), pool);
    if (!st.ok()) {
      state.SkipWithError(std::string(st.message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(k_out.data());
    benchmark::DoNotOptimize(v_out.data());
  }
  SetCounters(state, s, s.residual_bytes(), s.flops());
}

// Args: bf16, seqs, chunk, threads.
void BM_ReadDram(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;
  const Model* model = GetModel(bf16);
  if (model == nullptr) {
    state.SkipWithError("cannot load SmolLM2 (run tools/fetch_models.sh)");
    return;
  }
  const Shape s = ShapeOf(state, *model, bf16);
  cpu::ThreadPool* pool = state.range(3) > 1 ? model->pool() : nullptr;
  const std::vector<uint8_t>& cold = ColdPool(bf16);
  const size_t bytes = static_cast<size_t>(s.kv_bytes());
  std::vector<uint8_t> scratch(bytes);
  size_t offset = 0;
  for (auto _ : state) {
    const uint8_t* src = cold.data() + NextOffset(&offset, bytes);
    auto copy = [&](int64_t b, int64_t e) {
      std::memcpy(scratch.data() + b * kAlign, src + b * kAlign,
                  std::min(bytes, size_t(e) * kAlign) - b * kAlign);
    };
    const int64_t pages = (bytes + kAlign - 1) / kAlign;
    if (pool != nullptr) {
      pool->ParallelFor(pages, copy);
    } else {
      copy(0, pages);
    }
    benchmark::DoNotOptimize(scratch.data());
  }
  SetCounters(state, s, s.kv_bytes(), 0);
}

// A 256 MiB file of K/V-sized data in $TMPDIR (else /tmp), unlinked at once.
int ColdFile() {
  static int fd = -2;
  if (fd != -2) return fd;
  const char* dir = std::getenv("TMPDIR");
  std::string path =
      std::string(dir != nullptr ? dir : "/tmp") + "/kvd_kv_bench_XXXXXX";
  fd = mkstemp(path.data());
  if (fd < 0) return fd;
  unlink(path.c_str());
  const std::vector<uint8_t>& data = ColdPool(true);
  for (size_t done = 0; done < kPoolBytes;) {
    const ssize_t w = write(fd, data.data() + done, kPoolBytes - done);
    if (w <= 0) {
      close(fd);
      return fd = -1;
    }
    done += w;
  }
  fsync(fd);
  // No readahead: it would bring the next iteration's rows in early.
  posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  return fd;
}

// Args: bf16, seqs, chunk, threads (1: one pread).
void BM_ReadDisk(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;
  const Model* model = GetModel(bf16);
  const int fd = ColdFile();
  if (model == nullptr || fd < 0) {
    state.SkipWithError("cannot load SmolLM2 or write the temporary file");
    return;
  }
  const Shape s = ShapeOf(state, *model, bf16);
  const size_t bytes = static_cast<size_t>(s.kv_bytes());
  std::vector<uint8_t> scratch(bytes);
  size_t offset = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const size_t at = NextOffset(&offset, bytes);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // the whole file
    state.ResumeTiming();
    for (size_t done = 0; done < bytes;) {
      const ssize_t r =
          pread(fd, scratch.data() + done, bytes - done, at + done);
      if (r <= 0) {
        state.SkipWithError("pread failed");
        return;
      }
      done += r;
    }
    benchmark::DoNotOptimize(scratch.data());
  }
  SetCounters(state, s, s.kv_bytes(), 0);
}

void Sizes(benchmark::internal::Benchmark* b, bool threads) {
  b->ArgNames({"bf16", "seqs", "chunk", "threads"});
  for (int bf16 : {1, 0}) {
    for (int chunk : {32, 256}) {
      for (int seqs : {1, 4, 16, 64}) {
        for (int t : threads ? std::vector<int>{1, 2} : std::vector<int>{1}) {
          b->Args({bf16, seqs, chunk, t});
        }
      }
    }
  }
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

void WithThreads(benchmark::internal::Benchmark* b) { Sizes(b, true); }
void OneThread(benchmark::internal::Benchmark* b) { Sizes(b, false); }

BENCHMARK(BM_Recompute)->Apply(WithThreads);
BENCHMARK(BM_ReadDram)->Apply(WithThreads);
BENCHMARK(BM_ReadDisk)->Apply(OneThread);

}  // namespace
}  // namespace kvd::planner
