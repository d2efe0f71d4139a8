// Builds a Tokenizer from a GGUF file's tokenizer.ggml.* metadata, as
// llama.cpp's llama_vocab::load reads it.
//
// Keys read: tokenizer.ggml.model ("gpt2" or "llama"), .pre, .tokens, .scores
// (float or int32 array), .token_type, .merges (required for gpt2),
// .bos_token_id, .eos_token_id, .eot_token_id, .eom_token_id,
// .unknown_token_id, .padding_token_id, .add_bos_token, .add_eos_token,
// .add_space_prefix. Absent ids take llama.cpp's defaults for the model (llama:
// bos 1, eos 2, unk 0; gpt2: bos = eos = 11), dropped when outside the
// vocabulary. An id the file states outside the vocabulary is an error
// (llama.cpp warns and keeps its default).
//
// Errors are INVALID_ARGUMENT (NOT_FOUND for a missing required key) and name
// the file and the key or token at fault.
//
// Thread-safety: reads `file` only; the returned Tokenizer owns copies of
// everything it needs and does not refer to `file` afterwards.
//
//   KVD_ASSIGN_OR_RETURN(auto file, GgufFile::Open(path));
//   KVD_ASSIGN_OR_RETURN(auto tok, TokenizerFromGguf(*file));
#ifndef KVD_OPS_TOKENIZER_GGUF_TOKENIZER_H_
#define KVD_OPS_TOKENIZER_GGUF_TOKENIZER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "ops/gguf/gguf_file.h"
#include "ops/tokenizer/tokenizer.h"

namespace kvd::ops {

// The format-independent description of `file`'s vocabulary.
absl::StatusOr<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& file);

absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromGguf(
    const GgufFile& file);

}  // namespace kvd::ops

#endif  // KVD_OPS_TOKENIZER_GGUF_TOKENIZER_H_
