// GEMM over packed GGML blocks: every output equals, bit for bit, the
// contract's dot product over the rows kernels/quant dequantizes from the
// file's blocks (the fp32 mode's weights), for every block type, ISA, batch
// height, thread count and row-parallel grouping.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/packed_blocks.h"
#include "kernels/cpu/testing/gemm_contract.h"
#include "kernels/quant/dequant.h"
#include "kernels/quant/ggml_type.h"
#include "kernels/quant/half.h"

namespace kvd::kernels::cpu {
namespace {

using testing::ContractDot;
using testing::ContractGrouped;
using testing::ContractPairGrouped;
using testing::IsaGuard;
using testing::RandomVector;
using testing::SameBits;
using testing::SupportedIsas;

// Random bytes are valid blocks for every quant bit; only the fp16 scales
// need to be finite, so they are rewritten with small values of either sign.
std::vector<uint8_t> RandomBlocks(GgmlType type, int64_t rows, int64_t cols,
                                  uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t nb = rows * cols / BlockSize(type);
  const int64_t bytes = BlockBytes(type);
  std::vector<uint8_t> data(nb * bytes);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  auto put = [&](uint8_t* p) {
    const uint16_t h = Fp32ToFp16(scale(rng));
    std::memcpy(p, &h, 2);
  };
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t* b = data.data() + i * bytes;
    switch (type) {
      case GgmlType::kF16:
        put(b);
        break;
      case GgmlType::kQ6_K:
        put(b + 208);
        break;
      case GgmlType::kQ4_0:
      case GgmlType::kQ5_0:
      case GgmlType::kQ8_0:
        put(b);
        break;
      default:  // d and a min or dmin
        put(b);
        put(b + 2);
        break;
    }
  }
  return data;
}

std::vector<float> Dequantized(GgmlType type, const std::vector<uint8_t>& q,
                               int64_t rows, int64_t cols) {
  const int64_t row_bytes = cols / BlockSize(type) * BlockBytes(type);
  std::vector<float> w(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(DequantizeRow(type, q.data() + r * row_bytes, row_bytes,
                              w.data() + r * cols, cols)
                    .ok());
  }
  return w;
}

std::vector<uint8_t> Packed(GgmlType type, const std::vector<uint8_t>& q,
                            int64_t rows, int64_t cols) {
  const int64_t row_bytes = cols / BlockSize(type) * BlockBytes(type);
  std::vector<uint8_t> p(rows * PackedRowBytes(type, cols));
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(PackRow(type, q.data() + r * row_bytes, row_bytes, cols,
                        p.data() + r * PackedRowBytes(type, cols))
                    .ok());
  }
  return p;
}

struct Case {
  GgmlType type;
  int64_t rows;
  int64_t cols;
  int64_t groups;
};

class GemmBlocks : public ::testing::TestWithParam<Case> {};

// round_to_bf16: the weights are the dequantized values rounded to bf16, as
// the loader's bf16 copies hold them; with bf16_pairs too (the bf16 mode),
// the products follow the pair contract.
TEST_P(GemmBlocks, EqualsTheContractOverRowsDequantizedAtLoad) {
  const Case c = GetParam();
  ASSERT_TRUE(IsGemmBlockType(c.type));
  const std::vector<uint8_t> q = RandomBlocks(c.type, c.rows, c.cols, 7);
  const std::vector<uint8_t> packed = Packed(c.type, q, c.rows, c.cols);
  const int64_t k = c.cols;
  enum Mode { kFp32, kBf16Weights, kBf16Pairs };
  for (const Mode mode : {kFp32, kBf16Weights, kBf16Pairs}) {
    const bool bf16 = mode != kFp32;
    std::vector<float> wf = Dequantized(c.type, q, c.rows, c.cols);
    if (bf16) RoundToBf16(wf.data(), wf.size());
    std::vector<uint16_t> wb(wf.size());
    FloatToBf16(wf.data(), wb.data(), wf.size());
    WeightView w{
        WeightType::kGgmlBlocks, packed.data(), c.rows, c.cols, 0, c.type};
    w.round_to_bf16 = bf16;
    w.bf16_pairs = mode == kBf16Pairs;
    // 8 and 13: the in-register path's tiles of 8 (and 4 and 1) rows.
    for (const int64_t m : {1, 2, 3, 4, 5, 8, 13, 37}) {
      const std::vector<float> x = RandomVector(m * k, 11 + m);
      std::vector<float> want(m * c.rows);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < c.rows; ++j)
          want[i * c.rows + j] =
              mode == kBf16Pairs
                  ? ContractPairGrouped(&x[i * k], &wb[j * k], k, c.groups)
              : c.groups == 1
                  ? ContractDot(&x[i * k], &wf[j * k], k)
                  : ContractGrouped(&x[i * k], &wf[j * k], k, c.groups);
      for (Isa isa : SupportedIsas()) {
        IsaGuard guard(isa);
        for (int threads : {1, 2}) {
          SCOPED_TRACE(std::string(GgmlTypeName(c.type)) + " " + IsaName(isa) +
                       (mode == kFp32          ? " fp32"
                        : mode == kBf16Weights ? " bf16 weights"
                                               : " bf16 pairs") +
                       " m=" + std::to_string(m) +
                       " threads=" + std::to_string(threads));
          ThreadPool pool(threads);
          std::vector<float> y(m * c.rows, std::nanf(""));
          GroupedGemm(x.data(), m, k, w, c.groups, y.data(), c.rows, &pool);
          EXPECT_TRUE(SameBits(y, want));
        }
      }
    }
  }
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return std::string(GgmlTypeName(info.param.type)) + "_" +
         std::to_string(info.param.rows) + "x" +
         std::to_string(info.param.cols) + "_g" +
         std::to_string(info.param.groups);
}

INSTANTIATE_TEST_SUITE_P(
    Types, GemmBlocks,
    ::testing::Values(
        // SmolLM2's shapes (W_o and W_down are row-parallel in 3 groups).
        Case{GgmlType::kQ4_1, 37, 576, 1}, Case{GgmlType::kQ4_1, 19, 576, 3},
        Case{GgmlType::kQ4_1, 9, 1536, 3}, Case{GgmlType::kQ8_0, 21, 576, 1},
        Case{GgmlType::kQ4_0, 13, 576, 3}, Case{GgmlType::kQ5_0, 17, 640, 1},
        Case{GgmlType::kQ5_1, 11, 320, 2}, Case{GgmlType::kF16, 7, 592, 1},
        // Whole runs of 32: the bf16 mode's direct path decodes these random
        // halves (subnormals included) with denormals flushed.
        Case{GgmlType::kF16, 5, 640, 1},
        // Gemma 3's K-quants; with 4 groups a slice is half a super-block,
        // which the direct path cannot take.
        Case{GgmlType::kQ4_K, 10, 1024, 1}, Case{GgmlType::kQ4_K, 6, 1024, 4},
        Case{GgmlType::kQ5_K, 9, 512, 2}, Case{GgmlType::kQ6_K, 12, 2048, 1},
        Case{GgmlType::kQ6_K, 5, 768, 3}),
    CaseName);

// GemmShared (one input, several weights: Q/K/V, gate/up) gives each
// output exactly the bits its own Gemm gives, whatever the weights' row
// counts (not multiples of 8 here), block types (Gemma 3's K and V differ),
// precision mode, batch height and thread count; weights that cannot share
// their activations (another type) still get their Gemm's bits.
TEST(GemmShared, EachOutputHasItsGemmsBits) {
  struct Weight {
    GgmlType type;
    int64_t rows;
  };
  const std::vector<std::vector<Weight>> sets = {
      {{GgmlType::kQ4_1, 37}, {GgmlType::kQ4_1, 19}, {GgmlType::kQ4_1, 19}},
      {{GgmlType::kQ4_K, 21}, {GgmlType::kQ6_K, 13}},
      {{GgmlType::kQ8_0, 64}, {GgmlType::kQ4_0, 64}},
  };
  enum Mode { kFp32, kBf16Weights, kBf16Pairs };
  for (const std::vector<Weight>& set : sets) {
    const int64_t k = set[0].type == GgmlType::kQ4_K ? 512 : 576;
    std::vector<std::vector<uint8_t>> packed;
    for (size_t i = 0; i < set.size(); ++i) {
      packed.push_back(Packed(set[i].type,
                              RandomBlocks(set[i].type, set[i].rows, k, 20 + i),
                              set[i].rows, k));
    }
    for (const Mode mode : {kFp32, kBf16Weights, kBf16Pairs}) {
      std::vector<WeightView> views;
      for (size_t i = 0; i < set.size(); ++i) {
        WeightView w{WeightType::kGgmlBlocks,
                     packed[i].data(),
                     set[i].rows,
                     k,
                     0,
                     set[i].type};
        w.round_to_bf16 = mode != kFp32;
        w.bf16_pairs = mode == kBf16Pairs;
        views.push_back(w);
      }
      for (const int64_t m : {1, 4, 5, 8, 37}) {
        const std::vector<float> x = RandomVector(m * k, 31 + m);
        for (Isa isa : SupportedIsas()) {
          IsaGuard guard(isa);
          for (int threads : {1, 2, 3}) {
            SCOPED_TRACE(std::string(GgmlTypeName(set[0].type)) + " " +
                         IsaName(isa) + " mode " + std::to_string(mode) +
                         " m=" + std::to_string(m) +
                         " threads=" + std::to_string(threads));
            ThreadPool pool(threads);
            std::vector<std::vector<float>> want, got;
            for (const WeightView& w : views) {
              want.emplace_back(m * w.rows, std::nanf(""));
              got.emplace_back(m * w.rows, std::nanf(""));
              Gemm(x.data(), m, k, w, want.back().data(), w.rows, &pool);
            }
            if (views.size() == 3) {
              GemmShared(x.data(), m, k,
                         {{views[0], got[0].data(), views[0].rows},
                          {views[1], got[1].data(), views[1].rows},
                          {views[2], got[2].data(), views[2].rows}},
                         &pool);
            } else {
              GemmShared(x.data(), m, k,
                         {{views[0], got[0].data(), views[0].rows},
                          {views[1], got[1].data(), views[1].rows}},
                         &pool);
            }
            for (size_t i = 0; i < views.size(); ++i)
              EXPECT_TRUE(SameBits(got[i], want[i])) << "output " << i;
          }
        }
      }
    }
  }
  // A weight of another type: each Gemm on its own, same bits.
  const std::vector<uint8_t> q =
      Packed(GgmlType::kQ4_1, RandomBlocks(GgmlType::kQ4_1, 9, 576, 3), 9, 576);
  const std::vector<float> dense = RandomVector(11 * 576, 5);
  const WeightView blocks{WeightType::kGgmlBlocks, q.data(), 9, 576, 0,
                          GgmlType::kQ4_1};
  const WeightView fp32{WeightType::kF32, dense.data(), 11, 576, 576};
  const std::vector<float> x = RandomVector(6 * 576, 8);
  ThreadPool pool(2);
  std::vector<float> want_a(6 * 9), want_b(6 * 11), got_a(6 * 9, 1.0f),
      got_b(6 * 11, 1.0f);
  Gemm(x.data(), 6, 576, blocks, want_a.data(), 9, &pool);
  Gemm(x.data(), 6, 576, fp32, want_b.data(), 11, &pool);
  GemmShared(x.data(), 6, 576,
             {{blocks, got_a.data(), 9}, {fp32, got_b.data(), 11}}, &pool);
  EXPECT_TRUE(SameBits(got_a, want_a));
  EXPECT_TRUE(SameBits(got_b, want_b));
}

TEST(GemmBlocksView, StridedRowsAndColumnSlices) {
  // A view over the middle 64 columns of 128-wide Q8_0 rows.
  const int64_t rows = 6, ld = 128, k = 64;
  const std::vector<uint8_t> q = RandomBlocks(GgmlType::kQ8_0, rows, ld, 3);
  const std::vector<float> wf = Dequantized(GgmlType::kQ8_0, q, rows, ld);
  const std::vector<uint8_t> packed = Packed(GgmlType::kQ8_0, q, rows, ld);
  const WeightView w{WeightType::kGgmlBlocks,
                     packed.data() + PackedBlockBytes(GgmlType::kQ8_0),
                     rows,
                     k,
                     ld,
                     GgmlType::kQ8_0};
  EXPECT_EQ(w.row_stride_bytes(), 4 * 36);
  const std::vector<float> x = RandomVector(2 * k, 5);
  for (Isa isa : SupportedIsas()) {
    IsaGuard guard(isa);
    for (const int64_t m : {1, 2}) {
      std::vector<float> y(m * rows);
      Gemm(x.data(), m, k, w, y.data(), rows, nullptr);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < rows; ++j)
          EXPECT_EQ(y[i * rows + j],
                    ContractDot(&x[i * k], &wf[j * ld + 32], k))
              << IsaName(isa) << " m=" << m << " " << i << "," << j;
    }
  }
}

TEST(PackedBlocks, UnpackGivesTheDequantizersBits) {
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                        GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ4_K,
                        GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kF16}) {
    const int64_t k = 1024;
    const std::vector<uint8_t> q = RandomBlocks(type, 3, k, 9);
    const std::vector<float> want = Dequantized(type, q, 3, k);
    const std::vector<uint8_t> packed = Packed(type, q, 3, k);
    ASSERT_EQ(packed.size(), static_cast<size_t>(3 * PackedRowBytes(type, k)));
    std::vector<float> got(3 * k), rounded(3 * k);
    for (int64_t r = 0; r < 3; ++r) {
      UnpackRow(type, packed.data() + r * PackedRowBytes(type, k), k,
                got.data() + r * k);
      UnpackRow(type, packed.data() + r * PackedRowBytes(type, k), k,
                rounded.data() + r * k, /*round_to_bf16=*/true);
    }
    EXPECT_TRUE(SameBits(got, want)) << GgmlTypeName(type);
    std::vector<float> want_rounded = want;
    RoundToBf16(want_rounded.data(), want_rounded.size());
    EXPECT_TRUE(SameBits(rounded, want_rounded)) << GgmlTypeName(type);
  }
}

TEST(PackedBlocks, RefusesWhatItCannotPack) {
  std::vector<uint8_t> src(64), dst(64);
  EXPECT_FALSE(
      PackRow(GgmlType::kQ2_K, src.data(), src.size(), 256, dst.data()).ok());
  EXPECT_FALSE(
      PackRow(GgmlType::kQ4_1, src.data(), src.size(), 48, dst.data()).ok())
      << "not a whole number of blocks";
  EXPECT_FALSE(PackRow(GgmlType::kQ8_0, src.data(), 33, 32, dst.data()).ok())
      << "short source";
}

}  // namespace
}  // namespace kvd::kernels::cpu
