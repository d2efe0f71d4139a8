// Index arithmetic of the canonical attention walk, shared by the CUDA
// kernels (attention.cu, paged_attention.cu) and a CPU test
// (attention_index_test.cc) that checks it without a GPU: which keys a query
// sees, the canonical chunks in order, how a launch's position range clips
// them, and where a position's K/V row lives in a paged pool.
//
// Everything here is integer arithmetic, so host and device agree exactly.
//
// Paged layout (the CPU engine's ops/model/kv_block_pool.h, on the device): a
// pool of equal blocks; block b holds block_rows consecutive positions, first
// their K rows, then their V rows, each row kv_stride bf16 values apart, so a
// block is 2 * block_rows * kv_stride values. A sequence's block table maps
// its i-th block of positions ([i * block_rows, (i + 1) * block_rows)) to a
// pool block. block_rows is a multiple of the chunk, so a chunk never
// straddles two blocks: its rows are one run at stride kv_stride, exactly as
// in a contiguous cache.
#ifndef KVD_KERNELS_CUDA_INTERNAL_ATTENTION_INDEX_H_
#define KVD_KERNELS_CUDA_INTERNAL_ATTENTION_INDEX_H_

#include <cstdint>

#if defined(__CUDACC__)
#define KVD_AI_FN __host__ __device__ inline
#else
#define KVD_AI_FN inline
#endif

namespace kvd::kernels::cuda::internal {

// Key positions per canonical chunk (kernels/cpu/attention.h's
// kAttentionChunk; attention_index_test checks they agree).
inline constexpr int64_t kChunkRows = 32;

// First visible key of a query whose last key is `last` (window 0: all).
KVD_AI_FN int64_t FirstVisible(int64_t last, int64_t window) {
  return window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
}

// The keys one launch folds for one query: the visible keys [first, last]
// intersected with the launch's range [range_begin, range_end). Both range
// ends must be multiples of kChunkRows (or range_end "infinite"), so every
// canonical chunk is folded whole by exactly one launch. Empty: lo > hi.
struct KeySpan {
  int64_t lo;
  int64_t hi;  // inclusive
};
KVD_AI_FN KeySpan LaunchSpan(int64_t last, int64_t window, int64_t range_begin,
                             int64_t range_end) {
  const int64_t first = FirstVisible(last, window);
  const int64_t lo = first > range_begin ? first : range_begin;
  const int64_t hi = last < range_end - 1 ? last : range_end - 1;
  return {lo, hi};
}

// Canonical chunk containing position p (its first absolute position).
KVD_AI_FN int64_t ChunkOf(int64_t p) { return p / kChunkRows * kChunkRows; }

// Keys of chunk c that the span covers: [max(c, span.lo), min(c + 31,
// span.hi)].
KVD_AI_FN KeySpan ClipChunk(int64_t c, KeySpan span) {
  const int64_t lo = c > span.lo ? c : span.lo;
  const int64_t hi =
      c + kChunkRows - 1 < span.hi ? c + kChunkRows - 1 : span.hi;
  return {lo, hi};
}

// A pool of paged K/V (layout above). table_row points at the query's
// sequence's block table.
struct KvPageLayout {
  int64_t block_rows;  // positive multiple of kChunkRows
  int64_t kv_stride;   // bf16 values between consecutive rows
};

// Offset (in bf16 values from the pool's start) of position p's K row; its V
// row is block_rows * kv_stride further.
KVD_AI_FN int64_t PagedKRowOffset(const int32_t* table_row, KvPageLayout l,
                                  int64_t p) {
  const int64_t block = table_row[p / l.block_rows];
  return (block * 2 * l.block_rows + p % l.block_rows) * l.kv_stride;
}
KVD_AI_FN int64_t PagedVRowOffset(const int32_t* table_row, KvPageLayout l,
                                  int64_t p) {
  return PagedKRowOffset(table_row, l, p) + l.block_rows * l.kv_stride;
}

// Fused recompute: positions below hot_begin (a multiple of kChunkRows) come
// from residuals, group_rows (a multiple of kChunkRows) at a time; group g
// covers [g * group_rows, min((g + 1) * group_rows, hot_begin)).
KVD_AI_FN int64_t ColdGroups(int64_t hot_begin, int64_t group_rows) {
  return (hot_begin + group_rows - 1) / group_rows;
}

}  // namespace kvd::kernels::cuda::internal

#undef KVD_AI_FN

#endif  // KVD_KERNELS_CUDA_INTERNAL_ATTENTION_INDEX_H_
