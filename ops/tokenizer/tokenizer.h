// Text <-> token ids for the vocabularies kvd serves, bit-exact to llama.cpp's
// llama_tokenize, llama_token_to_piece and llama_detokenize.
//
// Two models:
//  - "gpt2": byte-level BPE (SmolLM2, Llama 3, Qwen2, ...). The pre-tokenizer
//    named in TokenizerSpec::pre (pretokenizer.h) splits text into words, each
//    word's UTF-8 bytes are mapped to printable codepoints (GPT-2's
//    bytes_to_unicode), and merges apply lowest rank first.
//  - "llama": SentencePiece-style BPE with scores (Llama 2, Gemma). Spaces
//    become U+2581, the highest-scoring adjacent pair that forms a token
//    merges until none does, and characters left without a token fall back
//    to <0xAB> byte tokens.
// In both, special tokens (control, user-defined and unknown types) are cut
// out of the text first, longest first, as llama.cpp does; control and
// unknown ones only when parse_special.
//
// TokenizerSpec is independent of the file format; gguf_tokenizer.h fills it
// from a GGUF file. Create() validates it (ids in range, merges made of
// existing tokens, unique token texts, ...) and applies llama.cpp's load-time
// fix-ups (tokens such as <|im_end|> that end a turn become control tokens;
// control tokens named "unused" are marked unused) so behaviour matches.
//
// Thread-safety: immutable after Create(); every const method may be called
// concurrently.
//
//   KVD_ASSIGN_OR_RETURN(auto tok, Tokenizer::Create(std::move(spec)));
//   std::vector<int32_t> ids =
//       tok->Encode(prompt, /*add_special=*/true, /*parse_special=*/true);
//   std::string text = tok->Decode(ids);
//   bool done = tok->IsEog(sampled_id);
#ifndef KVD_OPS_TOKENIZER_TOKENIZER_H_
#define KVD_OPS_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "ops/tokenizer/pretokenizer.h"

namespace kvd::ops {

enum class TokenizerModel {
  kGpt2,   // byte-level BPE with merges ("gpt2")
  kLlama,  // SentencePiece-style BPE with scores ("llama")
};

// Token types, with GGUF's tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Everything that defines a vocabulary, whatever file it came from.
struct TokenizerSpec {
  TokenizerModel model = TokenizerModel::kGpt2;
  // Pre-tokenizer name (GGUF tokenizer.ggml.pre): "smollm",
  // "llama3"/"llama-bpe", "gpt-2", "qwen2", "default", ... ("" = "default").
  // Used by kGpt2 only.
  std::string pre;
  // Token texts, indexed by id. For kGpt2 in byte-encoded form ("Ġthe"); for
  // kLlama with U+2581 for spaces and "<0x0A>" for byte tokens. An empty text
  // is renamed "[EMPTY_<id>]" (as llama.cpp does); duplicates are an error.
  std::vector<std::string> tokens;
  // Merge priorities of kLlama (higher merges first); empty means all 0. Else
  // tokens.size().
  std::vector<float> scores;
  // TokenType values; empty means all kNormal. Else tokens.size().
  std::vector<int32_t> token_types;
  // kGpt2 merges, "left right", rank = index. Both halves must be tokens.
  std::vector<std::string> merges;
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
  std::optional<int32_t> eot_id;  // end of turn, if the file names one
  std::optional<int32_t> eom_id;  // end of message, if the file names one
  std::optional<int32_t> unk_id;
  std::optional<int32_t> pad_id;
  // Unset fields take llama.cpp's defaults: add_bos is true for kLlama and for
  // the Llama 3 pre-tokenizers, add_eos is false, add_space_prefix is true for
  // kLlama only.
  std::optional<bool> add_bos;
  std::optional<bool> add_eos;
  std::optional<bool> add_space_prefix;
};

class Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerSpec spec);

  // Token ids of `text`. add_special adds BOS/EOS where the vocabulary asks for
  // them; parse_special lets control tokens written in the text
  // ("<|im_start|>") become those tokens (user-defined tokens are always
  // matched). Invalid UTF-8 is tokenized as llama.cpp does.
  std::vector<int32_t> Encode(std::string_view text, bool add_special,
                              bool parse_special) const;

  // kvd's one rule for prompt text, raw or rendered by a chat template, on
  // every path (kvd generate and chat, /v1/completions and chat, gRPC):
  // control tokens written in the text are parsed, as llama.cpp's server
  // and vLLM (Hugging Face tokenizers) do, so the same text gives the same
  // tokens everywhere and a raw prompt can carry a hand-written template.
  // `first`: the start of a sequence (BOS where the vocabulary asks for it).
  std::vector<int32_t> EncodePrompt(std::string_view text, bool first) const {
    return Encode(text, /*add_special=*/first, /*parse_special=*/true);
  }

  // The bytes of one token, as llama_token_to_piece(vocab, id, buf, len,
  // /*lstrip=*/0, special): control and unknown tokens give their text only
  // when `special`, else "". Out-of-range ids give "".
  std::string TokenToPiece(int32_t id, bool special = false) const;

  // Concatenated pieces, as llama_detokenize(..., remove_special=false,
  // unparse_special=special): with add_space_prefix the first piece loses one
  // leading space, and vocabularies with clean_spaces drop the space before
  // punctuation and some contractions.
  std::string Decode(const std::vector<int32_t>& ids,
                     bool special = false) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  TokenizerModel model() const { return model_; }
  std::optional<int32_t> bos() const { return bos_; }
  std::optional<int32_t> eos() const { return eos_; }
  std::optional<int32_t> unk() const { return unk_; }
  std::optional<int32_t> pad() const { return pad_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }

  // End of generation: EOS, end-of-turn tokens found by text (<|im_end|>,
  // <end_of_turn>, <|eot_id|>, <|endoftext|>, ...) and the others that
  // llama.cpp's llama_vocab_is_eog accepts.
  bool IsEog(int32_t id) const { return eog_ids_.contains(id); }
  const std::vector<int32_t>& eog_ids() const { return eog_ids_sorted_; }

  // The id whose text is exactly `text` (in vocabulary form: "Ġ"/U+2581 for
  // spaces).
  std::optional<int32_t> FindToken(std::string_view text) const;
  // The stored text of `id` ("" if out of range).
  std::string_view TokenText(int32_t id) const;
  // Control tokens (after llama.cpp's fix-ups), e.g. <|im_start|>.
  bool IsControl(int32_t id) const;

  // Attribute bits, llama.cpp's llama_token_attr.
  enum Attr : uint32_t {
    kAttrUnknown = 1u << 0,
    kAttrUnused = 1u << 1,
    kAttrNormal = 1u << 2,
    kAttrControl = 1u << 3,
    kAttrUserDefined = 1u << 4,
    kAttrByte = 1u << 5,
  };

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  // id of left+right, or -1 if that text is not a token
  };

  Tokenizer() = default;
  absl::Status Init(TokenizerSpec spec);
  absl::Status InitMerges(const std::vector<std::string>& merges);
  void ApplyLoadFixups();
  void BuildSpecialTokens();

  // Appends the ids of a run of text with no special tokens in it.
  void EncodeBpe(std::string_view text, std::vector<int32_t>* out) const;
  void EncodeSpm(std::string_view text, std::vector<int32_t>* out) const;
  int32_t Lookup(std::string_view text) const;  // -1 if absent
  std::string ComputePiece(int32_t id) const;

  TokenizerModel model_ = TokenizerModel::kGpt2;
  PreTokenizerInfo pre_;
  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<uint32_t> attrs_;
  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  // kGpt2: (left id << 32 | right id) -> merge.
  absl::flat_hash_map<uint64_t, Merge> merges_;
  // Special tokens, longest text first (ties by id), and a byte trie over their
  // texts used to skip the ones that do not occur in a text at all.
  std::vector<int32_t> special_ids_;
  std::vector<int32_t>
      byte_tokens_;  // kLlama: byte -> id of <0xAB> (or the 1-byte token)
  struct TrieNode {
    int32_t token = -1;  // special token ending here
  };
  std::vector<TrieNode> trie_nodes_;
  absl::flat_hash_map<uint64_t, int32_t>
      trie_edges_;                   // (node << 8 | byte) -> child node
  std::vector<std::string> pieces_;  // TokenToPiece(id, special=true)
  absl::flat_hash_set<int32_t> eog_ids_;
  std::vector<int32_t> eog_ids_sorted_;
  std::optional<int32_t> bos_, eos_, eot_, eom_, unk_, pad_;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_TOKENIZER_TOKENIZER_H_
