// A small deterministic pseudo-random generator for sampling: xoshiro256**
// (Blackman & Vigna), seeded from one 64-bit seed through splitmix64, as the
// authors recommend.
//
// kvd implements it itself rather than using <random> distributions, whose
// output differs between standard libraries: the same seed must give the same
// tokens on every platform and build. The four-word state can be saved and
// restored so a seeded session resumes its random stream exactly.
//
// Thread-safety: not thread-safe; one generator per request.
//
//   Rng rng(/*seed=*/42);
//   double u = rng.NextDouble();  // uniform in [0, 1)
#ifndef KVD_OPS_SAMPLER_RNG_H_
#define KVD_OPS_SAMPLER_RNG_H_

#include <array>
#include <cstdint>

namespace kvd::ops {

// splitmix64: advances *state and returns the next output.
inline uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class Rng {
 public:
  using State = std::array<uint64_t, 4>;

  explicit Rng(uint64_t seed) {
    uint64_t sm = seed;
    for (uint64_t& word : s_) word = SplitMix64(&sm);
  }

  // The next 64 random bits (xoshiro256**).
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits: every value is a multiple of 2^-53.
  double NextDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

  const State& state() const { return s_; }
  // Restores a state from state(). An all-zero state is a fixed point of
  // xoshiro; it cannot come from the seeding above, and callers restoring
  // untrusted state should reject it.
  void set_state(const State& s) { s_ = s; }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  State s_;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_SAMPLER_RNG_H_
