#include "kernels/cpu/elementwise.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/internal/exp_avx2.h"

namespace kvd::kernels::cpu {
void RmsNorm(const float* x, const float* w, float eps, int64_t n, float* y) {
  const float sum_sq = Dot(x, x, n);
  const float scale = 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps);
  if (w == nullptr) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale;
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
  }
}

// The vector loops below do, per lane, exactly what Silu / GeluTanh do
// (internal/exp_avx2.h), so results do not depend on n or alignment.
void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    // -x is a sign flip (not 0 - x, which differs for +0 and NaN).
    const __m256 e = internal::Exp8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = Silu(gate[i]) * up[i];
}

void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i);
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    const __m256 inner = _mm256_mul_ps(
        _mm256_set1_ps(0.7978845608028654f),
        _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(0.044715f), cube)));
    const __m256 e =
        internal::Exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), inner));
    const __m256 gelu = _mm256_div_ps(x, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = GeluTanh(gate[i]) * up[i];
}

void AddInPlace(float* acc, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

void Scale(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void Rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dim,
          const float* cos, const float* sin, RopeStyle style) {
  const int64_t half = rot_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = style == RopeStyle::kInterleaved ? 2 * i : i;
      const int64_t b = style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
      const float x0 = v[a];
      const float x1 = v[b];
      v[a] = x0 * cos[i] - x1 * sin[i];
      v[b] = x0 * sin[i] + x1 * cos[i];
    }
  }
}

void RopeAngles(int64_t position, float base, int64_t rot_dim, float* cos,
                float* sin) {
  // base^(-2i / rot_dim) depends on the model only, and a row's angles are
  // computed for many positions in a row: keep the last model's frequencies
  // (the same doubles, so the same bits).
  thread_local float freq_base = 0.0f;
  thread_local std::vector<double> inv_freq;
  if (freq_base != base ||
      static_cast<int64_t>(inv_freq.size()) != rot_dim / 2) {
    inv_freq.resize(rot_dim / 2);
    for (int64_t i = 0; i < rot_dim / 2; ++i)
      inv_freq[i] = std::pow(static_cast<double>(base),
                             -2.0 * static_cast<double>(i) / rot_dim);
    freq_base = base;
  }
  for (int64_t i = 0; i < rot_dim / 2; ++i) {
    const double theta = static_cast<double>(position) * inv_freq[i];
    cos[i] = static_cast<float>(std::cos(theta));
    sin[i] = static_cast<float>(std::sin(theta));
  }
}

void FloatToBf16(const float* x, uint16_t* y, int64_t n) {
  // The scalar rule without its branch, so the loop vectorizes.
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, &x[i], sizeof(b));
    const uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    const uint32_t quiet = (b >> 16) | 0x40u;
    y[i] = static_cast<uint16_t>((b & 0x7fffffffu) > 0x7f800000u ? quiet
                                                                 : rounded);
  }
}

void Bf16ToFloat(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Bf16ToFloat(x[i]);
}

void RoundToBf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = Bf16ToFloat(FloatToBf16(x[i]));
}

}  // namespace kvd::kernels::cpu
