#include "kernels/cpu/machine_ceilings.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_features.h"

namespace kvd::kernels::cpu {
namespace {

using Clock = std::chrono::steady_clock;

// Twelve independent accumulator chains hide the FMA latency (4 cycles, two
// pipes) on every x86 core kvd targets. Returns FLOPs done; `sink` keeps the
// compiler from dropping the work.
__attribute__((target("avx512f"))) double FmaAvx512(int64_t iters,
                                                    float* sink) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  *sink = _mm512_reduce_add_ps(s);
  return static_cast<double>(iters) * 12 * 16 * 2;
}

// The same chains with vdpbf16ps: 32 products per instruction.
__attribute__((target("avx512f,avx512bf16"))) double DpBf16Avx512(int64_t iters,
                                                                  float* sink) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3380));
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  *sink = _mm512_reduce_add_ps(s);
  return static_cast<double>(iters) * 12 * 32 * 2;
}

double FmaAvx2(int64_t iters, float* sink) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(1.0f + i * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float total = 0;
  for (float f : lanes) total += f;
  *sink = total;
  return static_cast<double>(iters) * 12 * 8 * 2;
}

double Fma(int64_t iters, float* sink) {
  return ActiveIsa() == Isa::kAvx512 ? FmaAvx512(iters, sink)
                                     : FmaAvx2(iters, sink);
}

// The best rate of `probe` over `threads` threads: calibrated to ~0.15 s per
// thread, best of three runs.
template <typename Probe>
double PeakFlops(int threads, std::vector<float>& sinks, Probe probe) {
  int64_t iters = 1 << 20;
  while (true) {
    const double s = RunTogether(1, [&](int) { probe(iters, &sinks[0]); });
    if (s > 0.02) {
      iters = static_cast<int64_t>(iters * 0.15 / s) + 1;
      break;
    }
    iters *= 4;
  }
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<double> done(threads);
    const double s = RunTogether(
        threads, [&](int t) { done[t] = probe(iters, &sinks[t * 16]); });
    double flops = 0;
    for (double d : done) flops += d;
    best = std::max(best, flops / s);
  }
  return best;
}

// Sums `n` floats (a multiple of streams x 8) as `streams` sequential
// streams, one per equal part: cores differ in how many streams their
// prefetchers follow best, so the probe tries 1 and 4.
double ReadSum(const float* p, int64_t n, int streams) {
  const int64_t q = n / streams;
  __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                 _mm256_setzero_ps()};
  if (streams == 1) {
    for (int64_t i = 0; i < n; i += 32) {
      for (int k = 0; k < 4; ++k)
        s[k] = _mm256_add_ps(s[k], _mm256_loadu_ps(p + i + 8 * k));
    }
  } else {
    for (int64_t i = 0; i < q; i += 8) {
      for (int k = 0; k < 4; ++k)
        s[k] = _mm256_add_ps(s[k], _mm256_loadu_ps(p + k * q + i));
    }
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(s[0], s[1]),
                                       _mm256_add_ps(s[2], s[3])));
  double total = 0;
  for (float f : lanes) total += f;
  return total;
}

// Runs body(t) on `threads` threads at once; the seconds from the start
// signal to the last one done.
template <typename Body>
double RunTogether(int threads, Body body) {
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      body(t);
    });
  }
  const auto start = Clock::now();
  go.store(true, std::memory_order_release);
  for (std::thread& th : pool) th.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

std::string CpuDescription() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model, family;
  while (std::getline(in, line) && (model.empty() || family.empty())) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos || colon + 2 > line.size()) continue;
    const std::string value = line.substr(colon + 2);
    if (line.rfind("model name", 0) == 0 && model.empty()) model = value;
    if (line.rfind("cpu family", 0) == 0 && family.empty()) family = value;
  }
  if (model.empty()) return "unknown CPU";
  return family.empty() ? model : model + ", CPU family " + family;
}

MachineCeilings MeasureMachineCeilings(int threads) {
  MachineCeilings c;
  c.cpu = CpuDescription();
  c.threads = threads = threads < 1 ? 1 : threads;
  std::vector<float> sinks(threads * 16);
  c.fma_gflops = PeakFlops(threads, sinks, Fma) / 1e9;
  c.pair_gflops = HasAvx512Bf16() && ActiveIsa() == Isa::kAvx512
                      ? PeakFlops(threads, sinks, DpBf16Avx512) / 1e9
                      : c.fma_gflops;

  // Memory: 512 MiB, far past any last-level cache here; each thread sums
  // its own slice; best of six passes (three with each stream count).
  const int64_t n = (int64_t{512} << 20) / sizeof(float);
  std::vector<float> buf(n, 1.0f);
  const int64_t slice = n / threads / 32 * 32;
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    std::vector<double> sums(threads);
    const double s = RunTogether(threads, [&](int t) {
      sums[t] = ReadSum(buf.data() + t * slice, slice, rep % 2 ? 4 : 1);
    });
    best = std::max(best,
                    static_cast<double>(slice) * threads * sizeof(float) / s);
    sinks[0] += static_cast<float>(sums[0]);
  }
  c.read_gb_per_s = best / 1e9;
  return c;
}

}  // namespace kvd::kernels::cpu
