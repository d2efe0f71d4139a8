// Checks DequantizeRow bit-exactly against values computed by the Python `gguf`
// package (tools/reference/make_dequant_golden.py ->
// tests/golden/dequant/dequant_golden.json).
#include "kernels/quant/dequant.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/quant/ggml_type.h"
#include "nlohmann/json.hpp"

namespace kvd::kernels {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> FromHex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] =
        static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

nlohmann::json LoadGolden() {
  std::ifstream in("tests/golden/dequant/dequant_golden.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

TEST(DequantTest, MatchesPythonGgufBitExactly) {
  const nlohmann::json golden = LoadGolden();
  ASSERT_TRUE(golden.contains("cases"));
  std::vector<std::string> seen;
  for (const auto& c : golden["cases"]) {
    const std::string name = c["type"];
    SCOPED_TRACE(name);
    seen.push_back(name);
    absl::StatusOr<GgmlType> type =
        GgmlTypeFromId(c["type_id"].get<uint32_t>());
    ASSERT_TRUE(type.ok()) << type.status();
    EXPECT_EQ(GgmlTypeName(*type), name);
    const int64_t n = c["n"];
    const std::vector<uint8_t> src = FromHex(c["src_hex"]);
    const std::vector<uint8_t> want_bytes = FromHex(c["expected_f32_hex"]);
    ASSERT_EQ(want_bytes.size(), static_cast<size_t>(n) * 4);
    ASSERT_EQ(src.size(), *RowBytes(*type, n));

    // Run at an odd address so unaligned block reads are exercised too.
    std::vector<uint8_t> shifted(src.size() + 1);
    std::memcpy(shifted.data() + 1, src.data(), src.size());
    std::vector<float> got(n, -12345.0f);
    ASSERT_TRUE(
        DequantizeRow(*type, shifted.data() + 1, src.size(), got.data(), n)
            .ok());
    int mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      uint32_t want;
      std::memcpy(&want, want_bytes.data() + 4 * i, 4);
      if (Bits(got[i]) != want && ++mismatches <= 5) {
        ADD_FAILURE() << name << " element " << i << ": got bits 0x" << std::hex
                      << Bits(got[i]) << " (" << got[i] << "), want 0x" << want;
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
  EXPECT_THAT(seen, ::testing::UnorderedElementsAre(
                        "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                        "Q8_0", "Q4_K", "Q5_K", "Q6_K"));
}

TEST(DequantTest, RejectsShortSource) {
  std::vector<uint8_t> src(18 * 2 - 1);
  std::vector<float> dst(64, 7.0f);
  absl::Status s =
      DequantizeRow(GgmlType::kQ4_0, src.data(), src.size(), dst.data(), 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("needs 36 bytes but only 35"));
  EXPECT_EQ(dst[0], 7.0f);  // untouched on error
}

TEST(DequantTest, RejectsPartialBlock) {
  std::vector<uint8_t> src(1000);
  std::vector<float> dst(300);
  absl::Status s =
      DequantizeRow(GgmlType::kQ4_K, src.data(), src.size(), dst.data(), 300);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("not a multiple of the Q4_K block size 256"));
  s = DequantizeRow(GgmlType::kF32, src.data(), src.size(), dst.data(), -1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(DequantTest, UnsupportedTypeIsUnimplemented) {
  std::vector<uint8_t> src(1000);
  std::vector<float> dst(256);
  absl::Status s = DequantizeRow(GgmlType::kIQ2_XXS, src.data(), src.size(),
                                 dst.data(), 256);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("IQ2_XXS"));
  s = DequantizeRow(static_cast<GgmlType>(4), src.data(), src.size(),
                    dst.data(), 32);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
}

TEST(DequantTest, EmptyRowIsFine) {
  float dst = 3.0f;
  EXPECT_TRUE(DequantizeRow(GgmlType::kQ8_0, nullptr, 0, &dst, 0).ok());
  EXPECT_EQ(dst, 3.0f);
}

}  // namespace
}  // namespace kvd::kernels
