// End-to-end timings of an 8B-shaped model (Llama-3-8B dimensions, random bf16
// weights generated on the device) built from the backend's kernels: GEMM,
// RMSNorm, RoPE, attention, SiLU gating. Run by tools/gpu/device_check.sh.
//
//  1. Decode: one step (all 32 layers + LM head) for batch 1, 8, 64, 256 with
//     --ctx positions of K/V per sequence; tok/s next to the HBM floor (weight
//     bytes / measured read bandwidth; also with the K/V bytes the step reads).
//  2. K/V recompute (kv-direct's rebuild): bf16 residual -> RMSNorm -> K/V
//     projection -> RoPE -> bf16 K/V, over many rows; TFLOP/s (projection
//     FLOPs) for device_check.sh to set against the measured bf16 ceiling.
//  3. Rebuild of a --session-tokens session: kv-direct (K/V of all 32 layers
//     from residuals) measured in full; re-prefill (tokens-only) measured over
//     --prefill-layers full layers and scaled to 32; stride:k estimated from
//     the two, labelled as estimates.
//
// Prints "RESULT<TAB>name<TAB>value<TAB>unit<TAB>note" lines. Times are
// CUDA-event medians after warm-up; decode steps are captured in a CUDA graph
// (plain launches if capture fails, said in the note).
//
// Every GEMM is the WMMA kernel (GemmImpl::kWmma: the historical rows). With
// --mma, decode at batch 1, 8 and 64 and the one-layer K/V recompute rows are
// measured again with the mma.sync kernel (GemmImpl::kMma), on the same
// weights, as rows named decode8b_mma_* and recompute_kv_mma_*.
//
//   model_benchmark [--quick] [--mma] [--ctx N] [--session-tokens N]
//                   [--prefill-layers N]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/bandwidth_probe.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/internal/bench_kernels.h"
#include "kernels/cuda/internal/bench_util.h"
#include "kernels/cuda/kv_recompute.h"

namespace kvd::kernels::cuda {
namespace {

using bench::Result;

std::string Int(double v) { return std::to_string(static_cast<long long>(v)); }

// Llama-3-8B.
constexpr int64_t kD = 4096, kLayers = 32, kHeads = 32, kKvHeads = 8,
                  kHeadDim = 128, kFfn = 14336, kVocab = 128256;
constexpr int64_t kKvWidth = kKvHeads * kHeadDim;  // 1024
constexpr int64_t kQkv = kD + 2 * kKvWidth;        // 6144
constexpr float kEps = 1e-5f, kRopeBase = 500000.0f;

template <typename T>
T* Alloc(size_t n) {
  T* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}

struct Layer {
  uint16_t* wqkv;   // kQkv x kD: q rows, then k rows, then v rows
  uint16_t* wo;     // kD x kD
  uint16_t* wgu;    // 2 kFfn x kD: gate rows, then up rows
  uint16_t* wdown;  // kD x kFfn
  float* attn_norm;
  float* ffn_norm;
};

struct Model {
  std::vector<Layer> layers;
  float* out_norm;
  uint16_t* output;  // kVocab x kD
  double weight_bytes = 0;
};

Model MakeModel(cudaStream_t s) {
  Model m;
  uint64_t seed = 1;
  auto w = [&](int64_t n, int64_t k) {
    uint16_t* p = Alloc<uint16_t>(static_cast<size_t>(n * k));
    // Scale 1/sqrt(k) keeps activations O(1) through the layers.
    BENCH_OK(bench::FillBf16(p, static_cast<size_t>(n * k), seed++,
                             1.0f / std::sqrt(static_cast<float>(k)), 0.0f, s));
    m.weight_bytes += 2.0 * n * k;
    return p;
  };
  auto norm = [&]() {
    float* p = Alloc<float>(kD);
    BENCH_OK(bench::FillF32(p, kD, seed++, 0.1f, 1.0f, s));
    return p;
  };
  for (int64_t l = 0; l < kLayers; ++l) {
    Layer L;
    L.wqkv = w(kQkv, kD);
    L.wo = w(kD, kD);
    L.wgu = w(2 * kFfn, kD);
    L.wdown = w(kD, kFfn);
    L.attn_norm = norm();
    L.ffn_norm = norm();
    m.layers.push_back(L);
  }
  m.out_norm = norm();
  m.output = w(kVocab, kD);
  BENCH_CHECK(cudaStreamSynchronize(s));
  return m;
}

// Activation buffers for up to `rows` tokens at once.
struct Scratch {
  float *x, *xn, *qkv, *attn, *tmp, *gu, *act, *logits;
  int32_t *pos, *last, *dest;
  explicit Scratch(int64_t rows, bool logits_too) {
    x = Alloc<float>(rows * kD);
    xn = Alloc<float>(rows * kD);
    qkv = Alloc<float>(rows * kQkv);
    attn = Alloc<float>(rows * kD);
    tmp = Alloc<float>(rows * kD);
    gu = Alloc<float>(rows * 2 * kFfn);
    act = Alloc<float>(rows * kFfn);
    logits = logits_too ? Alloc<float>(rows * kVocab) : nullptr;
    pos = Alloc<int32_t>(rows);
    last = Alloc<int32_t>(rows);
    dest = Alloc<int32_t>(rows);
  }
  void Free() {
    for (void* p : {static_cast<void*>(x), static_cast<void*>(xn),
                    static_cast<void*>(qkv), static_cast<void*>(attn),
                    static_cast<void*>(tmp), static_cast<void*>(gu),
                    static_cast<void*>(act), static_cast<void*>(logits),
                    static_cast<void*>(pos), static_cast<void*>(last),
                    static_cast<void*>(dest)})
      if (p != nullptr) BENCH_CHECK(cudaFree(p));
  }
};

void Upload(int32_t* dst, const std::vector<int32_t>& v) {
  BENCH_CHECK(cudaMemcpy(dst, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
}

// One full transformer layer over `rows` tokens whose residual is sc.x:
// K/V go to rows sc.dest[r] of (k, v); query r attends to keys
// [last[r] - window + 1, last[r]] (window 0: from 0), at RoPE position pos[r].
void LayerForward(const Layer& L, int64_t rows, int64_t window, uint16_t* k,
                  uint16_t* v, Scratch& sc, GemmImpl impl, cudaStream_t s) {
  constexpr GemmTile kTile = GemmTile::kAuto;
  BENCH_OK(RmsNorm(sc.x, kD, L.attn_norm, kEps, rows, kD, sc.xn, kD, s));
  BENCH_OK(Gemm({sc.xn, ActType::kF32, rows, kD}, {L.wqkv, kQkv, kD, kD},
                sc.qkv, kQkv, s, kTile, impl));
  BENCH_OK(Rope(sc.qkv, kQkv, rows, kHeads, kHeadDim, kHeadDim, sc.pos,
                kRopeBase, RopeStyle::kHalfSplit, s));
  BENCH_OK(Rope(sc.qkv + kD, kQkv, rows, kKvHeads, kHeadDim, kHeadDim, sc.pos,
                kRopeBase, RopeStyle::kHalfSplit, s));
  BENCH_OK(bench::StoreKv(sc.qkv + kD, kQkv, rows, kKvWidth, sc.dest, k, v, s));
  AttentionArgs a;
  a.q = sc.qkv;
  a.nq = rows;
  a.q_stride = kQkv;
  a.n_heads = kHeads;
  a.n_kv_heads = kKvHeads;
  a.head_dim = kHeadDim;
  a.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  a.k = k;
  a.v = v;
  a.kv_stride = kKvWidth;
  a.last = sc.last;
  a.window = window;
  a.out = sc.attn;
  a.out_stride = kD;
  BENCH_OK(Attention(a, s));
  BENCH_OK(Gemm({sc.attn, ActType::kF32, rows, kD}, {L.wo, kD, kD, kD}, sc.tmp,
                kD, s, kTile, impl));
  BENCH_OK(bench::AddInPlace(sc.x, sc.tmp, rows, kD, kD, s));
  BENCH_OK(RmsNorm(sc.x, kD, L.ffn_norm, kEps, rows, kD, sc.xn, kD, s));
  BENCH_OK(Gemm({sc.xn, ActType::kF32, rows, kD}, {L.wgu, 2 * kFfn, kD, kD},
                sc.gu, 2 * kFfn, s, kTile, impl));
  BENCH_OK(GatedActivation(GatedAct::kSilu, sc.gu, 2 * kFfn, sc.gu + kFfn,
                           2 * kFfn, rows, kFfn, sc.act, kFfn, s));
  BENCH_OK(Gemm({sc.act, ActType::kF32, rows, kFfn}, {L.wdown, kD, kFfn, kFfn},
                sc.tmp, kD, s, kTile, impl));
  BENCH_OK(bench::AddInPlace(sc.x, sc.tmp, rows, kD, kD, s));
}

// Median seconds of `fn` on stream s (events), after two warm-up calls.
template <typename Fn>
double MedianSeconds(int reps, cudaStream_t s, Fn&& fn) {
  return bench::MedianSeconds(2, reps, s, [&](int) { fn(); });
}

struct Options {
  bool quick = false;
  bool mma = false;
  int64_t ctx = 1024;
  int64_t session_tokens = 32768;
  int64_t prefill_layers = 2;
};

// Rows are named decode8b_<tag>b<batch>_*.
void Decode(const Model& m, const Options& o, double read_bps,
            const std::vector<int64_t>& batches, GemmImpl impl,
            const std::string& tag, cudaStream_t s) {
  const int64_t max_b = batches.back();
  const int64_t ctx = o.ctx;
  // Sequence b's K/V occupy positions [b * ctx, (b + 1) * ctx) of each
  // layer's cache; the attention window (= ctx) keeps each query inside its
  // own sequence.
  const size_t cache = static_cast<size_t>(max_b * ctx * kKvWidth);
  std::vector<uint16_t*> kc(kLayers), vc(kLayers);
  for (int64_t l = 0; l < kLayers; ++l) {
    kc[l] = Alloc<uint16_t>(cache);
    vc[l] = Alloc<uint16_t>(cache);
    BENCH_OK(bench::FillBf16(kc[l], cache, 1000 + l, 1.0f, 0.0f, s));
    BENCH_OK(bench::FillBf16(vc[l], cache, 2000 + l, 1.0f, 0.0f, s));
  }
  Scratch sc(max_b, /*logits_too=*/true);
  const double kv_bytes_per_token = 2.0 * kLayers * kKvWidth * 2;  // K+V bf16
  for (int64_t b : batches) {
    std::vector<int32_t> pos(b, static_cast<int32_t>(ctx - 1)), last(b);
    for (int64_t i = 0; i < b; ++i)
      last[i] = static_cast<int32_t>(i * ctx + ctx - 1);
    Upload(sc.pos, pos);
    Upload(sc.last, last);
    Upload(sc.dest, last);
    auto step = [&]() {
      for (int64_t l = 0; l < kLayers; ++l)
        LayerForward(m.layers[l], b, ctx, kc[l], vc[l], sc, impl, s);
      BENCH_OK(RmsNorm(sc.x, kD, m.out_norm, kEps, b, kD, sc.xn, kD, s));
      BENCH_OK(Gemm({sc.xn, ActType::kF32, b, kD}, {m.output, kVocab, kD, kD},
                    sc.logits, kVocab, s, GemmTile::kAuto, impl));
    };
    // The residual is reset before each step so every step sees the same
    // random input (a graph replays the reset too).
    auto reset = [&]() {
      BENCH_OK(
          bench::FillF32(sc.x, static_cast<size_t>(b * kD), 7, 1.0f, 0.0f, s));
    };
    std::string how = "CUDA graph";
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    bool graphed =
        cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess;
    if (graphed) {
      reset();
      step();
      graphed = cudaStreamEndCapture(s, &graph) == cudaSuccess &&
                cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    }
    if (!graphed) {
      cudaGetLastError();
      how = "plain launches (graph capture failed)";
    }
    const double t = MedianSeconds(o.quick ? 5 : 10, s, [&]() {
      if (graphed) {
        BENCH_CHECK(cudaGraphLaunch(exec, s));
      } else {
        reset();
        step();
      }
    });
    if (exec != nullptr) BENCH_CHECK(cudaGraphExecDestroy(exec));
    if (graph != nullptr) BENCH_CHECK(cudaGraphDestroy(graph));
    const double floor_w = read_bps / m.weight_bytes * b;
    const double floor_wkv =
        read_bps / (m.weight_bytes + b * ctx * kv_bytes_per_token) * b;
    const double tok_s = b / t;
    const std::string name = "decode8b_" + tag + "b" + std::to_string(b);
    Result(name + "_tok_s", tok_s, "tok/s",
           "ctx " + std::to_string(ctx) + ", step " +
               std::to_string(t * 1e3).substr(0, 6) + " ms, " + how);
    Result(name + "_floor_tok_s", floor_w, "tok/s",
           "weights " + Int(m.weight_bytes / 1e6) +
               " MB / hbm_read; with K/V reads " + Int(floor_wkv) + " tok/s");
    Result(name + "_pct_of_hbm_floor", 100.0 * tok_s / floor_w, "%",
           "target >= 70% at batch 1");
  }
  sc.Free();
  for (int64_t l = 0; l < kLayers; ++l) {
    BENCH_CHECK(cudaFree(kc[l]));
    BENCH_CHECK(cudaFree(vc[l]));
  }
}

// kv-direct rebuild of one layer through the backend's RecomputeKv
// (kv_recompute.h): bf16 residual rows -> RMSNorm -> K and V projections
// (rows kD..kQkv of wqkv) -> RoPE on K -> bf16 K/V.
void RecomputeLayer(const Layer& L, const uint16_t* resid, int64_t rows,
                    float* workspace, const int32_t* pos, uint16_t* k,
                    uint16_t* v, GemmImpl impl, cudaStream_t s) {
  KvRecomputeArgs a;
  a.gemm_impl = impl;
  a.residual = resid;
  a.rows = rows;
  a.d_model = kD;
  a.ld_residual = kD;
  a.norm_weight = L.attn_norm;
  a.eps = kEps;
  a.wk = L.wqkv + kD * kD;
  a.wv = L.wqkv + (kD + kKvWidth) * kD;
  a.n_kv_heads = kKvHeads;
  a.head_dim = kHeadDim;
  a.head_begin = 0;
  a.head_end = kKvHeads;
  a.rot_dim = kHeadDim;
  a.rope_base = kRopeBase;
  a.rope_style = RopeStyle::kHalfSplit;
  a.positions = pos;
  a.k_out = k;
  a.v_out = v;
  a.ld_out = kKvWidth;
  a.workspace = workspace;
  BENCH_OK(RecomputeKv(a, s));
}

void Rebuild(const Model& m, const Options& o, cudaStream_t s) {
  const int64_t n = o.session_tokens;
  std::vector<int32_t> iota(n);
  for (int64_t i = 0; i < n; ++i) iota[i] = static_cast<int32_t>(i);
  const double proj_flops = 2.0 * n * kD * 2 * kKvWidth;

  // --- kv-direct: all layers' K/V from stored residuals.
  {
    std::vector<uint16_t*> resid(kLayers);
    for (int64_t l = 0; l < kLayers; ++l) {
      resid[l] = Alloc<uint16_t>(static_cast<size_t>(n * kD));
      BENCH_OK(bench::FillBf16(resid[l], static_cast<size_t>(n * kD), 300 + l,
                               2.0f, 0.0f, s));
    }
    float* ws = Alloc<float>(
        static_cast<size_t>(KvRecomputeWorkspaceFloats(n, kD, kKvWidth)));
    float* xf = ws;  // the normalised residual, reused for the GEMM-only run
    float* kv = Alloc<float>(static_cast<size_t>(n * 2 * kKvWidth));
    int32_t* pos = Alloc<int32_t>(n);
    Upload(pos, iota);
    uint16_t* k = Alloc<uint16_t>(static_cast<size_t>(n * kKvWidth));
    uint16_t* v = Alloc<uint16_t>(static_cast<size_t>(n * kKvWidth));
    // The one-layer rows, per GEMM implementation: recompute_kv_<tag>*.
    std::vector<std::pair<GemmImpl, std::string>> impls = {
        {GemmImpl::kWmma, ""}};
    if (o.mma) impls.push_back({GemmImpl::kMma, "mma_"});
    for (const auto& [impl, tag] : impls) {
      const double t_layer = MedianSeconds(o.quick ? 3 : 10, s, [&]() {
        RecomputeLayer(m.layers[0], resid[0], n, ws, pos, k, v, impl, s);
      });
      Result("recompute_kv_" + tag + "tflops", proj_flops / t_layer / 1e12,
             "TFLOP/s",
             "RecomputeKv, " + std::to_string(n) + " rows x (norm + " +
                 Int(kD) + "->" + Int(2 * kKvWidth) +
                 " projections + RoPE), projection FLOPs");
      const double t_gemm = MedianSeconds(o.quick ? 3 : 10, s, [&]() {
        BENCH_OK(Gemm({xf, ActType::kF32, n, kD},
                      {m.layers[0].wqkv + kD * kD, 2 * kKvWidth, kD, kD}, kv,
                      2 * kKvWidth, s, GemmTile::kAuto, impl));
      });
      Result("recompute_kv_" + tag + "gemm_only_tflops",
             proj_flops / t_gemm / 1e12, "TFLOP/s",
             "the projection alone, same shape");
    }
    // Every layer, each with its own weights and residuals (K/V buffers are
    // reused: the timing is of the compute, not of keeping 32 layers' K/V).
    const double t_all = MedianSeconds(o.quick ? 2 : 5, s, [&]() {
      for (int64_t l = 0; l < kLayers; ++l)
        RecomputeLayer(m.layers[l], resid[l], n, ws, pos, k, v, GemmImpl::kWmma,
                       s);
    });
    Result("rebuild_kv_direct_s", t_all, "s",
           "measured: " + std::to_string(n) + "-token session, K/V of all " +
               Int(kLayers) + " layers from residuals");
    for (uint16_t* p : resid) BENCH_CHECK(cudaFree(p));
    for (void* p : {static_cast<void*>(ws), static_cast<void*>(kv),
                    static_cast<void*>(pos), static_cast<void*>(k),
                    static_cast<void*>(v)})
      BENCH_CHECK(cudaFree(p));

    // --- re-prefill (tokens-only): full layers over all n tokens, causal.
    Scratch sc(n, /*logits_too=*/false);
    Upload(sc.pos, iota);
    Upload(sc.last, iota);
    Upload(sc.dest, iota);
    uint16_t* kc = Alloc<uint16_t>(static_cast<size_t>(n * kKvWidth));
    uint16_t* vc = Alloc<uint16_t>(static_cast<size_t>(n * kKvWidth));
    BENCH_OK(
        bench::FillF32(sc.x, static_cast<size_t>(n * kD), 9, 1.0f, 0.0f, s));
    const int64_t measured = std::min<int64_t>(o.prefill_layers, kLayers);
    const double t_pre = MedianSeconds(1, s, [&]() {
      for (int64_t l = 0; l < measured; ++l)
        LayerForward(m.layers[l], n, 0, kc, vc, sc, GemmImpl::kWmma, s);
    });
    const double t_full_layer = t_pre / measured;
    const double t_prefill = t_full_layer * kLayers;
    Result("rebuild_reprefill_s", t_prefill, "s",
           "measured " + Int(measured) + " of " + Int(kLayers) +
               " layers over " + std::to_string(n) +
               " tokens, scaled (layers are identical in shape)");
    sc.Free();
    BENCH_CHECK(cudaFree(kc));
    BENCH_CHECK(cudaFree(vc));

    // --- stride:k, estimated: a segment of k layers runs k - 1 full layers
    // plus one K/V recompute.
    const double t_kv_layer = t_all / kLayers;
    for (int64_t k_stride : {2, 4, 8}) {
      const double est =
          (kLayers / k_stride) * ((k_stride - 1) * t_full_layer + t_kv_layer);
      Result("rebuild_stride" + std::to_string(k_stride) + "_s_estimate", est,
             "s",
             "ESTIMATE from measured per-layer prefill and recompute times: " +
                 Int(kLayers / k_stride) + " x (" + Int(k_stride - 1) +
                 " full layers + 1 K/V recompute)");
    }
    Result("rebuild_reprefill_over_kv_direct", t_prefill / t_all, "x",
           "re-prefill time / kv-direct time");
  }
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> int64_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::strtoll(argv[++i], nullptr, 10);
    };
    if (a == "--quick") {
      o.quick = true;
    } else if (a == "--mma") {
      o.mma = true;
    } else if (a == "--ctx") {
      o.ctx = next();
    } else if (a == "--session-tokens") {
      o.session_tokens = next();
    } else if (a == "--prefill-layers") {
      o.prefill_layers = next();
    } else {
      std::fprintf(stderr,
                   "usage: model_benchmark [--quick] [--mma] [--ctx N] "
                   "[--session-tokens N] [--prefill-layers N]\n");
      return 2;
    }
  }
  if (o.ctx < 32 || o.ctx % 32 != 0 || o.session_tokens < 32 ||
      o.prefill_layers < 1) {
    std::fprintf(stderr,
                 "--ctx and --session-tokens: multiples of 32 >= 32; "
                 "--prefill-layers >= 1\n");
    return 2;
  }
  if (o.quick) {
    o.session_tokens = std::min<int64_t>(o.session_tokens, 8192);
    o.prefill_layers = 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto secs = [&]() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
        .count();
  };
  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %zu MiB\n", prop.name,
              prop.multiProcessorCount, prop.totalGlobalMem >> 20);
  cudaStream_t s;
  BENCH_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto read_bw = MeasureReadBandwidth(size_t{4} << 30, 10);
  BENCH_OK(read_bw.status());
  Result("hbm_read_8b", *read_bw / 1e9, "GB/s", "the floor's bandwidth");
  const Model m = MakeModel(s);
  std::printf("weights: %.2f GB bf16 in %.1f s\n", m.weight_bytes / 1e9,
              secs());
  Decode(m, o, *read_bw, {1, 8, 64, 256}, GemmImpl::kWmma, "", s);
  std::printf("decode done at %.1f s\n", secs());
  if (o.mma) {
    Decode(m, o, *read_bw, {1, 8, 64}, GemmImpl::kMma, "mma_", s);
    std::printf("decode (mma) done at %.1f s\n", secs());
  }
  std::fflush(stdout);
  Rebuild(m, o, s);
  std::printf("rebuild done at %.1f s\n", secs());
  BENCH_CHECK(cudaStreamSynchronize(s));
  return 0;
}

}  // namespace
}  // namespace kvd::kernels::cuda

int main(int argc, char** argv) { return kvd::kernels::cuda::Main(argc, argv); }
