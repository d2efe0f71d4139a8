// Paged attention and its fused-recompute pipeline. The fold is
// internal/attention_core.cuh (the same code as the contiguous Attention);
// this file only locates rows and sequences K/V recompute with the fold.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/internal/attention_core.cuh"
#include "kernels/cuda/internal/attention_index.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "kernels/cuda/kv_recompute.h"
#include "kernels/cuda/paged_attention.h"

namespace kvd::kernels::cuda {
namespace {

// base/status_macros.h is outside this nvcc-compiled package.
#define KVD_CUDA_RETURN_IF_ERROR(expr)   \
  do {                                   \
    const absl::Status status_ = (expr); \
    if (!status_.ok()) return status_;   \
  } while (0)

using internal::kAttnThreads;

// One launch of the fold: keys of query i limited to [range_begin, range_end)
// and, per sequence, to [seq_begin[s], seq_end[s]) where given (device
// int32[n_seqs]); all bounds multiples of the chunk.
struct FoldLaunch {
  PagedAttentionArgs a;
  int64_t range_begin = 0;
  int64_t range_end = INT64_MAX;
  const int32_t* seq_begin = nullptr;
  const int32_t* seq_end = nullptr;
  const float* state_in = nullptr;  // null: fresh state
  float* state_out = nullptr;       // null: finalize into a.out
};

__global__ void __launch_bounds__(kAttnThreads) PagedKernel(FoldLaunch f) {
  const PagedAttentionArgs& a = f.a;
  const int64_t h = blockIdx.x;
  const int64_t qi = blockIdx.y;
  const int64_t kvh = h / (a.n_heads / a.n_kv_heads);
  const int64_t seq = a.query_seq != nullptr ? a.query_seq[qi] : qi;
  int64_t rb = f.range_begin, re = f.range_end;
  if (f.seq_begin != nullptr && f.seq_begin[seq] > rb) rb = f.seq_begin[seq];
  if (f.seq_end != nullptr && f.seq_end[seq] < re) re = f.seq_end[seq];
  const internal::KeySpan span =
      internal::LaunchSpan(a.last[qi], a.window, rb, re);
  const internal::PagedRows rows{
      a.kv.pool, a.kv.block_table + seq * a.kv.table_stride,
      internal::KvPageLayout{a.kv.block_rows, a.kv.kv_stride}, a.kv.kv_stride};
  const int64_t state_off =
      (qi * a.n_heads + h) * internal::AttnStateFloats(a.head_dim);
  internal::AttendSpan(
      a.q + qi * a.q_stride + h * a.head_dim, static_cast<int>(a.head_dim),
      a.scale, kvh * a.head_dim, span, rows,
      f.state_in != nullptr ? f.state_in + state_off : nullptr,
      f.state_out != nullptr ? f.state_out + state_off : nullptr,
      a.out + qi * a.out_stride + h * a.head_dim);
}

__global__ void Iota(int32_t* dst, int64_t n, int64_t first) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = static_cast<int32_t>(first + i);
  }
}

absl::Status Validate(const PagedAttentionArgs& a, const char* fn) {
  if (a.nq < 0 || a.n_heads <= 0 || a.n_kv_heads <= 0 ||
      a.n_heads % a.n_kv_heads != 0 || a.head_dim <= 0 ||
      a.head_dim > kMaxAttentionHeadDim || a.window < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn, ": need n_kv_heads dividing n_heads, 0 < head_dim <= ",
        kMaxAttentionHeadDim, ", window >= 0; got n_heads=", a.n_heads,
        " n_kv_heads=", a.n_kv_heads, " head_dim=", a.head_dim,
        " window=", a.window));
  }
  if (a.q_stride < a.n_heads * a.head_dim ||
      a.out_stride < a.n_heads * a.head_dim ||
      a.kv.kv_stride < a.n_kv_heads * a.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn, ": strides too small: q_stride=", a.q_stride,
        " out_stride=", a.out_stride, " (need >= ", a.n_heads * a.head_dim,
        "), kv_stride=", a.kv.kv_stride,
        " (need >= ", a.n_kv_heads * a.head_dim, ")"));
  }
  if (a.kv.block_rows <= 0 || a.kv.block_rows % kAttentionChunk != 0 ||
      a.kv.table_stride <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn, ": block_rows must be a positive multiple of ", kAttentionChunk,
        " (a chunk must not straddle blocks) and table_stride positive; got "
        "block_rows=",
        a.kv.block_rows, " table_stride=", a.kv.table_stride));
  }
  if (a.nq > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn, ": nq=", a.nq, " exceeds 65535 per launch; split the batch"));
  }
  if (a.nq > 0 &&
      (a.q == nullptr || a.kv.pool == nullptr || a.kv.block_table == nullptr ||
       a.last == nullptr || a.out == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn,
        ": null device pointer among q, kv.pool, kv.block_table, last, "
        "out"));
  }
  return absl::OkStatus();
}

absl::Status LaunchFold(const FoldLaunch& f, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(f.a.n_heads),
                  static_cast<unsigned>(f.a.nq));
  PagedKernel<<<grid, kAttnThreads, 0, s>>>(f);
  return internal::LastLaunchStatus(
      absl::StrCat("PagedAttention nq=", f.a.nq, " n_heads=", f.a.n_heads,
                   " range=[", f.range_begin, ", ", f.range_end, ")"));
}

int64_t Align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Byte offsets of the recompute workspace's parts.
struct WorkspaceLayout {
  int64_t state, recompute, scratch, cold_table, hot, positions, total;
};
WorkspaceLayout Layout(int64_t nq, int64_t n_heads, int64_t n_kv_heads,
                       int64_t head_dim, int64_t n_seqs, int64_t d_model,
                       int64_t group_rows, int64_t max_hot_begin) {
  const int64_t width = n_kv_heads * head_dim;
  WorkspaceLayout l;
  l.state = 0;
  l.recompute = l.state + Align256(nq * n_heads *
                                   internal::AttnStateFloats(head_dim) * 4);
  l.scratch =
      l.recompute +
      Align256(KvRecomputeWorkspaceFloats(group_rows, d_model, width) * 4);
  l.cold_table = l.scratch + Align256(n_seqs * 2 * group_rows * width * 2);
  l.hot =
      l.cold_table +
      Align256(n_seqs * internal::ColdGroups(max_hot_begin, group_rows) * 4);
  l.positions = l.hot + Align256(n_seqs * 4);
  l.total = l.positions + Align256(group_rows * 4);
  return l;
}

}  // namespace

absl::Status PagedAttention(const PagedAttentionArgs& a, void* stream) {
  KVD_CUDA_RETURN_IF_ERROR(Validate(a, "PagedAttention"));
  if (a.nq == 0) return absl::OkStatus();
  FoldLaunch f;
  f.a = a;
  return LaunchFold(f, static_cast<cudaStream_t>(stream));
}

int64_t PagedRecomputeWorkspaceBytes(int64_t nq, int64_t n_heads,
                                     int64_t n_kv_heads, int64_t head_dim,
                                     int64_t n_seqs, int64_t d_model,
                                     int64_t group_rows,
                                     int64_t max_hot_begin) {
  return Layout(nq, n_heads, n_kv_heads, head_dim, n_seqs, d_model, group_rows,
                max_hot_begin)
      .total;
}

absl::Status PagedAttentionRecompute(const PagedRecomputeArgs& r,
                                     void* stream) {
  const PagedAttentionArgs& a = r.attn;
  KVD_CUDA_RETURN_IF_ERROR(Validate(a, "PagedAttentionRecompute"));
  if (r.n_seqs <= 0 || r.hot_begin == nullptr || r.d_model <= 0 ||
      r.ld_residual < r.d_model || r.group_rows <= 0 ||
      r.group_rows % kAttentionChunk != 0 || r.rot_dim < 0 ||
      r.rot_dim > a.head_dim || r.rot_dim % 2 != 0 ||
      (a.query_seq == nullptr && r.n_seqs < a.nq)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedAttentionRecompute: need n_seqs > 0 (>= nq without query_seq), "
        "host hot_begin, d_model > 0, ld_residual >= d_model, group_rows a "
        "positive multiple of ",
        kAttentionChunk, ", even rot_dim <= head_dim; got n_seqs=", r.n_seqs,
        " nq=", a.nq, " d_model=", r.d_model, " ld_residual=", r.ld_residual,
        " group_rows=", r.group_rows, " rot_dim=", r.rot_dim));
  }
  int64_t max_hot = 0;
  for (int64_t s = 0; s < r.n_seqs; ++s) {
    const int64_t hb = r.hot_begin[s];
    if (hb < 0 || hb % kAttentionChunk != 0 || hb > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PagedAttentionRecompute: hot_begin[", s, "]=", hb,
          " must be a non-negative multiple of ", kAttentionChunk,
          " (the fold switches source only between canonical chunks)"));
    }
    if (hb > 0 && (r.residual == nullptr || r.residual[s] == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("PagedAttentionRecompute: sequence ", s, " recomputes ",
                       hb, " positions but has no residual pointer"));
    }
    max_hot = std::max(max_hot, hb);
  }
  if (max_hot > 0 && (r.wk == nullptr || r.wv == nullptr)) {
    return absl::InvalidArgumentError(
        "PagedAttentionRecompute: null wk or wv with positions to recompute");
  }
  // RecomputeKv's own refusal, here before anything is enqueued.
  if ((r.bk == nullptr) != (r.bv == nullptr)) {
    return absl::InvalidArgumentError(
        "PagedAttentionRecompute: bk and bv must both be given or both be "
        "null");
  }
  const WorkspaceLayout l = Layout(a.nq, a.n_heads, a.n_kv_heads, a.head_dim,
                                   r.n_seqs, r.d_model, r.group_rows, max_hot);
  if (r.workspace == nullptr || r.workspace_bytes < l.total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedAttentionRecompute: workspace of ", r.workspace_bytes,
        " bytes (null: ", r.workspace == nullptr, "), need ", l.total,
        " (PagedRecomputeWorkspaceBytes)"));
  }
  if (a.nq == 0) return absl::OkStatus();

  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  char* ws = static_cast<char*>(r.workspace);
  float* state = reinterpret_cast<float*>(ws + l.state);
  float* rc = reinterpret_cast<float*>(ws + l.recompute);
  uint16_t* scratch = reinterpret_cast<uint16_t*>(ws + l.scratch);
  int32_t* cold_table = reinterpret_cast<int32_t*>(ws + l.cold_table);
  int32_t* hot = reinterpret_cast<int32_t*>(ws + l.hot);
  int32_t* positions = reinterpret_cast<int32_t*>(ws + l.positions);
  const int64_t width = a.n_kv_heads * a.head_dim;
  const int64_t gr = r.group_rows;
  const int64_t groups = internal::ColdGroups(max_hot, gr);

  // Scratch as a paged pool with one block of group_rows per sequence: every
  // cold block index of sequence s maps to block s (each group overwrites
  // it after the previous group was folded, in stream order).
  std::vector<int32_t> host_hot(r.n_seqs);
  std::vector<int32_t> host_cold(std::max<int64_t>(1, r.n_seqs * groups));
  for (int64_t s = 0; s < r.n_seqs; ++s) {
    host_hot[s] = static_cast<int32_t>(r.hot_begin[s]);
    for (int64_t g = 0; g < groups; ++g)
      host_cold[s * groups + g] = static_cast<int32_t>(s);
  }
  // From pageable memory these copies are staged before returning, so the
  // vectors may die with this frame.
  KVD_CUDA_RETURN_IF_ERROR(
      internal::CudaStatus(cudaMemcpyAsync(hot, host_hot.data(), r.n_seqs * 4,
                                           cudaMemcpyHostToDevice, st),
                           "PagedAttentionRecompute: upload hot_begin"));
  if (groups > 0) {
    KVD_CUDA_RETURN_IF_ERROR(internal::CudaStatus(
        cudaMemcpyAsync(cold_table, host_cold.data(), r.n_seqs * groups * 4,
                        cudaMemcpyHostToDevice, st),
        "PagedAttentionRecompute: upload the scratch block table"));
  }

  for (int64_t g = 0; g < groups; ++g) {
    const int64_t p0 = g * gr;
    Iota<<<static_cast<unsigned>((gr + 255) / 256), 256, 0, st>>>(positions, gr,
                                                                  p0);
    KVD_CUDA_RETURN_IF_ERROR(internal::LastLaunchStatus("Iota (positions)"));
    for (int64_t s = 0; s < r.n_seqs; ++s) {
      if (r.hot_begin[s] <= p0) continue;
      KvRecomputeArgs k;
      k.residual = r.residual[s] + p0 * r.ld_residual;
      k.rows = std::min(gr, r.hot_begin[s] - p0);
      k.d_model = r.d_model;
      k.ld_residual = r.ld_residual;
      k.norm_weight = r.norm_weight;
      k.eps = r.eps;
      k.wk = r.wk;
      k.wv = r.wv;
      k.bk = r.bk;
      k.bv = r.bv;
      k.n_kv_heads = a.n_kv_heads;
      k.head_dim = a.head_dim;
      k.head_begin = 0;
      k.head_end = a.n_kv_heads;
      k.rot_dim = r.rot_dim;
      k.rope_base = r.rope_base;
      k.rope_style = r.rope_style;
      k.positions = positions;
      k.k_out = scratch + s * 2 * gr * width;
      k.v_out = k.k_out + gr * width;
      k.ld_out = width;
      k.workspace = rc;
      KVD_CUDA_RETURN_IF_ERROR(RecomputeKv(k, stream));
    }
    FoldLaunch f;
    f.a = a;
    f.a.kv = PagedKv{scratch, cold_table, groups, gr, width};
    f.range_begin = p0;
    f.range_end = p0 + gr;
    f.seq_end = hot;
    f.state_in = g > 0 ? state : nullptr;
    f.state_out = state;
    KVD_CUDA_RETURN_IF_ERROR(LaunchFold(f, st));
  }
  FoldLaunch f;
  f.a = a;
  f.seq_begin = hot;
  f.state_in = groups > 0 ? state : nullptr;
  return LaunchFold(f, st);
}

}  // namespace kvd::kernels::cuda
