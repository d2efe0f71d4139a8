// Tile shapes and index arithmetic of the mma.sync GEMM (gemm_mma.cu), shared
// by the kernel and a CPU test (gemm_mma_index_test.cc) that simulates the
// kernel's warp-level data movement without a GPU: which global chunk each
// thread copies into which shared-memory offset, which stage row each lane
// hands to ldmatrix, which output (row, col) each accumulator register holds,
// and which output tile each block computes. The kernel calls only these
// functions for that arithmetic, so the test checks the kernel's real
// addressing.
//
// Everything here is integer arithmetic, so host and device agree exactly.
#ifndef KVD_KERNELS_CUDA_INTERNAL_GEMM_MMA_INDEX_H_
#define KVD_KERNELS_CUDA_INTERNAL_GEMM_MMA_INDEX_H_

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define KVD_MMA_FN __host__ __device__ constexpr inline
#else
#define KVD_MMA_FN constexpr inline
#endif

namespace kvd::kernels::cuda::internal::mma {

// Block tile BM x BN, k tile BK, warp tile WM x WN, kStages shared-memory
// stages (kStages - 1 k tiles in flight while one is computed).
template <int BM_, int BN_, int BK_, int WM_, int WN_, int kStages_>
struct MmaTile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_;
  static constexpr int kStages = kStages_;
  static constexpr int kWarpsN = BN / WN;
  static constexpr int kThreads = 32 * (BM / WM) * kWarpsN;
  static constexpr int kMt = WM / 16;  // m16 fragments per warp
  static constexpr int kNt = WN / 8;   // n8 fragments per warp
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 8 == 0 &&
                BK % 16 == 0);
  static_assert(kNt == 1 || kNt % 2 == 0, "B is loaded 16 columns at a time");
  static_assert(kStages >= 2);
};

// Prefill / recompute: 4 warps of 64 x 64 (CUTLASS's sm_80 shape): per 16-wide
// k step a warp reads 64 A rows and 64 B rows from shared memory (2 bytes
// each) for 32 HMMA, half the shared-memory bytes per HMMA of 64 x 32 warps.
// 4 stages of 32-wide k tiles: 80 KiB, two blocks per SM.
using PrefillTile = MmaTile<128, 128, 32, 64, 64, 4>;
// Decode (m <= 16): one 16-row slab and 16 weight rows per block, so n is
// spread over n / 16 blocks (256 for n = 4096). The bytes in flight over the
// whole grid are n * (kStages - 1) * BK * 2 whatever BN is: 1280 per weight
// row here, 5 MiB for n = 4096, enough to cover HBM latency at full
// bandwidth. 52 KiB per block (4 per SM).
using DecodeTile = MmaTile<16, 16, 128, 16, 8, 6>;
// 16 < m <= 64 under kPrefill (small batched decode): 128-row blocks would
// idle half their warps and give n / 128 blocks; 4 warps of 32 x 32 over
// 64 x 64 give twice the blocks. Same k walk, so the same bits.
using MidTile = MmaTile<64, 64, 32, 32, 32, 4>;
inline constexpr int64_t kMidMaxM = 64;

// One stage in shared memory: A (BM rows) then B (BN rows) of bf16, each row
// BK + 8 elements: the 16 bytes of padding put ldmatrix's 8 row addresses in
// distinct banks.
template <class C>
struct Layout {
  static constexpr int kLdA = C::BK + 8;
  static constexpr int kLdB = C::BK + 8;
  static constexpr size_t kABytes = size_t{C::BM} * kLdA * 2;
  static constexpr size_t kStageBytes = kABytes + size_t{C::BN} * kLdB * 2;
  static constexpr size_t kSmemBytes = kStageBytes * C::kStages;
  static_assert(kABytes % 16 == 0 && kStageBytes % 16 == 0);
};

// A position in a tile: (row, k) of an operand tile, or (row, col) of an
// output fragment.
struct RowCol {
  int row;
  int col;
};

// Element offset of (row, k) in an operand tile of row stride ld (elements),
// relative to the tile's base (A's or B's part of a stage).
KVD_MMA_FN int SmemOffset(int row, int k, int ld) { return row * ld + k; }

// Index of the it-th chunk thread tid copies (chunks are dealt round-robin).
KVD_MMA_FN int ChunkIndex(int it, int threads, int tid) {
  return it * threads + tid;
}

// Tile (row, k) of chunk i when a tile of bk columns is copied `per` elements
// at a time (per = 8: 16-byte cp.async of bf16; 4: a float4 of fp32 rounded
// into bf16; 1: element copies).
KVD_MMA_FN RowCol TileChunk(int i, int bk, int per) {
  return {i / (bk / per), (i % (bk / per)) * per};
}

// Whether global (gr, gc) is inside the rows_total x k operand (else the
// chunk or element is zero-filled).
KVD_MMA_FN bool InOperand(int64_t gr, int64_t gc, int64_t rows_total,
                          int64_t k) {
  return gr < rows_total && gc < k;
}

// The warp's tile within the block: (warp row, warp column).
KVD_MMA_FN RowCol WarpOf(int warp, int warps_n) {
  return {warp / warps_n, warp % warps_n};
}

// First tile row (A) or column (B, output) of fragment i of warp position w
// with warp tile extent wt and fragment extent frag (16 for m, 8 for n).
KVD_MMA_FN int FragOrigin(int w, int wt, int i, int frag) {
  return w * wt + i * frag;
}

// ldmatrix.x4 row address of `lane` for the A fragment of tile rows
// [r0, r0 + 16) x k [kk, kk + 16). Lanes 0-15 address rows 0-15 at kk, lanes
// 16-31 rows 0-15 at kk + 8: matrices 0..3 = (rows 0-7, k lo), (8-15, lo),
// (0-7, hi), (8-15, hi), which are a[0..3] of PTX's m16n8k16 A fragment.
KVD_MMA_FN RowCol LdmA(int lane, int r0, int kk) {
  return {r0 + (lane & 15), kk + (lane >> 4) * 8};
}

// ldmatrix.x2 row address of `lane` for the B fragment of weight rows (output
// columns) [c0, c0 + 8) x k [kk, kk + 16): lanes 0-7 at kk (b[0]), lanes 8-15
// at kk + 8 (b[1]); lanes 16-31 are ignored by .x2 but stay in the tile.
KVD_MMA_FN RowCol LdmBx2(int lane, int c0, int kk) {
  return {c0 + (lane & 7), kk + ((lane >> 3) & 1) * 8};
}

// ldmatrix.x4 row address of `lane` for the B fragments of weight rows
// [c0, c0 + 16): matrices 0..3 = (columns 0-7, k lo), (0-7, hi), (8-15, lo),
// (8-15, hi): b of the fragment at c0, then of the one at c0 + 8.
KVD_MMA_FN RowCol LdmBx4(int lane, int c0, int kk) {
  return {c0 + (lane >> 4) * 8 + (lane & 7), kk + ((lane >> 3) & 1) * 8};
}

// (row, col) within the 16 x 8 output fragment of accumulator register e of
// `lane` (PTX's m16n8k16 f32 C/D layout): e = 0, 1 at (g, 2t), (g, 2t + 1);
// e = 2, 3 at (g + 8, 2t), (g + 8, 2t + 1), for lane = 4 * g + t. The
// epilogue stores e = 2h, 2h + 1 as one pair at columns col, col + 1.
KVD_MMA_FN RowCol AccCoord(int lane, int e) {
  return {(lane >> 2) + 8 * (e >> 1), 2 * (lane & 3) + (e & 1)};
}

// The output tile (m tile, n tile) of block pid: blocks walk groups of 8 m
// tiles across all n tiles, so the activation rows of a group and each weight
// tile are reused from L2 (no effect on what any element computes).
struct TilePos {
  int64_t tm;
  int64_t tn;
};
KVD_MMA_FN TilePos BlockTile(int64_t pid, int64_t tiles_m, int64_t tiles_n) {
  constexpr int64_t kGroupM = 8;
  const int64_t per_group = kGroupM * tiles_n;
  const int64_t first_m = (pid / per_group) * kGroupM;
  const int64_t group_m =
      tiles_m - first_m < kGroupM ? tiles_m - first_m : kGroupM;
  const int64_t in_group = pid % per_group;
  return {first_m + in_group % group_m, in_group / group_m};
}

// The stage after s in the ring of `stages`.
KVD_MMA_FN int NextStage(int s, int stages) {
  return s + 1 == stages ? 0 : s + 1;
}

}  // namespace kvd::kernels::cuda::internal::mma

#endif  // KVD_KERNELS_CUDA_INTERNAL_GEMM_MMA_INDEX_H_
