#include "ops/tokenizer/pretokenizer.h"

#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "ops/tokenizer/unicode.h"

namespace kvd::ops {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Split(std::string_view pre_name,
                               std::string_view text) {
  absl::StatusOr<PreTokenizerInfo> pre = LookupPreTokenizer(pre_name);
  EXPECT_TRUE(pre.ok()) << pre.status();
  const std::vector<uint32_t> cpts = unicode::DecodeUtf8(text);
  std::vector<std::string> words;
  size_t start = 0;
  for (size_t len : PreTokenize(pre->type, cpts)) {
    std::string w;
    for (size_t i = start; i < start + len; ++i)
      unicode::AppendUtf8(cpts[i], &w);
    words.push_back(w);
    start += len;
  }
  EXPECT_EQ(start, cpts.size());
  return words;
}

// Expected splits come from tools/reference/make_pretokenizer_cases.py (Python
// `regex` applying llama.cpp's regex lists), not from this code.
TEST(PreTokenizerTest, MatchesRegexReference) {
  std::ifstream in("ops/tokenizer/testdata/pretokenizer_cases.jsonl");
  ASSERT_TRUE(in.good()) << "missing testdata/pretokenizer_cases.jsonl";
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string pre = j["pre"];
    const std::string text = j["text"];
    const std::vector<std::string> want = j["words"];
    EXPECT_EQ(Split(pre, text), want)
        << "pre=" << pre << " text=" << nlohmann::json(text);
    ++cases;
  }
  EXPECT_EQ(cases, 200);
}

// Cases the regex reference cannot state, worked out from llama.cpp's
// hand-written matchers.
TEST(PreTokenizerTest, Gpt2SingleTrailingSpaceIsItsOwnWord) {
  EXPECT_THAT(Split("gpt-2", "a \tb"), ElementsAre("a", " ", "\t", "b"));
  EXPECT_THAT(Split("gpt-2", "a "), ElementsAre("a", " "));
}

TEST(PreTokenizerTest, InvalidUtf8BecomesReplacementCharacters) {
  // 0xFF is not a UTF-8 lead byte: llama.cpp decodes it to U+FFFD, a symbol
  // (So).
  EXPECT_THAT(Split("gpt-2",
                    "a\xFF"
                    "b"),
              ElementsAre("a", "\xEF\xBF\xBD", "b"));
}

TEST(PreTokenizerTest, SmollmSplitsEveryDigit) {
  EXPECT_THAT(Split("smollm", "x 2024"),
              ElementsAre("x", " ", "2", "0", "2", "4"));
}

TEST(PreTokenizerTest, Llama3GroupsDigitsByThree) {
  EXPECT_THAT(Split("llama3", "1234567"), ElementsAre("123", "456", "7"));
  EXPECT_THAT(Split("llama-bpe", "1234567"), ElementsAre("123", "456", "7"));
}

TEST(PreTokenizerTest, EmptyTextHasNoWords) {
  EXPECT_TRUE(PreTokenize(PreTokenizer::kGpt2, {}).empty());
}

TEST(PreTokenizerTest, UnknownNameListsSupportedOnes) {
  absl::StatusOr<PreTokenizerInfo> pre = LookupPreTokenizer("no-such-pre");
  ASSERT_FALSE(pre.ok());
  EXPECT_EQ(pre.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(pre.status().message(), HasSubstr("no-such-pre"));
  EXPECT_THAT(pre.status().message(), HasSubstr("smollm"));
}

TEST(PreTokenizerTest, NamesMapToLlamaCppSettings) {
  EXPECT_FALSE(LookupPreTokenizer("smollm")->clean_spaces);
  EXPECT_TRUE(LookupPreTokenizer("default")->clean_spaces);
  EXPECT_TRUE(LookupPreTokenizer("")->clean_spaces);
  EXPECT_TRUE(LookupPreTokenizer("llama-bpe")->ignore_merges);
  EXPECT_TRUE(LookupPreTokenizer("llama3")->add_bos);
  EXPECT_FALSE(LookupPreTokenizer("qwen2")->clean_spaces);
}

}  // namespace
}  // namespace kvd::ops
