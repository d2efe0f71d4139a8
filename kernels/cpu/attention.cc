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

// Asks for the K and V rows of the chunk starting at `first` (up to `last`)
// while the current one is worked on: at depth they come from DRAM, and the
// loads, not the arithmetic, set the pace of decode.
void PrefetchRows(const KvRows& k, const KvRows& v, int64_t head_dim,
                  int64_t first, int64_t last) {
  const int64_t row_bytes = head_dim * (k.type == WeightType::kF32 ? 4 : 2);
  const int64_t end = std::min(first + kAttentionChunk - 1, last);
  for (int64_t r = first; r <= end; ++r) {
    const char* kr = static_cast<const char*>(RowPtr(k, r));
    const char* vr = static_cast<const char*>(RowPtr(v, r));
    for (int64_t b = 0; b < row_bytes; b += 64) {
      __builtin_prefetch(kr + b, 0, 1);
      __builtin_prefetch(vr + b, 0, 1);
    }
  }
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

void AccumulatePV(const float* p, const KvRows& v, int64_t n, int64_t head_dim,
                  float* acc) {
  int64_t d0 = 0;
  for (; d0 + 64 <= head_dim; d0 += 64) AccumulateRows<8>(p, v, n, d0, acc);
  for (; d0 + 8 <= head_dim; d0 += 8) AccumulateRows<1>(p, v, n, d0, acc);
  for (; d0 < head_dim; ++d0) {  // a head_dim that is not a multiple of 8
    for (int64_t j = 0; j < n; ++j) {
      const void* row = RowPtr(v, j);
      const float vd = v.type == WeightType::kF32
                           ? static_cast<const float*>(row)[d0]
                           : Bf16ToFloat(static_cast<const uint16_t*>(row)[d0]);
      acc[d0] = std::fma(p[j], vd, acc[d0]);
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

}  // namespace

OnlineSoftmax::OnlineSoftmax(int64_t group, int64_t head_dim, float scale)
    : group_(group),
      head_dim_(head_dim),
      scale_(scale),
      max_(group, -std::numeric_limits<float>::infinity()),
      sum_(group, 0.0f),
      acc_(group * head_dim, 0.0f),
      scores_(group * kAttentionChunk),
      vrow_(head_dim) {}

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
    float chunk_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      s[j] *= scale_;
      chunk_max = std::max(chunk_max, s[j]);
    }
    const float new_max = std::max(max_[i], chunk_max);
    float* acc = acc_.data() + i * head_dim_;
    if (max_[i] != new_max) {
      const float alpha = max_[i] == -std::numeric_limits<float>::infinity()
                              ? 0.0f
                              : Exp(max_[i] - new_max);
      sum_[i] *= alpha;
      for (int64_t d = 0; d < head_dim_; ++d) acc[d] *= alpha;
      max_[i] = new_max;
    }
    ExpShifted(s, n, new_max);
    for (int64_t j = 0; j < n; ++j) sum_[i] += s[j];
    AccumulatePV(s, v, n, head_dim_, acc);
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
  for (int64_t i = 0; i < nq; ++i) states.emplace_back(group, head_dim, scale);
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

}  // namespace kvd::kernels::cpu
