// The row-parallel projections of the numerics contract (attention output
// W_o and MLP down W_down): their input dimension K is cut into `groups`
// contiguous, equal slices, each slice's product is a canonical Gemm (one
// partial result per output element), and the partials are added in group
// order: y = ((p_0 + p_1) + p_2) + ... (DESIGN.md section 7).
//
// Why: a tensor-parallel shard holds whole groups (its heads, its slice of
// the MLP), computes their partials itself and the partials are added in
// group order across shards, so every degree that divides `groups` and the
// unsharded path produce the same bits; a session checkpointed at TP = 3
// resumes bit-identically at TP = 1. With groups = 1 this is plain Gemm.
//
//   GroupedGemm(x, m, ldx, w, /*groups=*/3, y, ldy, pool);  // gemm.h
//   // a shard holding groups [2, 3): GroupPartial(x, m, ldx, w, 3, 2, p, ...)
//
// Thread-safety: pure functions of their inputs; `pool` must not be shared by
// concurrent callers.
#ifndef KVD_KERNELS_CPU_ROW_PARALLEL_GEMM_H_
#define KVD_KERNELS_CPU_ROW_PARALLEL_GEMM_H_

#include <cstdint>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"

namespace kvd::kernels::cpu {

// Group g's partial: p[i * ldp + j] = sum over k in [g K / G, (g + 1) K / G)
// of x[i * ldx + k] * W[j][k], by the canonical dot product. `groups` must
// divide w.cols.
void GroupPartial(const float* x, int64_t m, int64_t ldx, const WeightView& w,
                  int64_t groups, int64_t g, float* p, int64_t ldp,
                  ThreadPool* pool);

// acc[i * ld + j] += p[i * ld + j] for i < m, j < n: the ordered add of one
// more partial (the same fp32 add the collectives do).
void AddPartial(const float* p, int64_t m, int64_t n, int64_t ld, float* acc);

}  // namespace kvd::kernels::cpu

#endif  // KVD_KERNELS_CPU_ROW_PARALLEL_GEMM_H_
