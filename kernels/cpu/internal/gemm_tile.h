// The canonical GEMM tile, written once and instantiated per ISA (internal).
//
// Canonical order (the numerics contract, kernels/cpu/README.md): for one
// output element, the reduction over k uses 16 fp32 lane accumulators; lane r
// accumulates k = r, r+16, r+32, ... in increasing k with fused multiply-add; a
// tail shorter than 16 is zero-padded (lanes past the end add 0*0); the 16
// lanes are then summed by a fixed tree: s[i] = l[i] + l[i+8], t[i] = s[i] +
// s[i+4], u[i] = t[i] + t[i+2], result = u[0] + u[1]. Tiling over rows (m) and
// columns (n) only changes which elements are computed together, never the
// order inside one element, so results do not depend on the batch size, the
// tile shape, the thread count or the ISA.
//
// The functions sit in an anonymous namespace on purpose: every ISA translation
// unit gets its own copy compiled with its own flags, and the linker can never
// merge an AVX-512 copy into the AVX2 path.
#ifndef KVD_KERNELS_CPU_INTERNAL_GEMM_TILE_H_
#define KVD_KERNELS_CPU_INTERNAL_GEMM_TILE_H_

#include <cstdint>
#include <cstring>

#include "kernels/cpu/internal/gemm_isa.h"

namespace kvd::kernels::cpu::internal {
namespace {

constexpr int kLanes = 16;
// Rows of x kept hot while a block of weight rows streams past.
constexpr int64_t kRowBlock = 64;

template <class Ops, class W, int MR, int NR>
inline void TileDot(const float* x, int64_t ldx, const W* w, int64_t ldw,
                    int64_t k, float* y, int64_t ldy) {
  typename Ops::V acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = Ops::Zero();
  const int64_t k_full = k / kLanes * kLanes;
  for (int64_t kk = 0; kk < k_full; kk += kLanes) {
    typename Ops::V xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = Ops::Load(x + i * ldx + kk);
    for (int j = 0; j < NR; ++j) {
      if (MR == 1) {
        // Decode streams each weight once from DRAM in short rows, which the
        // hardware prefetchers follow poorly; fetch the same offset of the next
        // tile's rows now.
        __builtin_prefetch(w + (j + NR) * ldw + kk, 0, 0);
      }
      const typename Ops::V wv = Ops::Load(w + j * ldw + kk);
      for (int i = 0; i < MR; ++i) acc[i][j] = Ops::Fma(xv[i], wv, acc[i][j]);
    }
  }
  if (k_full < k) {
    // Zero-padded tail: the same lanes receive the same products as in an
    // unpadded run.
    const int64_t rest = k - k_full;
    float xt[MR][kLanes];
    W wt[NR][kLanes];
    std::memset(xt, 0, sizeof(xt));
    std::memset(wt, 0, sizeof(wt));
    for (int i = 0; i < MR; ++i)
      std::memcpy(xt[i], x + i * ldx + k_full, rest * sizeof(float));
    for (int j = 0; j < NR; ++j)
      std::memcpy(wt[j], w + j * ldw + k_full, rest * sizeof(W));
    typename Ops::V xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = Ops::Load(xt[i]);
    for (int j = 0; j < NR; ++j) {
      const typename Ops::V wv = Ops::Load(wt[j]);
      for (int i = 0; i < MR; ++i) acc[i][j] = Ops::Fma(xv[i], wv, acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = Ops::Reduce(acc[i][j]);
}

// With groups > 1, k is cut into `groups` equal slices, each a canonical dot
// of its own, and the slices' results are added in order (the row-parallel
// projections, row_parallel_gemm.h); the tile reads each weight row front to
// back once either way.
template <class Ops, class W, int MR, int NR>
inline void Tile(const float* x, int64_t ldx, const W* w, int64_t ldw,
                 int64_t k, int64_t groups, float* y, int64_t ldy) {
  if (groups <= 1) {
    TileDot<Ops, W, MR, NR>(x, ldx, w, ldw, k, y, ldy);
    return;
  }
  const int64_t slice = k / groups;
  float sum[MR][NR], part[MR][NR];
  TileDot<Ops, W, MR, NR>(x, ldx, w, ldw, slice, &sum[0][0], NR);
  for (int64_t g = 1; g < groups; ++g) {
    TileDot<Ops, W, MR, NR>(x + g * slice, ldx, w + g * slice, ldw, slice,
                            &part[0][0], NR);
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) sum[i][j] += part[i][j];
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = sum[i][j];
}

// Computes columns [n0, n0 + nr) for rows [m0, m0 + mr), mr <= MR, nr <= NR, by
// picking the instantiation of exactly that shape (remainder tiles use smaller
// shapes, same order).
template <class Ops, class W, int MR, int NR>
inline void TileAny(const GemmArgs& a, const W* w, int64_t m0, int mr,
                    int64_t n0, int nr) {
  const float* x = a.x + m0 * a.ldx;
  const W* wr = w + n0 * a.ldw;
  float* y = a.y + m0 * a.ldy + n0;
  if (mr == MR && nr == NR) {
    Tile<Ops, W, MR, NR>(x, a.ldx, wr, a.ldw, a.k, a.groups, y, a.ldy);
    return;
  }
  // Remainders: one row at a time, columns in NR-wide or single steps.
  for (int i = 0; i < mr; ++i) {
    int j = 0;
    for (; j + NR <= nr; j += NR)
      Tile<Ops, W, 1, NR>(x + i * a.ldx, a.ldx, wr + j * a.ldw, a.ldw, a.k,
                          a.groups, y + i * a.ldy + j, a.ldy);
    for (; j < nr; ++j)
      Tile<Ops, W, 1, 1>(x + i * a.ldx, a.ldx, wr + j * a.ldw, a.ldw, a.k,
                         a.groups, y + i * a.ldy + j, a.ldy);
  }
}

template <class Ops, class W, int MR, int NR, int NR1>
inline void GemmRange(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  const W* w = static_cast<const W*>(a.w);
  if (a.m == 1) {
    // Decode: one activation row against many weight rows; wider column tiles
    // keep more weight streams in flight.
    int64_t n = n_begin;
    for (; n + NR1 <= n_end; n += NR1)
      TileAny<Ops, W, 1, NR1>(a, w, 0, 1, n, NR1);
    if (n < n_end)
      TileAny<Ops, W, 1, NR1>(a, w, 0, 1, n, static_cast<int>(n_end - n));
    return;
  }
  for (int64_t m_blk = 0; m_blk < a.m; m_blk += kRowBlock) {
    const int64_t m_blk_end = m_blk + kRowBlock < a.m ? m_blk + kRowBlock : a.m;
    for (int64_t n = n_begin; n < n_end; n += NR) {
      const int nr = static_cast<int>(n_end - n < NR ? n_end - n : NR);
      for (int64_t m = m_blk; m < m_blk_end; m += MR) {
        const int mr =
            static_cast<int>(m_blk_end - m < MR ? m_blk_end - m : MR);
        TileAny<Ops, W, MR, NR>(a, w, m, mr, n, nr);
      }
    }
  }
}

}  // namespace
}  // namespace kvd::kernels::cpu::internal

#endif  // KVD_KERNELS_CPU_INTERNAL_GEMM_TILE_H_
