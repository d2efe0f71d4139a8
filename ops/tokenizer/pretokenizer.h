// Pre-tokenizers of byte-level BPE vocabularies: split text into words before
// BPE merges run, exactly as llama.cpp does for each `tokenizer.ggml.pre` type.
//
// llama.cpp gives each pre-tokenizer type a list of regexes applied in turn,
// each to every piece the previous one produced (matches and the text between
// matches both become pieces). Two of them (GPT-2's and Llama 3's) it runs
// through hand-written matchers; the rest through std::regex on text whose
// non-ASCII codepoints are collapsed to one byte per Unicode category. Both are
// reproduced here by hand, without std::regex, from the codepoint flags in
// unicode.h: the hand-written matchers line by line (including their quirks),
// the std::regex ones by working out what ECMAScript's leftmost,
// ordered-alternation matching selects.
//
// Thread-safety: stateless functions; safe from any thread.
//
//   KVD_ASSIGN_OR_RETURN(PreTokenizerInfo pre, LookupPreTokenizer("smollm"));
//   std::vector<uint32_t> cpts = unicode::DecodeUtf8("abc 123");
//   std::vector<size_t> lens = PreTokenize(pre.type, cpts);
//   // lens == {3, 1, 1, 1, 1}: "abc", " ", "1", "2", "3"
#ifndef KVD_OPS_TOKENIZER_PRETOKENIZER_H_
#define KVD_OPS_TOKENIZER_PRETOKENIZER_H_

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvd::ops {

// Groups of llama.cpp's LLAMA_VOCAB_PRE_TYPE_* that share one regex list.
enum class PreTokenizer {
  // LLAMA_VOCAB_PRE_TYPE_DEFAULT: [\p{P}\$\+<=>\^~\|]+, then the GPT-2 regex,
  // then \p{N}+, then
  // [0-9][0-9][0-9].
  kDefault,
  // GPT2, MPT, OLMO, ...: the GPT-2 regex alone.
  kGpt2,
  // LLAMA3, DBRX, SMAUG: the Llama 3 regex (contractions, letters, \p{N}{1,3},
  // ...).
  kLlama3,
  // QWEN2, STABLELM2: like Llama 3 but single digits.
  kQwen2,
  // STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA: every
  // digit on its own
  // (\p{N}), then the GPT-2 regex.
  kDigitsThenGpt2,
};

// What a `tokenizer.ggml.pre` name implies, per llama.cpp's
// llama_vocab::impl::load.
struct PreTokenizerInfo {
  PreTokenizer type = PreTokenizer::kDefault;
  // Whether detokenization removes spaces before punctuation and contractions
  // (tokenizer_clean_spaces).
  bool clean_spaces = true;
  // Whether a word that is itself a token skips the merges
  // (tokenizer_ignore_merges).
  bool ignore_merges = false;
  // Default for add_bos when the file does not say.
  bool add_bos = false;
};

// Maps a `tokenizer.ggml.pre` value to its pre-tokenizer. "" means "default"
// (as llama.cpp, which warns). INVALID_ARGUMENT lists the supported names for
// anything else.
absl::StatusOr<PreTokenizerInfo> LookupPreTokenizer(std::string_view name);

// Splits `cpts` into words; returns their lengths in codepoints, in order, all
// > 0, summing to cpts.size().
std::vector<size_t> PreTokenize(PreTokenizer type,
                                const std::vector<uint32_t>& cpts);

}  // namespace kvd::ops

#endif  // KVD_OPS_TOKENIZER_PRETOKENIZER_H_
