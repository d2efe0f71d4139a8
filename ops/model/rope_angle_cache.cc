#include "ops/model/rope_angle_cache.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/elementwise.h"

namespace kvd::ops {

struct RopeAngleCache::Table {
  float base;
  int64_t rot_dim;
  int64_t max_positions;            // a multiple of kBlock
  std::unique_ptr<float[]> values;  // max_positions x rot_dim, untouched
                                    // until a block is filled
  std::unique_ptr<std::atomic<bool>[]> ready;  // per block
};

RopeAngleCache::~RopeAngleCache() {
  for (auto& slot : tables_) delete slot.load(std::memory_order_acquire);
}

RopeAngleCache::Table* RopeAngleCache::Find(float base, int64_t rot_dim) {
  for (auto& slot : tables_) {
    Table* t = slot.load(std::memory_order_acquire);
    if (t == nullptr) break;
    if (t->base == base && t->rot_dim == rot_dim) return t;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& slot : tables_) {
    Table* t = slot.load(std::memory_order_acquire);
    if (t != nullptr) {
      if (t->base == base && t->rot_dim == rot_dim) return t;
      continue;
    }
    const int64_t positions = max_bytes_per_base_ /
                              (rot_dim * int64_t{sizeof(float)}) / kBlock *
                              kBlock;
    if (positions <= 0) return nullptr;
    auto* made =
        new Table{base, rot_dim, positions,
                  // Not value-initialized: pages stay untouched.
                  std::unique_ptr<float[]>(new float[positions * rot_dim]),
                  std::make_unique<std::atomic<bool>[]>(positions / kBlock)};
    slot.store(made, std::memory_order_release);
    return made;
  }
  return nullptr;
}

const float* RopeAngleCache::Row(Table& t, int64_t position) {
  const int64_t block = position / kBlock;
  if (!t.ready[block].load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!t.ready[block].load(std::memory_order_relaxed)) {
      const int64_t half = t.rot_dim / 2;
      for (int64_t p = block * kBlock; p < (block + 1) * kBlock; ++p) {
        float* row = t.values.get() + p * t.rot_dim;
        kernels::cpu::RopeAngles(p, t.base, t.rot_dim, row, row + half);
      }
      t.ready[block].store(true, std::memory_order_release);
    }
  }
  return t.values.get() + position * t.rot_dim;
}

void RopeAngleCache::Angles(float base, int64_t rot_dim,
                            const int64_t* positions, int64_t n, float* out) {
  const int64_t half = rot_dim / 2;
  Table* t = Find(base, rot_dim);
  for (int64_t r = 0; r < n; ++r) {
    float* dst = out + r * rot_dim;
    if (t != nullptr && positions[r] >= 0 && positions[r] < t->max_positions) {
      std::memcpy(dst, Row(*t, positions[r]), rot_dim * sizeof(float));
    } else {
      kernels::cpu::RopeAngles(positions[r], base, rot_dim, dst, dst + half);
    }
  }
}

}  // namespace kvd::ops
