#include "kernels/cpu/row_parallel_gemm.h"

#include <cassert>

namespace kvd::kernels::cpu {

void GroupPartial(const float* x, int64_t m, int64_t ldx, const WeightView& w,
                  int64_t groups, int64_t g, float* p, int64_t ldp,
                  ThreadPool* pool) {
  assert(groups >= 1 && w.cols % groups == 0 && g >= 0 && g < groups);
  const int64_t slice = w.cols / groups;
  const int64_t k0 = g * slice;
  WeightView part = w;
  // Blocks: k0 must start a block (GroupedGemm takes any slicing).
  assert(w.type != WeightType::kGgmlBlocks ||
         k0 % PackedBlockSize(w.blocks) == 0);
  part.data = static_cast<const char*>(w.data) + w.bytes_for(k0);
  part.cols = slice;
  part.ld = w.stride();
  Gemm(x + k0, m, ldx, part, p, ldp, pool);
}

void AddPartial(const float* p, int64_t m, int64_t n, int64_t ld, float* acc) {
  for (int64_t i = 0; i < m; ++i) {
    const float* src = p + i * ld;
    float* dst = acc + i * ld;
    for (int64_t j = 0; j < n; ++j) dst[j] += src[j];
  }
}

}  // namespace kvd::kernels::cpu
