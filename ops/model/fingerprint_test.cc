#include "ops/model/fingerprint.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace kvd::ops {
namespace {

namespace fs = std::filesystem;

fs::path TempDir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  fs::path p = fs::path(t != nullptr ? t : "/tmp") / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void Write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

// The framing of one file is "<name>\0<size>\0<bytes>"; its SHA-256 is
// computed independently with coreutils' sha256sum.
TEST(FingerprintTest, SingleFileMatchesSha256sumOfItsFraming) {
  const fs::path dir = TempDir("fp_single");
  Write(dir / "m.gguf", "GGUF-bytes");
  Write(dir / "framed", std::string("m.gguf\0"
                                    "10\0GGUF-bytes",
                                    20));
  const std::string cmd =
      "sha256sum " + (dir / "framed").string() + " > " + (dir / "sum").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream in(dir / "sum");
  std::string expected;
  in >> expected;
  absl::StatusOr<std::string> fp =
      FingerprintModelFiles((dir / "m.gguf").string());
  ASSERT_TRUE(fp.ok()) << fp.status();
  EXPECT_EQ(*fp, "sha256:" + expected);
}

TEST(FingerprintTest, ContentNotPathDecides) {
  const fs::path a = TempDir("fp_a"), b = TempDir("fp_b");
  Write(a / "m.gguf", "weights v1");
  Write(b / "m.gguf", "weights v1");
  EXPECT_EQ(*FingerprintModelFiles((a / "m.gguf").string()),
            *FingerprintModelFiles((b / "m.gguf").string()));
  Write(b / "m.gguf", "weights v2");
  EXPECT_NE(*FingerprintModelFiles((a / "m.gguf").string()),
            *FingerprintModelFiles((b / "m.gguf").string()));
}

TEST(FingerprintTest, HuggingFaceDirectoryCoversTokenizerAndConfig) {
  const fs::path dir = TempDir("fp_hf");
  Write(dir / "config.json", "{}");
  Write(dir / "tokenizer.json", "{\"v\":1}");
  Write(dir / "model.safetensors", "tensors");
  Write(dir / "README.md", "ignored");
  const std::string before = *FingerprintModelFiles(dir.string());
  Write(dir / "README.md", "edited");
  EXPECT_EQ(*FingerprintModelFiles(dir.string()), before);
  Write(dir / "tokenizer.json", "{\"v\":2}");
  EXPECT_NE(*FingerprintModelFiles(dir.string()), before);
}

TEST(FingerprintTest, MissingFileIsNotFound) {
  absl::StatusOr<std::string> fp = FingerprintModelFiles("/nonexistent/m.gguf");
  EXPECT_EQ(fp.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(fp.status().message().find("/nonexistent/m.gguf"),
            std::string::npos);
}

}  // namespace
}  // namespace kvd::ops
