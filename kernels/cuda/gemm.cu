// Tensor-core GEMM through WMMA (bf16 m16n16k16, fp32 accumulators). The
// numerics contract lives in gemm.h; what makes it batch-invariant here:
//  - each output element has exactly one accumulator fragment slot, updated by
//    one mma per 16-wide k step, k steps in increasing order;
//  - every tile configuration executes exactly ceil(k / 16) steps (steps that
//    lie wholly past k are skipped, so a larger k tile cannot add extra
//    zero-products and flip a -0 to +0);
//  - the zero padding of a partial k step is the same in every configuration;
//  - warps and blocks split only m and n, never k.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/internal/cp_async.cuh"
#include "kernels/cuda/internal/cuda_check.h"
#include "kernels/cuda/internal/gemm_mma.h"

namespace kvd::kernels::cuda {
namespace {

using internal::CpAsync16;
using internal::CpAsyncCommit;
using internal::CpAsyncWait;
namespace wmma = nvcuda::wmma;

// Block tile BM x BN, k tile BK, warp tile WM x WN.
template <int BM_, int BN_, int BK_, int WM_, int WN_>
struct TileConfig {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_;
  static constexpr int kWarpsN = BN / WN;
  static constexpr int kThreads = 32 * (BM / WM) * kWarpsN;
  // 8 bf16 (16 bytes) of padding per shared-memory row: keeps every wmma
  // pointer 32-byte aligned and spreads rows over the banks.
  static constexpr int kLd = BK + 8;
  static constexpr int kLdC = BN + 4;
  static constexpr size_t kStageBytes = size_t{BM + BN} * kLd * 2;
  static constexpr size_t kSmemBytes =
      std::max(2 * kStageBytes, size_t{BM} * kLdC * 4);
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0 &&
                BK % 16 == 0);
  static_assert(kSmemBytes <= 48 * 1024, "needs cudaFuncSetAttribute");
};

// m <= 16: one 16-row slab; a long k tile keeps many weight bytes in flight.
using DecodeTile = TileConfig<16, 64, 128, 16, 16>;
// Larger m: 8 warps of 32 x 32.
using PrefillTile = TileConfig<64, 128, 32, 32, 32>;

__device__ inline __nv_bfloat16 ToBf16(float v) {
  return __float2bfloat16_rn(v);
}
__device__ inline __nv_bfloat16 ToBf16(__nv_bfloat16 v) { return v; }

// Loads a rows x BK tile starting at (row0, k0) of a row-major matrix into
// shared memory (row stride kLd), zero outside [0, rows_total) x [0, k).
// kVec: 16-byte cp.async copies (needs bf16, k % 8 == 0, ld % 8 == 0 and a
// 16-byte aligned base); otherwise element loads with conversion to bf16.
template <class C, int kRows, bool kVec, typename T>
__device__ inline void LoadTile(const T* g, int64_t rows_total, int64_t k,
                                int64_t ld, int64_t row0, int64_t k0,
                                __nv_bfloat16* s) {
  if constexpr (kVec) {
    constexpr int kChunks = kRows * C::BK / 8;
    for (int i = threadIdx.x; i < kChunks; i += C::kThreads) {
      const int r = i / (C::BK / 8);
      const int c = (i % (C::BK / 8)) * 8;
      const int64_t gr = row0 + r;
      const int64_t gc = k0 + c;
      const bool in = gr < rows_total && gc < k;
      CpAsync16(s + r * C::kLd + c, in ? g + gr * ld + gc : g, in ? 16 : 0);
    }
  } else {
    for (int i = threadIdx.x; i < kRows * C::BK; i += C::kThreads) {
      const int r = i / C::BK;
      const int c = i % C::BK;
      const int64_t gr = row0 + r;
      const int64_t gc = k0 + c;
      s[r * C::kLd + c] = (gr < rows_total && gc < k)
                              ? ToBf16(g[gr * ld + gc])
                              : __float2bfloat16_rn(0.0f);
    }
  }
}

template <class C, typename TA, bool kVecA, bool kVecB>
__global__ void __launch_bounds__(C::kThreads)
    GemmKernel(const TA* __restrict__ x, int64_t m, int64_t ldx,
               const __nv_bfloat16* __restrict__ w, int64_t n, int64_t k,
               int64_t ldw, float* __restrict__ y, int64_t ldy) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kFm = C::WM / 16;
  constexpr int kFn = C::WN / 16;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * C::BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * C::BN;
  const int warp = threadIdx.x / 32;
  const int wm = warp / C::kWarpsN;
  const int wn = warp % C::kWarpsN;

  auto a_tile = [&](int stage) {
    return reinterpret_cast<__nv_bfloat16*>(smem + stage * C::kStageBytes);
  };
  auto b_tile = [&](int stage) { return a_tile(stage) + C::BM * C::kLd; };
  auto load_stage = [&](int stage, int64_t k0) {
    LoadTile<C, C::BM, kVecA>(x, m, k, ldx, m0, k0, a_tile(stage));
    LoadTile<C, C::BN, kVecB>(w, n, k, ldw, n0, k0, b_tile(stage));
    CpAsyncCommit();
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFm][kFn];
#pragma unroll
  for (int i = 0; i < kFm; ++i)
#pragma unroll
    for (int j = 0; j < kFn; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  const int64_t num_k_tiles = (k + C::BK - 1) / C::BK;
  load_stage(0, 0);
  for (int64_t kt = 0; kt < num_k_tiles; ++kt) {
    // Two-stage pipeline: the next tile's copies fly while this one computes.
    // The buffer being refilled was last read before the trailing barrier of
    // the previous iteration.
    if (kt + 1 < num_k_tiles) {
      load_stage((kt + 1) & 1, (kt + 1) * C::BK);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const __nv_bfloat16* a = a_tile(kt & 1);
    const __nv_bfloat16* b = b_tile(kt & 1);
    const int64_t k0 = kt * C::BK;
#pragma unroll
    for (int kk = 0; kk < C::BK; kk += 16) {
      if (k0 + kk >= k) break;  // uniform across the block; see file comment
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>
          af[kFm];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major>
          bf[kFn];
#pragma unroll
      for (int i = 0; i < kFm; ++i)
        wmma::load_matrix_sync(af[i], a + (wm * C::WM + i * 16) * C::kLd + kk,
                               C::kLd);
#pragma unroll
      for (int j = 0; j < kFn; ++j)
        wmma::load_matrix_sync(bf[j], b + (wn * C::WN + j * 16) * C::kLd + kk,
                               C::kLd);
#pragma unroll
      for (int i = 0; i < kFm; ++i)
#pragma unroll
        for (int j = 0; j < kFn; ++j)
          wmma::mma_sync(acc[i][j], af[i], bf[j], acc[i][j]);
    }
    __syncthreads();
  }

  // Stage the block's results in shared memory so the global stores are
  // masked per element and coalesced.
  float* cs = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < kFm; ++i)
#pragma unroll
    for (int j = 0; j < kFn; ++j)
      wmma::store_matrix_sync(
          cs + (wm * C::WM + i * 16) * C::kLdC + wn * C::WN + j * 16, acc[i][j],
          C::kLdC, wmma::mem_row_major);
  __syncthreads();
  for (int i = threadIdx.x; i < C::BM * C::BN; i += C::kThreads) {
    const int r = i / C::BN;
    const int c = i % C::BN;
    if (m0 + r < m && n0 + c < n)
      y[(m0 + r) * ldy + n0 + c] = cs[r * C::kLdC + c];
  }
}

bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <class C, typename TA, bool kVecA, bool kVecB>
absl::Status Launch(const TA* x, int64_t m, int64_t ldx, const __nv_bfloat16* w,
                    int64_t n, int64_t k, int64_t ldw, float* y, int64_t ldy,
                    cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((n + C::BN - 1) / C::BN),
                  static_cast<unsigned>((m + C::BM - 1) / C::BM));
  GemmKernel<C, TA, kVecA, kVecB><<<grid, C::kThreads, C::kSmemBytes, stream>>>(
      x, m, ldx, w, n, k, ldw, y, ldy);
  return internal::LastLaunchStatus(
      absl::StrCat("Gemm m=", m, " n=", n, " k=", k));
}

template <class C>
absl::Status Dispatch(const Activations& x, const Bf16Weights& w, int64_t ldw,
                      float* y, int64_t ldy, cudaStream_t stream) {
  const auto* wp = reinterpret_cast<const __nv_bfloat16*>(w.data);
  const bool vec_b = w.k % 8 == 0 && ldw % 8 == 0 && Aligned16(w.data);
  if (x.type == ActType::kF32) {
    const auto* xp = static_cast<const float*>(x.data);
    return vec_b ? Launch<C, float, false, true>(xp, x.m, x.ld, wp, w.n, w.k,
                                                 ldw, y, ldy, stream)
                 : Launch<C, float, false, false>(xp, x.m, x.ld, wp, w.n, w.k,
                                                  ldw, y, ldy, stream);
  }
  const auto* xp = static_cast<const __nv_bfloat16*>(x.data);
  const bool vec_a = w.k % 8 == 0 && x.ld % 8 == 0 && Aligned16(x.data);
  if (vec_a && vec_b)
    return Launch<C, __nv_bfloat16, true, true>(xp, x.m, x.ld, wp, w.n, w.k,
                                                ldw, y, ldy, stream);
  if (vec_a)
    return Launch<C, __nv_bfloat16, true, false>(xp, x.m, x.ld, wp, w.n, w.k,
                                                 ldw, y, ldy, stream);
  if (vec_b)
    return Launch<C, __nv_bfloat16, false, true>(xp, x.m, x.ld, wp, w.n, w.k,
                                                 ldw, y, ldy, stream);
  return Launch<C, __nv_bfloat16, false, false>(xp, x.m, x.ld, wp, w.n, w.k,
                                                ldw, y, ldy, stream);
}

}  // namespace

absl::Status Gemm(const Activations& x, const Bf16Weights& w, float* y,
                  int64_t ldy, void* stream, GemmTile tile, GemmImpl impl) {
  const int64_t ldw = w.ld == 0 ? w.k : w.ld;
  if (w.n <= 0 || w.k <= 0 || x.m < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gemm: need n > 0, k > 0, m >= 0; got m=", x.m, " n=", w.n,
                     " k=", w.k));
  }
  if (x.ld < w.k || ldw < w.k || ldy < w.n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gemm: strides too small: ldx=", x.ld, " ldw=", ldw,
        " must be >= k=", w.k, ", ldy=", ldy, " must be >= n=", w.n));
  }
  if (x.m == 0) return absl::OkStatus();
  if (x.data == nullptr || w.data == nullptr || y == nullptr) {
    return absl::InvalidArgumentError(
        "Gemm: null device pointer for x, w or y");
  }
  if ((x.m + PrefillTile::BM - 1) / PrefillTile::BM > 65535 ||
      (w.n + DecodeTile::BN - 1) / DecodeTile::BN > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gemm: m=", x.m, " or n=", w.n, " exceeds the grid; split the batch"));
  }
  if (impl == GemmImpl::kAuto) {
    impl = kMmaGemmVerified ? GemmImpl::kMma : GemmImpl::kWmma;
  }
  if (impl == GemmImpl::kMma) {
    if (tile == GemmTile::kAuto) {
      tile = x.m <= internal::kMmaDecodeMaxM ? GemmTile::kDecode
                                             : GemmTile::kPrefill;
    }
    return internal::GemmMma(x, w, ldw, y, ldy, stream, tile);
  }
  if (tile == GemmTile::kAuto) {
    tile = x.m <= DecodeTile::BM ? GemmTile::kDecode : GemmTile::kPrefill;
  }
  auto* s = static_cast<cudaStream_t>(stream);
  if (tile == GemmTile::kDecode) {
    if ((x.m + DecodeTile::BM - 1) / DecodeTile::BM > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Gemm: m=", x.m, " too large for the decode tile; use kPrefill"));
    }
    return Dispatch<DecodeTile>(x, w, ldw, y, ldy, s);
  }
  return Dispatch<PrefillTile>(x, w, ldw, y, ldy, s);
}

}  // namespace kvd::kernels::cuda
