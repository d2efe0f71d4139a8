// Runs without a GPU (CI): the per-element dequantization that the CUDA
// kernel runs (internal/dequant_element.h), compiled for the host, equals the
// CPU dequantizer (kernels/quant/dequant.h, itself checked against the Python
// gguf package's golden values) followed by the CPU backend's bf16 rounding,
// bit for bit: on unconstrained random blocks of every supported type (NaN
// and inf scales included: on one machine NaN arithmetic is deterministic),
// and on real model tensors when $KVD_DEQUANT_FIXTURE names a fixture from
// tools/gpu/make_dequant_fixture.py. This checks the indexing and operation
// order of the device code; dequant_test checks the device arithmetic.
#include "kernels/cuda/internal/dequant_element.h"

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/internal/dequant_fixture.h"
#include "kernels/quant/dequant.h"
#include "kernels/quant/ggml_type.h"

namespace kvd::kernels::cuda {
namespace {

namespace dq = internal::dequant;

// The kernel's dispatch, on the host.
uint16_t Element(GgmlType type, const uint8_t* block, int j) {
  switch (static_cast<uint32_t>(type)) {
    case dq::kF32:
      return dq::ElementBf16<dq::kF32>(block, j);
    case dq::kF16:
      return dq::ElementBf16<dq::kF16>(block, j);
    case dq::kBF16:
      return dq::ElementBf16<dq::kBF16>(block, j);
    case dq::kQ4_0:
      return dq::ElementBf16<dq::kQ4_0>(block, j);
    case dq::kQ4_1:
      return dq::ElementBf16<dq::kQ4_1>(block, j);
    case dq::kQ5_0:
      return dq::ElementBf16<dq::kQ5_0>(block, j);
    case dq::kQ5_1:
      return dq::ElementBf16<dq::kQ5_1>(block, j);
    case dq::kQ8_0:
      return dq::ElementBf16<dq::kQ8_0>(block, j);
    case dq::kQ4_K:
      return dq::ElementBf16<dq::kQ4_K>(block, j);
    case dq::kQ5_K:
      return dq::ElementBf16<dq::kQ5_K>(block, j);
    case dq::kQ6_K:
      return dq::ElementBf16<dq::kQ6_K>(block, j);
  }
  ADD_FAILURE() << "no element function for type "
                << static_cast<uint32_t>(type);
  return 0;
}

// Mismatching elements of `rows` rows of `cols` elements.
int64_t Mismatches(GgmlType type, const std::vector<uint8_t>& bytes,
                   int64_t rows, int64_t cols, const std::string& what) {
  const int64_t row_bytes = static_cast<int64_t>(bytes.size()) / rows;
  const int be = dq::BlockElems(static_cast<uint32_t>(type));
  const int bb = dq::BlockBytes(static_cast<uint32_t>(type));
  std::vector<float> ref(cols);
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = bytes.data() + r * row_bytes;
    const absl::Status s =
        DequantizeRow(type, row, row_bytes, ref.data(), cols);
    EXPECT_TRUE(s.ok()) << what << ": " << s;
    for (int64_t c = 0; c < cols; ++c) {
      const uint16_t got =
          Element(type, row + (c / be) * bb, static_cast<int>(c % be));
      const uint16_t want = kernels::cpu::FloatToBf16(ref[c]);
      if (got != want && bad++ < 5) {
        ADD_FAILURE() << what << ": row " << r << " col " << c << ": 0x"
                      << std::hex << got << " != 0x" << want;
      }
    }
  }
  return bad;
}

TEST(DequantElement, GeometryMatchesGgml) {
  for (uint32_t id = 0; id < 64; ++id) {
    if (!IsKnownGgmlType(id)) continue;
    const GgmlType t = static_cast<GgmlType>(id);
    if (!IsDequantizeSupported(t)) {
      EXPECT_EQ(dq::BlockElems(id), 0) << GgmlTypeName(t);
      continue;
    }
    EXPECT_EQ(dq::BlockElems(id), BlockSize(t)) << GgmlTypeName(t);
    EXPECT_EQ(dq::BlockBytes(id), BlockBytes(t)) << GgmlTypeName(t);
  }
}

TEST(DequantElement, RandomBlocksMatchCpuBitForBit) {
  const char* env = std::getenv("KVD_TEST_SEED");
  const uint64_t seed =
      env != nullptr ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::printf("[ seed ] KVD_TEST_SEED=%llu\n",
              static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (uint32_t id :
       {dq::kF32, dq::kF16, dq::kBF16, dq::kQ4_0, dq::kQ4_1, dq::kQ5_0,
        dq::kQ5_1, dq::kQ8_0, dq::kQ4_K, dq::kQ5_K, dq::kQ6_K}) {
    const GgmlType type = static_cast<GgmlType>(id);
    const int64_t bs = BlockSize(type);
    const int64_t cols = bs == 1 ? 333 : bs * 5, rows = 23;
    std::vector<uint8_t> bytes(rows * *RowBytes(type, cols));
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    EXPECT_EQ(
        Mismatches(type, bytes, rows, cols, std::string(GgmlTypeName(type))),
        0);
  }
}

TEST(DequantElement, RealModelTensorsMatchCpuBitForBit) {
  const char* path = std::getenv("KVD_DEQUANT_FIXTURE");
  if (path == nullptr || *path == 0) {
    GTEST_SKIP() << "set KVD_DEQUANT_FIXTURE to a file made by "
                    "tools/gpu/make_dequant_fixture.py";
  }
  const std::vector<testing::FixtureTensor> tensors =
      testing::ReadDequantFixture(path);
  ASSERT_FALSE(tensors.empty());
  for (const testing::FixtureTensor& t : tensors) {
    EXPECT_EQ(Mismatches(t.type, t.bytes, t.rows, t.cols, t.name), 0);
  }
}

}  // namespace
}  // namespace kvd::kernels::cuda
