// RoPE's cos and sin per position, computed once per (base, position) and
// kept. kernels::cpu::RopeAngles takes two double-precision sincos per pair of
// dimensions, and a KV-Direct rebuild recomputes K for the same positions at
// every layer, so it paid them once per layer: about 7% of a 32-row K/V
// recompute of SmolLM2 (docs/BENCHMARKS.md, "Issue 18: where each bar
// stands"). The kept values are RopeAngles's own, so the bits cannot differ.
//
//   RopeAngleCache cache;
//   cache.Angles(config.layers[l].rope_base, config.rope_dim, positions, n,
//                angles);  // n x rope_dim: rope_dim / 2 cos, then sin
//
// Positions below a per-base cap (max_bytes_per_base of floats) are kept, in
// blocks filled on first use; later positions are computed on each call.
// Only touched blocks take memory (at most 2 MiB for SmolLM2's 8k context).
//
// Thread-safety: Angles may be called concurrently.
#ifndef KVD_OPS_MODEL_ROPE_ANGLE_CACHE_H_
#define KVD_OPS_MODEL_ROPE_ANGLE_CACHE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

namespace kvd::ops {

class RopeAngleCache {
 public:
  explicit RopeAngleCache(int64_t max_bytes_per_base = int64_t{4} << 20)
      : max_bytes_per_base_(max_bytes_per_base) {}
  ~RopeAngleCache();

  // For each of the n positions, rot_dim / 2 cos then rot_dim / 2 sin
  // values into out (n x rot_dim floats; rot_dim even): RopeAngles's bits.
  void Angles(float base, int64_t rot_dim, const int64_t* positions, int64_t n,
              float* out);

  RopeAngleCache(const RopeAngleCache&) = delete;
  RopeAngleCache& operator=(const RopeAngleCache&) = delete;

 private:
  static constexpr int64_t kBlock = 64;  // positions filled together
  struct Table;
  // The table of (base, rot_dim), made on first use; null if every slot is
  // taken by other bases (then the caller computes).
  Table* Find(float base, int64_t rot_dim);
  // The angles of `position` in `t`, filling its block first if needed.
  const float* Row(Table& t, int64_t position);

  const int64_t max_bytes_per_base_;
  std::mutex mu_;  // makes tables and fills blocks
  std::array<std::atomic<Table*>, 4> tables_{};
};

}  // namespace kvd::ops

#endif  // KVD_OPS_MODEL_ROPE_ANGLE_CACHE_H_
