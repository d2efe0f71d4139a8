// Decode throughput of KV-Direct bounded-memory decoding vs the plain K/V
// cache over context length, SmolLM2-135M (docs/BENCHMARKS.md
// "KV-Direct decode vs plain K/V over context length").
//
// One benchmark per (precision, context T). It prefills T random tokens once
// (a master cache and a kv-direct ResidualStore, extended or truncated as T
// changes), then times, one token per step, single-sequence decoding:
//   kv     on the master cache (rolled back afterwards);
//   B=64, B=512
//          on a fresh cache rebuilt by RebuildKv to the last B positions, with
//          ResidualKvSource serving older chunks from the store (rolled back).
// Figures per policy: decode tok/s; hot K/V bytes (kv-direct:
// KvCache::allocated_bytes after the last step; kv: size_bytes); residual
// checkpoint bytes (ResidualStore::size_bytes at T); peak RSS (VmHWM after
// resetting it through /proc/self/clear_refs: the whole process, so it includes
// the weights, the master cache and store); and for kv-direct the recompute
// rate: K/V projection FLOPs per step (cold rows x 4 x d_model x kv_dim, summed
// over layers) divided by the time the step took beyond plain decoding at the
// same T, as a fraction of the GEMM ceiling MeasureGemmFlops measures at the
// K/V projection's shape with 1024 rows, the size of a recompute round (the
// best of three).
//
//   bazel run -c opt //services/planner:decode_benchmark --
//   --benchmark_filter=bf16 2>&1 | tee /tmp/decode.txt
// Prints one Markdown row per benchmark on stderr besides the counters.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/model_dir.h"
#include "base/status_macros.h"
#include "benchmark/benchmark.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/rebuild.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/model/model.h"
#include "services/planner/calibration.h"

namespace kvd::planner {
namespace {

using ops::CheckpointLayers;
using ops::CheckpointPolicy;
using ops::ForwardOutput;
using ops::KvCache;
using ops::KvSource;
using ops::LogitsMode;
using ops::Model;
using ops::ModelConfig;
using ops::Precision;
using ops::PrecisionName;
using ops::RebuildKv;
using ops::RebuildSpec;
using ops::ResidualKvSource;
using ops::ResidualStore;
using ops::SequenceStep;

constexpr char kModelFile[] = "SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr int64_t kMaxContext = 8192;
constexpr int64_t kPrefillBlock = 512;
constexpr int64_t kSequence = 0;
constexpr int64_t kBudgets[] = {64, 512};

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// VmRSS and VmHWM of this process, MiB.
std::pair<double, double> MemoryMiB() {
  std::ifstream f("/proc/self/status");
  std::string line;
  double rss = 0, hwm = 0;
  while (std::getline(f, line)) {
    long kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %ld kB", &kb) == 1) rss = kb / 1024.0;
    if (std::sscanf(line.c_str(), "VmHWM: %ld kB", &kb) == 1) hwm = kb / 1024.0;
  }
  return {rss, hwm};
}

// Resets VmHWM to the current RSS (Linux >= 4.0), so the next reading is the
// peak of what runs in between.
void ResetPeakRss() { std::ofstream("/proc/self/clear_refs") << "5"; }

struct Master {
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<ResidualStore> store;
  std::vector<int32_t> tokens;  // kMaxContext + decode steps
};

// The GEMM ceiling: FLOP/s of the K/V projection's GEMM shape at 1024 rows
// (one recompute round) on the model's pool, the best of two timings.
absl::StatusOr<double> Ceiling(const Model& model) {
  const ModelConfig& c = model.config();
  double best = 0;
  for (int i = 0; i < 2; ++i) {
    KVD_ASSIGN_OR_RETURN(
        double f, MeasureGemmFlops(PrecisionName(model.precision()), c.kv_dim(),
                                   c.d_model, /*m=*/1024, model.pool(),
                                   /*min_seconds=*/0.3));
    best = std::max(best, f);
  }
  return best;
}

// K/V projection FLOP/s of Model::RecomputeKv over 1024 rows (one round) on
// the model's pool, outside Forward: the best of two timings.
absl::StatusOr<double> RecomputeAlone(const Model& model) {
  const ModelConfig& c = model.config();
  constexpr int64_t kRows = 1024;
  std::vector<float> h(kRows * c.d_model);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (float& x : h) x = u(rng);
  std::vector<int64_t> positions(kRows);
  for (int64_t r = 0; r < kRows; ++r) positions[r] = r;
  const size_t bytes = model.NewCache().row_bytes() * kRows;
  std::vector<uint8_t> k(bytes), v(bytes);
  double best = 0;
  for (int i = 0; i < 2; ++i) {
    int64_t calls = 0;
    const auto t0 = Clock::now();
    do {
      absl::Status s = model.RecomputeKv(0, h.data(), positions.data(), kRows,
                                         k.data(), v.data(), model.pool());
      if (!s.ok()) return s;
      ++calls;
    } while (Seconds(t0, Clock::now()) < 0.3);
    best = std::max(best, calls * kRows * 4.0 * c.d_model * c.kv_dim() /
                              Seconds(t0, Clock::now()));
  }
  return best;
}

Master* GetMaster(bool bf16) {
  static std::unique_ptr<Master> masters[2];
  static bool tried[2] = {false, false};
  if (tried[bf16]) return masters[bf16].get();
  tried[bf16] = true;
  absl::StatusOr<std::unique_ptr<Model>> m =
      Model::Load(CachedModelPath(kModelFile),
                  {.precision = bf16 ? Precision::kBf16 : Precision::kF32,
                   .num_threads = 2});
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", std::string(m.status().message()).c_str());
    return nullptr;
  }
  auto master = std::make_unique<Master>();
  master->model = *std::move(m);
  const ModelConfig& c = master->model->config();
  master->cache = std::make_unique<KvCache>(master->model->NewCache());
  CheckpointPolicy kv_direct;
  kv_direct.kind = CheckpointPolicy::Kind::kKvDirect;
  master->store = std::make_unique<ResidualStore>(
      c, master->model->precision(), CheckpointLayers(kv_direct, c.n_layers));
  std::mt19937 rng(7);
  master->tokens.resize(kMaxContext + 64);
  for (int32_t& t : master->tokens) t = rng() % c.vocab_size;
  masters[bf16] = std::move(master);
  return masters[bf16].get();
}

// Brings the master cache and store to exactly `t` positions.
absl::Status EnsureContext(Master& m, int64_t t) {
  if (m.cache->length() > t) {
    m.cache->Truncate(t);
    m.store->Truncate(kSequence, t);
  }
  while (m.cache->length() < t) {
    const int64_t p = m.cache->length();
    const int64_t n = std::min(kPrefillBlock, t - p);
    SequenceStep step{m.cache.get(),
                      absl::MakeConstSpan(m.tokens).subspan(p, n),
                      LogitsMode::kNone, kSequence};
    ForwardOutput out;
    if (absl::Status s = m.model->Forward({&step, 1}, &out, m.store.get());
        !s.ok()) {
      return s;
    }
  }
  return m.store->status();
}

struct DecodeResult {
  double seconds_per_step = 0;
  double hot_bytes = 0;
  double peak_rss_mib = 0;
};

// Decodes `steps` tokens (plus one untimed warm-up) from position t.
absl::StatusOr<DecodeResult> Decode(Master& m, KvCache* cache,
                                    const KvSource* source, int64_t t,
                                    int64_t steps) {
  ResetPeakRss();
  ForwardOutput out;
  Clock::time_point t0;
  for (int64_t i = 0; i <= steps; ++i) {
    if (i == 1) t0 = Clock::now();
    SequenceStep step{cache, absl::MakeConstSpan(m.tokens).subspan(t + i, 1),
                      LogitsMode::kLast, kSequence, source};
    if (absl::Status s = m.model->Forward(
            {&step, 1}, &out, source != nullptr ? m.store.get() : nullptr);
        !s.ok()) {
      return s;
    }
  }
  DecodeResult r;
  r.seconds_per_step = Seconds(t0, Clock::now()) / steps;
  // The plain master cache's capacity reflects the longest context it held,
  // so it reports the rows it holds (a fresh plain cache allocates up to 2x).
  r.hot_bytes =
      source != nullptr ? cache->allocated_bytes() : cache->size_bytes();
  r.peak_rss_mib = MemoryMiB().second;
  return r;
}

// K/V projection FLOPs a kv-direct step at cache length `len` recomputes:
// cold rows (below HotBegin, visible to the new token) x 2 GEMMs.
double RecomputeFlops(const ModelConfig& c, int64_t len, int64_t budget) {
  double flops = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const int64_t hot = std::max<int64_t>(0, len - budget);
    const int64_t w = c.layers[l].sliding_window;
    const int64_t first = w > 0 ? std::max<int64_t>(0, len - w + 1) : 0;
    flops += std::max<int64_t>(0, hot - first) * 4.0 * c.d_model * c.kv_dim();
  }
  return flops;
}

int64_t StepsFor(int64_t t) { return t <= 1024 ? 16 : t <= 2048 ? 8 : 4; }

// Args: bf16, context.
void BM_Decode(benchmark::State& state) {
  const bool bf16 = state.range(0) != 0;
  const int64_t t = state.range(1);
  Master* m = GetMaster(bf16);
  if (m == nullptr) {
    state.SkipWithError("cannot load SmolLM2 (run tools/fetch_models.sh)");
    return;
  }
  const ModelConfig& c = m->model->config();
  const int64_t steps = StepsFor(t);
  const double mib = 1024.0 * 1024.0;
  for (auto _ : state) {
    if (absl::Status s = EnsureContext(*m, t); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
    // Measured at each context, next to the runs, because the shared
    // machine's load changes within minutes.
    absl::StatusOr<double> ceiling = Ceiling(*m->model);
    absl::StatusOr<double> alone = RecomputeAlone(*m->model);
    if (!ceiling.ok() || !alone.ok()) {
      state.SkipWithError("GEMM / RecomputeKv timing failed");
      return;
    }
    const double residual_bytes = m->store->size_bytes();
    absl::StatusOr<DecodeResult> plain =
        Decode(*m, m->cache.get(), nullptr, t, steps);
    m->cache->Truncate(t);
    if (!plain.ok()) {
      state.SkipWithError(std::string(plain.status().message()).c_str());
      return;
    }
    state.counters["kv_tok/s"] = 1.0 / plain->seconds_per_step;
    state.counters["kv_hot_MiB"] = plain->hot_bytes / mib;
    std::fprintf(stderr,
                 "| %s | %lld | kv | %.2f | %.1f | - | %.0f | - | - |\n",
                 PrecisionName(m->model->precision()),
                 static_cast<long long>(t), 1.0 / plain->seconds_per_step,
                 plain->hot_bytes / mib, plain->peak_rss_mib);
    for (int64_t budget : kBudgets) {
      KvCache cache = m->model->NewCache();
      CheckpointPolicy kv_direct;
      kv_direct.kind = CheckpointPolicy::Kind::kKvDirect;
      RebuildSpec spec{.policy = kv_direct,
                       .tokens = absl::MakeConstSpan(m->tokens).subspan(0, t),
                       .checkpoint = m->store.get(),
                       .sequence_id = kSequence,
                       .budget = budget};
      if (absl::Status s = RebuildKv(*m->model, spec, &cache, nullptr);
          !s.ok()) {
        state.SkipWithError(std::string(s.message()).c_str());
        return;
      }
      ResidualKvSource source(m->store.get(), kSequence, budget);
      absl::StatusOr<DecodeResult> r = Decode(*m, &cache, &source, t, steps);
      m->store->Truncate(kSequence, t);
      if (!r.ok()) {
        state.SkipWithError(std::string(r.status().message()).c_str());
        return;
      }
      double flops = 0;
      for (int64_t i = 1; i <= steps; ++i)
        flops += RecomputeFlops(c, t + i, budget);
      flops /= steps;
      const double extra = r->seconds_per_step - plain->seconds_per_step;
      const double rate = extra > 0 ? flops / extra : 0;
      const std::string b = "B" + std::to_string(budget);
      state.counters[b + "_tok/s"] = 1.0 / r->seconds_per_step;
      state.counters[b + "_hot_MiB"] = r->hot_bytes / mib;
      state.counters[b + "_ceil%"] = 100.0 * rate / *ceiling;
      std::fprintf(stderr,
                   "| %s | %lld | kv-direct B=%lld | %.2f | %.2f | %.1f | %.0f "
                   "| %.1f | %.0f%% |\n",
                   PrecisionName(m->model->precision()),
                   static_cast<long long>(t), static_cast<long long>(budget),
                   1.0 / r->seconds_per_step, r->hot_bytes / mib,
                   residual_bytes / mib, r->peak_rss_mib, rate / 1e9,
                   100.0 * rate / *ceiling);
    }
    state.counters["resid_MiB"] = m->store->size_bytes() / mib;
    state.counters["ceiling_GFLOP/s"] = *ceiling / 1e9;
    state.counters["alone_ceil%"] = 100.0 * *alone / *ceiling;
    std::fprintf(
        stderr,
        "(%s: GEMM ceiling %.1f GFLOP/s; RecomputeKv of 1024 rows alone "
        "%.1f GFLOP/s = %.0f%%)\n",
        PrecisionName(m->model->precision()), *ceiling / 1e9, *alone / 1e9,
        100.0 * *alone / *ceiling);
  }
}

// 8176: the longest context that leaves room for the decode steps within
// SmolLM2's 8192.
void Contexts(benchmark::internal::Benchmark* b) {
  for (int64_t bf16 : {1, 0}) {
    for (int64_t t : {512, 1024, 2048, 4096, 8176}) b->Args({bf16, t});
  }
}

BENCHMARK(BM_Decode)
    ->ArgNames({"bf16", "T"})
    ->Apply(Contexts)
    ->Iterations(1)
    ->Unit(benchmark::kSecond);

}  // namespace
}  // namespace kvd::planner
