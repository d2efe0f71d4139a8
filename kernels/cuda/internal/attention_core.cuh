// The one canonical attention fold on the device, shared by the contiguous
// kernel (attention.cu) and the paged / fused-recompute kernels
// (paged_attention.cu). Where a chunk's K/V rows come from is a template
// parameter (Rows) that only computes addresses; the arithmetic is this one
// function, so contiguous, paged and recomputed K/V give the same bits for the
// same rows by construction (and tested on the device).
//
// One block of kThreads per (query, head). Per chunk:
//  1. scores: warp w computes keys j = w, w + 4, ...; lane l sums dims
//     l, l + 32, ... with FMA in increasing order, then a fixed xor butterfly;
//  2. threads j < 32 turn scores into p_j = exp(s_j - new_max) (kvd's exp);
//  3. every thread rescales and folds the chunk into its own dims
//     d = tid, tid + kThreads: acc = fma(p_j, v_j[d], acc) for j in order, and
//     the running sum adds p_j in the same order (redundantly in each thread,
//     so no cross-thread reduction can vary).
//
// A fold may be split over several launches at chunk boundaries (the fused
// recompute does: cold chunks from scratch, then hot chunks from the cache):
// the (max, sum, acc) state is stored to and reloaded from global memory as
// floats, which is exact, so the split changes no bit.
#ifndef KVD_KERNELS_CUDA_INTERNAL_ATTENTION_CORE_CUH_
#define KVD_KERNELS_CUDA_INTERNAL_ATTENTION_CORE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/internal/attention_index.h"
#include "kernels/cuda/internal/device_math.cuh"

namespace kvd::kernels::cuda::internal {

inline constexpr int kAttnThreads = 128;
inline constexpr int kAttnWarps = kAttnThreads / 32;
inline constexpr int kAttnChunk = static_cast<int>(kAttentionChunk);
inline constexpr int kAttnDimsPerThread = kMaxAttentionHeadDim / kAttnThreads;
static_assert(kAttentionChunk == kChunkRows, "one chunk size");

// Floats of fold state per (query, head): max, sum, then head_dim accumulators.
__host__ __device__ inline int64_t AttnStateFloats(int64_t head_dim) {
  return head_dim + 2;
}

__device__ inline float Bf16At(const uint16_t* p, int64_t i) {
  return __uint_as_float(static_cast<uint32_t>(p[i]) << 16);
}

// Rows: K(p) / V(p) give the address of position p's row (all kv heads);
// rows p..p+31 of one chunk are at K(p) + j * stride.
struct ContiguousRows {
  const uint16_t* k;
  const uint16_t* v;
  int64_t stride;
  __device__ const uint16_t* K(int64_t p) const { return k + p * stride; }
  __device__ const uint16_t* V(int64_t p) const { return v + p * stride; }
};

struct PagedRows {
  const uint16_t* pool;
  const int32_t* table_row;
  KvPageLayout layout;
  int64_t stride;  // == layout.kv_stride
  __device__ const uint16_t* K(int64_t p) const {
    return pool + PagedKRowOffset(table_row, layout, p);
  }
  __device__ const uint16_t* V(int64_t p) const {
    return pool + PagedVRowOffset(table_row, layout, p);
  }
};

// Folds keys span.lo..span.hi of one (query, head) into the state, in
// canonical chunks. state_in: null starts fresh, else the stored state.
// state_out: null finalizes into out_row (acc / sum; zeros if no key was ever
// folded), else the state is stored there. Must be called by all kAttnThreads
// threads of the block.
template <class Rows>
__device__ void AttendSpan(const float* q_row, int hd, float scale,
                           int64_t kv_head_offset, KeySpan span,
                           const Rows& rows, const float* state_in,
                           float* state_out, float* out_row) {
  __shared__ float q[kMaxAttentionHeadDim];
  __shared__ float s[kAttnChunk];
  __shared__ float chunk_max;
  for (int d = threadIdx.x; d < hd; d += kAttnThreads) q[d] = q_row[d];

  float acc[kAttnDimsPerThread];
  float run_max = -__int_as_float(0x7f800000);
  float run_sum = 0.0f;
  if (state_in == nullptr) {
#pragma unroll
    for (int t = 0; t < kAttnDimsPerThread; ++t) acc[t] = 0.0f;
  } else {
    run_max = state_in[0];
    run_sum = state_in[1];
#pragma unroll
    for (int t = 0; t < kAttnDimsPerThread; ++t) {
      const int d = threadIdx.x + t * kAttnThreads;
      acc[t] = d < hd ? state_in[2 + d] : 0.0f;
    }
  }
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  __syncthreads();

  for (int64_t c = ChunkOf(span.lo); c <= span.hi; c += kAttnChunk) {
    const KeySpan ch = ClipChunk(c, span);
    const int n = static_cast<int>(ch.hi - ch.lo + 1);
    const uint16_t* kc = rows.K(ch.lo) + kv_head_offset;
    const uint16_t* vc = rows.V(ch.lo) + kv_head_offset;
    for (int j = warp; j < n; j += kAttnWarps) {
      const uint16_t* kr = kc + j * rows.stride;
      float dot = 0.0f;
      for (int d = lane; d < hd; d += 32) dot = fmaf(q[d], Bf16At(kr, d), dot);
#pragma unroll
      for (int off = 16; off > 0; off /= 2) {
        dot = __fadd_rn(dot, __shfl_xor_sync(0xffffffffu, dot, off));
      }
      if (lane == 0) s[j] = __fmul_rn(dot, scale);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float m = s[0];
      for (int j = 1; j < n; ++j) m = fmaxf(m, s[j]);
      chunk_max = m;
    }
    __syncthreads();
    const float new_max = fmaxf(run_max, chunk_max);
    if (threadIdx.x < n) s[threadIdx.x] = Exp(s[threadIdx.x] - new_max);
    if (new_max != run_max) {
      const float alpha = run_max == -__int_as_float(0x7f800000)
                              ? 0.0f
                              : Exp(run_max - new_max);
      run_sum = __fmul_rn(run_sum, alpha);
#pragma unroll
      for (int t = 0; t < kAttnDimsPerThread; ++t)
        acc[t] = __fmul_rn(acc[t], alpha);
      run_max = new_max;
    }
    __syncthreads();
    for (int j = 0; j < n; ++j) {
      const float p = s[j];
      run_sum = __fadd_rn(run_sum, p);
      const uint16_t* vr = vc + j * rows.stride;
#pragma unroll
      for (int t = 0; t < kAttnDimsPerThread; ++t) {
        const int d = threadIdx.x + t * kAttnThreads;
        if (d < hd) acc[t] = fmaf(p, Bf16At(vr, d), acc[t]);
      }
    }
    __syncthreads();  // s is rewritten by the next chunk
  }

  if (state_out != nullptr) {
    if (threadIdx.x == 0) {
      state_out[0] = run_max;
      state_out[1] = run_sum;
    }
#pragma unroll
    for (int t = 0; t < kAttnDimsPerThread; ++t) {
      const int d = threadIdx.x + t * kAttnThreads;
      if (d < hd) state_out[2 + d] = acc[t];
    }
    return;
  }
#pragma unroll
  for (int t = 0; t < kAttnDimsPerThread; ++t) {
    const int d = threadIdx.x + t * kAttnThreads;
    if (d < hd)
      out_row[d] = run_sum == 0.0f ? 0.0f : __fdiv_rn(acc[t], run_sum);
  }
}

}  // namespace kvd::kernels::cuda::internal

#endif  // KVD_KERNELS_CUDA_INTERNAL_ATTENTION_CORE_CUH_
