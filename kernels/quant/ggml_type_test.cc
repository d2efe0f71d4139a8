#include "kernels/quant/ggml_type.h"

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::kernels {
namespace {

using ::testing::HasSubstr;

// Expected geometry copied from gguf-py 0.19.0 GGML_QUANT_SIZES (the Python
// reference), not from ggml_type.cc.
TEST(GgmlTypeTest, GeometryMatchesGgufPy) {
  struct Row {
    uint32_t id;
    const char* name;
    int64_t block_size;
    int64_t block_bytes;
  };
  const Row rows[] = {
      {0, "F32", 1, 4},         {1, "F16", 1, 2},
      {2, "Q4_0", 32, 18},      {3, "Q4_1", 32, 20},
      {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
      {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 40},
      {10, "Q2_K", 256, 84},    {11, "Q3_K", 256, 110},
      {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
      {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},
      {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74},
      {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
      {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},
      {22, "IQ2_S", 256, 82},   {23, "IQ4_XS", 256, 136},
      {24, "I8", 1, 1},         {25, "I16", 1, 2},
      {26, "I32", 1, 4},        {27, "I64", 1, 8},
      {28, "F64", 1, 8},        {29, "IQ1_M", 256, 56},
      {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
      {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
      {40, "NVFP4", 64, 36},    {41, "Q1_0", 128, 18},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    absl::StatusOr<GgmlType> t = GgmlTypeFromId(r.id);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(GgmlTypeName(*t), r.name);
    EXPECT_EQ(BlockSize(*t), r.block_size);
    EXPECT_EQ(BlockBytes(*t), r.block_bytes);
    EXPECT_EQ(*GgmlTypeFromName(r.name), *t);
  }
}

TEST(GgmlTypeTest, RetiredAndUnknownIdsAreRejected) {
  for (uint32_t id :
       {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 42u, 1000u, 0xffffffffu}) {
    EXPECT_FALSE(IsKnownGgmlType(id)) << id;
    absl::StatusOr<GgmlType> t = GgmlTypeFromId(id);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(GgmlTypeFromId(99).status().message(),
              HasSubstr("unknown GGML tensor type id 99"));
  EXPECT_EQ(GgmlTypeName(static_cast<GgmlType>(99)), "unknown");
  EXPECT_EQ(BlockSize(static_cast<GgmlType>(99)), 0);
  EXPECT_FALSE(GgmlTypeFromName("Q4_2").ok());
}

TEST(GgmlTypeTest, RowBytes) {
  EXPECT_EQ(*RowBytes(GgmlType::kF32, 576), 2304u);
  EXPECT_EQ(*RowBytes(GgmlType::kQ4_1, 576), 18u * 20u);
  EXPECT_EQ(*RowBytes(GgmlType::kQ6_K, 640 * 4), 10u * 210u);
  EXPECT_EQ(*RowBytes(GgmlType::kQ8_0, 0), 0u);
  EXPECT_THAT(RowBytes(GgmlType::kQ8_0, 33).status().message(),
              HasSubstr("not a multiple of the Q8_0 block size 32"));
  EXPECT_EQ(RowBytes(GgmlType::kF32, -4).status().code(),
            absl::StatusCode::kInvalidArgument);
  // int64 max elements of F32 need 2^65 bytes: must not wrap.
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(RowBytes(GgmlType::kF32, max).status().message(),
              HasSubstr("more than 2^64"));
  EXPECT_TRUE(RowBytes(GgmlType::kI8, max).ok());
  EXPECT_EQ(RowBytes(static_cast<GgmlType>(5), 32).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GgmlTypeTest, DequantizeSupport) {
  for (GgmlType t :
       {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ4_0,
        GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
        GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    EXPECT_TRUE(IsDequantizeSupported(t)) << GgmlTypeName(t);
  }
  for (GgmlType t :
       {GgmlType::kQ8_1, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kIQ4_NL,
        GgmlType::kI32, static_cast<GgmlType>(77)}) {
    EXPECT_FALSE(IsDequantizeSupported(t)) << GgmlTypeName(t);
  }
}

}  // namespace
}  // namespace kvd::kernels
