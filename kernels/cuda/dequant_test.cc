// Device dequantization vs the CPU dequantizer (kernels/quant/dequant.h, itself
// checked against the Python gguf package's golden values) followed by the CPU
// backend's bf16 rounding (kernels/cpu FloatToBf16): bit for bit, on fresh
// random blocks of every supported type and on real tensors of the project's
// models (a fixture cut from them by tools/gpu/make_dequant_fixture.py, named
// by $KVD_DEQUANT_FIXTURE). Outputs are NaN-poisoned first; row padding past
// `cols` must stay poisoned.
#include "kernels/cuda/dequant.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/internal/dequant_fixture.h"
#include "kernels/cuda/internal/test_util.h"
#include "kernels/quant/dequant.h"
#include "kernels/quant/ggml_type.h"

namespace kvd::kernels::cuda {
namespace {

using testing::DeviceBuffer;

// CPU reference: DequantizeRow then FloatToBf16, row by row.
std::vector<uint16_t> CpuReference(GgmlType type, const uint8_t* src,
                                   int64_t row_bytes, int64_t rows,
                                   int64_t cols) {
  std::vector<uint16_t> out(static_cast<size_t>(rows * cols));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const absl::Status s =
        DequantizeRow(type, src + r * row_bytes, static_cast<size_t>(row_bytes),
                      row.data(), cols);
    EXPECT_TRUE(s.ok()) << s;
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = kernels::cpu::FloatToBf16(row[c]);
  }
  return out;
}

// Runs both device paths (device source, host upload) into a poisoned, padded
// output and compares every element, padding included; the first mismatches
// are reported with their position.
void ExpectBitIdentical(GgmlType type, const std::vector<uint8_t>& bytes,
                        int64_t rows, int64_t cols, const std::string& what) {
  const int64_t row_bytes = static_cast<int64_t>(bytes.size()) / rows;
  const int64_t ld = cols + 8;
  const std::vector<uint16_t> want =
      CpuReference(type, bytes.data(), row_bytes, rows, cols);

  DeviceBuffer<uint8_t> src(bytes.size());
  DeviceBuffer<uint16_t> dst(static_cast<size_t>(rows * ld));
  KVD_CUDA_ASSERT(src.status());
  KVD_CUDA_ASSERT(dst.status());
  KVD_CUDA_ASSERT(src.Upload(bytes));
  for (int path = 0; path < 2; ++path) {
    KVD_CUDA_ASSERT(dst.Poison());
    const absl::Status s =
        path == 0 ? DequantizeToBf16(type, src.get(), row_bytes, rows, cols,
                                     dst.get(), ld, nullptr)
                  : UploadDequantizedBf16(type, bytes.data(), bytes.size(),
                                          rows, cols, dst.get(), ld, nullptr);
    ASSERT_TRUE(s.ok()) << what << ": " << s;
    KVD_CUDA_SYNC();
    std::vector<uint16_t> got;
    KVD_CUDA_ASSERT(dst.Download(&got));
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < ld; ++c) {
        const uint16_t g = got[r * ld + c];
        const uint16_t w = c < cols ? want[r * cols + c] : 0xffff;
        if (g != w && bad++ < 5) {
          ADD_FAILURE() << what << (path ? " (upload)" : " (device src)")
                        << ": row " << r << " col " << c << ": got 0x"
                        << std::hex << g << ", want 0x" << w << std::dec;
        }
      }
    }
    EXPECT_EQ(bad, 0) << what << ": " << bad << " mismatching elements";
  }
}

// Offsets of the fp16 scale fields in one block, which random bytes must keep
// finite: NaN arithmetic does not preserve payloads identically on CPU and GPU
// (the GPU returns a canonical NaN), and no real model stores such scales.
std::vector<int> Fp16FieldOffsets(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0:
    case GgmlType::kQ6_K:
      return {type == GgmlType::kQ6_K ? 208 : 0};
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      return {0, 2};
    default:
      return {};
  }
}

std::vector<uint8_t> RandomBlocks(GgmlType type, int64_t rows, int64_t cols,
                                  std::mt19937_64* rng) {
  const int64_t row_bytes = static_cast<int64_t>(*RowBytes(type, cols));
  std::vector<uint8_t> b(static_cast<size_t>(rows * row_bytes));
  for (uint8_t& x : b) x = static_cast<uint8_t>((*rng)() & 0xff);
  const int64_t block = BlockBytes(type);
  for (size_t off = 0; off < b.size(); off += block) {
    for (int f : Fp16FieldOffsets(type)) {
      // Exponent 0x1f (inf/NaN) -> clear its top bit; subnormals stay.
      if ((b[off + f + 1] & 0x7c) == 0x7c) b[off + f + 1] &= ~0x40;
    }
  }
  return b;
}

const GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16,
                           GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                           GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ4_K,
                           GgmlType::kQ5_K, GgmlType::kQ6_K};

TEST(CudaDequant, SupportsWhatTheCpuDequantizerSupports) {
  for (uint32_t id = 0; id < 64; ++id) {
    if (!IsKnownGgmlType(id)) continue;
    const GgmlType t = static_cast<GgmlType>(id);
    EXPECT_EQ(IsDeviceDequantizeSupported(t), IsDequantizeSupported(t))
        << GgmlTypeName(t);
  }
}

TEST(CudaDequant, RandomBlocksMatchCpuBitForBit) {
  KVD_REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed());
  for (GgmlType type : kTypes) {
    const int64_t bs = BlockSize(type);
    // Odd row counts and several blocks per row, so row and block indexing
    // both matter; F32/F16/BF16 rows get an odd length.
    const int64_t cols = bs == 1 ? 333 : bs * 3;
    const int64_t rows = 37;
    // Random bit patterns for F32/F16/BF16 include NaN and inf: these are
    // pure bit conversions on both sides and must match exactly.
    ExpectBitIdentical(type, RandomBlocks(type, rows, cols, &rng), rows, cols,
                       std::string(GgmlTypeName(type)) + " random");
  }
}

TEST(CudaDequant, LargeTensorUsesGridStrideLoop) {
  KVD_REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed());
  // 2^20 blocks of 256 threads cover 2^28 elements per pass; this tensor is
  // bigger, so the grid-stride loop must take a second lap.
  const int64_t rows = 4160, cols = 65536;  // 272,629,760 elements
  ExpectBitIdentical(GgmlType::kQ4_0,
                     RandomBlocks(GgmlType::kQ4_0, rows, cols, &rng), rows,
                     cols, "Q4_0 large");
}

TEST(CudaDequant, RealModelTensorsMatchCpuBitForBit) {
  KVD_REQUIRE_GPU();
  const char* path = std::getenv("KVD_DEQUANT_FIXTURE");
  if (path == nullptr || *path == 0) {
    GTEST_SKIP() << "set KVD_DEQUANT_FIXTURE to a file made by "
                    "tools/gpu/make_dequant_fixture.py";
  }
  const std::vector<testing::FixtureTensor> tensors =
      testing::ReadDequantFixture(path);
  ASSERT_FALSE(tensors.empty());
  for (const testing::FixtureTensor& t : tensors) {
    ASSERT_EQ(static_cast<int64_t>(*RowBytes(t.type, t.cols)) * t.rows,
              static_cast<int64_t>(t.bytes.size()))
        << t.name;
    std::printf("  %s: %s %lld x %lld\n", t.name.c_str(),
                std::string(GgmlTypeName(t.type)).c_str(),
                static_cast<long long>(t.rows), static_cast<long long>(t.cols));
    ExpectBitIdentical(t.type, t.bytes, t.rows, t.cols, t.name);
  }
}

}  // namespace
}  // namespace kvd::kernels::cuda
