// The GEMM through inline-PTX mma.sync (GemmImpl::kMma): the same function as
// the WMMA kernel in gemm.cu, bit for bit, with a deeper pipeline and tiles
// sized for sm_90.
//
// Why the bits equal the WMMA kernel's. Both kernels reduce to the same
// tensor-core instruction applied to the same operands in the same order:
//  - WMMA's bf16 m16n16k16 mma_sync compiles, on sm_80 and later, to two
//    HMMA.16816.F32.BF16 (one per 8-column half of the 16x16 tile), each
//    consuming the fragment's whole 16-wide k slice and adding into that
//    half's accumulators. mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32 is that
//    HMMA, one n8 half at a time (the SASS of both kernels can be compared
//    with cuobjdump -sass; tools/gpu/build_device_binaries.sh greps for it).
//  - An output element (i, j) of an HMMA depends only on row i of A, column j
//    of B and its own accumulator: which other rows and columns share the
//    instruction (other batch rows, other weight rows, zero padding) cannot
//    change it, which is what makes both kernels batch-invariant.
//  - Per element, both kernels start from +0.0f and issue exactly ceil(k/16)
//    such steps, k0 = 0, 16, 32, ... in increasing order, into one fp32
//    accumulator; never split-K. Steps wholly past k are skipped in both
//    (break on k0 + kk >= k), so a longer k tile adds no 0*0 step.
//  - The operands are the same bf16 values at the same k positions: W copied
//    bit for bit; bf16 activations copied bit for bit; fp32 activations
//    rounded to nearest-even (cvt.rn: here two at a time with
//    __floats2bfloat162_rn, or __float2bfloat16_rn on the element-copy path,
//    there __float2bfloat16_rn: the same rounding per value); k positions past
//    k are +0 in both A and B, rows past m or n are +0 too (they only feed
//    outputs that are not stored).
//  - No k permutation: the shared-memory tiles keep k in place and ldmatrix
//    puts element k0 + c of a tile at exactly the fragment position PTX
//    defines for column c, as WMMA's load_matrix_sync does.
// So each stored float is the same sequence of the same HMMA on the same
// inputs; gemm_mma_test checks this on the device (bit for bit against the
// WMMA kernel) rather than trusting the argument. Without a GPU,
// gemm_mma_index_test runs this kernel's addressing (internal/gemm_mma_index.h)
// through a CPU emulation of cp.async, ldmatrix and mma.m16n8k16.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/internal/cp_async.cuh"
#include "kernels/cuda/internal/cuda_check.h"
#include "kernels/cuda/internal/gemm_mma.h"
#include "kernels/cuda/internal/gemm_mma_index.h"

namespace kvd::kernels::cuda::internal {
namespace {

// Shared memory holds bf16 only: fp32 activations are rounded on their way in
// (16-byte global loads into registers one k tile ahead, rounded and stored
// after the current tile's mma), so every fragment comes from ldmatrix. Tile
// shapes, stage layout and all index arithmetic: internal/gemm_mma_index.h.
using mma::ChunkIndex;
using mma::DecodeTile;
using mma::InOperand;
using mma::kMidMaxM;
using mma::Layout;
using mma::MidTile;
using mma::PrefillTile;
using mma::RowCol;
using mma::SmemOffset;
using mma::TileChunk;

__device__ inline __nv_bfloat16 ToSmem(float v, __nv_bfloat16*) {
  return __float2bfloat16_rn(v);
}
__device__ inline __nv_bfloat16 ToSmem(__nv_bfloat16 v, __nv_bfloat16*) {
  return v;
}

// Copies rows [row0, row0 + kRows) x columns [k0, k0 + kBK) of a row-major
// matrix into shared memory (row stride kLdS), zero outside [0, rows_total) x
// [0, k). kVec: 16-byte cp.async copies (T == S; the caller checked k and ld
// are multiples of 16 bytes' worth of elements and the base is 16-byte
// aligned; out-of-range chunks are zero-filled without a global read);
// otherwise element copies, fp32 into bf16 rounded to nearest-even.
template <int kRows, int kBK, int kLdS, int kThreads, bool kVec, typename T,
          typename S>
__device__ inline void LoadTile(const T* __restrict__ g, int64_t rows_total,
                                int64_t k, int64_t ld, int64_t row0, int64_t k0,
                                S* s) {
  if constexpr (kVec) {
    static_assert(std::is_same_v<T, S>);
    constexpr int kPer = 16 / sizeof(T);
    constexpr int kChunksPerRow = kBK / kPer;
    constexpr int kChunks = kRows * kChunksPerRow;
    constexpr int kIters = (kChunks + kThreads - 1) / kThreads;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int i = ChunkIndex(it, kThreads, static_cast<int>(threadIdx.x));
      if (kChunks % kThreads != 0 && i >= kChunks) break;
      const RowCol rc = TileChunk(i, kBK, kPer);
      const int64_t gr = row0 + rc.row;
      const int64_t gc = k0 + rc.col;
      const bool in = InOperand(gr, gc, rows_total, k);
      internal::CpAsync16(s + SmemOffset(rc.row, rc.col, kLdS),
                          in ? g + gr * ld + gc : g, in ? 16 : 0);
    }
  } else {
    for (int i = threadIdx.x; i < kRows * kBK; i += kThreads) {
      const RowCol rc = TileChunk(i, kBK, 1);
      const int64_t gr = row0 + rc.row;
      const int64_t gc = k0 + rc.col;
      s[SmemOffset(rc.row, rc.col, kLdS)] = ToSmem(
          InOperand(gr, gc, rows_total, k) ? g[gr * ld + gc] : T(0.0f), s);
    }
  }
}

// fp32 activations rounded into bf16 shared memory through registers: Fetch
// issues the tile's 16-byte global loads (zeros outside [0, rows_total) x
// [0, k); the caller checked k % 4 == 0, ld % 4 == 0, 16-byte base), Store
// rounds them (cvt.rn, as __float2bfloat16_rn) and writes them, after the
// loads have had the current tile's mma to land.
template <int kRows, int kBK, int kLdS, int kThreads>
struct F32ToBf16Stager {
  static constexpr int kChunksPerRow = kBK / 4;
  static constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0);
  static constexpr int kIters = kChunks / kThreads;
  float4 v[kIters];

  __device__ inline void Fetch(const float* __restrict__ g, int64_t rows_total,
                               int64_t k, int64_t ld, int64_t row0,
                               int64_t k0) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const RowCol rc = TileChunk(
          ChunkIndex(it, kThreads, static_cast<int>(threadIdx.x)), kBK, 4);
      const int64_t gr = row0 + rc.row;
      const int64_t gc = k0 + rc.col;
      v[it] = InOperand(gr, gc, rows_total, k)
                  ? __ldg(reinterpret_cast<const float4*>(g + gr * ld + gc))
                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  __device__ inline void Store(__nv_bfloat16* s) const {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const RowCol rc = TileChunk(
          ChunkIndex(it, kThreads, static_cast<int>(threadIdx.x)), kBK, 4);
      const __nv_bfloat162 lo = __floats2bfloat162_rn(v[it].x, v[it].y);
      const __nv_bfloat162 hi = __floats2bfloat162_rn(v[it].z, v[it].w);
      uint2 u;
      memcpy(&u.x, &lo, 4);
      memcpy(&u.y, &hi, 4);
      *reinterpret_cast<uint2*>(s + SmemOffset(rc.row, rc.col, kLdS)) = u;
    }
  }
};

__device__ inline uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ inline void LdMatrixX4(uint32_t (&r)[4], const void* p) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(SmemAddr(p)));
}

__device__ inline void LdMatrixX2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(SmemAddr(p)));
}

// d += a * b over one 16-wide k step: the HMMA.16816.F32.BF16 that WMMA's
// m16n16k16 bf16 mma_sync issues twice.
__device__ inline void Mma16816(float (&d)[4], const uint32_t (&a)[4],
                                const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The A fragment of rows [r0, r0 + 16) x k [kk, kk + 16) of the stage (row
// stride kLd). PTX's m16n8k16 layout for lane = 4 * g + t: a[0] = (g,
// 2t..2t+1), a[1] = (g + 8, 2t..), a[2] = (g, 2t + 8..), a[3] = (g + 8, 2t
// + 8..).
template <int kLd>
__device__ inline void LoadA(uint32_t (&a)[4], const __nv_bfloat16* s, int r0,
                             int kk, int lane) {
  const RowCol p = mma::LdmA(lane, r0, kk);
  LdMatrixX4(a, s + SmemOffset(p.row, p.col, kLd));
}

template <class C, typename TA, bool kVecA, bool kVecB>
__global__ void __launch_bounds__(C::kThreads)
    MmaGemmKernel(const TA* __restrict__ x, int64_t m, int64_t ldx,
                  const __nv_bfloat16* __restrict__ w, int64_t n, int64_t k,
                  int64_t ldw, float* __restrict__ y, int64_t ldy, bool vec_y) {
  using SA = __nv_bfloat16;
  using L = Layout<C>;
  // fp32 rows through registers (F32ToBf16Stager); everything else through
  // LoadTile.
  constexpr bool kStaged = std::is_same_v<TA, float> && kVecA;
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const RowCol wpos = mma::WarpOf(warp, C::kWarpsN);
  const int wm = wpos.row;
  const int wn = wpos.col;

  const mma::TilePos tile = mma::BlockTile(blockIdx.x, (m + C::BM - 1) / C::BM,
                                           (n + C::BN - 1) / C::BN);
  const int64_t m0 = tile.tm * C::BM;
  const int64_t n0 = tile.tn * C::BN;

  auto a_tile = [&](int stage) {
    return reinterpret_cast<SA*>(smem + stage * L::kStageBytes);
  };
  auto b_tile = [&](int stage) {
    return reinterpret_cast<__nv_bfloat16*>(smem + stage * L::kStageBytes +
                                            L::kABytes);
  };
  F32ToBf16Stager<C::BM, C::BK, L::kLdA, C::kThreads> staged_a;
  // Issues tile k0's copies into `stage`; a staged A tile is only fetched
  // into registers (Store writes it).
  auto load_stage = [&](int stage, int64_t k0) {
    if constexpr (kStaged) {
      staged_a.Fetch(x, m, k, ldx, m0, k0);
    } else {
      LoadTile<C::BM, C::BK, L::kLdA, C::kThreads,
               kVecA && std::is_same_v<TA, SA>>(x, m, k, ldx, m0, k0,
                                                a_tile(stage));
    }
    LoadTile<C::BN, C::BK, L::kLdB, C::kThreads, kVecB>(w, n, k, ldw, n0, k0,
                                                        b_tile(stage));
  };

  float acc[C::kMt][C::kNt][4];
#pragma unroll
  for (int i = 0; i < C::kMt; ++i)
#pragma unroll
    for (int j = 0; j < C::kNt; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  const int64_t num_k_tiles = (k + C::BK - 1) / C::BK;
  // Prologue: kStages - 1 tiles in flight. Every iteration commits one group
  // (empty past the end) so wait_group's count stays exact.
#pragma unroll
  for (int st = 0; st < C::kStages - 1; ++st) {
    if (st < num_k_tiles) {
      load_stage(st, int64_t{st} * C::BK);
      if constexpr (kStaged) staged_a.Store(a_tile(st));
    }
    internal::CpAsyncCommit();
  }
  int read_stage = 0;
  int write_stage = C::kStages - 1;
  for (int64_t kt = 0; kt < num_k_tiles; ++kt) {
    // Tile kt has landed (for every thread, after the barrier); the stage
    // refilled next was last read in iteration kt - 1, before this barrier.
    internal::CpAsyncWait<C::kStages - 2>();
    __syncthreads();
    const int64_t next = kt + C::kStages - 1;
    if (next < num_k_tiles) load_stage(write_stage, next * C::BK);
    internal::CpAsyncCommit();

    const SA* as = a_tile(read_stage);
    const __nv_bfloat16* bs = b_tile(read_stage);
    const int64_t k0 = kt * C::BK;
#pragma unroll
    for (int kk = 0; kk < C::BK; kk += 16) {
      if (k0 + kk >= k) break;  // uniform; see the file comment
      uint32_t af[C::kMt][4];
      uint32_t bf[C::kNt][2];
#pragma unroll
      for (int i = 0; i < C::kMt; ++i)
        LoadA<L::kLdA>(af[i], as, mma::FragOrigin(wm, C::WM, i, 16), kk, lane);
      if constexpr (C::kNt == 1) {
        const RowCol p =
            mma::LdmBx2(lane, mma::FragOrigin(wn, C::WN, 0, 8), kk);
        LdMatrixX2(bf[0], bs + SmemOffset(p.row, p.col, L::kLdB));
      } else {
#pragma unroll
        for (int j = 0; j < C::kNt; j += 2) {
          // b of fragment j, then of fragment j + 1.
          const RowCol p =
              mma::LdmBx4(lane, mma::FragOrigin(wn, C::WN, j, 8), kk);
          uint32_t r[4];
          LdMatrixX4(r, bs + SmemOffset(p.row, p.col, L::kLdB));
          bf[j][0] = r[0];
          bf[j][1] = r[1];
          bf[j + 1][0] = r[2];
          bf[j + 1][1] = r[3];
        }
      }
#pragma unroll
      for (int i = 0; i < C::kMt; ++i)
#pragma unroll
        for (int j = 0; j < C::kNt; ++j) Mma16816(acc[i][j], af[i], bf[j]);
    }
    // The staged A tile `next` lands in write_stage, read in iteration next
    // after at least one more barrier; its previous contents (tile kt - 1)
    // were last read before this iteration's barrier.
    if constexpr (kStaged) {
      if (next < num_k_tiles) staged_a.Store(a_tile(write_stage));
    }
    read_stage = mma::NextStage(read_stage, C::kStages);
    write_stage = mma::NextStage(write_stage, C::kStages);
  }

  // acc[2h], acc[2h + 1] are one row's adjacent columns (mma::AccCoord).
  // Only [0, m) x [0, n) is written.
#pragma unroll
  for (int i = 0; i < C::kMt; ++i) {
#pragma unroll
    for (int j = 0; j < C::kNt; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const RowCol e = mma::AccCoord(lane, 2 * h);
        const int64_t row = m0 + mma::FragOrigin(wm, C::WM, i, 16) + e.row;
        const int64_t col = n0 + mma::FragOrigin(wn, C::WN, j, 8) + e.col;
        if (row >= m || col >= n) continue;
        float* out = y + row * ldy + col;
        if (vec_y && col + 1 < n) {
          *reinterpret_cast<float2*>(out) =
              make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        } else {
          out[0] = acc[i][j][2 * h];
          if (col + 1 < n) out[1] = acc[i][j][2 * h + 1];
        }
      }
    }
  }
}

// Raises `kernel`'s dynamic shared-memory limit to `bytes` once per device
// (the attribute is per device; bit d of `done` is device d). Once, rather
// than per launch, so launches inside a stream capture make no other runtime
// call than the launch itself after the first use on a device.
absl::Status EnsureSmemLimit(const void* kernel, size_t bytes,
                             std::atomic<uint64_t>* done) {
  int dev = 0;
  const absl::Status got = CudaStatus(cudaGetDevice(&dev), "cudaGetDevice");
  if (!got.ok()) return got;
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;
  if (bit != 0 && (done->load(std::memory_order_acquire) & bit) != 0) {
    return absl::OkStatus();
  }
  const absl::Status set = CudaStatus(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)),
      "cudaFuncSetAttribute (mma GEMM shared memory)");
  if (set.ok()) done->fetch_or(bit, std::memory_order_release);
  return set;
}

bool Aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <class C, typename TA, bool kVecA, bool kVecB>
absl::Status Launch(const TA* x, int64_t m, int64_t ldx, const __nv_bfloat16* w,
                    int64_t n, int64_t k, int64_t ldw, float* y, int64_t ldy,
                    cudaStream_t stream) {
  using L = Layout<C>;
  const int64_t tiles = ((m + C::BM - 1) / C::BM) * ((n + C::BN - 1) / C::BN);
  if (tiles > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gemm (mma): m=", m, " n=", n, " exceeds the grid; split the batch"));
  }
  auto* kernel = &MmaGemmKernel<C, TA, kVecA, kVecB>;
  if constexpr (L::kSmemBytes > 48 * 1024) {
    static std::atomic<uint64_t> done{0};
    const absl::Status st = EnsureSmemLimit(
        reinterpret_cast<const void*>(kernel), L::kSmemBytes, &done);
    if (!st.ok()) return st;
  }
  const bool vec_y = ldy % 2 == 0 && Aligned(y, 8);
  kernel<<<static_cast<unsigned>(tiles), C::kThreads, L::kSmemBytes, stream>>>(
      x, m, ldx, w, n, k, ldw, y, ldy, vec_y);
  return internal::LastLaunchStatus(
      absl::StrCat("Gemm (mma) m=", m, " n=", n, " k=", k));
}

template <class C>
absl::Status Dispatch(const Activations& x, const Bf16Weights& w, int64_t ldw,
                      float* y, int64_t ldy, cudaStream_t s) {
  const auto* wp = reinterpret_cast<const __nv_bfloat16*>(w.data);
  const bool vec_b = w.k % 8 == 0 && ldw % 8 == 0 && Aligned(w.data, 16);
  if (x.type == ActType::kF32) {
    const auto* xp = static_cast<const float*>(x.data);
    const bool vec_a = w.k % 4 == 0 && x.ld % 4 == 0 && Aligned(x.data, 16);
    if (vec_a && vec_b)
      return Launch<C, float, true, true>(xp, x.m, x.ld, wp, w.n, w.k, ldw, y,
                                          ldy, s);
    if (vec_a)
      return Launch<C, float, true, false>(xp, x.m, x.ld, wp, w.n, w.k, ldw, y,
                                           ldy, s);
    if (vec_b)
      return Launch<C, float, false, true>(xp, x.m, x.ld, wp, w.n, w.k, ldw, y,
                                           ldy, s);
    return Launch<C, float, false, false>(xp, x.m, x.ld, wp, w.n, w.k, ldw, y,
                                          ldy, s);
  }
  const auto* xp = static_cast<const __nv_bfloat16*>(x.data);
  const bool vec_a = w.k % 8 == 0 && x.ld % 8 == 0 && Aligned(x.data, 16);
  if (vec_a && vec_b)
    return Launch<C, __nv_bfloat16, true, true>(xp, x.m, x.ld, wp, w.n, w.k,
                                                ldw, y, ldy, s);
  if (vec_a)
    return Launch<C, __nv_bfloat16, true, false>(xp, x.m, x.ld, wp, w.n, w.k,
                                                 ldw, y, ldy, s);
  if (vec_b)
    return Launch<C, __nv_bfloat16, false, true>(xp, x.m, x.ld, wp, w.n, w.k,
                                                 ldw, y, ldy, s);
  return Launch<C, __nv_bfloat16, false, false>(xp, x.m, x.ld, wp, w.n, w.k,
                                                ldw, y, ldy, s);
}

}  // namespace

absl::Status GemmMma(const Activations& x, const Bf16Weights& w, int64_t ldw,
                     float* y, int64_t ldy, void* stream, GemmTile tile) {
  auto* s = static_cast<cudaStream_t>(stream);
  if (tile == GemmTile::kDecode)
    return Dispatch<DecodeTile>(x, w, ldw, y, ldy, s);
  if (x.m <= kMidMaxM) return Dispatch<MidTile>(x, w, ldw, y, ldy, s);
  return Dispatch<PrefillTile>(x, w, ldw, y, ldy, s);
}

}  // namespace kvd::kernels::cuda::internal
