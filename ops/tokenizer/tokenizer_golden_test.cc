// Exact agreement with llama.cpp on the real model files: every line of
// tests/golden/<model>/tokenizer.jsonl (llama_tokenize through
// llama-cpp-python, see tools/reference/make_golden.py) must give the same ids,
// and every id of detok.jsonl the same llama_token_to_piece bytes. Skipped when
// the model files are not on this machine.
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "base/model_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "ops/gguf/gguf_file.h"
#include "ops/tokenizer/gguf_tokenizer.h"
#include "ops/tokenizer/tokenizer.h"

namespace kvd::ops {
namespace {

std::string Hex(const std::string& bytes) {
  return absl::BytesToHexString(absl::string_view(bytes.data(), bytes.size()));
}

struct ModelCase {
  const char* name;  // tests/golden/<name>/
  const char* file;
};

class TokenizerGoldenTest : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    const std::string path = CachedModelPath(GetParam().file);
    if (!std::ifstream(path).good())
      FAIL() << "(run tools/setup.sh --test) "
             << "model file not found: " << path;
    absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = std::move(*file);
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = TokenizerFromGguf(*file_);
    load_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(*tok);
  }

  std::string GoldenPath(const char* leaf) const {
    return std::string("tests/golden/") + GetParam().name + "/" + leaf;
  }

  std::unique_ptr<GgufFile> file_;
  std::unique_ptr<Tokenizer> tok_;
  double load_seconds_ = 0;
};

TEST_P(TokenizerGoldenTest, EncodeMatchesLlamaCpp) {
  std::ifstream in(GoldenPath("tokenizer.jsonl"));
  ASSERT_TRUE(in.good()) << GoldenPath("tokenizer.jsonl");
  std::string line;
  int lines = 0;
  int mismatches = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string text = j["text"];
    const bool add_special = j["add_special"];
    const bool parse_special = j["parse_special"];
    const std::vector<int32_t> want = j["ids"];
    const std::vector<int32_t> got =
        tok_->Encode(text, add_special, parse_special);
    ++lines;
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "text=" << nlohmann::json(text).dump()
                    << " add_special=" << add_special
                    << " parse_special=" << parse_special << "\n  want "
                    << nlohmann::json(want).dump() << "\n  got  "
                    << nlohmann::json(got).dump();
    }
  }
  EXPECT_GT(lines, 200);
  EXPECT_EQ(mismatches, 0) << "of " << lines << " lines";
  std::cout << GetParam().name << ": " << lines
            << " golden lines, vocabulary of " << tok_->vocab_size()
            << " loaded in " << load_seconds_ << " s\n";
}

TEST_P(TokenizerGoldenTest, PiecesMatchLlamaCpp) {
  std::ifstream in(GoldenPath("detok.jsonl"));
  ASSERT_TRUE(in.good()) << GoldenPath("detok.jsonl");
  std::string line;
  int ids = 0;
  int mismatches = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const int32_t id = j["id"];
    const std::string want = j["hex"];
    const std::string want_plain = j["hex_plain"];
    const std::string got = Hex(tok_->TokenToPiece(id, /*special=*/true));
    const std::string got_plain =
        Hex(tok_->TokenToPiece(id, /*special=*/false));
    ++ids;
    if ((got != want || got_plain != want_plain) && ++mismatches <= 10) {
      ADD_FAILURE() << "id " << id << " ("
                    << nlohmann::json(std::string(tok_->TokenText(id)))
                    << "): want " << want << " / " << want_plain << ", got "
                    << got << " / " << got_plain;
    }
  }
  EXPECT_GT(ids, 1000);
  EXPECT_EQ(mismatches, 0) << "of " << ids << " ids";
}

TEST_P(TokenizerGoldenTest, DecodeInvertsEncodeOnPlainText) {
  // llama.cpp's detokenizer reproduces ordinary text exactly for these
  // vocabularies (no clean_spaces for SmolLM2; Gemma has no space prefix to
  // strip).
  const std::string text =
      "Hello, world! The year is 2024.\n  Indented line\twith a tab; "
      "caf\xC3\xA9.";
  EXPECT_EQ(tok_->Decode(tok_->Encode(text, /*add_special=*/false,
                                      /*parse_special=*/false)),
            text);
}

INSTANTIATE_TEST_SUITE_P(
    Models, TokenizerGoldenTest,
    ::testing::Values(ModelCase{"smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"},
                      ModelCase{"gemma3", "gemma-3-270m-q4_k_m.gguf"}),
    [](const ::testing::TestParamInfo<ModelCase>& info) {
      return std::string(info.param.name);
    });

// Facts stated by the files' metadata and llama.cpp's end-of-generation rules.
TEST(RealModelTokenizerTest, SmolLm2SpecialTokens) {
  const std::string path = CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!std::ifstream(path).good())
    FAIL() << "(run tools/setup.sh --test) "
           << "model file not found: " << path;
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = TokenizerFromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 49152);
  EXPECT_EQ((*tok)->bos(), 1);
  EXPECT_EQ((*tok)->eos(), 2);
  EXPECT_FALSE((*tok)->add_bos());
  EXPECT_EQ((*tok)->FindToken("<|im_end|>"), 2);
  EXPECT_TRUE((*tok)->IsEog(2));   // <|im_end|>
  EXPECT_TRUE((*tok)->IsEog(0));   // <|endoftext|>
  EXPECT_FALSE((*tok)->IsEog(1));  // <|im_start|>
  EXPECT_FALSE((*tok)->IsEog(*(*tok)->FindToken("Hello")));
}

TEST(RealModelTokenizerTest, Gemma3SpecialTokens) {
  const std::string path = CachedModelPath("gemma-3-270m-q4_k_m.gguf");
  if (!std::ifstream(path).good())
    FAIL() << "(run tools/setup.sh --test) "
           << "model file not found: " << path;
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = TokenizerFromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 262144);
  EXPECT_EQ((*tok)->bos(), 2);
  EXPECT_EQ((*tok)->eos(), 1);
  EXPECT_TRUE((*tok)->add_bos());
  const std::optional<int32_t> eot = (*tok)->FindToken("<end_of_turn>");
  ASSERT_TRUE(eot.has_value());
  EXPECT_TRUE((*tok)->IsEog(*eot));
  EXPECT_TRUE((*tok)->IsEog(1));
  EXPECT_FALSE((*tok)->IsEog(*(*tok)->FindToken("<start_of_turn>")));
}

}  // namespace
}  // namespace kvd::ops
