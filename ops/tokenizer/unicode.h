// UTF-8 and codepoint helpers shared by the tokenizers, with llama.cpp's exact
// semantics.
//
// Tokenization must reproduce llama.cpp bit for bit, including on malformed
// input, so these helpers copy its rules rather than a strict UTF-8 decoder's:
// a bad byte decodes to U+FFFD and decoding resumes at the next byte; overlong
// forms and surrogates are accepted as they are. Codepoint flags come from a
// Unicode 15.1 table (unicode_tables.cc), as llama.cpp's do.
//
// Thread-safety: all functions are pure or read immutable tables; safe from
// any thread.
//
//   std::vector<uint32_t> cpts = unicode::DecodeUtf8("h\xC3\xA9llo");
//   bool letter = unicode::Flags(cpts[1]) & unicode::kLetter;  // true
//   std::string enc = unicode::ByteToUnicode(' ');  // "\xC4\xA0", GPT-2's 'Ġ'
#ifndef KVD_OPS_TOKENIZER_UNICODE_H_
#define KVD_OPS_TOKENIZER_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvd::ops::unicode {

// Codepoint flags, in llama.cpp's unicode_cpt_flags bit layout.
inline constexpr uint16_t kUndefined =
    0x001;                                  // unassigned (Cn), or past U+10FFFF
inline constexpr uint16_t kNumber = 0x002;  // \p{N}
inline constexpr uint16_t kLetter = 0x004;  // \p{L}
inline constexpr uint16_t kSeparator = 0x008;    // \p{Z}
inline constexpr uint16_t kAccentMark = 0x010;   // \p{M}
inline constexpr uint16_t kPunctuation = 0x020;  // \p{P}
inline constexpr uint16_t kSymbol = 0x040;       // \p{S}
inline constexpr uint16_t kControl = 0x080;      // \p{C} other than Cn
inline constexpr uint16_t kWhitespace =
    0x100;  // Unicode White_Space (regex \s)

// Flags of `cpt`; kUndefined for codepoints past U+10FFFF.
uint16_t Flags(uint32_t cpt);

// Length of the UTF-8 sequence that `lead` starts, judged by its high nibble
// alone (1 for continuation bytes), as llama.cpp's unicode_len_utf8.
size_t Utf8SeqLen(char lead);

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Decodes UTF-8 as llama.cpp's unicode_cpts_from_utf8: each undecodable byte
// becomes U+FFFD.
std::vector<uint32_t> DecodeUtf8(std::string_view text);

// Appends the UTF-8 encoding of `cpt` (1-4 bytes). Codepoints past U+10FFFF,
// which llama.cpp cannot encode (it throws), are written as U+FFFD.
void AppendUtf8(uint32_t cpt, std::string* out);

// GPT-2 byte-level BPE's reversible byte -> printable codepoint map (0x20 ->
// U+0120 'Ġ', ...), as UTF-8.
const std::string& ByteToUnicode(uint8_t byte);

// Inverse of ByteToUnicode; nullopt if `cpt` is not the image of any byte.
std::optional<uint8_t> UnicodeToByte(uint32_t cpt);

}  // namespace kvd::ops::unicode

#endif  // KVD_OPS_TOKENIZER_UNICODE_H_
