// Hostile-file hardening: every crafted malformed file must fail to parse with
// INVALID_ARGUMENT and a message naming the file and the problem; truncating a
// valid file at any byte must fail cleanly too. The crafted files are also
// committed as fuzzer seeds.
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/gguf/gguf_file.h"
#include "ops/gguf/gguf_test_files.h"

namespace kvd::ops {
namespace {

using ::kvd::ops::testing::HostileFile;
using ::kvd::ops::testing::HostileGgufFiles;
using ::kvd::ops::testing::SmallValidGguf;
using ::testing::HasSubstr;

absl::StatusOr<std::unique_ptr<GgufFile>> ParseString(
    const std::string& name, const std::string& bytes) {
  return GgufFile::Parse(name, reinterpret_cast<const uint8_t*>(bytes.data()),
                         bytes.size());
}

TEST(GgufHostileTest, SmallValidFileParses) {
  const std::string bytes = SmallValidGguf();
  auto file = ParseString("small.gguf", bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->architecture(), "tiny");
  ASSERT_EQ((*file)->tensors().size(), 2u);
  EXPECT_EQ((*file)->tensors()[0].offset, 224u);
  EXPECT_EQ((*file)->tensors()[1].offset, 256u);
  EXPECT_EQ((*file)->tensors()[1].size_bytes, 68u);
  EXPECT_EQ((*file)->data_section_offset(), 224u);
}

class HostileFileTest : public ::testing::TestWithParam<HostileFile> {};

TEST_P(HostileFileTest, FailsWithClearError) {
  const HostileFile& c = GetParam();
  const std::string name = "bad_" + c.name + ".gguf";
  auto file = ParseString(name, c.bytes);
  ASSERT_FALSE(file.ok()) << name << " parsed";
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument)
      << file.status();
  EXPECT_THAT(file.status().message(), HasSubstr(name + ": "));
  EXPECT_THAT(file.status().message(), HasSubstr(c.want));
}

INSTANTIATE_TEST_SUITE_P(All, HostileFileTest,
                         ::testing::ValuesIn(HostileGgufFiles()),
                         [](const ::testing::TestParamInfo<HostileFile>& info) {
                           return info.param.name;
                         });

TEST(GgufHostileTest, EveryTruncationFailsCleanly) {
  const std::string bytes = SmallValidGguf();
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto file = ParseString("cut.gguf", bytes.substr(0, n));
    ASSERT_FALSE(file.ok()) << "prefix of " << n << " bytes parsed";
    ASSERT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument)
        << file.status();
    ASSERT_THAT(file.status().message(), HasSubstr("cut.gguf: "));
  }
  EXPECT_TRUE(ParseString("whole.gguf", bytes).ok());
}

TEST(GgufHostileTest, VersionTwoIsAccepted) {
  std::string bytes = SmallValidGguf();
  bytes[4] = 2;
  auto file = ParseString("v2.gguf", bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->version(), 2u);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The committed fuzzer seeds are exactly the files this test checks. Set
// KVD_WRITE_GGUF_TESTDATA to a directory to (re)write them there.
TEST(GgufHostileTest, CommittedTestdataMatches) {
  std::vector<std::pair<std::string, std::string>> files = {
      {"valid_small.gguf", SmallValidGguf()}};
  for (const HostileFile& c : HostileGgufFiles()) {
    files.emplace_back("bad_" + c.name + ".gguf", c.bytes);
  }
  if (const char* dir = std::getenv("KVD_WRITE_GGUF_TESTDATA")) {
    for (const auto& [name, bytes] : files) {
      std::ofstream(std::string(dir) + "/" + name, std::ios::binary) << bytes;
    }
  }
  for (const auto& [name, bytes] : files) {
    const std::string path = "ops/gguf/testdata/" + name;
    EXPECT_EQ(ReadFile(path), bytes)
        << path << " is stale or missing; see gguf_test_files.h";
    auto file = GgufFile::Open(path);
    EXPECT_EQ(file.ok(), name == "valid_small.gguf")
        << path << ": " << file.status();
  }
}

TEST(GgufHostileTest, OpenErrors) {
  auto missing = GgufFile::Open("/nonexistent/dir/model.gguf");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("/nonexistent/dir/model.gguf"));
  auto dir = GgufFile::Open("ops/gguf/testdata");
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dir.status().message(), HasSubstr("not a regular file"));
  auto empty = GgufFile::Open("ops/gguf/testdata/bad_empty.gguf");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(),
              HasSubstr("bad_empty.gguf: file is 0 bytes"));
}

}  // namespace
}  // namespace kvd::ops
