// The canonical GEMM over weights kept as GGML blocks (internal; use
// kernels/cpu/gemm.h with WeightType::kGgmlBlocks).
//
// Why: users run quantized files. Dequantizing them at load multiplies the
// bytes every decoded token must stream by 3.5-7x. Here the blocks stay as
// they are in the file and each group of 16 weights is dequantized into a
// register right before the canonical FMA chain (gemm_tile.h). Each weight
// value is computed by exactly the operations of kernels/quant/dequant.cc (an
// int converted to fp32, times an fp32 scale, plus or minus an fp32 offset;
// no FMA), and it meets the same activation in the same lane at the same step,
// so every output is bit-identical to the GEMM over weights dequantized at
// load.
//
// Two shapes:
//   - few activation rows (decode): DirectRange decodes each block once and
//     feeds MR x NR accumulators with it;
//   - many rows (prefill): PanelRange decodes a panel of weight rows into an
//     fp32 scratch buffer once and runs the fp32 tiles over it for every row.
//
// Like gemm_tile.h, everything sits in an anonymous namespace so each ISA's
// translation unit gets its own copy compiled with its own flags.
#ifndef KVD_KERNELS_CPU_INTERNAL_GEMM_BLOCKS_H_
#define KVD_KERNELS_CPU_INTERNAL_GEMM_BLOCKS_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/internal/gemm_isa.h"
#include "kernels/cpu/internal/gemm_pairs.h"
#include "kernels/cpu/internal/gemm_tile.h"
#include "kernels/quant/ggml_type.h"

namespace kvd::kernels::cpu::internal {
namespace {

// A packed block's fp32 scale (packed_blocks.h).
inline float Scale(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, sizeof(f));
  return f;
}

// 16-entry table lookups replace convert, multiply and add where the ISA has
// a one-instruction permute (Ops::kLut16): the table holds the 16 possible
// values of a 4-bit weight, computed by the same multiply and add.
template <class Ops>
inline typename Ops::V Lut4(float scale, float offset, bool subtract) {
  const typename Ops::V v = Ops::Mul(Ops::Iota(), scale);
  return subtract ? Ops::Sub(v, offset) : Ops::Add(v, offset);
}

// The bf16 mode's weights are the bf16 rounding of the dequantized values
// (Ops::RoundBf16 is elementwise.h's FloatToBf16 rule, widened back).
template <class Ops, bool kRound>
inline typename Ops::V Round(const typename Ops::V& v) {
  if constexpr (kRound) {
    return Ops::RoundBf16(v);
  } else {
    return v;
  }
}

// Each decoder reads one packed block (packed_blocks.h) and calls sink(v, g)
// for its groups of 16 values in order (g = 0, 1, ...), v holding elements
// [16 g, 16 g + 16) of the block as fp32. Ops supplies 16-lane int32 (I) and
// fp32 (V) vectors; the arithmetic is dequant.cc's term by term.

// Q4_0 {f32 d; u8 qs[16]}: (q - 8) * d.
struct Q4_0 {
  static constexpr int kBlock = 32, kBytes = 20;
  template <class Ops, bool kRound, class Sink>
  static void Decode(const uint8_t* b, Sink&& sink) {
    auto emit = [&](const typename Ops::V& v, int g) {
      sink(Round<Ops, kRound>(v), g);
    };
    const float d = Scale(b);
    const typename Ops::I q = Ops::U8(b + 4);
    if constexpr (Ops::kLut16) {
      const typename Ops::V lut =
          Round<Ops, kRound>(Ops::Mul(Ops::IotaMinus8(), d));
      sink(Ops::Lut16(lut, q), 0);
      sink(Ops::Lut16(lut, Ops::Srl(q, 4)), 1);
      return;
    }
    emit(Ops::Mul(Ops::ToFloat(Ops::SubC(Ops::AndC(q, 15), 8)), d), 0);
    emit(Ops::Mul(Ops::ToFloat(Ops::SubC(Ops::Srl(q, 4), 8)), d), 1);
  }
};

// Q4_1 {f32 d, m; u8 qs[16]}: q * d + m.
struct Q4_1 {
  static constexpr int kBlock = 32, kBytes = 24;
  template <class Ops, bool kRound, class Sink>
  static void Decode(const uint8_t* b, Sink&& sink) {
    auto emit = [&](const typename Ops::V& v, int g) {
      sink(Round<Ops, kRound>(v), g);
    };
    const float d = Scale(b), m = Scale(b + 4);
    const typename Ops::I q = Ops::U8(b + 8);
    if constexpr (Ops::kLut16) {
      const typename Ops::V lut = Round<Ops, kRound>(Lut4<Ops>(d, m, false));
      sink(Ops::Lut16(lut, q), 0);
      sink(Ops::Lut16(lut, Ops::Srl(q, 4)), 1);
      return;
    }
    emit(Ops::Add(Ops::Mul(Ops::ToFloat(Ops::AndC(q, 15)), d), m), 0);
    emit(Ops::Add(Ops::Mul(Ops::ToFloat(Ops::Srl(q, 4)), d), m), 1);
  }
};

// The fifth bits of Q5_0/Q5_1: bit j of qh belongs to element j.
template <class Ops>
inline typename Ops::I FifthBits(uint32_t qh, int first) {
  return Ops::Shl(Ops::AndC(Ops::SrlIota(Ops::Broadcast(qh), first), 1), 4);
}

// Q5_0 {f32 d; u32 qh; u8 qs[16]} and Q5_1 {f32 d, m; u32 qh; u8 qs[16]}:
// (q - 16) * d and q * d + m.
template <bool kMin>
struct Q5 {
  static constexpr int kBlock = 32, kBytes = kMin ? 28 : 24;
  template <class Ops, bool kRound, class Sink>
  static void Decode(const uint8_t* b, Sink&& sink) {
    auto emit = [&](const typename Ops::V& v, int g) {
      sink(Round<Ops, kRound>(v), g);
    };
    const float d = Scale(b);
    const uint8_t* p = b + (kMin ? 8 : 4);
    uint32_t qh;
    std::memcpy(&qh, p, sizeof(qh));
    const typename Ops::I q = Ops::U8(p + 4);
    const typename Ops::I lo = Ops::Or(Ops::AndC(q, 15), FifthBits<Ops>(qh, 0));
    const typename Ops::I hi = Ops::Or(Ops::Srl(q, 4), FifthBits<Ops>(qh, 16));
    if constexpr (kMin) {
      const float m = Scale(b + 4);
      emit(Ops::Add(Ops::Mul(Ops::ToFloat(lo), d), m), 0);
      emit(Ops::Add(Ops::Mul(Ops::ToFloat(hi), d), m), 1);
    } else {
      emit(Ops::Mul(Ops::ToFloat(Ops::SubC(lo, 16)), d), 0);
      emit(Ops::Mul(Ops::ToFloat(Ops::SubC(hi, 16)), d), 1);
    }
  }
};
using Q5_0 = Q5<false>;
using Q5_1 = Q5<true>;

// Q8_0 {f32 d; i8 qs[32]}: q * d.
struct Q8_0 {
  static constexpr int kBlock = 32, kBytes = 36;
  template <class Ops, bool kRound, class Sink>
  static void Decode(const uint8_t* b, Sink&& sink) {
    auto emit = [&](const typename Ops::V& v, int g) {
      sink(Round<Ops, kRound>(v), g);
    };
    const float d = Scale(b);
    emit(Ops::Mul(Ops::ToFloat(Ops::S8(b + 4)), d), 0);
    emit(Ops::Mul(Ops::ToFloat(Ops::S8(b + 20)), d), 1);
  }
};

// Q4_K {f32 d[8], m[8]; u8 qs[128]} and Q5_K {f32 d[8], m[8]; u8 qh[32];
// u8 qs[128]}: per sub-block j of 32, d[j] * q - m[j]; 32 qs bytes hold two
// sub-blocks (low nibbles, then high nibbles); for Q5_K bit j of qh[l] is the
// fifth bit of element l of sub-block j.
template <bool kFive>
struct QK {
  static constexpr int kBlock = 256, kBytes = kFive ? 224 : 192;
  template <class Ops, bool kRound, class Sink>
  static void Decode(const uint8_t* b, Sink&& sink) {
    auto emit = [&](const typename Ops::V& v, int g) {
      sink(Round<Ops, kRound>(v), g);
    };
    typename Ops::I h0, h1;
    if constexpr (kFive) {
      h0 = Ops::U8(b + 64);
      h1 = Ops::U8(b + 80);
    }
    auto fifth = [&](const typename Ops::I& h, int bit) {
      return Ops::Shl(Ops::AndC(Ops::Srl(h, bit), 1), 4);
    };
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = b + (kFive ? 96 : 64) + 32 * c;
      const float d1 = Scale(b + 8 * c), d2 = Scale(b + 8 * c + 4);
      const float m1 = Scale(b + 32 + 8 * c), m2 = Scale(b + 36 + 8 * c);
      const typename Ops::I q0 = Ops::U8(q), q1 = Ops::U8(q + 16);
      if constexpr (!kFive && Ops::kLut16) {
        const typename Ops::V lut1 =
            Round<Ops, kRound>(Lut4<Ops>(d1, m1, true));
        const typename Ops::V lut2 =
            Round<Ops, kRound>(Lut4<Ops>(d2, m2, true));
        sink(Ops::Lut16(lut1, q0), 4 * c);
        sink(Ops::Lut16(lut1, q1), 4 * c + 1);
        sink(Ops::Lut16(lut2, Ops::Srl(q0, 4)), 4 * c + 2);
        sink(Ops::Lut16(lut2, Ops::Srl(q1, 4)), 4 * c + 3);
        continue;
      }
      typename Ops::I a0 = Ops::AndC(q0, 15), a1 = Ops::AndC(q1, 15);
      typename Ops::I b0 = Ops::Srl(q0, 4), b1 = Ops::Srl(q1, 4);
      if constexpr (kFive) {
        a0 = Ops::Or(a0, fifth(h0, 2 * c));
        a1 = Ops::Or(a1, fifth(h1, 2 * c));
        b0 = Ops::Or(b0, fifth(h0, 2 * c + 1));
        b1 = Ops::Or(b1, fifth(h1, 2 * c + 1));
      }
      emit(Ops::Sub(Ops::Mul(Ops::ToFloat(a0), d1), m1), 4 * c);
      emit(Ops::Sub(Ops::Mul(Ops::ToFloat(a1), d1), m1), 4 * c + 1);
      emit(Ops::Sub(Ops::Mul(Ops::ToFloat(b0), d2), m2), 4 * c + 2);
      emit(Ops::Sub(Ops::Mul(Ops::ToFloat(b1), d2), m2), 4 * c + 3);
    }
  }
};
using Q4_K = QK<false>;
using Q5_K = QK<true>;

// Q6_K {f32 s[16]; u8 ql[128]; u8 qh[64]}: two halves of 128; element =
// s * (q - 32), one scale per 16 elements.
struct Q6_K {
  static constexpr int kBlock = 256, kBytes = 256;
  template <class Ops, bool kRound, class Sink>
  static void Decode(const uint8_t* b, Sink&& sink) {
    auto emit = [&](const typename Ops::V& v, int g) {
      sink(Round<Ops, kRound>(v), g);
    };
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = b + 64 + 64 * half;
      const uint8_t* qh = b + 192 + 32 * half;
      const uint8_t* s = b + 32 * half;
      const int g0 = 8 * half;
      // Quarter t of the half: low / high nibbles of ql[0..31] / ql[32..63]
      // with bits 2t, 2t+1 of qh.
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        const uint8_t* src = ql + (t & 1) * 32;
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const typename Ops::I l = Ops::U8(src + 16 * h);
          const typename Ops::I low = t < 2 ? Ops::AndC(l, 15) : Ops::Srl(l, 4);
          const typename Ops::I high =
              Ops::Shl(Ops::AndC(Ops::Srl(Ops::U8(qh + 16 * h), 2 * t), 3), 4);
          emit(Ops::Mul(Ops::ToFloat(Ops::SubC(Ops::Or(low, high), 32)),
                        Scale(s + 4 * (2 * t + h))),
               g0 + 2 * t + h);
        }
      }
    }
  }
};

// fp16 as stored: 16 values per group, converted exactly.
struct F16 {
  static constexpr int kBlock = 16, kBytes = 32;
  template <class Ops, bool kRound, class Sink>
  static void Decode(const uint8_t* b, Sink&& sink) {
    auto emit = [&](const typename Ops::V& v, int g) {
      sink(Round<Ops, kRound>(v), g);
    };
    emit(Ops::Half(b), 0);
  }
};

// The activation rows a block meets in DirectRange at once: the decoded
// weights are reused for each of them.
constexpr int64_t kDirectMaxRows = 4;

// acc[i][j] += x_i . W_j over blocks [0, nblocks) starting at x / w.
template <class Ops, class T, bool kRound, int MR, int NR>
inline void DirectAccumulate(const float* x, int64_t ldx, const uint8_t* w,
                             int64_t ldw_bytes, int64_t nblocks,
                             typename Ops::V (&acc)[MR][NR]) {
  // Fully unrolled over the tile so the accumulators live in registers.
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const float* xb = x + blk * T::kBlock;
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const uint8_t* wb = w + j * ldw_bytes + blk * T::kBytes;
      // 1 KiB ahead in the row: decode streams weights from DRAM.
      __builtin_prefetch(wb + 1024, 0, 0);
      T::template Decode<Ops, kRound>(wb, [&](const typename Ops::V& v, int g) {
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i)
          acc[i][j] = Ops::Fma(Ops::Load(xb + i * ldx + 16 * g), v, acc[i][j]);
      });
    }
  }
}

// y[i][j] for MR activation rows and NR weight rows, k in `groups` slices
// added in order (each slice a whole number of blocks).
template <class Ops, class T, bool kRound, int MR, int NR>
inline void DirectTile(const float* x, int64_t ldx, const uint8_t* w,
                       int64_t ldw_bytes, int64_t k, int64_t groups, float* y,
                       int64_t ldy) {
  const int64_t slice_blocks = k / groups / T::kBlock;
  float sum[MR][NR] = {};
  for (int64_t g = 0; g < groups; ++g) {
    typename Ops::V acc[MR][NR];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] = Ops::Zero();
    DirectAccumulate<Ops, T, kRound, MR, NR>(
        x + g * slice_blocks * T::kBlock, ldx, w + g * slice_blocks * T::kBytes,
        ldw_bytes, slice_blocks, acc);
    // The first slice is stored, not added to zero: -0 stays -0.
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) {
        const float p = Ops::Reduce(acc[i][j]);
        sum[i][j] = g == 0 ? p : sum[i][j] + p;
      }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = sum[i][j];
}

template <class Ops, class T, bool kRound, int MR, int NR>
inline void DirectRows(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  const auto* w = static_cast<const uint8_t*>(a.w);
  int64_t n = n_begin;
  for (; n + NR <= n_end; n += NR)
    DirectTile<Ops, T, kRound, MR, NR>(a.x, a.ldx, w + n * a.ldw, a.ldw, a.k,
                                       a.groups, a.y + n, a.ldy);
  for (; n < n_end; ++n)
    DirectTile<Ops, T, kRound, MR, 1>(a.x, a.ldx, w + n * a.ldw, a.ldw, a.k,
                                      a.groups, a.y + n, a.ldy);
}

template <class Ops, class T, bool kRound, int NR>
inline void DirectRange(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  switch (a.m) {
    case 1:
      return DirectRows<Ops, T, kRound, 1, NR>(a, n_begin, n_end);
    case 2:
      return DirectRows<Ops, T, kRound, 2, (NR / 2 > 0 ? NR / 2 : 1)>(
          a, n_begin, n_end);
    case 3:
      return DirectRows<Ops, T, kRound, 3, (NR / 4 > 0 ? NR / 4 : 1)>(
          a, n_begin, n_end);
    default:
      return DirectRows<Ops, T, kRound, 4, (NR / 4 > 0 ? NR / 4 : 1)>(
          a, n_begin, n_end);
  }
}

// Weight rows decoded per panel: 16 rows of up to a few thousand values stay
// in L2 while every activation row passes over them.
constexpr int64_t kPanelRows = 16;

template <class Ops, class T, bool kRound>
inline void DecodeRow(const uint8_t* w, int64_t k, float* out) {
  for (int64_t blk = 0; blk < k / T::kBlock; ++blk)
    T::template Decode<Ops, kRound>(
        w + blk * T::kBytes, [&](const typename Ops::V& v, int g) {
          Ops::Store(out + blk * T::kBlock + 16 * g, v);
        });
}

template <class Ops, class T, bool kRound, int MR, int NR, int NR1>
inline void PanelRange(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  thread_local std::vector<float> panel;
  panel.resize(kPanelRows * a.k);
  const auto* w = static_cast<const uint8_t*>(a.w);
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kPanelRows) {
    const int64_t rows = n_end - n0 < kPanelRows ? n_end - n0 : kPanelRows;
    for (int64_t r = 0; r < rows; ++r)
      DecodeRow<Ops, T, kRound>(w + (n0 + r) * a.ldw, a.k,
                                panel.data() + r * a.k);
    GemmArgs f = a;
    f.w = panel.data();
    f.ldw = a.k;
    f.y = a.y + n0;
    GemmRange<Ops, float, MR, NR, NR1>(f, 0, rows);
  }
}

// Whether the direct path can take `a`: whole blocks in every slice of k
// (the panel path needs whole blocks in k only; anything else goes through the
// scalar reference).
template <class T>
inline bool WholeBlocks(const GemmArgs& a) {
  return (a.k / a.groups) % T::kBlock == 0;  // groups divides k (gemm.cc)
}

// Calls f(T{}) with the decoder of `type`; false if there is none.
template <class F>
inline bool VisitBlockType(GgmlType type, F&& f) {
  switch (type) {
    case GgmlType::kQ4_0:
      return f(Q4_0{});
    case GgmlType::kQ4_1:
      return f(Q4_1{});
    case GgmlType::kQ5_0:
      return f(Q5_0{});
    case GgmlType::kQ5_1:
      return f(Q5_1{});
    case GgmlType::kQ8_0:
      return f(Q8_0{});
    case GgmlType::kQ4_K:
      return f(Q4_K{});
    case GgmlType::kQ5_K:
      return f(Q5_K{});
    case GgmlType::kQ6_K:
      return f(Q6_K{});
    case GgmlType::kF16:
      return f(F16{});
    default:
      return false;
  }
}

// Dispatches on the block type; returns false if it is not one of the types
// above or k is not a whole number of its blocks.
template <class Ops, int MR, int NR, int NR1, int DNR>
inline bool BlocksRange(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  return VisitBlockType(a.blocks, [&](auto tag) {
    using T = decltype(tag);
    if (a.k % T::kBlock != 0) return false;
    const bool direct = a.m <= kDirectMaxRows && WholeBlocks<T>(a);
    if (direct && a.round_bf16) {
      DirectRange<Ops, T, true, DNR>(a, n_begin, n_end);
    } else if (direct) {
      DirectRange<Ops, T, false, DNR>(a, n_begin, n_end);
    } else if (a.round_bf16) {
      PanelRange<Ops, T, true, MR, NR, NR1>(a, n_begin, n_end);
    } else {
      PanelRange<Ops, T, false, MR, NR, NR1>(a, n_begin, n_end);
    }
    return true;
  });
}

// Rows [n0, n0 + rows) as the bf16 mode's weights (each value rounded to
// bf16) in bf16, `a.k` per row, for the pair contract (gemm_pairs.h); false
// where BlocksRange would be.
template <class Ops>
inline bool DecodeBlocksBf16(const GemmArgs& a, int64_t n0, int64_t rows,
                             uint16_t* out) {
  return VisitBlockType(a.blocks, [&](auto tag) {
    using T = decltype(tag);
    if (a.k % T::kBlock != 0) return false;
    thread_local std::vector<float> row;
    row.resize(a.k);
    const auto* w = static_cast<const uint8_t*>(a.w);
    for (int64_t r = 0; r < rows; ++r) {
      DecodeRow<Ops, T, true>(w + (n0 + r) * a.ldw, a.k, row.data());
      ExactBf16(row.data(), out + r * a.k, a.k);
    }
    return true;
  });
}

}  // namespace
}  // namespace kvd::kernels::cpu::internal

#endif  // KVD_KERNELS_CPU_INTERNAL_GEMM_BLOCKS_H_
