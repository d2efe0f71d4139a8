// Microbenchmark of the CUDA kernels at Llama-3-8B shapes (plain main, run by
// tools/gpu/device_check.sh on a GPU machine). Prints one "RESULT<TAB>name
// <TAB>value<TAB>unit<TAB>note" line per number. Inputs are random, never
// zeros; weights rotate among several copies (> L2) so repeated runs do not
// measure the cache; times are CUDA-event medians after warm-up.
//
//   kernels_benchmark [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/bandwidth_probe.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/internal/bench_util.h"
#include "kernels/cuda/paged_attention.h"

namespace kvd::kernels::cuda {
namespace {

using bench::Result;

// A device buffer filled by tiling a block of random host data.
template <typename T>
T* RandomDevice(size_t n, const std::vector<T>& block) {
  T* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, n * sizeof(T)));
  for (size_t off = 0; off < n; off += block.size()) {
    const size_t len = std::min(block.size(), n - off);
    BENCH_CHECK(cudaMemcpy(p + off, block.data(), len * sizeof(T),
                           cudaMemcpyHostToDevice));
  }
  return p;
}

// Three warm-up calls; events on the legacy stream.
template <typename Fn>
double MedianSeconds(int reps, Fn&& fn) {
  return bench::MedianSeconds(3, reps, nullptr, std::forward<Fn>(fn));
}

struct GemmShape {
  const char* what;
  int64_t n, k;
};

int Main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int reps = quick ? 5 : 20;
  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MiB\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20);

  auto read_bw = MeasureReadBandwidth(size_t{4} << 30, reps);
  BENCH_OK(read_bw.status());
  Result("hbm_read", *read_bw / 1e9, "GB/s",
         "streaming 16-byte loads over 4 GiB");
  auto copy_bw = MeasureCopyBandwidth(size_t{2} << 30, reps);
  BENCH_OK(copy_bw.status());
  Result("hbm_copy", *copy_bw / 1e9, "GB/s",
         "cudaMemcpy D2D 2 GiB, read+write");

  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> wblock(size_t{1} << 22);
  for (uint16_t& v : wblock) {
    const float f = u(rng);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    v = static_cast<uint16_t>(b >> 16);
  }
  std::vector<float> xblock(size_t{1} << 20);
  for (float& v : xblock) v = u(rng);

  // Llama-3-8B per-layer projections.
  const GemmShape shapes[] = {{"qo", 4096, 4096},
                              {"kv", 1024, 4096},
                              {"gate_up", 14336, 4096},
                              {"down", 4096, 14336}};
  const int64_t per_layer_count[] = {2, 2, 2, 1};
  const int64_t layers = 32;
  double layer_weight_bytes = 0;
  for (int s = 0; s < 4; ++s) {
    layer_weight_bytes += 2.0 * shapes[s].n * shapes[s].k * per_layer_count[s];
  }
  const std::vector<int64_t> batches =
      quick ? std::vector<int64_t>{1, 64, 4096}
            : std::vector<int64_t>{1, 8, 64, 256, 4096};
  // Both GEMM implementations (gemm.h) on the same buffers; the WMMA rows
  // keep their historical names, the mma.sync rows add "mma_".
  const std::pair<GemmImpl, std::string> impls[] = {{GemmImpl::kWmma, ""},
                                                    {GemmImpl::kMma, "mma_"}};
  for (int64_t m : batches) {
    double layer_seconds[2] = {0, 0};
    for (int s = 0; s < 4; ++s) {
      const GemmShape& g = shapes[s];
      const size_t wsize = static_cast<size_t>(g.n * g.k);
      const int copies = static_cast<int>(
          std::max<size_t>(2, (size_t{512} << 20) / (wsize * 2) + 1));
      uint16_t* w = RandomDevice(wsize * copies, wblock);
      float* x = RandomDevice(static_cast<size_t>(m * g.k), xblock);
      float* y = nullptr;
      BENCH_CHECK(cudaMalloc(&y, m * g.n * sizeof(float)));
      for (int v = 0; v < 2; ++v) {
        const GemmImpl impl = impls[v].first;
        const double t = MedianSeconds(reps, [&](int i) {
          BENCH_OK(Gemm({x, ActType::kF32, m, g.k},
                        {w + (i % copies) * wsize, g.n, g.k, g.k}, y, g.n,
                        nullptr, GemmTile::kAuto, impl));
        });
        layer_seconds[v] += t * per_layer_count[s];
        const double flops = 2.0 * m * g.n * g.k;
        const double bytes = 2.0 * g.n * g.k + 4.0 * m * g.k + 4.0 * m * g.n;
        const std::string name = "gemm_" + impls[v].second +
                                 std::string(g.what) + "_m" + std::to_string(m);
        Result(name + "_tflops", flops / t / 1e12, "TFLOP/s",
               "n=" + std::to_string(g.n) + " k=" + std::to_string(g.k));
        Result(
            name + "_gbs", bytes / t / 1e9, "GB/s",
            "of hbm_read " + std::to_string(static_cast<int>(*read_bw / 1e9)));
      }
      BENCH_CHECK(cudaFree(w));
      BENCH_CHECK(cudaFree(x));
      BENCH_CHECK(cudaFree(y));
    }
    if (m <= 256) {
      // Projections only (no attention, norms, lm_head): an upper bound on
      // decode speed, against the floor of reading every weight once per step.
      const double floor_tok_s = *read_bw / (layers * layer_weight_bytes) * m;
      for (int v = 0; v < 2; ++v) {
        Result("decode_proj_" + impls[v].second + "tok_s_b" + std::to_string(m),
               m / (layers * layer_seconds[v]), "tok/s",
               "HBM floor " + std::to_string(static_cast<int>(floor_tok_s)) +
                   " tok/s (weights read once per step)");
      }
    }
  }

  // Decode attention over a 32k-token context (32 heads, 8 KV heads, 128 dims).
  const int64_t positions = quick ? 8192 : 32768, n_heads = 32, n_kv = 8,
                hd = 128;
  const size_t kv_elems = static_cast<size_t>(positions * n_kv * hd);
  uint16_t* k = RandomDevice(kv_elems, wblock);
  uint16_t* v = RandomDevice(kv_elems, wblock);
  for (int64_t nq : {int64_t{1}, int64_t{64}}) {
    float* q = RandomDevice(static_cast<size_t>(nq * n_heads * hd), xblock);
    float* out = nullptr;
    int32_t* last = nullptr;
    BENCH_CHECK(cudaMalloc(&out, nq * n_heads * hd * sizeof(float)));
    BENCH_CHECK(cudaMalloc(&last, nq * sizeof(int32_t)));
    std::vector<int32_t> hl(nq);
    for (int64_t i = 0; i < nq; ++i)
      hl[i] = static_cast<int32_t>(positions - 1 - i);
    BENCH_CHECK(cudaMemcpy(last, hl.data(), nq * 4, cudaMemcpyHostToDevice));
    AttentionArgs a;
    a.q = q;
    a.nq = nq;
    a.q_stride = n_heads * hd;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv;
    a.head_dim = hd;
    a.scale = 0.088f;
    a.k = k;
    a.v = v;
    a.kv_stride = n_kv * hd;
    a.last = last;
    a.out = out;
    a.out_stride = n_heads * hd;
    const double t =
        MedianSeconds(reps, [&](int) { BENCH_OK(Attention(a, nullptr)); });
    Result("attn_decode_ctx" + std::to_string(positions) + "_nq" +
               std::to_string(nq) + "_us",
           t * 1e6, "us",
           "K/V bytes " + std::to_string(kv_elems * 4 >> 20) + " MiB");
    Result("attn_decode_ctx" + std::to_string(positions) + "_nq" +
               std::to_string(nq) + "_gbs",
           kv_elems * 4.0 / t / 1e9, "GB/s", "unique K+V bytes / time");
    BENCH_CHECK(cudaFree(q));
    BENCH_CHECK(cudaFree(out));
    BENCH_CHECK(cudaFree(last));
  }
  BENCH_CHECK(cudaFree(k));
  BENCH_CHECK(cudaFree(v));

  // Paged decode attention at 8k context: one sequence per query, 32-row
  // blocks scattered over the pool in a random order (the CPU engine's
  // default block size), next to the contiguous kernel on one sequence.
  const int64_t ctx = 8192, block_rows = 32, kv_stride = n_kv * hd;
  const int64_t seq_blocks = ctx / block_rows;
  for (int64_t nq : {int64_t{1}, int64_t{64}}) {
    const int64_t blocks = nq * seq_blocks;
    const size_t pool_elems =
        static_cast<size_t>(blocks * 2 * block_rows * kv_stride);
    uint16_t* pool = RandomDevice(pool_elems, wblock);
    std::vector<int32_t> table(blocks);
    for (int64_t i = 0; i < blocks; ++i) table[i] = static_cast<int32_t>(i);
    std::shuffle(table.begin(), table.end(), std::mt19937_64(7));
    int32_t* dtable = nullptr;
    int32_t* last = nullptr;
    float* out = nullptr;
    BENCH_CHECK(cudaMalloc(&dtable, blocks * sizeof(int32_t)));
    BENCH_CHECK(
        cudaMemcpy(dtable, table.data(), blocks * 4, cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMalloc(&last, nq * sizeof(int32_t)));
    const std::vector<int32_t> hl(nq, static_cast<int32_t>(ctx - 1));
    BENCH_CHECK(cudaMemcpy(last, hl.data(), nq * 4, cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMalloc(&out, nq * n_heads * hd * sizeof(float)));
    float* q = RandomDevice(static_cast<size_t>(nq * n_heads * hd), xblock);
    PagedAttentionArgs a;
    a.q = q;
    a.nq = nq;
    a.q_stride = n_heads * hd;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv;
    a.head_dim = hd;
    a.scale = 0.088f;
    a.kv = PagedKv{pool, dtable, seq_blocks, block_rows, kv_stride};
    a.last = last;
    a.out = out;
    a.out_stride = n_heads * hd;
    const double t =
        MedianSeconds(reps, [&](int) { BENCH_OK(PagedAttention(a, nullptr)); });
    const std::string name = "paged_attn_decode_ctx8192_b" + std::to_string(nq);
    Result(name + "_us", t * 1e6, "us",
           "block_rows 32, shuffled; K/V bytes " +
               std::to_string(pool_elems * 2 >> 20) + " MiB");
    Result(name + "_gbs", pool_elems * 2.0 / t / 1e9, "GB/s",
           "unique K+V bytes / time");
    if (nq == 1) {
      // The same sequence's rows contiguous: the paging overhead.
      AttentionArgs c;
      c.q = q;
      c.nq = 1;
      c.q_stride = n_heads * hd;
      c.n_heads = n_heads;
      c.n_kv_heads = n_kv;
      c.head_dim = hd;
      c.scale = 0.088f;
      c.k = pool;
      c.v = pool + ctx * kv_stride;
      c.kv_stride = kv_stride;
      c.last = last;
      c.out = out;
      c.out_stride = n_heads * hd;
      const double tc =
          MedianSeconds(reps, [&](int) { BENCH_OK(Attention(c, nullptr)); });
      Result("attn_decode_ctx8192_b1_contiguous_us", tc * 1e6, "us",
             "same shape, one contiguous K and V");
    }
    BENCH_CHECK(cudaFree(pool));
    BENCH_CHECK(cudaFree(dtable));
    BENCH_CHECK(cudaFree(last));
    BENCH_CHECK(cudaFree(out));
    BENCH_CHECK(cudaFree(q));
  }
  return 0;
}

}  // namespace
}  // namespace kvd::kernels::cuda

int main(int argc, char** argv) { return kvd::kernels::cuda::Main(argc, argv); }
