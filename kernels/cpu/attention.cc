#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/elementwise.h"

namespace kvd::kernels::cpu {
namespace {

const void* RowPtr(const KvRows& rows, int64_t r) {
  const size_t elem = rows.type == WeightType::kBf16 ? 2 : 4;
  return static_cast<const char*>(rows.data) + r * rows.stride * elem;
}

}  // namespace

OnlineSoftmax::OnlineSoftmax(int64_t group, int64_t head_dim, float scale)
    : group_(group),
      head_dim_(head_dim),
      scale_(scale),
      max_(group, -std::numeric_limits<float>::infinity()),
      sum_(group, 0.0f),
      acc_(group * head_dim, 0.0f),
      scores_(group * kAttentionChunk) {}

void OnlineSoftmax::AddChunk(const float* q, const KvRows& k, const KvRows& v,
                             int64_t n) {
  if (n <= 0) return;
  // scores[i][j] = q_i . k_j, canonical dot per element (batch-invariant GEMM).
  const WeightView kw{k.type, k.data, n, head_dim_, k.stride};
  Gemm(q, group_, head_dim_, kw, scores_.data(), kAttentionChunk, nullptr);
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
    for (int64_t j = 0; j < n; ++j) {
      const float p = Exp(s[j] - new_max);
      sum_[i] += p;
      if (v.type == WeightType::kF32) {
        const float* vr = static_cast<const float*>(RowPtr(v, j));
        for (int64_t d = 0; d < head_dim_; ++d)
          acc[d] = std::fma(p, vr[d], acc[d]);
      } else {
        const uint16_t* vr = static_cast<const uint16_t*>(RowPtr(v, j));
        for (int64_t d = 0; d < head_dim_; ++d)
          acc[d] = std::fma(p, Bf16ToFloat(vr[d]), acc[d]);
      }
    }
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
    KvRows kc{k.type, RowPtr(k, b), k.stride};
    KvRows vc{v.type, RowPtr(v, b), v.stride};
    state.AddChunk(q, kc, vc, e - b + 1);
  }
  state.Finish(out);
}

}  // namespace kvd::kernels::cpu
