#include "ops/tokenizer/tokenizer.h"

#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::ops {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// Expected ids below are worked out by hand from the algorithms' definitions
// (GPT-2 BPE: lowest merge rank first, leftmost on ties; SentencePiece BPE:
// highest score first, leftmost on ties; llama.cpp's special-token and
// byte-fallback rules), not taken from this code's output.

constexpr char kG[] = "\xC4\xA0";        // 'Ġ', GPT-2's encoding of ' '
constexpr char kSpm[] = "\xE2\x96\x81";  // '▁', SentencePiece's space

std::unique_ptr<Tokenizer> MustCreate(TokenizerSpec spec) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::Create(std::move(spec));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

TokenizerSpec Gpt2Spec(std::vector<std::string> merges) {
  TokenizerSpec spec;
  spec.model = TokenizerModel::kGpt2;
  spec.pre = "gpt-2";
  //            0    1    2    3     4     5      6   7
  spec.tokens = {"a", "b", "c", "ab", "bc", "abc", kG, std::string(kG) + "a",
                 // 8      9    10             11    12
                 "<ctl>", ",", "<ctl><ctl2>", "<u>", "<ctl2>"};
  spec.token_types = {1, 1, 1, 1, 1, 1, 1, 1, 3, 1, 3, 4, 3};
  spec.merges = std::move(merges);
  return spec;
}

TEST(Gpt2BpeTest, LowestRankMergesFirst) {
  // "b c" outranks "a b": a + bc, then "a bc" completes the word.
  auto tok = MustCreate(Gpt2Spec({"b c", "a b", "a bc"}));
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("abc", false, false), ElementsAre(5));

  // Without a way to finish, the order decides the split.
  auto bc_first = MustCreate(Gpt2Spec({"b c", "a b"}));
  EXPECT_THAT(bc_first->Encode("abc", false, false), ElementsAre(0, 4));
  auto ab_first = MustCreate(Gpt2Spec({"a b", "b c"}));
  EXPECT_THAT(ab_first->Encode("abc", false, false), ElementsAre(3, 2));
}

TEST(Gpt2BpeTest, EqualRanksMergeLeftmostFirst) {
  // "abab": the pair (a,b) occurs twice with the same rank; both merge, left
  // one first.
  auto tok = MustCreate(Gpt2Spec({"a b"}));
  EXPECT_THAT(tok->Encode("abab", false, false), ElementsAre(3, 3));
  // "aba" + nothing else: ab, a.
  EXPECT_THAT(tok->Encode("aba", false, false), ElementsAre(3, 0));
}

TEST(Gpt2BpeTest, SpacesAreByteEncodedBeforeMerging) {
  auto tok = MustCreate(Gpt2Spec({std::string(kG) + " a"}));
  // "b a" -> words "b", " a" -> "b", "Ġa".
  EXPECT_THAT(tok->Encode("b a", false, false), ElementsAre(1, 7));
}

TEST(Gpt2BpeTest, CharactersWithoutTokensAreDropped) {
  // 'x' is not in the vocabulary and neither is its single byte: llama.cpp
  // emits nothing.
  auto tok = MustCreate(Gpt2Spec({}));
  EXPECT_THAT(tok->Encode("axb", false, false), ElementsAre(0, 1));
}

TEST(Gpt2BpeTest, ControlTokensOnlyWithParseSpecial) {
  auto tok = MustCreate(Gpt2Spec({}));
  EXPECT_THAT(tok->Encode("a<ctl>b", false, true), ElementsAre(0, 8, 1));
  // Without parse_special the text is ordinary text: '<', 't', 'l', '>' are not
  // tokens.
  EXPECT_THAT(tok->Encode("a<ctl>b", false, false), ElementsAre(0, 2, 1));
}

TEST(Gpt2BpeTest, UserDefinedTokensAlwaysSplit) {
  auto tok = MustCreate(Gpt2Spec({}));
  EXPECT_THAT(tok->Encode("a<u>b", false, false), ElementsAre(0, 11, 1));
}

TEST(Gpt2BpeTest, LongestSpecialTokenWins) {
  auto tok = MustCreate(Gpt2Spec({}));
  EXPECT_THAT(tok->Encode("<ctl><ctl2><ctl2>", false, true),
              ElementsAre(10, 12));
  EXPECT_THAT(tok->Encode("<ctl2><ctl>", false, true), ElementsAre(12, 8));
}

TEST(Gpt2BpeTest, AddsBosAndEosWhenAsked) {
  TokenizerSpec spec = Gpt2Spec({});
  spec.bos_id = 8;
  spec.eos_id = 12;
  spec.add_bos = true;
  spec.add_eos = true;
  auto tok = MustCreate(std::move(spec));
  EXPECT_THAT(tok->Encode("a", true, false), ElementsAre(8, 0, 12));
  EXPECT_THAT(tok->Encode("a", false, false), ElementsAre(0));
  EXPECT_THAT(tok->Encode("", true, false), ElementsAre(8, 12));
}

TEST(Gpt2BpeTest, GptPreTokenizerDefaultsToNoBos) {
  TokenizerSpec spec = Gpt2Spec({});
  spec.bos_id = 8;
  auto tok = MustCreate(std::move(spec));
  EXPECT_FALSE(tok->add_bos());
  EXPECT_THAT(tok->Encode("a", true, false), ElementsAre(0));
}

TEST(Gpt2BpeTest, PiecesUndoTheByteEncoding) {
  auto tok = MustCreate(Gpt2Spec({}));
  EXPECT_EQ(tok->TokenToPiece(7), " a");
  EXPECT_EQ(tok->TokenToPiece(6), " ");
  EXPECT_EQ(tok->TokenToPiece(8), "");  // control: only with special
  EXPECT_EQ(tok->TokenToPiece(8, /*special=*/true), "<ctl>");
  EXPECT_EQ(tok->TokenToPiece(11), "<u>");  // user-defined: always
  EXPECT_EQ(tok->TokenToPiece(-1), "");
  EXPECT_EQ(tok->TokenToPiece(13), "");
}

TEST(Gpt2BpeTest, DecodeCleansSpacesOnlyWhereThePreTokenizerSaysSo) {
  // pieces: "a", " ", ",", "b"  ->  "a ,b"; llama.cpp's clean-up drops the
  // space before ','.
  auto gpt2 = MustCreate(Gpt2Spec({}));
  EXPECT_EQ(gpt2->Decode({0, 6, 9, 1}), "a,b");
  TokenizerSpec spec = Gpt2Spec({});
  spec.pre = "smollm";  // clean_spaces = false
  auto smollm = MustCreate(std::move(spec));
  EXPECT_EQ(smollm->Decode({0, 6, 9, 1}), "a ,b");
  EXPECT_EQ(smollm->Decode({0, 8, 1}), "ab");
  EXPECT_EQ(smollm->Decode({0, 8, 1}, /*special=*/true), "a<ctl>b");
}

TEST(Gpt2BpeTest, FindToken) {
  auto tok = MustCreate(Gpt2Spec({}));
  EXPECT_EQ(tok->FindToken("<ctl>"), 8);
  EXPECT_EQ(tok->FindToken("zzz"), std::nullopt);
  EXPECT_EQ(tok->TokenText(3), "ab");
  EXPECT_EQ(tok->vocab_size(), 13);
}

TEST(Gpt2BpeTest, ConcurrentEncodesAgree) {
  auto tok = MustCreate(Gpt2Spec({"b c", "a b", "a bc"}));
  const std::vector<int32_t> want = tok->Encode("abc abc<ctl>abc", false, true);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i)
        ok[t] += tok->Encode("abc abc<ctl>abc", false, true) == want;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 200);
}

TEST(EogTest, TurnEndTokensFoundByTextBecomeControlAndEog) {
  TokenizerSpec spec;
  spec.model = TokenizerModel::kGpt2;
  spec.pre = "smollm";
  spec.tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "a",
                 "<end_of_turn>", "<x>"};
  spec.token_types = {3, 3, 1,
                      1, 1, 3};  // <|im_end|> and <end_of_turn> typed normal
  spec.eos_id = 0;
  auto tok = MustCreate(std::move(spec));
  EXPECT_TRUE(tok->IsEog(0));
  EXPECT_FALSE(tok->IsEog(1));
  EXPECT_TRUE(tok->IsEog(2));
  EXPECT_FALSE(tok->IsEog(3));
  EXPECT_TRUE(tok->IsEog(4));
  EXPECT_FALSE(tok->IsEog(5));
  EXPECT_TRUE(tok->IsControl(2));
  EXPECT_THAT(tok->eog_ids(), ElementsAre(0, 2, 4));
  // Now control, <|im_end|> is cut out only with parse_special.
  EXPECT_THAT(tok->Encode("a<|im_end|>", false, true), ElementsAre(3, 2));
}

TokenizerSpec SpmSpec() {
  TokenizerSpec spec;
  spec.model = TokenizerModel::kLlama;
  //             0        1        2        3    4    5    6     7
  spec.tokens = {"<unk>", "<s>", "</s>", "a", "b", "c", "ab", "bc",
                 // 8                       9                         10 11
                 std::string(kSpm) + "a", std::string(kSpm) + "b", kSpm,
                 "<0xC3>",
                 // 12       13        14
                 "<0xA9>", "<0x41>", "<ctl>"};
  spec.scores = {0, 0, 0, -5, -5, -5, -1, -1, -2, -2, -3, 0, 0, 0, 0};
  spec.token_types = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 6, 6, 6, 3};
  spec.bos_id = 1;
  spec.eos_id = 2;
  spec.unk_id = 0;
  spec.add_space_prefix = false;
  return spec;
}

TEST(SpmBpeTest, HighestScoreMergesFirstLeftmostOnTies) {
  auto tok = MustCreate(SpmSpec());
  ASSERT_NE(tok, nullptr);
  // "ab" and "bc" both score -1: the leftmost pair merges first.
  EXPECT_THAT(tok->Encode("abc", false, false), ElementsAre(6, 5));
  TokenizerSpec spec = SpmSpec();
  spec.scores[7] = -0.5f;  // now "bc" wins
  auto tok2 = MustCreate(std::move(spec));
  EXPECT_THAT(tok2->Encode("abc", false, false), ElementsAre(3, 7));
}

TEST(SpmBpeTest, SpacesBecomeU2581AndBosIsAddedByDefault) {
  auto tok = MustCreate(SpmSpec());
  EXPECT_TRUE(tok->add_bos());
  EXPECT_THAT(tok->Encode("a b", true, false), ElementsAre(1, 3, 9));
  EXPECT_THAT(tok->Encode(" a", false, false), ElementsAre(8));
}

TEST(SpmBpeTest, SpacePrefixAtStartAndAfterSpecialTokens) {
  TokenizerSpec spec = SpmSpec();
  spec.add_space_prefix.reset();  // llama.cpp's default for SentencePiece: on
  auto tok = MustCreate(std::move(spec));
  EXPECT_THAT(tok->Encode("a", false, false), ElementsAre(8));
  EXPECT_THAT(tok->Encode("a<ctl>b", false, true), ElementsAre(8, 14, 9));
  // Decoding drops the one leading space the prefix added.
  EXPECT_EQ(tok->Decode({8, 9}), "a b");
}

TEST(SpmBpeTest, UnknownCharactersFallBackToByteTokens) {
  auto tok = MustCreate(SpmSpec());
  // 'é' = C3 A9: both byte tokens exist.
  EXPECT_THAT(tok->Encode("\xC3\xA9", false, false), ElementsAre(11, 12));
  // 'z' (0x7A) has no byte token: llama.cpp would throw; kvd uses <unk>.
  EXPECT_THAT(tok->Encode("z", false, false), ElementsAre(0));
}

TEST(SpmBpeTest, PiecesOfSpmTokens) {
  auto tok = MustCreate(SpmSpec());
  EXPECT_EQ(tok->TokenToPiece(8), " a");
  EXPECT_EQ(tok->TokenToPiece(13), "A");
  EXPECT_EQ(tok->TokenToPiece(11), "\xC3");
  EXPECT_EQ(tok->TokenToPiece(0), "");  // unknown: only with special
  EXPECT_EQ(tok->TokenToPiece(0, true), "<unk>");
  EXPECT_EQ(tok->Decode({11, 12}), "\xC3\xA9");
}

// Validation: each malformed spec is rejected with a message naming the
// problem.
struct BadSpecCase {
  const char* name;
  void (*mutate)(TokenizerSpec&);
  const char* message;
};

class BadSpecTest : public ::testing::TestWithParam<BadSpecCase> {};

TEST_P(BadSpecTest, IsRejected) {
  TokenizerSpec spec = Gpt2Spec({"a b"});
  GetParam().mutate(spec);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::Create(std::move(spec));
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tok.status().message(), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Specs, BadSpecTest,
    ::testing::Values(
        BadSpecCase{"NoTokens",
                    [](TokenizerSpec& s) {
                      s.tokens.clear();
                      s.token_types.clear();
                    },
                    "no tokens"},
        BadSpecCase{"Duplicate", [](TokenizerSpec& s) { s.tokens[1] = "a"; },
                    "duplicate token"},
        BadSpecCase{"MergeOfNonToken",
                    [](TokenizerSpec& s) { s.merges = {"a zz"}; },
                    "'zz', which is not a token"},
        BadSpecCase{"MergeWithoutSpace",
                    [](TokenizerSpec& s) { s.merges = {"ab"}; },
                    "not of the form"},
        BadSpecCase{"BosOutOfRange", [](TokenizerSpec& s) { s.bos_id = 13; },
                    "bos token id 13"},
        BadSpecCase{"NegativeEos", [](TokenizerSpec& s) { s.eos_id = -1; },
                    "eos token id -1"},
        BadSpecCase{"AddBosWithoutBos",
                    [](TokenizerSpec& s) { s.add_bos = true; }, "no BOS token"},
        BadSpecCase{"BadType", [](TokenizerSpec& s) { s.token_types[2] = 9; },
                    "invalid type 9"},
        BadSpecCase{"BadByteToken",
                    [](TokenizerSpec& s) { s.token_types[0] = 6; },
                    "expected the form <0xAB>"},
        BadSpecCase{"ScoreCount", [](TokenizerSpec& s) { s.scores = {1.0f}; },
                    "1 scores"},
        BadSpecCase{"TypeCount",
                    [](TokenizerSpec& s) { s.token_types.pop_back(); },
                    "12 token types"},
        BadSpecCase{"UnknownPre", [](TokenizerSpec& s) { s.pre = "martian"; },
                    "martian"}),
    [](const ::testing::TestParamInfo<BadSpecCase>& info) {
      return info.param.name;
    });

TEST(TokenizerTest, EmptyTokenTextIsRenamedAsLlamaCppDoes) {
  TokenizerSpec spec = Gpt2Spec({});
  spec.tokens[2] = "";
  auto tok = MustCreate(std::move(spec));
  EXPECT_EQ(tok->TokenText(2), "[EMPTY_2]");
}

TEST(TokenizerTest, UnusedControlTokensStillSplitWithParseSpecial) {
  TokenizerSpec spec = SpmSpec();
  spec.tokens[14] = "<unused0>";
  auto tok = MustCreate(std::move(spec));
  EXPECT_THAT(tok->Encode("a<unused0>", false, true), ElementsAre(3, 14));
  EXPECT_THAT(tok->Encode("a<unused0>", false, false), Not(Contains(14)));
  EXPECT_THAT(tok->Encode("", false, false), IsEmpty());
}

}  // namespace
}  // namespace kvd::ops
