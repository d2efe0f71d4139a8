#include "ops/tokenizer/unicode.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::ops::unicode {
namespace {

using ::testing::ElementsAre;

// Expected flags are Unicode 15.1 general categories (unicodedata2 15.1.0) and
// White_Space.
TEST(UnicodeTest, FlagsFollowUnicodeCategories) {
  EXPECT_EQ(Flags('A'), kLetter);
  EXPECT_EQ(Flags('7'), kNumber);
  EXPECT_EQ(Flags(' '), kSeparator | kWhitespace);
  EXPECT_EQ(Flags('\n'), kControl | kWhitespace);
  EXPECT_EQ(Flags(0x1C), kControl);  // not White_Space, unlike str.isspace()
  EXPECT_EQ(Flags('$'), kSymbol);
  EXPECT_EQ(Flags('_'), kPunctuation);
  EXPECT_EQ(Flags(0x00E9), kLetter);      // é
  EXPECT_EQ(Flags(0x0301), kAccentMark);  // combining acute
  EXPECT_EQ(Flags(0x0663), kNumber);      // Arabic-Indic three
  EXPECT_EQ(Flags(0x00B2), kNumber);      // superscript two (No)
  EXPECT_EQ(Flags(0x3000), kSeparator | kWhitespace);
  EXPECT_EQ(Flags(0x0085), kControl | kWhitespace);
  EXPECT_EQ(Flags(0x0378), kUndefined);    // unassigned
  EXPECT_EQ(Flags(0x31EF), kSymbol);       // new in Unicode 15.1
  EXPECT_EQ(Flags(0x1F600), kSymbol);      // emoji
  EXPECT_EQ(Flags(0xD800), kControl);      // surrogate (Cs)
  EXPECT_EQ(Flags(0x10FFFF), kUndefined);  // noncharacter, unassigned
  EXPECT_EQ(Flags(0x110000), kUndefined);
}

TEST(UnicodeTest, DecodesValidUtf8) {
  EXPECT_THAT(DecodeUtf8("a\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80"),
              ElementsAre('a', 0xE9, 0x4F60, 0x1F600));
}

TEST(UnicodeTest, EachBadByteBecomesOneReplacementChar) {
  // Stray continuation, truncated 2- and 3-byte sequences, and a byte that
  // starts nothing.
  EXPECT_THAT(DecodeUtf8("\x80"), ElementsAre(kReplacementChar));
  EXPECT_THAT(DecodeUtf8("\xC3"), ElementsAre(kReplacementChar));
  EXPECT_THAT(DecodeUtf8("\xE4\xBD"
                         "a"),
              ElementsAre(kReplacementChar, kReplacementChar, 'a'));
  EXPECT_THAT(DecodeUtf8("\xFF"
                         "b"),
              ElementsAre(kReplacementChar, 'b'));
  // Overlong forms decode without complaint, as in llama.cpp.
  EXPECT_THAT(DecodeUtf8("\xC0\xAF"), ElementsAre(0x2F));
}

TEST(UnicodeTest, EncodesUtf8) {
  std::string s;
  AppendUtf8(0x41, &s);
  AppendUtf8(0xE9, &s);
  AppendUtf8(0x4F60, &s);
  AppendUtf8(0x1F600, &s);
  AppendUtf8(0x110000, &s);  // not encodable: U+FFFD
  EXPECT_EQ(s, "A\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80\xEF\xBF\xBD");
}

TEST(UnicodeTest, Utf8SeqLenUsesTheLeadNibble) {
  EXPECT_EQ(Utf8SeqLen('a'), 1u);
  EXPECT_EQ(Utf8SeqLen('\x80'), 1u);
  EXPECT_EQ(Utf8SeqLen('\xC3'), 2u);
  EXPECT_EQ(Utf8SeqLen('\xE4'), 3u);
  EXPECT_EQ(Utf8SeqLen('\xF0'), 4u);
  EXPECT_EQ(Utf8SeqLen('\xF8'), 4u);
}

// GPT-2's bytes_to_unicode (openai/gpt-2 encoder.py): printable bytes map to
// themselves, the rest to U+0100.. in order, so ' ' (the 33rd unprintable byte)
// is U+0120 'Ġ'.
TEST(UnicodeTest, GptByteEncoding) {
  EXPECT_EQ(ByteToUnicode('a'), "a");
  EXPECT_EQ(ByteToUnicode(' '), "\xC4\xA0");   // Ġ
  EXPECT_EQ(ByteToUnicode('\n'), "\xC4\x8A");  // Ċ
  EXPECT_EQ(ByteToUnicode(0x00), "\xC4\x80");  // Ā
  EXPECT_EQ(ByteToUnicode(0xAD), "\xC5\x83");  // soft hyphen -> U+0143
  EXPECT_EQ(ByteToUnicode(0xE9), "\xC3\xA9");  // é is printable
  for (int b = 0; b < 256; ++b) {
    const std::vector<uint32_t> cpts =
        DecodeUtf8(ByteToUnicode(static_cast<uint8_t>(b)));
    ASSERT_EQ(cpts.size(), 1u);
    EXPECT_EQ(UnicodeToByte(cpts[0]), b);
  }
  EXPECT_EQ(UnicodeToByte(0x4F60), std::nullopt);
  EXPECT_EQ(UnicodeToByte(0x20),
            std::nullopt);  // a space is not an encoded byte
}

}  // namespace
}  // namespace kvd::ops::unicode
