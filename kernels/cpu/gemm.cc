#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cassert>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/internal/gemm_isa.h"
#include "kernels/cpu/internal/gemm_pairs.h"

namespace kvd::kernels::cpu {
namespace {

using RangeFn = void (*)(const internal::GemmArgs&, int64_t, int64_t);

// GGML blocks: the vector paths take every type and shape the loader keeps
// (gemm_blocks.h); anything else falls back to the scalar reference.
template <bool (*Vector)(const internal::GemmArgs&, int64_t, int64_t)>
void BlocksOrScalar(const internal::GemmArgs& a, int64_t begin, int64_t end) {
  if (!Vector(a, begin, end)) internal::GemmBlocksScalar(a, begin, end);
}

RangeFn Pick(WeightType type, int64_t m) {
  if (type == WeightType::kGgmlBlocks) {
    switch (ActiveIsa()) {
      case Isa::kAvx512:
        return BlocksOrScalar<internal::GemmBlocksAvx512>;
      case Isa::kAvx2:
        return BlocksOrScalar<internal::GemmBlocksAvx2>;
      case Isa::kScalar:
        break;
    }
    return internal::GemmBlocksScalar;
  }
  const bool bf16 = type == WeightType::kBf16;
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      // All paths give identical bits, so each shape takes the fastest one.
      // Measured on Zen 4 (docs/BENCHMARKS.md): a single row streaming weights
      // from DRAM runs faster with 256-bit loads and two accumulator registers
      // than with one 512-bit register.
      if (m == 1) return bf16 ? internal::GemmBf16Avx2 : internal::GemmF32Avx2;
      return bf16 ? internal::GemmBf16Avx512 : internal::GemmF32Avx512;
    case Isa::kAvx2:
      return bf16 ? internal::GemmBf16Avx2 : internal::GemmF32Avx2;
    case Isa::kScalar:
      break;
  }
  return bf16 ? internal::GemmBf16Scalar : internal::GemmF32Scalar;
}

// The bf16 pair contract's paths (internal/gemm_pairs.h): bf16 weight rows go
// straight to a pair range; GGML blocks are decoded to bf16 panels first (or,
// for few rows on AVX-512, in registers).
using DecodeFn = bool (*)(const internal::GemmArgs&, int64_t, int64_t,
                          uint16_t*);

template <RangeFn kPairs, DecodeFn kDecode>
void BlocksPanels(const internal::GemmArgs& a, int64_t begin, int64_t end) {
  internal::BlocksAsPairs(
      a, begin, end,
      [](const internal::GemmArgs& b, int64_t n0, int64_t rows, uint16_t* out) {
        if (kDecode == nullptr || !kDecode(b, n0, rows, out))
          internal::DecodeBlocksBf16Scalar(b, n0, rows, out);
      },
      kPairs);
}

void BlocksDirectAvx512Bf16(const internal::GemmArgs& a, int64_t begin,
                            int64_t end) {
  if (!internal::GemmBlocksPairsAvx512Bf16(a, begin, end))
    BlocksPanels<internal::GemmPairsAvx512Bf16,
                 internal::DecodeBlocksBf16Avx512>(a, begin, end);
}

struct PairPath {
  RangeFn fn;
  internal::PairLayout layout;
};

PairPath PickPairs(bool blocks, int64_t m) {
  using internal::PairLayout;
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      if (HasAvx512Bf16()) {
        if (blocks && m <= internal::kDirectPairsMaxRows)
          return {BlocksDirectAvx512Bf16, PairLayout::kBf16};
        if (blocks) {
          return {BlocksPanels<internal::GemmPairsAvx512Bf16,
                               internal::DecodeBlocksBf16Avx512>,
                  PairLayout::kBf16};
        }
        // A single row streams its weights from DRAM: the AVX2 emulation's
        // two 256-bit chains keep up with it at least as well as vdpbf16ps's
        // one (SmolLM2 bf16 decode from bf16 copies on Zen 4, 1 thread:
        // 62-74 vs 63 tok/s; tiles of 2 or 4 rows ran at ~40).
        if (m == 1) return {internal::GemmPairsAvx2, PairLayout::kPairOrder};
        return {internal::GemmPairsAvx512Bf16, PairLayout::kBf16};
      }
      if (blocks) {
        return {BlocksPanels<internal::GemmPairsAvx2,
                             internal::DecodeBlocksBf16Avx512>,
                PairLayout::kPairOrder};
      }
      return {internal::GemmPairsAvx2, PairLayout::kPairOrder};
    case Isa::kAvx2:
      if (blocks) {
        return {BlocksPanels<internal::GemmPairsAvx2,
                             internal::DecodeBlocksBf16Avx2>,
                PairLayout::kPairOrder};
      }
      return {internal::GemmPairsAvx2, PairLayout::kPairOrder};
    case Isa::kScalar:
      break;
  }
  if (blocks) {
    return {BlocksPanels<internal::GemmPairsScalar, nullptr>,
            PairLayout::kPairOrder};
  }
  return {internal::GemmPairsScalar, PairLayout::kPairOrder};
}

// The pair paths' activations (GemmArgs::xp): each row's `groups` slices of
// k rounded to bf16 and zero-padded to `slice_pad`, as bf16 in k order or as
// fp32 in pair order.
struct PairActivations {
  std::vector<uint16_t> bf16;
  std::vector<float> pair_order;
};

void PreparePairs(const float* x, int64_t m, int64_t ldx, int64_t k,
                  int64_t groups, internal::PairLayout layout, ThreadPool* pool,
                  PairActivations& out, internal::GemmArgs& args) {
  constexpr int64_t kRun = internal::kPairRun;
  const int64_t slice = k / groups;
  const int64_t pad = (slice + kRun - 1) / kRun * kRun;
  const int64_t ldxp = groups * pad;
  args.slice_pad = pad;
  args.ldxp = ldxp;
  const bool bf16 = layout == internal::PairLayout::kBf16;
  // Every element is written, the padding included (no separate fill).
  if (bf16) {
    out.bf16.resize(m * ldxp);
    args.xp = out.bf16.data();
  } else {
    out.pair_order.resize(m * ldxp);
    args.xp = out.pair_order.data();
  }
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t g = 0; g < groups; ++g) {
        const float* src = x + i * ldx + g * slice;
        if (bf16) {
          uint16_t* dst = out.bf16.data() + i * ldxp + g * pad;
          FloatToBf16(src, dst, slice);
          std::fill(dst + slice, dst + pad, uint16_t{0});
          continue;
        }
        float* dst = out.pair_order.data() + i * ldxp + g * pad;
        for (int64_t t = 0; t < pad; ++t) {
          // Element 32j + 2r + 1 goes to 32j + r, element 32j + 2r to
          // 32j + 16 + r.
          const int64_t run = t / kRun * kRun, in_run = t - run;
          const int64_t at =
              run + (in_run % 2 == 1 ? in_run / 2 : 16 + in_run / 2);
          dst[at] = t < slice ? Bf16ToFloat(FloatToBf16(src[t])) : 0.0f;
        }
      }
    }
  };
  if (pool == nullptr || pool->num_threads() == 1 || m * k < (1 << 15)) {
    rows(0, m);
  } else {
    pool->ParallelFor(m, rows);
  }
}

// Below this many multiply-adds a call runs on the calling thread: waking
// workers costs more.
constexpr int64_t kMinParallelWork = 1 << 15;

}  // namespace

void Gemm(const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y,
          int64_t ldy, ThreadPool* pool) {
  GroupedGemm(x, m, ldx, w, /*groups=*/1, y, ldy, pool);
}

namespace {

// Outputs one shared pass takes (no allocation on the per-Gemm path).
constexpr size_t kMaxSharedOutputs = 4;

// The Gemms of one input over weights that agree on type, cols and bf16
// handling: the activations prepared once, and one parallel pass over every
// output's rows, each output at an offset rounded up to 8 in one index space
// so the pool's aligned splits fall on 8-row boundaries of every output.
void SharedPass(const float* x, int64_t m, int64_t ldx, int64_t groups,
                const GemmOutput* outputs, size_t n_outputs, ThreadPool* pool) {
  const WeightView& first = outputs[0].w;
  assert(groups >= 1 && first.cols % groups == 0);
  const bool blocks = first.type == WeightType::kGgmlBlocks;
  internal::GemmArgs base{x,
                          m,
                          ldx,
                          nullptr,
                          0,
                          first.cols,
                          nullptr,
                          0,
                          groups,
                          first.blocks,
                          first.round_to_bf16};
  RangeFn fn = Pick(first.type, m);
  if (first.bf16_pairs) {
    assert(first.type == WeightType::kBf16 || (blocks && first.round_to_bf16));
    const PairPath path = PickPairs(blocks, m);
    thread_local PairActivations prepared;
    PreparePairs(x, m, ldx, first.cols, groups, path.layout, pool, prepared,
                 base);
    fn = path.fn;
  }
  struct Part {
    internal::GemmArgs args;
    int64_t offset, rows;
  };
  assert(n_outputs <= kMaxSharedOutputs);
  Part parts[kMaxSharedOutputs];
  int64_t total = 0, work = 0;
  for (size_t o = 0; o < n_outputs; ++o) {
    const WeightView& w = outputs[o].w;
    assert(!blocks || (IsGemmBlockType(w.blocks) &&
                       w.cols % PackedBlockSize(w.blocks) == 0 &&
                       w.stride() % PackedBlockSize(w.blocks) == 0));
    internal::GemmArgs a = base;
    a.w = w.data;
    a.ldw = blocks ? w.row_stride_bytes() : w.stride();
    a.y = outputs[o].y;
    a.ldy = outputs[o].ldy;
    a.blocks = w.blocks;
    parts[o] = {a, total, w.rows};
    total += (w.rows + 7) / 8 * 8;
    work += m * w.rows * w.cols;
  }
  auto run = [&](int64_t begin, int64_t end) {
    for (size_t o = 0; o < n_outputs; ++o) {
      const Part& p = parts[o];
      const int64_t b = std::max<int64_t>(begin - p.offset, 0);
      const int64_t e = std::min<int64_t>(end - p.offset, p.rows);
      if (b < e) fn(p.args, b, e);
    }
  };
  if (pool == nullptr || pool->num_threads() == 1 || work < kMinParallelWork) {
    run(0, total);
    return;
  }
  pool->ParallelFor(total, run, /*align=*/8);
}

}  // namespace

void GroupedGemm(const float* x, int64_t m, int64_t ldx, const WeightView& w,
                 int64_t groups, float* y, int64_t ldy, ThreadPool* pool) {
  if (m <= 0 || w.rows <= 0) return;
  const GemmOutput output{w, y, ldy};
  SharedPass(x, m, ldx, groups, &output, 1, pool);
}

void GemmShared(const float* x, int64_t m, int64_t ldx,
                std::initializer_list<GemmOutput> outputs, ThreadPool* pool) {
  if (m <= 0 || outputs.size() == 0) return;
  const WeightView& first = outputs.begin()->w;
  bool shared = true;
  for (const GemmOutput& o : outputs) {
    shared = shared && o.w.type == first.type && o.w.cols == first.cols &&
             o.w.bf16_pairs == first.bf16_pairs &&
             o.w.round_to_bf16 == first.round_to_bf16;
  }
  if (!shared || outputs.size() > kMaxSharedOutputs) {
    for (const GemmOutput& o : outputs) Gemm(x, m, ldx, o.w, o.y, o.ldy, pool);
    return;
  }
  SharedPass(x, m, ldx, /*groups=*/1, outputs.begin(), outputs.size(), pool);
}

int64_t WeightView::bytes_for(int64_t elements) const {
  switch (type) {
    case WeightType::kF32:
      return elements * 4;
    case WeightType::kBf16:
      return elements * 2;
    case WeightType::kGgmlBlocks:
      break;
  }
  return PackedRowBytes(blocks, elements);
}

float Dot(const float* a, const float* b, int64_t n) {
  float y = 0.0f;
  const WeightView w{WeightType::kF32, b, 1, n, n};
  Gemm(a, 1, n, w, &y, 1, nullptr);
  return y;
}

}  // namespace kvd::kernels::cpu
