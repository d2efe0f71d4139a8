// Runs without a GPU: simulates the mma.sync GEMM (gemm_mma.cu) block by
// block on the host, driven by the kernel's own index arithmetic
// (internal/gemm_mma_index.h), and checks it against a plain CPU GEMM.
//
// The simulation fills each shared-memory stage the way the kernel's copy
// paths do (16-byte cp.async chunks of bf16 with zero fill, float4 chunks of
// fp32 rounded to bf16, element copies), follows the kernel's stage ring and
// k walk, emulates ldmatrix and mma.m16n8k16 from the PTX ISA's definitions
// (written here independently of the header), and writes the accumulators
// through the kernel's epilogue map. Every shared-memory element carries a tag
// saying which global (row, k) it came from, so a wrong address is reported
// as the exact fragment element that holds the wrong operand, not only as a
// wrong sum. Not covered: real cp.async timing, the device's rounding (cvt.rn
// vs FloatToBf16) and the HMMA's internal accumulation order.
#include "kernels/cuda/internal/gemm_mma_index.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/elementwise.h"

namespace kvd::kernels::cuda::internal::mma {
namespace {

using kvd::kernels::cpu::Bf16ToFloat;
using kvd::kernels::cpu::FloatToBf16;

// A shared-memory element or half of a 32-bit register: its bits and the
// global element it came from.
struct Cell {
  uint16_t bits;
  int64_t tag;
};
constexpr int64_t kZeroTag = -1;          // zero fill (outside the operand)
constexpr int64_t kPoisonTag = -2;        // never written
constexpr int64_t kJunkTag = -3;          // a stride's padding past k
constexpr uint16_t kPoisonBits = 0x7FC1;  // a NaN
constexpr int64_t kBTagBase = int64_t{1} << 40;

// One 32-bit register: element 2c in the low half, 2c + 1 in the high half
// (ldmatrix and the mma fragments both pair a row's adjacent columns so).
struct Reg {
  Cell lo, hi;
};

enum class APath { kBf16Vec, kBf16Elem, kF32Staged, kF32Elem };

const char* Name(APath p) {
  switch (p) {
    case APath::kBf16Vec:
      return "bf16 cp.async";
    case APath::kBf16Elem:
      return "bf16 element";
    case APath::kF32Staged:
      return "fp32 staged";
    case APath::kF32Elem:
      return "fp32 element";
  }
  return "?";
}

struct Problem {
  int64_t m, n, k, ldx, ldw;
  APath a_path;
  bool vec_b;
  std::vector<float> x_f32;      // m x ldx when A is fp32
  std::vector<uint16_t> x_bf16;  // m x ldx when A is bf16
  std::vector<uint16_t> w;       // n x ldw

  bool a_f32() const {
    return a_path == APath::kF32Staged || a_path == APath::kF32Elem;
  }
  // The bf16 operand the kernel multiplies (fp32 rounded to nearest even).
  uint16_t ABits(int64_t r, int64_t c) const {
    return a_f32() ? FloatToBf16(x_f32[r * ldx + c]) : x_bf16[r * ldx + c];
  }
};

int64_t TagA(const Problem& p, int64_t r, int64_t c) { return r * p.k + c; }
int64_t TagB(const Problem& p, int64_t r, int64_t c) {
  return kBTagBase + r * p.k + c;
}

// Failures are counted; only the first few are printed.
struct Checker {
  int64_t failures = 0;
  int64_t ldm_phases = 0;
  int64_t ldm_conflicted = 0;
  std::string context;
  void Fail(const std::string& what) {
    if (failures++ < 12) ADD_FAILURE() << context << ": " << what;
  }
};
// The message is only built on failure (the simulation checks millions of
// elements).
#define SIM_CHECK(checker, cond, msg) \
  do {                                \
    if (!(cond)) (checker).Fail(msg); \
  } while (0)

std::string At(int64_t a, int64_t b) {
  return "(" + std::to_string(a) + ", " + std::to_string(b) + ")";
}

// One operand tile's copy into a stage as one of the kernel's paths does it:
// chunked (per 8: LoadTile's 16-byte cp.async, per 4: F32ToBf16Stager) with
// chunk ChunkIndex(it, threads, tid), or element-wise (LoadTile's strided
// loop). `global(gr, gc)` is the in-range operand element. `writes` counts
// writes per tile element so each fill can be checked to cover the tile once.
template <class Global>
void FillTile(std::vector<Cell>* smem, std::vector<int>* writes,
              size_t base_elem, int rows, int bk, int ld, int threads, int per,
              int64_t rows_total, int64_t k, int64_t row0, int64_t k0,
              const Global& global, Checker& check) {
  auto put = [&](int off, Cell c) {
    const size_t at = base_elem + static_cast<size_t>(off);
    if (off < 0 || off >= rows * ld || at >= smem->size()) {
      check.Fail("copy outside the tile, offset " + std::to_string(off));
      return;
    }
    (*smem)[at] = c;
    ++(*writes)[off];
  };
  if (per == 1) {
    for (int tid = 0; tid < threads; ++tid) {
      for (int i = tid; i < rows * bk; i += threads) {
        const RowCol rc = TileChunk(i, bk, 1);
        const int64_t gr = row0 + rc.row, gc = k0 + rc.col;
        put(SmemOffset(rc.row, rc.col, ld), InOperand(gr, gc, rows_total, k)
                                                ? global(gr, gc)
                                                : Cell{0, kZeroTag});
      }
    }
    return;
  }
  const int chunks = rows * (bk / per);
  const int iters = (chunks + threads - 1) / threads;
  for (int tid = 0; tid < threads; ++tid) {
    for (int it = 0; it < iters; ++it) {
      const int i = ChunkIndex(it, threads, tid);
      if (i >= chunks) break;
      const RowCol rc = TileChunk(i, bk, per);
      const int64_t gr = row0 + rc.row, gc = k0 + rc.col;
      const bool in = InOperand(gr, gc, rows_total, k);
      const int off = SmemOffset(rc.row, rc.col, ld);
      // cp.async 16 needs 16-byte aligned shared addresses; the stager's
      // uint2 store 8.
      SIM_CHECK(check, (base_elem + off) * 2 % (per * 2) == 0,
                "misaligned chunk store at tile " + At(rc.row, rc.col));
      // In-range chunks are read whole: they must not run past k.
      if (in)
        SIM_CHECK(check, gc + per <= k, "chunk reads past k at " + At(gr, gc));
      for (int e = 0; e < per; ++e) {
        // A 16-byte copy reads all of its elements, in range or not.
        put(off + e, in ? global(gr, gc + e) : Cell{0, kZeroTag});
      }
    }
  }
}

// ldmatrix.sync.aligned.m8n8.{x2,x4}.shared.b16 as the PTX ISA defines it
// ("Warp-level matrix load instruction: ldmatrix"): for matrix q, lanes
// 8q..8q+7 supply the addresses of its rows 0..7, each row 8 consecutive
// 16-bit elements; lane t receives row t / 4, columns 2 * (t % 4) and
// 2 * (t % 4) + 1 of matrix q in register q. `addr` are element offsets into
// smem; rows must lie in [lo, hi) and be 16-byte aligned.
void LdMatrix(const std::vector<Cell>& smem, const size_t (&addr)[32], int nmat,
              size_t lo, size_t hi, Reg (*out)[4], Checker& check) {
  std::set<size_t> rows;
  for (int l = 0; l < 8 * nmat; ++l) {
    SIM_CHECK(
        check, addr[l] % 8 == 0,
        "ldmatrix row address not 16-byte aligned, lane " + std::to_string(l));
    SIM_CHECK(
        check, addr[l] >= lo && addr[l] + 8 <= hi,
        "ldmatrix row outside its operand tile, lane " + std::to_string(l));
    SIM_CHECK(check, rows.insert(addr[l]).second,
              "two lanes address one ldmatrix row, lane " + std::to_string(l));
  }
  for (int q = 0; q < nmat; ++q) {
    // One phase: 8 rows x 16 bytes over 32 four-byte banks.
    std::set<size_t> banks;
    for (int r = 0; r < 8; ++r) {
      for (int w = 0; w < 4; ++w) banks.insert((addr[8 * q + r] / 2 + w) % 32);
    }
    ++check.ldm_phases;
    if (banks.size() != 32) ++check.ldm_conflicted;
  }
  for (int t = 0; t < 32; ++t) {
    for (int q = 0; q < nmat; ++q) {
      const size_t row = addr[8 * q + t / 4];
      const size_t at = row + 2 * (t % 4);
      if (at + 1 >= smem.size()) {
        check.Fail("ldmatrix past shared memory");
        continue;
      }
      out[t][q] = {smem[at], smem[at + 1]};
    }
  }
}

// The operand a fragment element must hold: the global element (or a zero
// outside the operand) at (gr, gk).
void ExpectCell(const Cell& c, bool in, int64_t tag, const char* what,
                int64_t gr, int64_t gk, Checker& check) {
  if (in) {
    SIM_CHECK(check, c.tag == tag,
              std::string(what) + " fragment element for global " + At(gr, gk) +
                  " holds tag " + std::to_string(c.tag) + " instead of " +
                  std::to_string(tag));
  } else {
    SIM_CHECK(check, c.tag == kZeroTag && c.bits == 0,
              std::string(what) + " fragment element outside the operand " +
                  At(gr, gk) + " is not a zero fill (tag " +
                  std::to_string(c.tag) + ")");
  }
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, d = a * b + c, with
// the PTX ISA's fragment layouts ("Matrix Fragments for mma.m16n8k16 with
// floating point type"), lane = 4 * g + t:
//  A (16 x 16, .bf16): a0,a1 = (g, 2t), (g, 2t+1); a2,a3 = (g+8, 2t..);
//    a4,a5 = (g, 2t+8..); a6,a7 = (g+8, 2t+8..), two per 32-bit register.
//  B (16 x 8, k x n): b0,b1 = (k 2t, 2t+1; n g); b2,b3 = (k 2t+8, 2t+9; n g).
//  C/D (16 x 8, .f32): c0,c1 = (g, 2t), (g, 2t+1); c2,c3 = (g+8, 2t..).
// Also checks that every A and B element is the operand the GEMM needs:
// A(row a_row0 + r, k k0 + c), B(weight row b_row0 + n, k k0 + kk).
void Mma16816(const Reg (*a)[4], const Reg (*b)[4], float (*acc)[4],
              const Problem& p, int64_t a_row0, int64_t b_row0, int64_t k0,
              Checker& check) {
  Cell am[16][16], bm[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    const int rows[4] = {g, g + 8, g, g + 8};
    const int cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int q = 0; q < 4; ++q) {
      am[rows[q]][cols[q]] = a[lane][q].lo;
      am[rows[q]][cols[q] + 1] = a[lane][q].hi;
    }
    bm[2 * t][g] = b[lane][0].lo;
    bm[2 * t + 1][g] = b[lane][0].hi;
    bm[2 * t + 8][g] = b[lane][1].lo;
    bm[2 * t + 9][g] = b[lane][1].hi;
  }
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      const int64_t gr = a_row0 + r, gk = k0 + c;
      const bool in = InOperand(gr, gk, p.m, p.k);
      ExpectCell(am[r][c], in, in ? TagA(p, gr, gk) : 0, "A", gr, gk, check);
    }
  }
  for (int kk = 0; kk < 16; ++kk) {
    for (int c = 0; c < 8; ++c) {
      const int64_t gn = b_row0 + c, gk = k0 + kk;
      const bool in = InOperand(gn, gk, p.n, p.k);
      ExpectCell(bm[kk][c], in, in ? TagB(p, gn, gk) : 0, "B", gn, gk, check);
    }
  }
  float d[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    d[g][2 * t] = acc[lane][0];
    d[g][2 * t + 1] = acc[lane][1];
    d[g + 8][2 * t] = acc[lane][2];
    d[g + 8][2 * t + 1] = acc[lane][3];
  }
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 8; ++c) {
      double s = 0.0;
      for (int kk = 0; kk < 16; ++kk) {
        s += static_cast<double>(Bf16ToFloat(am[r][kk].bits)) *
             Bf16ToFloat(bm[kk][c].bits);
      }
      d[r][c] = static_cast<float>(d[r][c] + s);
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    acc[lane][0] = d[g][2 * t];
    acc[lane][1] = d[g][2 * t + 1];
    acc[lane][2] = d[g + 8][2 * t];
    acc[lane][3] = d[g + 8][2 * t + 1];
  }
}

// The whole grid of MmaGemmKernel<C, ...> for problem p, one block at a time,
// in the kernel's order of copies, barriers and reads. Writes y (m x n) and
// counts writes per output element.
template <class C>
void SimulateGemm(const Problem& p, std::vector<float>* y,
                  std::vector<int>* y_writes, Checker& check) {
  using L = Layout<C>;
  const size_t stage_elems = L::kStageBytes / 2;
  const size_t a_elems = L::kABytes / 2;
  const int64_t tiles_m = (p.m + C::BM - 1) / C::BM;
  const int64_t tiles_n = (p.n + C::BN - 1) / C::BN;
  const int64_t num_k_tiles = (p.k + C::BK - 1) / C::BK;
  auto global_a = [&](int64_t r, int64_t c) {
    if (c >= p.ldx) return Cell{kPoisonBits, kJunkTag};
    return Cell{p.ABits(r, c), c < p.k ? TagA(p, r, c) : kJunkTag};
  };
  auto global_b = [&](int64_t r, int64_t c) {
    if (c >= p.ldw) return Cell{kPoisonBits, kJunkTag};
    return Cell{p.w[r * p.ldw + c], c < p.k ? TagB(p, r, c) : kJunkTag};
  };
  const int a_per = p.a_path == APath::kBf16Vec     ? 8
                    : p.a_path == APath::kF32Staged ? 4
                                                    : 1;
  // A written by load_stage (LoadTile) rather than by the stager's Store at
  // the end of the iteration.
  const bool a_at_load = p.a_path != APath::kF32Staged;
  const bool a_async = p.a_path == APath::kBf16Vec;

  for (int64_t pid = 0; pid < tiles_m * tiles_n; ++pid) {
    const TilePos tile = BlockTile(pid, tiles_m, tiles_n);
    SIM_CHECK(
        check,
        tile.tm >= 0 && tile.tm < tiles_m && tile.tn >= 0 && tile.tn < tiles_n,
        "block " + std::to_string(pid) + " maps outside the grid");
    const int64_t m0 = tile.tm * C::BM, n0 = tile.tn * C::BN;
    std::vector<Cell> smem(L::kSmemBytes / 2, Cell{kPoisonBits, kPoisonTag});
    // Pipeline bookkeeping per stage and operand: which k tile it holds,
    // and when that data becomes visible to every thread (the iteration
    // whose barrier first follows the write; cp.async data: the iteration
    // whose wait_group completes its group).
    struct Held {
      int64_t tile = -1, visible_at = -1, last_read = -2;
    };
    std::vector<Held> held_a(C::kStages), held_b(C::kStages);

    auto fill = [&](bool is_a, int stage, int64_t kt, int64_t visible_at) {
      Held& h = (is_a ? held_a : held_b)[stage];
      const int rows = is_a ? C::BM : C::BN;
      const int ld = is_a ? L::kLdA : L::kLdB;
      const size_t base = stage * stage_elems + (is_a ? 0 : a_elems);
      std::vector<int> writes(static_cast<size_t>(rows) * ld, 0);
      if (is_a) {
        FillTile(&smem, &writes, base, rows, C::BK, ld, C::kThreads, a_per, p.m,
                 p.k, m0, kt * C::BK, global_a, check);
      } else {
        FillTile(&smem, &writes, base, rows, C::BK, ld, C::kThreads,
                 p.vec_b ? 8 : 1, p.n, p.k, n0, kt * C::BK, global_b, check);
      }
      for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < ld; ++c) {
          SIM_CHECK(check, writes[r * ld + c] == (c < C::BK ? 1 : 0),
                    std::string(is_a ? "A" : "B") + " tile element " +
                        At(r, c) + " written " +
                        std::to_string(writes[r * ld + c]) +
                        " times by one fill");
        }
      }
      h.tile = kt;
      h.visible_at = visible_at;
    };
    // When data written in iteration `it` (-1: the prologue) is visible to
    // every thread: a plain store after the next barrier (iteration it + 1);
    // a cp.async once a wait_group<kStages - 2> has completed its commit
    // group (then the same iteration's barrier). Every prologue step and
    // every iteration commits one group, as the kernel does; at iteration
    // kt's wait, kStages - 1 + kt groups are committed.
    int64_t commits = 0;
    auto visible = [&](bool async, int64_t it) -> int64_t {
      if (!async) return it + 1;
      // Smallest kt with (kStages - 1 + kt) - (kStages - 2) > group.
      const int64_t group = commits;
      return group - (C::kStages - 1) + (C::kStages - 2) + 1;
    };
    // A stage may be overwritten in iteration `it` only if every read of
    // its previous contents happened in an earlier iteration (before the
    // barrier this write follows).
    auto check_overwrite = [&](const Held& h, int64_t it, const char* what) {
      SIM_CHECK(check, h.last_read < it,
                std::string(what) + " stage overwritten in iteration " +
                    std::to_string(it) + " that reads it");
    };

    for (int st = 0; st < C::kStages - 1; ++st) {
      if (st < num_k_tiles) {
        fill(true, st, st, visible(a_async, -1));
        fill(false, st, st, visible(p.vec_b, -1));
      }
      ++commits;
    }
    int read_stage = 0;
    int write_stage = C::kStages - 1;
    std::vector<std::vector<float>> acc(
        C::kThreads / 32, std::vector<float>(C::kMt * C::kNt * 32 * 4, 0.0f));
    for (int64_t kt = 0; kt < num_k_tiles; ++kt) {
      const int64_t next = kt + C::kStages - 1;
      if (next < num_k_tiles) {
        if (a_at_load) {
          check_overwrite(held_a[write_stage], kt, "A");
          fill(true, write_stage, next, visible(a_async, kt));
        }
        check_overwrite(held_b[write_stage], kt, "B");
        fill(false, write_stage, next, visible(p.vec_b, kt));
      }
      ++commits;
      for (Held* h : {&held_a[read_stage], &held_b[read_stage]}) {
        SIM_CHECK(check, h->tile == kt && h->visible_at <= kt,
                  "iteration " + std::to_string(kt) +
                      " reads a stage holding tile " + std::to_string(h->tile) +
                      " visible at " + std::to_string(h->visible_at));
        h->last_read = kt;
      }
      const int64_t k0 = kt * C::BK;
      for (int warp = 0; warp < C::kThreads / 32; ++warp) {
        const RowCol wp = WarpOf(warp, C::kWarpsN);
        float(*wacc)[4] = reinterpret_cast<float(*)[4]>(acc[warp].data());
        for (int kk = 0; kk < C::BK; kk += 16) {
          if (k0 + kk >= p.k) break;
          std::vector<Reg> af(C::kMt * 32 * 4), bf(C::kNt * 32 * 4);
          auto afrag = [&](int i) {
            return reinterpret_cast<Reg(*)[4]>(&af[i * 32 * 4]);
          };
          auto bfrag = [&](int j) {
            return reinterpret_cast<Reg(*)[4]>(&bf[j * 32 * 4]);
          };
          const size_t a_lo = read_stage * stage_elems;
          const size_t a_hi = a_lo + static_cast<size_t>(C::BM) * L::kLdA;
          const size_t b_lo = a_lo + a_elems;
          const size_t b_hi = b_lo + static_cast<size_t>(C::BN) * L::kLdB;
          for (int i = 0; i < C::kMt; ++i) {
            size_t addr[32];
            for (int lane = 0; lane < 32; ++lane) {
              const RowCol q = LdmA(lane, FragOrigin(wp.row, C::WM, i, 16), kk);
              addr[lane] = a_lo + SmemOffset(q.row, q.col, L::kLdA);
            }
            LdMatrix(smem, addr, 4, a_lo, a_hi, afrag(i), check);
          }
          if (C::kNt == 1) {
            size_t addr[32];
            for (int lane = 0; lane < 32; ++lane) {
              const RowCol q =
                  LdmBx2(lane, FragOrigin(wp.col, C::WN, 0, 8), kk);
              addr[lane] = b_lo + SmemOffset(q.row, q.col, L::kLdB);
            }
            LdMatrix(smem, addr, 2, b_lo, b_hi, bfrag(0), check);
          } else {
            for (int j = 0; j < C::kNt; j += 2) {
              size_t addr[32];
              for (int lane = 0; lane < 32; ++lane) {
                const RowCol q =
                    LdmBx4(lane, FragOrigin(wp.col, C::WN, j, 8), kk);
                addr[lane] = b_lo + SmemOffset(q.row, q.col, L::kLdB);
              }
              Reg r[32][4];
              LdMatrix(smem, addr, 4, b_lo, b_hi, r, check);
              // The kernel's register split: r[0], r[1] are fragment j's
              // b[0], b[1]; r[2], r[3] fragment j + 1's.
              for (int lane = 0; lane < 32; ++lane) {
                bfrag(j)[lane][0] = r[lane][0];
                bfrag(j)[lane][1] = r[lane][1];
                bfrag(j + 1)[lane][0] = r[lane][2];
                bfrag(j + 1)[lane][1] = r[lane][3];
              }
            }
          }
          for (int i = 0; i < C::kMt; ++i) {
            for (int j = 0; j < C::kNt; ++j) {
              Mma16816(afrag(i), bfrag(j), wacc + (i * C::kNt + j) * 32, p,
                       m0 + FragOrigin(wp.row, C::WM, i, 16),
                       n0 + FragOrigin(wp.col, C::WN, j, 8), k0 + kk, check);
            }
          }
        }
      }
      if (!a_at_load && next < num_k_tiles) {
        // F32ToBf16Stager::Store at the end of the iteration.
        check_overwrite(held_a[write_stage], kt, "A");
        fill(true, write_stage, next, visible(false, kt));
      }
      read_stage = NextStage(read_stage, C::kStages);
      write_stage = NextStage(write_stage, C::kStages);
    }

    // The kernel's epilogue: acc[2h], acc[2h + 1] at AccCoord(lane, 2h) and
    // the next column.
    for (int warp = 0; warp < C::kThreads / 32; ++warp) {
      const RowCol wp = WarpOf(warp, C::kWarpsN);
      for (int i = 0; i < C::kMt; ++i) {
        for (int j = 0; j < C::kNt; ++j) {
          for (int lane = 0; lane < 32; ++lane) {
            const float* a = &acc[warp][((i * C::kNt + j) * 32 + lane) * 4];
            for (int h = 0; h < 2; ++h) {
              const RowCol e = AccCoord(lane, 2 * h);
              const int64_t row = m0 + FragOrigin(wp.row, C::WM, i, 16) + e.row;
              const int64_t col = n0 + FragOrigin(wp.col, C::WN, j, 8) + e.col;
              if (row >= p.m || col >= p.n) continue;
              (*y)[row * p.n + col] = a[2 * h];
              ++(*y_writes)[row * p.n + col];
              if (col + 1 < p.n) {
                (*y)[row * p.n + col + 1] = a[2 * h + 1];
                ++(*y_writes)[row * p.n + col + 1];
              }
            }
          }
        }
      }
    }
  }
}

Problem MakeProblem(int64_t m, int64_t n, int64_t k, APath a_path, bool vec_b,
                    uint32_t seed) {
  Problem p{m, n, k, 0, 0, a_path, vec_b, {}, {}, {}};
  // Strides keep the vector paths' alignment (k % 8 == 0 there) and put
  // junk past k that must never be read.
  p.ldx = k % 8 == 0 ? k + 8 : k + 3;
  p.ldw = k % 8 == 0 ? k + 16 : k + 5;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  if (p.a_f32()) {
    p.x_f32.resize(m * p.ldx);
    for (float& v : p.x_f32) v = u(rng);
  } else {
    p.x_bf16.resize(m * p.ldx);
    for (uint16_t& v : p.x_bf16) v = FloatToBf16(u(rng));
  }
  p.w.resize(n * p.ldw);
  for (uint16_t& v : p.w) v = FloatToBf16(u(rng));
  return p;
}

template <class C>
void RunCase(int64_t m, int64_t n, int64_t k, APath a_path, bool vec_b) {
  const Problem p = MakeProblem(m, n, k, a_path, vec_b,
                                static_cast<uint32_t>(m * 7919 + n * 31 + k));
  Checker check;
  check.context = "tile " + std::to_string(C::BM) + "x" +
                  std::to_string(C::BN) + "x" + std::to_string(C::BK) +
                  " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                  " k=" + std::to_string(k) + " A " + Name(a_path) +
                  (vec_b ? ", B cp.async" : ", B element");
  std::vector<float> y(m * n, std::nanf(""));
  std::vector<int> writes(m * n, 0);
  SimulateGemm<C>(p, &y, &writes, check);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      double ref = 0.0, mag = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double prod = static_cast<double>(Bf16ToFloat(p.ABits(r, kk))) *
                            Bf16ToFloat(p.w[c * p.ldw + kk]);
        ref += prod;
        mag += std::fabs(prod);
      }
      SIM_CHECK(check, writes[r * n + c] == 1,
                "output " + At(r, c) + " written " +
                    std::to_string(writes[r * n + c]) + " times");
      // fp32 accumulation over ceil(k / 16) steps: far inside 1e-5 of the
      // magnitude; one misplaced operand is O(1) of it.
      SIM_CHECK(check, std::fabs(y[r * n + c] - ref) <= 1e-5 * mag + 1e-30,
                "output " + At(r, c) + " = " + std::to_string(y[r * n + c]) +
                    ", CPU GEMM " + std::to_string(ref));
    }
  }
  std::printf("%s: %lld ldmatrix phases, %lld with bank conflicts\n",
              check.context.c_str(), static_cast<long long>(check.ldm_phases),
              static_cast<long long>(check.ldm_conflicted));
  EXPECT_EQ(check.failures, 0) << check.context;
}

// Every path the kernel's dispatch can take for this k (vector paths need
// k % 8 == 0 for bf16, k % 4 == 0 for the fp32 stager).
template <class C>
void RunAllPaths(int64_t m, int64_t n, int64_t k) {
  if (k % 8 == 0) {
    RunCase<C>(m, n, k, APath::kBf16Vec, true);
    RunCase<C>(m, n, k, APath::kF32Staged, true);
    RunCase<C>(m, n, k, APath::kBf16Vec, false);
  }
  if (k % 4 == 0) RunCase<C>(m, n, k, APath::kF32Staged, false);
  RunCase<C>(m, n, k, APath::kBf16Elem, false);
  RunCase<C>(m, n, k, APath::kF32Elem, false);
}

TEST(GemmMmaSimTest, DecodeTile) {
  RunAllPaths<DecodeTile>(1, 40, 920);  // 8 k tiles over 6 stages, n tail
  RunAllPaths<DecodeTile>(16, 16, 136);
  RunAllPaths<DecodeTile>(5, 24, 36);  // k % 8 == 4
  RunAllPaths<DecodeTile>(3, 9, 37);
}

TEST(GemmMmaSimTest, MidTile) {
  RunAllPaths<MidTile>(33, 72, 168);  // 6 k tiles over 4 stages, tails
  RunAllPaths<MidTile>(64, 64, 32);
  RunAllPaths<MidTile>(50, 70, 45);
}

TEST(GemmMmaSimTest, PrefillTile) {
  RunAllPaths<PrefillTile>(130, 136, 168);
  RunAllPaths<PrefillTile>(128, 128, 40);
  RunAllPaths<PrefillTile>(129, 9, 21);
}

// Many m tiles: the grouped block order (8 m tiles at a time) with a partial
// last group.
TEST(GemmMmaSimTest, DecodeTileManyBlocks) {
  RunCase<DecodeTile>(16, 16 * 11 + 3, 24, APath::kBf16Vec, true);
}

TEST(GemmMmaSimTest, BlockOrderIsABijection) {
  for (int64_t tm = 1; tm <= 20; ++tm) {
    for (int64_t tn = 1; tn <= 13; ++tn) {
      std::vector<int> hit(tm * tn, 0);
      for (int64_t pid = 0; pid < tm * tn; ++pid) {
        const TilePos t = BlockTile(pid, tm, tn);
        ASSERT_TRUE(t.tm >= 0 && t.tm < tm && t.tn >= 0 && t.tn < tn)
            << pid << " of " << tm << "x" << tn;
        ++hit[t.tm * tn + t.tn];
      }
      for (int v : hit) ASSERT_EQ(v, 1) << tm << "x" << tn;
    }
  }
}

// The epilogue stores acc[2h], acc[2h + 1] as one pair: they must be one
// row's adjacent columns, and the 128 registers of a warp must tile 16 x 8.
TEST(GemmMmaSimTest, AccumulatorMapTilesTheFragment) {
  int hit[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 4; ++e) {
      const RowCol rc = AccCoord(lane, e);
      ASSERT_TRUE(rc.row >= 0 && rc.row < 16 && rc.col >= 0 && rc.col < 8);
      ++hit[rc.row][rc.col];
      if (e % 2 == 1) {
        const RowCol first = AccCoord(lane, e - 1);
        EXPECT_EQ(rc.row, first.row);
        EXPECT_EQ(rc.col, first.col + 1);
        EXPECT_EQ(first.col % 2, 0);  // float2 stores need even columns
      }
    }
  }
  for (auto& row : hit) {
    for (int v : row) EXPECT_EQ(v, 1);
  }
}

// Every (row, k) of both operand tiles of a stage has its own element, and
// the stages, A and B do not overlap.
template <class C>
void CheckStageLayout() {
  using L = Layout<C>;
  std::set<size_t> seen;
  for (int s = 0; s < C::kStages; ++s) {
    const size_t base = s * L::kStageBytes;
    for (int r = 0; r < C::BM; ++r) {
      for (int c = 0; c < C::BK; ++c) {
        const size_t b = base + 2 * SmemOffset(r, c, L::kLdA);
        EXPECT_LT(b, base + L::kABytes);
        EXPECT_TRUE(seen.insert(b).second) << "A " << At(r, c);
      }
    }
    for (int r = 0; r < C::BN; ++r) {
      for (int c = 0; c < C::BK; ++c) {
        const size_t b = base + L::kABytes + 2 * SmemOffset(r, c, L::kLdB);
        EXPECT_LT(b, base + L::kStageBytes);
        EXPECT_TRUE(seen.insert(b).second) << "B " << At(r, c);
      }
    }
  }
  EXPECT_LE(*seen.rbegin() + 2, L::kSmemBytes);
  // The fp32 stager deals its chunks evenly (F32ToBf16Stager's
  // static_assert), and every copy path covers the tile: checked per fill by
  // the simulation.
  EXPECT_EQ(C::BM * (C::BK / 4) % C::kThreads, 0);
}

TEST(GemmMmaSimTest, StageLayoutIsInjective) {
  CheckStageLayout<DecodeTile>();
  CheckStageLayout<MidTile>();
  CheckStageLayout<PrefillTile>();
}

}  // namespace
}  // namespace kvd::kernels::cuda::internal::mma
