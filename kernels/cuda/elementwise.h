// RMSNorm, RoPE and gated activations on the GPU, with batch-invariant
// numerics: each row (token) is processed by a fixed set of threads in a fixed
// order, whatever the number of rows; transcendentals use kvd's own polynomial
// exp (the same Cephes-style one as kernels/cpu/elementwise.h), so they do not
// depend on the CUDA math library version.
//
//   KVD_RETURN_IF_ERROR(RmsNorm(x, d_model, w, 1e-5f, tokens, y, d_model,
//                               stream));
//
// Thread-safety: each call enqueues one kernel on `stream` (nullptr: the
// legacy default stream) and returns; pointers are device memory the caller
// keeps alive until the stream has run it. Argument errors (INVALID_ARGUMENT)
// are reported before any launch; launch failures are INTERNAL.
#ifndef KVD_KERNELS_CUDA_ELEMENTWISE_H_
#define KVD_KERNELS_CUDA_ELEMENTWISE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace kvd::kernels::cuda {

// For each of `rows` rows: y = x / sqrt(mean(x^2) + eps) * w (w may be null).
// The sum of squares is reduced by 256 threads in a fixed order: thread t sums
// x[t], x[t + 256], ... with FMA, then a fixed butterfly over lanes and warps.
// y may alias x (same ld).
absl::Status RmsNorm(const float* x, int64_t ldx, const float* w, float eps,
                     int64_t rows, int64_t n, float* y, int64_t ldy,
                     void* stream);

// out[r][i] = act(gate[r][i]) * up[r][i] for `rows` rows of n values.
enum class GatedAct { kSilu, kGeluTanh };
absl::Status GatedActivation(GatedAct act, const float* gate, int64_t ld_gate,
                             const float* up, int64_t ld_up, int64_t rows,
                             int64_t n, float* out, int64_t ld_out,
                             void* stream);

// Rotary embedding in place on `rows` tokens, each holding n_heads heads of
// head_dim values at x + r * ldx; the first rot_dim dims of each head rotate by
// theta_i = positions[r] * base^(-2i / rot_dim), computed in double and
// rounded once (as kernels/cpu RopeAngles). positions: device int32[rows].
enum class RopeStyle { kInterleaved, kHalfSplit };
absl::Status Rope(float* x, int64_t ldx, int64_t rows, int64_t n_heads,
                  int64_t head_dim, int64_t rot_dim, const int32_t* positions,
                  float base, RopeStyle style, void* stream);

}  // namespace kvd::kernels::cuda

#endif  // KVD_KERNELS_CUDA_ELEMENTWISE_H_
