#include "kernels/cpu/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/internal/exp_avx2.h"

namespace kvd::kernels::cpu {
namespace {

// Row r of `rows`. Callers only step from a resolved row to the others of
// its canonical chunk, which share a block when the store is paged.
const void* RowPtr(const KvRows& rows, int64_t r) { return rows.Row(r); }

// Asks for `bytes` of each of rows [first, min(first + kAttentionChunk - 1,
// last)], starting `offset` bytes into the row, while the current chunk is
// worked on: at depth the rows come from DRAM, and the loads, not the
// arithmetic, set the pace of decode.
void PrefetchChunk(const KvRows& rows, int64_t offset, int64_t bytes,
                   int64_t first, int64_t last) {
  const int64_t end = std::min(first + kAttentionChunk - 1, last);
  for (int64_t r = first; r <= end; ++r) {
    const char* row = static_cast<const char*>(RowPtr(rows, r)) + offset;
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0, 1);
  }
}

int64_t ElementBytes(const KvRows& rows) {
  return rows.type == WeightType::kF32 ? 4 : 2;
}

// The next chunk's K and V rows.
void PrefetchRows(const KvRows& k, const KvRows& v, int64_t head_dim,
                  int64_t first, int64_t last) {
  PrefetchChunk(k, 0, head_dim * ElementBytes(k), first, last);
  PrefetchChunk(v, 0, head_dim * ElementBytes(v), first, last);
}

// 8 values of a V row, widened exactly when bf16.
inline __m256 LoadV(const void* row, WeightType type, int64_t d) {
  if (type == WeightType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + d);
  }
  const __m128i h = _mm_loadu_si128(
      reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + d));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// acc[d0, d0 + 8R) = fma(p_j, v_j[d], acc[d]) for j = 0, 1, ..., n-1 in that
// order: the contract's per-element order, with the R accumulator registers
// kept across the chunk instead of going through memory for every key.
template <int R>
void AccumulateRows(const float* p, const KvRows& v, int64_t n, int64_t d0,
                    float* acc) {
  __m256 a[R];
  for (int r = 0; r < R; ++r) a[r] = _mm256_loadu_ps(acc + d0 + 8 * r);
  for (int64_t j = 0; j < n; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    const void* row = RowPtr(v, j);
    for (int r = 0; r < R; ++r)
      a[r] = _mm256_fmadd_ps(pj, LoadV(row, v.type, d0 + 8 * r), a[r]);
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(acc + d0 + 8 * r, a[r]);
}

// AccumulateRows over the elements [d0, d1) of the rows.
void AccumulateSlice(const float* p, const KvRows& v, int64_t n, int64_t d0,
                     int64_t d1, float* acc) {
  int64_t d = d0;
  for (; d + 64 <= d1; d += 64) AccumulateRows<8>(p, v, n, d, acc);
  for (; d + 32 <= d1; d += 32) AccumulateRows<4>(p, v, n, d, acc);
  for (; d + 8 <= d1; d += 8) AccumulateRows<1>(p, v, n, d, acc);
  for (; d < d1; ++d) {  // a slice that is not a multiple of 8
    for (int64_t j = 0; j < n; ++j) {
      const void* row = RowPtr(v, j);
      const float vd = v.type == WeightType::kF32
                           ? static_cast<const float*>(row)[d]
                           : Bf16ToFloat(static_cast<const uint16_t*>(row)[d]);
      acc[d] = std::fma(p[j], vd, acc[d]);
    }
  }
}

// AccumulateRows for G query heads that share the V rows (weights p[h],
// accumulators acc[h]): each V value is loaded, and widened from bf16, once
// for all G heads instead of once per head; every head's elements still get
// their FMAs in key order.
template <int G, int R>
void AccumulateHeadsRows(const float* const* p, const KvRows& v, int64_t n,
                         int64_t d0, float* const* acc) {
  __m256 a[G][R];
  for (int h = 0; h < G; ++h)
    for (int r = 0; r < R; ++r) a[h][r] = _mm256_loadu_ps(acc[h] + d0 + 8 * r);
  for (int64_t j = 0; j < n; ++j) {
    const void* row = RowPtr(v, j);
    __m256 pj[G];
    for (int h = 0; h < G; ++h) pj[h] = _mm256_set1_ps(p[h][j]);
    for (int r = 0; r < R; ++r) {
      const __m256 vr = LoadV(row, v.type, d0 + 8 * r);
      for (int h = 0; h < G; ++h) a[h][r] = _mm256_fmadd_ps(pj[h], vr, a[h][r]);
    }
  }
  for (int h = 0; h < G; ++h)
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(acc[h] + d0 + 8 * r, a[h][r]);
}

// Up to three heads take 32 values of a row per pass (12 accumulators, 3
// weights and a value fill AVX2's 16 registers), four take 16: at depth the
// rows come from DRAM, and fewer passes over a chunk's rows read them
// faster.
template <int G>
void AccumulateHeadsSlice(const float* const* p, const KvRows& v, int64_t n,
                          int64_t d0, int64_t d1, float* const* acc) {
  int64_t d = d0;
  if constexpr (G <= 3) {
    for (; d + 32 <= d1; d += 32) AccumulateHeadsRows<G, 4>(p, v, n, d, acc);
  }
  for (; d + 16 <= d1; d += 16) AccumulateHeadsRows<G, 2>(p, v, n, d, acc);
  for (; d + 8 <= d1; d += 8) AccumulateHeadsRows<G, 1>(p, v, n, d, acc);
  for (int h = 0; h < G && d < d1; ++h) {
    AccumulateSlice(p[h], v, n, d, d1, acc[h]);
  }
}

// AccumulateSlice for `heads` query heads sharing the V rows, up to four at
// a time.
void AccumulateHeads(int64_t heads, const float* const* p, const KvRows& v,
                     int64_t n, int64_t d0, int64_t d1, float* const* acc) {
  for (int64_t h = 0; h < heads; h += 4) {
    switch (std::min<int64_t>(4, heads - h)) {
      case 4:
        AccumulateHeadsSlice<4>(p + h, v, n, d0, d1, acc + h);
        break;
      case 3:
        AccumulateHeadsSlice<3>(p + h, v, n, d0, d1, acc + h);
        break;
      case 2:
        AccumulateHeadsSlice<2>(p + h, v, n, d0, d1, acc + h);
        break;
      default:
        AccumulateSlice(p[h], v, n, d0, d1, acc[h]);
    }
  }
}

// x[j] = Exp(x[j] - shift), 8 lanes at a time (bit-identical to the scalar).
void ExpShifted(float* x, int64_t n, float shift) {
  int64_t j = 0;
  const __m256 s = _mm256_set1_ps(shift);
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(x + j,
                     internal::Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), s)));
  }
  for (; j < n; ++j) x[j] = Exp(x[j] - shift);
}

// What one chunk did to a query head's running max: where it rose, the
// accumulator must be multiplied by alpha before the chunk's values are added.
struct SoftmaxStep {
  bool rescale = false;
  float alpha = 1.0f;
};

// One chunk of the online softmax for one query head: scales the n raw scores
// s in place, raises *max to cover them (scaling *sum by alpha if it rose),
// turns s into the weights Exp(s - max) and adds them to *sum, in that order.
SoftmaxStep SoftmaxChunk(float* s, int64_t n, float scale, float* max,
                         float* sum) {
  float chunk_max = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    s[j] *= scale;
    chunk_max = std::max(chunk_max, s[j]);
  }
  const float new_max = std::max(*max, chunk_max);
  SoftmaxStep step;
  if (*max != new_max) {
    step.rescale = true;
    step.alpha = *max == -std::numeric_limits<float>::infinity()
                     ? 0.0f
                     : Exp(*max - new_max);
    *sum *= step.alpha;
    *max = new_max;
  }
  ExpShifted(s, n, new_max);
  for (int64_t j = 0; j < n; ++j) *sum += s[j];
  return step;
}

}  // namespace

OnlineSoftmax::OnlineSoftmax(int64_t group, int64_t head_dim, float scale)
    : group_(group),
      head_dim_(head_dim),
      scale_(scale),
      max_(group, -std::numeric_limits<float>::infinity()),
      sum_(group, 0.0f),
      acc_(group * head_dim, 0.0f),
      scores_(group * kAttentionChunk),
      weights_(group),
      accs_(group) {}

void OnlineSoftmax::AddChunk(const float* q, const KvRows& k, const KvRows& v,
                             int64_t n) {
  if (n <= 0) return;
  // scores[i][j] = q_i . k_j, canonical dot per element (batch-invariant GEMM).
  const WeightView kw{k.type, RowPtr(k, 0), n, head_dim_, k.stride};
  Gemm(q, group_, head_dim_, kw, scores_.data(), kAttentionChunk, nullptr);
  Fold(v, n);
}

void OnlineSoftmax::AddScores(const float* scores, int64_t stride,
                              const KvRows& v, int64_t n) {
  if (n <= 0) return;
  for (int64_t i = 0; i < group_; ++i) {
    std::copy(scores + i * stride, scores + i * stride + n,
              scores_.data() + i * kAttentionChunk);
  }
  Fold(v, n);
}

void OnlineSoftmax::Fold(const KvRows& v, int64_t n) {
  for (int64_t i = 0; i < group_; ++i) {
    float* s = scores_.data() + i * kAttentionChunk;
    float* acc = acc_.data() + i * head_dim_;
    const SoftmaxStep step = SoftmaxChunk(s, n, scale_, &max_[i], &sum_[i]);
    if (step.rescale) {
      for (int64_t d = 0; d < head_dim_; ++d) acc[d] *= step.alpha;
    }
    if (!fuse_heads_) {
      AccumulateSlice(s, v, n, 0, head_dim_, acc);
      continue;
    }
    weights_[i] = s;
    accs_[i] = acc;
  }
  if (fuse_heads_) {
    AccumulateHeads(group_, weights_.data(), v, n, 0, head_dim_, accs_.data());
  }
}

void OnlineSoftmax::Finish(float* out) const {
  for (int64_t i = 0; i < group_; ++i) {
    const float* acc = acc_.data() + i * head_dim_;
    float* o = out + i * head_dim_;
    if (sum_[i] == 0.0f) {
      std::fill(o, o + head_dim_, 0.0f);
      continue;
    }
    for (int64_t d = 0; d < head_dim_; ++d) o[d] = acc[d] / sum_[i];
  }
}

void AttendRange(const float* q, int64_t group, int64_t head_dim, float scale,
                 const KvRows& k, const KvRows& v, int64_t first, int64_t last,
                 float* out) {
  OnlineSoftmax state(group, head_dim, scale);
  for (int64_t c = first / kAttentionChunk * kAttentionChunk; c <= last;
       c += kAttentionChunk) {
    const int64_t b = std::max(c, first);
    const int64_t e = std::min(c + kAttentionChunk - 1, last);
    PrefetchRows(k, v, head_dim, c + kAttentionChunk, last);
    KvRows kc{k.type, RowPtr(k, b), k.stride};
    KvRows vc{v.type, RowPtr(v, b), v.stride};
    state.AddChunk(q, kc, vc, e - b + 1);
  }
  state.Finish(out);
}

}  // namespace kvd::kernels::cpu

namespace kvd::kernels::cpu {

void AttendCausalBlock(const float* q, int64_t q_stride, int64_t nq,
                       int64_t group, int64_t head_dim, float scale,
                       const KvRows& k, const KvRows& v, int64_t pos0,
                       int64_t window, float* out, int64_t out_stride) {
  if (nq <= 0) return;
  auto first_of = [&](int64_t i) {
    return window > 0 ? std::max<int64_t>(0, pos0 + i - window + 1)
                      : int64_t{0};
  };
  std::vector<OnlineSoftmax> states;
  states.reserve(nq);
  for (int64_t i = 0; i < nq; ++i) {
    states.emplace_back(group, head_dim, scale);
    states.back().set_fuse_heads(nq > 1);
  }
  // Queries packed as (nq * group) rows of head_dim for the score GEMM.
  std::vector<float> qm(nq * group * head_dim);
  for (int64_t i = 0; i < nq; ++i) {
    std::copy(q + i * q_stride, q + i * q_stride + group * head_dim,
              qm.data() + i * group * head_dim);
  }
  std::vector<float> scores(nq * group * kAttentionChunk);
  const int64_t last_pos = pos0 + nq - 1;
  for (int64_t c = first_of(0) / kAttentionChunk * kAttentionChunk;
       c <= last_pos; c += kAttentionChunk) {
    const int64_t c_end = std::min(c + kAttentionChunk - 1, last_pos);
    // Queries that see part of this chunk: pos_i >= c and first_i <= c_end (a
    // contiguous range).
    const int64_t i_begin = std::max<int64_t>(0, c - pos0);
    int64_t i_end = nq;
    while (i_end > i_begin && first_of(i_end - 1) > c_end) --i_end;
    if (i_begin >= i_end) continue;
    PrefetchRows(k, v, head_dim, c + kAttentionChunk, last_pos);
    const WeightView kw{k.type, RowPtr(k, c), c_end - c + 1, head_dim,
                        k.stride};
    Gemm(qm.data() + i_begin * group * head_dim, (i_end - i_begin) * group,
         head_dim, kw, scores.data(), kAttentionChunk, nullptr);
    for (int64_t i = i_begin; i < i_end; ++i) {
      const int64_t b = std::max(c, first_of(i));
      const int64_t e = std::min(c_end, pos0 + i);
      if (b > e) continue;
      const KvRows vc{v.type, RowPtr(v, b), v.stride};
      states[i].AddScores(
          scores.data() + (i - i_begin) * group * kAttentionChunk + (b - c),
          kAttentionChunk, vc, e - b + 1);
    }
  }
  for (int64_t i = 0; i < nq; ++i) states[i].Finish(out + i * out_stride);
}

namespace {

// Scratch of AttendRangeAcrossThreads, kept by the calling thread so that a
// decode step does not fault in fresh pages for every layer.
struct SpreadScratch {
  std::vector<float> weights;    // heads x keys: raw scores, then Exp(s - max)
  std::vector<float> alpha;      // heads x chunks
  std::vector<uint8_t> rescale;  // heads x chunks
  std::vector<float> sum;        // heads
};

// Chunks of keys per score task: enough work to pay for a task, few enough
// that two or more threads share a head's keys evenly.
constexpr int64_t kSpanChunks = 8;

}  // namespace

void AttendRangeAcrossThreads(const float* q, int64_t n_kv_heads, int64_t group,
                              int64_t head_dim, float scale, const KvRows& k,
                              const KvRows& v, int64_t first, int64_t last,
                              float* out, ThreadPool* pool) {
  const int64_t heads = n_kv_heads * group;
  const int64_t c0 = first / kAttentionChunk * kAttentionChunk;
  const int64_t n_chunks = (last - c0) / kAttentionChunk + 1;
  const int64_t n_keys = last - first + 1;
  // Chunk ci covers keys [chunk_begin(ci), chunk_end(ci)], as in AttendRange.
  auto chunk_begin = [&](int64_t ci) {
    return std::max(c0 + ci * kAttentionChunk, first);
  };
  auto chunk_end = [&](int64_t ci) {
    return std::min(c0 + ci * kAttentionChunk + kAttentionChunk - 1, last);
  };
  if (pool == nullptr || last < first) {
    for (int64_t g = 0; g < n_kv_heads; ++g) {
      AttendRange(q + g * group * head_dim, group, head_dim, scale,
                  k.Shifted(g * head_dim), v.Shifted(g * head_dim), first, last,
                  out + g * group * head_dim);
    }
    return;
  }
  // Workers must see the caller's scratch, so it is reached through pointers
  // (naming the thread_local inside a task would give the worker's own).
  thread_local SpreadScratch scratch;
  scratch.weights.resize(heads * n_keys);
  scratch.alpha.resize(heads * n_chunks);
  scratch.rescale.resize(heads * n_chunks);
  scratch.sum.resize(heads);
  float* const weights = scratch.weights.data();
  float* const alphas = scratch.alpha.data();
  uint8_t* const rescales = scratch.rescale.data();
  float* const sums = scratch.sum.data();

  // 1. Raw scores, by spans of chunks of one K/V head: each is the canonical
  // dot whatever the span, so the split cannot change a bit.
  const int64_t spans = (n_chunks + kSpanChunks - 1) / kSpanChunks;
  const int64_t k_row_bytes = head_dim * ElementBytes(k);
  pool->ParallelFor(n_kv_heads * spans, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t g = t / spans;
      const KvRows kg = k.Shifted(g * head_dim);
      const int64_t ci_end = std::min(n_chunks, (t % spans + 1) * kSpanChunks);
      for (int64_t ci = t % spans * kSpanChunks; ci < ci_end; ++ci) {
        const int64_t b = chunk_begin(ci), e = chunk_end(ci);
        if (ci + 1 < n_chunks) {
          PrefetchChunk(kg, 0, k_row_bytes, chunk_begin(ci + 1), last);
        }
        const WeightView kw{k.type, RowPtr(kg, b), e - b + 1, head_dim,
                            k.stride};
        Gemm(q + g * group * head_dim, group, head_dim, kw,
             weights + g * group * n_keys + (b - first), n_keys, nullptr);
      }
    }
  });

  // 2. Per query head, the online softmax's max, sum and weights chunk by
  // chunk, as OnlineSoftmax::Fold computes them.
  pool->ParallelFor(heads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float max = -std::numeric_limits<float>::infinity(), sum = 0.0f;
      for (int64_t ci = 0; ci < n_chunks; ++ci) {
        const int64_t b = chunk_begin(ci), e = chunk_end(ci);
        const SoftmaxStep step = SoftmaxChunk(
            weights + i * n_keys + (b - first), e - b + 1, scale, &max, &sum);
        rescales[i * n_chunks + ci] = step.rescale;
        alphas[i * n_chunks + ci] = step.alpha;
      }
      sums[i] = sum;
    }
  });

  // 3. The weighted values by slices of head_dim: each output element gets
  // the same rescales and FMAs in the same order as in Fold, and each thread
  // reads only its slice of every V row.
  const int64_t slices = std::max<int64_t>(
      1, std::min<int64_t>(pool->num_threads(), head_dim / 16));
  // Slices of whole 64-byte lines: two threads never fetch the same line of
  // a V row (rows start on a line in the cache's blocks).
  const int64_t v_elem = ElementBytes(v);
  const int64_t line = 64 / v_elem;
  const int64_t width =
      ((head_dim + slices - 1) / slices + line - 1) / line * line;
  for (int64_t i = 0; i < heads; ++i) {
    std::fill(out + i * head_dim, out + (i + 1) * head_dim, 0.0f);
  }
  pool->ParallelFor(n_kv_heads * slices, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t g = t / slices;
      const int64_t d0 = t % slices * width;
      const int64_t d1 = std::min(head_dim, d0 + width);
      if (d0 >= d1) continue;
      const KvRows vg = v.Shifted(g * head_dim);
      std::vector<const float*> head_p(group);
      std::vector<float*> head_acc(group);
      for (int64_t ci = 0; ci < n_chunks; ++ci) {
        const int64_t b = chunk_begin(ci), e = chunk_end(ci);
        if (ci + 1 < n_chunks) {
          PrefetchChunk(vg, d0 * v_elem, (d1 - d0) * v_elem,
                        chunk_begin(ci + 1), last);
        }
        const KvRows vc{v.type, RowPtr(vg, b), v.stride};
        for (int64_t i = g * group; i < (g + 1) * group; ++i) {
          float* acc = out + i * head_dim;
          if (rescales[i * n_chunks + ci]) {
            const float alpha = alphas[i * n_chunks + ci];
            for (int64_t d = d0; d < d1; ++d) acc[d] *= alpha;
          }
          head_p[i - g * group] = weights + i * n_keys + (b - first);
          head_acc[i - g * group] = acc;
        }
        AccumulateHeads(group, head_p.data(), vc, e - b + 1, d0, d1,
                        head_acc.data());
      }
      for (int64_t i = g * group; i < (g + 1) * group; ++i) {
        float* o = out + i * head_dim;
        const float sum = sums[i];
        for (int64_t d = d0; d < d1; ++d)
          o[d] = sum == 0.0f ? 0.0f : o[d] / sum;
      }
    }
  });
  // A long context's scratch is not kept past its step.
  if (scratch.weights.capacity() > (size_t{32} << 20) / sizeof(float)) {
    scratch = SpreadScratch();
  }
}

}  // namespace kvd::kernels::cpu
