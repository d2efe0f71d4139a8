// Element-wise and normalisation kernels with fixed, ISA-independent numerics.
//
// Transcendentals (exp, SiLU, GELU-tanh) are kvd's own polynomials written with
// explicit fused multiply-adds, so results depend neither on the libm nor on
// the ISA; the whole package is compiled with -ffp-contract=off so the compiler
// cannot fuse or reorder anything else. The one reduction here (RMSNorm's sum
// of squares) uses the canonical dot product (gemm.h).
//
// Thread-safety: pure functions.
#ifndef KVD_KERNELS_CPU_ELEMENTWISE_H_
#define KVD_KERNELS_CPU_ELEMENTWISE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace kvd::kernels::cpu {

// exp(x) to about 1 ulp over the float range; +inf above 88.72, 0 below
// -87.33, NaN stays NaN. Inline and branch-free so loops over it vectorise;
// every lane performs the same IEEE operations as the scalar code, so
// vectorisation cannot change a bit.
inline float Exp(float x) {
  const float xc = std::min(std::max(x, -87.33f), 88.72f);  // NaN passes
  // x = n * ln2 + r with |r| <= ln2 / 2; ln2 split in two so n * ln2_hi is
  // exact.
  const float n = std::nearbyint(xc * 1.44269504088896341f);
  float r = std::fma(n, -0.693359375f, xc);
  r = std::fma(n, 2.12194440e-4f, r);
  // Minimax polynomial for (exp(r) - 1 - r) / r^2 (Cephes expf coefficients).
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const float e = std::fma(p, r * r, r) + 1.0f;
  // 2^n as two factors so each stays a normal float for n in [-126, 128].
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni / 2;
  const int32_t n2 = ni - n1;
  const uint32_t b1 = static_cast<uint32_t>(n1 + 127) << 23;
  const uint32_t b2 = static_cast<uint32_t>(n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, sizeof(s1));
  std::memcpy(&s2, &b2, sizeof(s2));
  const float y = e * s1 * s2;
  return x > 88.72f ? std::numeric_limits<float>::infinity()
                    : (x < -87.33f ? 0.0f : y);
}
inline float Silu(float x) { return x / (1.0f + Exp(-x)); }
// GELU with the tanh approximation (Gemma's gelu_pytorch_tanh), written as
// 0.5 * x * (1 + tanh(y)) == x / (1 + exp(-2y)): no cancellation for x << 0.
inline float GeluTanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCoef = 0.044715f;
  const float inner = kSqrt2OverPi * (x + kCoef * (x * x * x));
  return x / (1.0f + Exp(-2.0f * inner));
}

// y = x / sqrt(mean(x^2) + eps) * w   (w may be null: no scale). y may alias x.
void RmsNorm(const float* x, const float* w, float eps, int64_t n, float* y);

// out[i] = silu(gate[i]) * up[i]; out may alias either input.
void SiluMul(const float* gate, const float* up, int64_t n, float* out);
// out[i] = gelu_tanh(gate[i]) * up[i].
void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out);

// acc[i] += x[i]
void AddInPlace(float* acc, const float* x, int64_t n);
// x[i] *= s
void Scale(float* x, float s, int64_t n);

// Rotary position embedding on `n_heads` consecutive heads of `head_dim`
// values, rotating the first `rot_dim` dims of each head. cos/sin hold rot_dim
// / 2 values for this position. Interleaved pairs (2i, 2i+1) are GGML's
// "normal" style (llama); half-split pairs (i, i + rot_dim/2) are the "neox"
// style (qwen2, gemma3).
enum class RopeStyle { kInterleaved, kHalfSplit };
void Rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dim,
          const float* cos, const float* sin, RopeStyle style);
// Fills cos/sin (rot_dim / 2 each) for `position`: theta_i = position *
// base^(-2i / rot_dim), computed in double and rounded once, so every process
// and machine gets the same table.
void RopeAngles(int64_t position, float base, int64_t rot_dim, float* cos,
                float* sin);

// bf16 <-> fp32 (round to nearest even; NaN stays NaN).
inline uint16_t FloatToBf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  if ((b & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((b >> 16) | 0x40);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}
inline float Bf16ToFloat(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}
void FloatToBf16(const float* x, uint16_t* y, int64_t n);
void Bf16ToFloat(const uint16_t* x, float* y, int64_t n);
// x[i] = bf16(x[i]) as float: the precision the bf16 mode keeps at layer
// boundaries.
void RoundToBf16(float* x, int64_t n);

}  // namespace kvd::kernels::cpu

#endif  // KVD_KERNELS_CPU_ELEMENTWISE_H_
