// Portable reference implementation of the canonical GEMM: 16 lanes as a plain
// array.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/internal/gemm_isa.h"
#include "kernels/cpu/internal/gemm_pairs.h"
#include "kernels/cpu/internal/gemm_tile.h"
#include "kernels/cpu/packed_blocks.h"

namespace kvd::kernels::cpu::internal {
namespace {

struct ScalarOps {
  struct V {
    float l[kLanes];
  };
  static V Zero() {
    V v;
    for (int r = 0; r < kLanes; ++r) v.l[r] = 0.0f;
    return v;
  }
  static V Load(const float* p) {
    V v;
    std::memcpy(v.l, p, sizeof(v.l));
    return v;
  }
  static V Load(const uint16_t* p) {
    V v;
    for (int r = 0; r < kLanes; ++r) {
      const uint32_t bits = static_cast<uint32_t>(p[r]) << 16;
      std::memcpy(&v.l[r], &bits, sizeof(float));
    }
    return v;
  }
  static V Fma(const V& a, const V& b, const V& c) {
    V v;
    for (int r = 0; r < kLanes; ++r) v.l[r] = std::fma(a.l[r], b.l[r], c.l[r]);
    return v;
  }
  static void SplitPairs(const uint16_t* p, V* odd, V* even) {
    for (int r = 0; r < kLanes; ++r) {
      const uint32_t o = static_cast<uint32_t>(p[2 * r + 1]) << 16;
      const uint32_t e = static_cast<uint32_t>(p[2 * r]) << 16;
      std::memcpy(&odd->l[r], &o, sizeof(float));
      std::memcpy(&even->l[r], &e, sizeof(float));
    }
  }
  static float Reduce(const V& v) {
    float s[8], t[4], u[2];
    for (int i = 0; i < 8; ++i) s[i] = v.l[i] + v.l[i + 8];
    for (int i = 0; i < 4; ++i) t[i] = s[i] + s[i + 4];
    for (int i = 0; i < 2; ++i) u[i] = t[i] + t[i + 2];
    return u[0] + u[1];
  }
};

}  // namespace

void GemmF32Scalar(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  GemmRange<ScalarOps, float, 2, 2, 4>(a, n_begin, n_end);
}

void GemmBf16Scalar(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  GemmRange<ScalarOps, uint16_t, 2, 2, 4>(a, n_begin, n_end);
}

// The plain form of GGML blocks: each packed weight row unpacked by the
// scalar code of packed_blocks.cc, then the fp32 tiles.
void GemmBlocksScalar(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  constexpr int64_t kRows = 16;
  std::vector<float> rows(kRows * a.k);
  const auto* w = static_cast<const uint8_t*>(a.w);
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kRows) {
    const int64_t count = n_end - n0 < kRows ? n_end - n0 : kRows;
    for (int64_t r = 0; r < count; ++r)
      UnpackRow(a.blocks, w + (n0 + r) * a.ldw, a.k, rows.data() + r * a.k,
                a.round_bf16);
    GemmArgs f = a;
    f.w = rows.data();
    f.ldw = a.k;
    f.y = a.y + n0;
    GemmRange<ScalarOps, float, 2, 2, 4>(f, 0, count);
  }
}

void GemmPairsScalar(const GemmArgs& a, int64_t n_begin, int64_t n_end) {
  FlushDenormals flush;
  PairRange<EmulatedPairs<ScalarOps>, 2, 2, 4>(a, n_begin, n_end);
}

void DecodeBlocksBf16Scalar(const GemmArgs& a, int64_t n0, int64_t rows,
                            uint16_t* out) {
  std::vector<float> row(a.k);
  const auto* w = static_cast<const uint8_t*>(a.w);
  for (int64_t r = 0; r < rows; ++r) {
    UnpackRow(a.blocks, w + (n0 + r) * a.ldw, a.k, row.data(),
              /*round_to_bf16=*/true);
    ExactBf16(row.data(), out + r * a.k, a.k);
  }
}

}  // namespace kvd::kernels::cpu::internal
