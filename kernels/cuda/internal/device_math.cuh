// kvd's own exp, SiLU and GELU-tanh for device code: the same polynomial and
// operation order as kernels/cpu/elementwise.h, written with explicit fmaf and
// IEEE-rounded (_rn) operations so nvcc's FMA contraction cannot change them.
#ifndef KVD_KERNELS_CUDA_INTERNAL_DEVICE_MATH_CUH_
#define KVD_KERNELS_CUDA_INTERNAL_DEVICE_MATH_CUH_

#include <cstdint>

namespace kvd::kernels::cuda::internal {

__device__ inline float Exp(float x) {
  const float xc = fminf(fmaxf(x, -87.33f), 88.72f);
  const float n = rintf(__fmul_rn(xc, 1.44269504088896341f));
  float r = fmaf(n, -0.693359375f, xc);
  r = fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  const float e = __fadd_rn(fmaf(p, __fmul_rn(r, r), r), 1.0f);
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni / 2;
  const int32_t n2 = ni - n1;
  const float s1 = __uint_as_float(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = __uint_as_float(static_cast<uint32_t>(n2 + 127) << 23);
  const float y = __fmul_rn(__fmul_rn(e, s1), s2);
  if (x != x) return x;  // NaN stays NaN (fminf/fmaxf would drop it)
  return x > 88.72f ? __int_as_float(0x7f800000) : (x < -87.33f ? 0.0f : y);
}

__device__ inline float Silu(float x) {
  return __fdiv_rn(x, __fadd_rn(1.0f, Exp(-x)));
}

__device__ inline float GeluTanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCoef = 0.044715f;
  const float cube = __fmul_rn(__fmul_rn(x, x), x);
  const float inner =
      __fmul_rn(kSqrt2OverPi, __fadd_rn(x, __fmul_rn(kCoef, cube)));
  return __fdiv_rn(x, __fadd_rn(1.0f, Exp(__fmul_rn(-2.0f, inner))));
}

}  // namespace kvd::kernels::cuda::internal

#endif  // KVD_KERNELS_CUDA_INTERNAL_DEVICE_MATH_CUH_
