// Checks both CRC32C implementations against values computed elsewhere: RFC
// 3720 appendix B.4 and the PyPI crc32c / google-crc32c packages
// (tools/reference/make_crc32c_vectors.py).
#include "storage/checkpoint/crc32c.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvd::storage {
namespace {

using Impl = uint32_t (*)(uint32_t, const void*, size_t);

std::string LcgBytes(uint32_t seed, size_t n) {
  std::string out(n, '\0');
  uint32_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    out[i] = static_cast<char>(x >> 24);
  }
  return out;
}

struct LcgVector {
  uint32_t seed;
  size_t size;
  uint32_t crc;
};
// Output of tools/reference/make_crc32c_vectors.py.
constexpr LcgVector kLcgVectors[] = {
    {1, 0, 0x00000000u},    {1, 1, 0xE16DCDEEu},     {1, 2, 0xA9DD325Eu},
    {1, 3, 0x5BFE01A2u},    {1, 7, 0x5FF658B0u},     {1, 8, 0x3FDCE407u},
    {1, 9, 0x6A8EA5B3u},    {1, 15, 0xB0633746u},    {1, 16, 0x31007BE9u},
    {1, 17, 0xCBC5F811u},   {1, 31, 0xA2AE741Eu},    {1, 63, 0xB111A34Bu},
    {1, 64, 0x56DBF329u},   {1, 65, 0xC18698C3u},    {1, 255, 0x9E979EAAu},
    {7, 1000, 0x2813692Bu}, {42, 4099, 0x2DC912EBu}, {2024, 65541, 0x7E6E631Bu},
};

class Crc32cTest : public ::testing::TestWithParam<const char*> {
 protected:
  Impl impl() const {
    return std::string(GetParam()) == "portable" ? &internal::Crc32cPortable
                                                 : &internal::Crc32cSse42;
  }
  void SetUp() override {
    if (std::string(GetParam()) == "sse42" &&
        !internal::Crc32cHardwareAvailable()) {
      GTEST_SKIP() << "CPU lacks SSE4.2";
    }
  }
  uint32_t Crc(const std::string& s) const {
    return impl()(0, s.data(), s.size());
  }
};

TEST_P(Crc32cTest, Rfc3720AppendixB4) {
  EXPECT_EQ(Crc(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc(std::string(32, '\xff')), 0x62A8AB43u);
  std::string inc(32, '\0'), dec(32, '\0');
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<char>(i);
    dec[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(Crc(inc), 0x46DD794Eu);
  EXPECT_EQ(Crc(dec), 0x113FDB5Cu);
  // The iSCSI read PDU of B.4.
  const uint8_t pdu[48] = {
      0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
      0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(impl()(0, pdu, sizeof(pdu)), 0xD9963A56u);
  EXPECT_EQ(Crc("123456789"), 0xE3069283u);
}

TEST_P(Crc32cTest, MatchesPythonPackagesAtEveryLength) {
  for (const LcgVector& v : kLcgVectors) {
    EXPECT_EQ(Crc(LcgBytes(v.seed, v.size)), v.crc)
        << "seed " << v.seed << " size " << v.size;
  }
}

TEST_P(Crc32cTest, ExtendEqualsOneShotAtAnySplitAndAlignment) {
  const std::string data = LcgBytes(7, 1000);
  // Unaligned starts exercise the SSE path's byte-wise head.
  std::string buffer = "xyz" + data;
  const char* d = buffer.data() + 3;
  for (size_t split : {0u, 1u, 5u, 8u, 13u, 500u, 999u, 1000u}) {
    const uint32_t head = impl()(0, d, split);
    EXPECT_EQ(impl()(head, d + split, data.size() - split), 0x2813692Bu)
        << "split " << split;
  }
}

TEST_P(Crc32cTest, DetectsEverySingleBitFlip) {
  std::string data = LcgBytes(3, 64);
  const uint32_t good = Crc(data);
  for (size_t bit = 0; bit < data.size() * 8; ++bit) {
    data[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    EXPECT_NE(Crc(data), good) << "bit " << bit;
    data[bit / 8] ^= static_cast<char>(1 << (bit % 8));
  }
}

INSTANTIATE_TEST_SUITE_P(Impls, Crc32cTest,
                         ::testing::Values("portable", "sse42"));

TEST(Crc32c, DispatchMatchesPortable) {
  const std::string data = LcgBytes(42, 4099);
  EXPECT_EQ(Crc32c(data), 0x2DC912EBu);
  EXPECT_EQ(Crc32cExtend(Crc32c(data.substr(0, 100)), data.data() + 100,
                         data.size() - 100),
            0x2DC912EBu);
}

}  // namespace
}  // namespace kvd::storage
