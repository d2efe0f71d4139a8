// Canonical chunked attention on the GPU (decode and prefill queries).
//
// Each query head visits its visible keys in chunks of kAttentionChunk = 32
// absolute positions ([0, 32), [32, 64), ...), clipped to the visible range,
// from low to high, folding each chunk into a running (max, sum, accumulator)
// online-softmax state, exactly the order kernels/cpu/attention.h defines.
// One thread block owns one (query, head) pair and nothing else, with a fixed
// block size, so a query's output does not depend on how many queries share
// the launch or where they come from (bit-identical across batch composition).
// K and V are bf16 (the GPU backend's cache dtype); q and out are fp32.
//
//   AttentionArgs a{...};
//   KVD_RETURN_IF_ERROR(Attention(a, stream));
//
// Thread-safety: enqueues one kernel on `stream` and returns; the K/V rows it
// reads must not change until the stream has run it.
#ifndef KVD_KERNELS_CUDA_ATTENTION_H_
#define KVD_KERNELS_CUDA_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"

namespace kvd::kernels::cuda {

inline constexpr int64_t kAttentionChunk = 32;
inline constexpr int64_t kMaxAttentionHeadDim = 256;

struct AttentionArgs {
  // nq queries; query i's head h is q[i * q_stride + h * head_dim + d].
  const float* q = nullptr;
  int64_t nq = 0;
  int64_t q_stride = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads; head h reads kv head h / group
  int64_t head_dim = 0;    // <= kMaxAttentionHeadDim
  float scale = 0.0f;      // scores are (q . k) * scale
  // K/V rows by absolute position p: k[p * kv_stride + kvh * head_dim + d].
  const uint16_t* k = nullptr;  // bf16
  const uint16_t* v = nullptr;  // bf16
  int64_t kv_stride = 0;
  // Device int32[nq]: query i sees keys [max(0, last[i] - window + 1),
  // last[i]] (window 0: all). A negative last[i] means no keys: output 0.
  const int32_t* last = nullptr;
  int64_t window = 0;
  // out[i * out_stride + h * head_dim + d]
  float* out = nullptr;
  int64_t out_stride = 0;
};

// INVALID_ARGUMENT for bad shapes or null pointers, INTERNAL on launch failure.
absl::Status Attention(const AttentionArgs& args, void* stream);

}  // namespace kvd::kernels::cuda

#endif  // KVD_KERNELS_CUDA_ATTENTION_H_
