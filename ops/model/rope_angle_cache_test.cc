// RopeAngleCache gives RopeAngles's bits for every position, kept or not,
// for several bases at once (more than it has table slots), and from
// several threads at once.
#include "ops/model/rope_angle_cache.h"

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/elementwise.h"

namespace kvd::ops {
namespace {

std::vector<float> Direct(float base, int64_t rot_dim,
                          const std::vector<int64_t>& positions) {
  std::vector<float> out(positions.size() * rot_dim);
  for (size_t r = 0; r < positions.size(); ++r) {
    float* row = out.data() + r * rot_dim;
    kernels::cpu::RopeAngles(positions[r], base, rot_dim, row,
                             row + rot_dim / 2);
  }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(RopeAngleCache, EveryPositionHasRopeAnglesBits) {
  // 128 positions kept for rot_dim 64 (two blocks), fewer for wider rows.
  RopeAngleCache cache(/*max_bytes_per_base=*/128 * 64 * 4);
  std::mt19937 rng(3);
  const float bases[] = {10000.0f, 1e6f, 500000.0f, 10000.0f, 1234.5f, 77.0f};
  const int64_t dims[] = {64, 256, 32, 64, 64, 128};
  for (int round = 0; round < 3; ++round) {
    for (size_t b = 0; b < std::size(bases); ++b) {
      std::vector<int64_t> positions;
      for (int i = 0; i < 200; ++i) positions.push_back(rng() % 8192);
      for (int64_t p : {0, 63, 64, 127, 128, 8191}) positions.push_back(p);
      std::vector<float> got(positions.size() * dims[b], -1.0f);
      cache.Angles(bases[b], dims[b], positions.data(), positions.size(),
                   got.data());
      EXPECT_TRUE(SameBits(got, Direct(bases[b], dims[b], positions)))
          << "base " << bases[b] << " rot_dim " << dims[b] << " round "
          << round;
    }
  }
}

TEST(RopeAngleCache, ThreadsFillingTheSameBlocksAgree) {
  RopeAngleCache cache;
  std::vector<int64_t> positions(4096);
  for (int64_t i = 0; i < 4096; ++i) positions[i] = (i * 37) % 4096;
  const std::vector<float> want = Direct(10000.0f, 64, positions);
  std::vector<std::vector<float>> got(4,
                                      std::vector<float>(want.size(), -1.0f));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      cache.Angles(10000.0f, 64, positions.data(), positions.size(),
                   got[t].data());
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(SameBits(got[t], want)) << t;
}

}  // namespace
}  // namespace kvd::ops
