#include "kernels/cpu/gemm.h"

#include <cassert>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/internal/gemm_isa.h"

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

// Below this many multiply-adds a call runs on the calling thread: waking
// workers costs more.
constexpr int64_t kMinParallelWork = 1 << 15;

}  // namespace

void Gemm(const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y,
          int64_t ldy, ThreadPool* pool) {
  GroupedGemm(x, m, ldx, w, /*groups=*/1, y, ldy, pool);
}

void GroupedGemm(const float* x, int64_t m, int64_t ldx, const WeightView& w,
                 int64_t groups, float* y, int64_t ldy, ThreadPool* pool) {
  assert(groups >= 1 && w.cols % groups == 0);
  if (m <= 0 || w.rows <= 0) return;
  const bool blocks = w.type == WeightType::kGgmlBlocks;
  assert(!blocks || (IsGemmBlockType(w.blocks) &&
                     w.cols % PackedBlockSize(w.blocks) == 0 &&
                     w.stride() % PackedBlockSize(w.blocks) == 0));
  const internal::GemmArgs args{x,
                                m,
                                ldx,
                                w.data,
                                blocks ? w.row_stride_bytes() : w.stride(),
                                w.cols,
                                y,
                                ldy,
                                groups,
                                w.blocks,
                                w.round_to_bf16};
  const RangeFn fn = Pick(w.type, m);
  if (pool == nullptr || pool->num_threads() == 1 ||
      m * w.rows * w.cols < kMinParallelWork) {
    fn(args, 0, w.rows);
    return;
  }
  pool->ParallelFor(
      w.rows, [&](int64_t begin, int64_t end) { fn(args, begin, end); },
      /*align=*/8);
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
