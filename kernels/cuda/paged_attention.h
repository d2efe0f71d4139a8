// Canonical attention over paged K/V on the GPU, and its fused-recompute
// variant (kv-direct: old chunks rebuilt from residuals inside the call).
//
// Paged layout (the CPU engine's ops/model/kv_block_pool.h, on the device):
// a pool of equal blocks; block b holds block_rows consecutive positions of
// one layer, first their K rows then their V rows, kv_stride bf16 values
// apart (a block is 2 * block_rows * kv_stride values). Each sequence has a
// block table: entry i is the pool block holding its positions
// [i * block_rows, (i + 1) * block_rows). block_rows is a multiple of
// kAttentionChunk, so a canonical chunk is one run of rows at a fixed stride,
// and the fold (internal/attention_core.cuh, the same code as Attention) gives
// the same bits as the contiguous Attention over the same rows, whatever the
// block size and wherever the blocks sit in the pool.
//
// PagedAttentionRecompute: positions below a per-sequence hot boundary are
// not read from the pool but recomputed from bf16 residuals with RecomputeKv
// (kv_recompute.h: RMSNorm, K/V projection, optional k/v bias, RoPE, bf16),
// `group_rows` positions per sequence at a time into a bounded scratch, and
// each group is folded before the next is recomputed (a two-stage per-group
// pipeline, not a single fused kernel; README.md). The fold state crosses
// launches exactly, so the output equals PagedAttention over a cache that
// RecomputeKv filled, bit for bit. Scratch is bounded by group_rows, not by the
// context length.
//
//   PagedAttentionArgs a{...};  // a.kv: pool + block tables
//   KVD_RETURN_IF_ERROR(PagedAttention(a, stream));
//
//   PagedRecomputeArgs r{...};  // r.attn as above, plus residual sources;
//                               // r.workspace: PagedRecomputeWorkspaceBytes
//   KVD_RETURN_IF_ERROR(PagedAttentionRecompute(r, stream));
//
// Thread-safety: enqueue on `stream` and return; device buffers must stay
// unchanged until the stream has run the work. The host arrays of
// PagedRecomputeArgs are read before the call returns: PagedAttentionRecompute
// uploads small tables from host memory, so unlike PagedAttention it cannot
// be captured into a CUDA graph.
#ifndef KVD_KERNELS_CUDA_PAGED_ATTENTION_H_
#define KVD_KERNELS_CUDA_PAGED_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"

namespace kvd::kernels::cuda {

struct PagedKv {
  const uint16_t* pool = nullptr;  // bf16 blocks (layout above)
  // Device int32[n_seqs * table_stride]: sequence s's block i is pool block
  // block_table[s * table_stride + i]. Entries for blocks a query reads must
  // be valid pool blocks (not checked on the device).
  const int32_t* block_table = nullptr;
  int64_t table_stride = 0;
  int64_t block_rows = 0;  // positive multiple of kAttentionChunk
  int64_t kv_stride = 0;   // >= n_kv_heads * head_dim
};

struct PagedAttentionArgs {
  // As AttentionArgs: query i's head h is q[i * q_stride + h * head_dim + d].
  const float* q = nullptr;
  int64_t nq = 0;
  int64_t q_stride = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads
  int64_t head_dim = 0;    // <= kMaxAttentionHeadDim
  float scale = 0.0f;
  PagedKv kv;
  // Device int32[nq]: the sequence (block table row) of query i; null means
  // query i reads table row i (one decode query per sequence).
  const int32_t* query_seq = nullptr;
  // Device int32[nq]: query i sees keys [max(0, last[i] - window + 1),
  // last[i]] of its sequence (window 0: all); negative: no keys, output 0.
  const int32_t* last = nullptr;
  int64_t window = 0;
  float* out = nullptr;  // out[i * out_stride + h * head_dim + d]
  int64_t out_stride = 0;
};

// INVALID_ARGUMENT for bad shapes or null pointers, INTERNAL on launch
// failure.
absl::Status PagedAttention(const PagedAttentionArgs& args, void* stream);

struct PagedRecomputeArgs {
  // Queries, hot K/V (positions >= hot_begin) and outputs. attn.query_seq
  // indexes sequences 0..n_seqs-1.
  PagedAttentionArgs attn;
  int64_t n_seqs = 0;
  // HOST int64[n_seqs]: sequence s's positions < hot_begin[s] come from
  // residuals; each a multiple of kAttentionChunk, >= 0. Pool entries below
  // it are never read.
  const int64_t* hot_begin = nullptr;
  // HOST array[n_seqs] of device pointers: sequence s's residual of position
  // p is residual[s] + p * ld_residual (d_model bf16 values); only positions
  // < hot_begin[s] are read. May be null where hot_begin[s] is 0.
  const uint16_t* const* residual = nullptr;
  int64_t ld_residual = 0;
  // RecomputeKv's parameters (kv_recompute.h), all heads: the weights give
  // attn.n_kv_heads * attn.head_dim rows of d_model.
  int64_t d_model = 0;
  const float* norm_weight = nullptr;
  float eps = 1e-5f;
  const uint16_t* wk = nullptr;
  const uint16_t* wv = nullptr;
  // Optional k/v biases (qwen2), attn.n_kv_heads * attn.head_dim device
  // floats each, both or neither; null: none. RecomputeKv adds them as the
  // forward pass does.
  const float* bk = nullptr;
  const float* bv = nullptr;
  int64_t rot_dim = 0;
  float rope_base = 10000.0f;
  RopeStyle rope_style = RopeStyle::kHalfSplit;
  // Positions recomputed per sequence per step: a positive multiple of
  // kAttentionChunk. Bigger groups mean fewer, larger GEMMs.
  int64_t group_rows = 256;
  // Device scratch of at least PagedRecomputeWorkspaceBytes(...) bytes,
  // 256-byte aligned (cudaMalloc is).
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

// Scratch for PagedAttentionRecompute: fold state per (query, head), the
// recomputed K/V of one group per sequence, RecomputeKv's own workspace, and
// small tables. Grows with group_rows and max_hot_begin / group_rows (4
// bytes per group per sequence), not with the cached context.
int64_t PagedRecomputeWorkspaceBytes(int64_t nq, int64_t n_heads,
                                     int64_t n_kv_heads, int64_t head_dim,
                                     int64_t n_seqs, int64_t d_model,
                                     int64_t group_rows, int64_t max_hot_begin);

// INVALID_ARGUMENT for bad shapes, null pointers, only one of bk/bv, a hot
// boundary that is not chunk-aligned, a missing residual or a small
// workspace (naming it);
// INTERNAL on launch failure.
absl::Status PagedAttentionRecompute(const PagedRecomputeArgs& args,
                                     void* stream);

}  // namespace kvd::kernels::cuda

#endif  // KVD_KERNELS_CUDA_PAGED_ATTENTION_H_
