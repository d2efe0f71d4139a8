#include "ops/tokenizer/gguf_tokenizer.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvd::ops {
namespace {

constexpr char kModelKey[] = "tokenizer.ggml.model";
constexpr char kPreKey[] = "tokenizer.ggml.pre";
constexpr char kTokensKey[] = "tokenizer.ggml.tokens";
constexpr char kScoresKey[] = "tokenizer.ggml.scores";
constexpr char kTypesKey[] = "tokenizer.ggml.token_type";
constexpr char kMergesKey[] = "tokenizer.ggml.merges";

// Reads an optional token id; `fallback` (llama.cpp's default) when the key is
// absent, dropped when that default does not fit the vocabulary.
absl::StatusOr<std::optional<int32_t>> ReadId(const GgufFile& file,
                                              const std::string& key,
                                              size_t vocab_size,
                                              std::optional<int32_t> fallback) {
  if (file.Find(key) == nullptr) {
    if (fallback && static_cast<size_t>(*fallback) < vocab_size)
      return fallback;
    return std::optional<int32_t>();
  }
  KVD_ASSIGN_OR_RETURN(uint64_t id, file.GetUint64(key));
  if (id >= vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": ", key, " = ", id,
                     " is outside the vocabulary of ", vocab_size, " tokens"));
  }
  return std::optional<int32_t>(static_cast<int32_t>(id));
}

absl::StatusOr<std::optional<bool>> ReadFlag(const GgufFile& file,
                                             const std::string& key) {
  if (file.Find(key) == nullptr) return std::optional<bool>();
  KVD_ASSIGN_OR_RETURN(bool v, file.GetBool(key));
  return std::optional<bool>(v);
}

}  // namespace

absl::StatusOr<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& file) {
  TokenizerSpec spec;
  KVD_ASSIGN_OR_RETURN(std::string_view model, file.GetString(kModelKey));
  if (model == "gpt2") {
    spec.model = TokenizerModel::kGpt2;
  } else if (model == "llama") {
    spec.model = TokenizerModel::kLlama;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": ", kModelKey, " is '", std::string(model),
                     "'; supported tokenizer models: gpt2, llama"));
  }
  KVD_ASSIGN_OR_RETURN(std::string_view pre, file.GetStringOr(kPreKey, ""));
  spec.pre = std::string(pre);

  KVD_ASSIGN_OR_RETURN(absl::Span<const std::string_view> tokens,
                       file.GetStringArray(kTokensKey));
  spec.tokens.assign(tokens.begin(), tokens.end());
  const size_t n = spec.tokens.size();

  if (const GgufValue* scores = file.Find(kScoresKey); scores != nullptr) {
    // llama.cpp accepts int32 scores as well as float ones.
    if (scores->type() == GgufValueType::kArray &&
        scores->array_type() == GgufValueType::kInt32) {
      KVD_ASSIGN_OR_RETURN(std::vector<int32_t> iscores,
                           file.GetInt32Array(kScoresKey));
      spec.scores.assign(iscores.begin(), iscores.end());
    } else {
      KVD_ASSIGN_OR_RETURN(spec.scores, file.GetFloatArray(kScoresKey));
    }
    if (spec.scores.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": ", kScoresKey, " has ",
                       spec.scores.size(), " entries for ", n, " tokens"));
    }
  }
  if (file.Find(kTypesKey) != nullptr) {
    KVD_ASSIGN_OR_RETURN(spec.token_types, file.GetInt32Array(kTypesKey));
    if (spec.token_types.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": ", kTypesKey, " has ",
                       spec.token_types.size(), " entries for ", n, " tokens"));
    }
  }
  if (spec.model == TokenizerModel::kGpt2) {
    KVD_ASSIGN_OR_RETURN(absl::Span<const std::string_view> merges,
                         file.GetStringArray(kMergesKey));
    spec.merges.assign(merges.begin(), merges.end());
  }

  const bool spm = spec.model == TokenizerModel::kLlama;
  // llama.cpp's defaults for absent ids: llama (SentencePiece) bos 1, eos 2,
  // unk 0; gpt2 bos = eos = 11 (its historical GPT-2 default).
  const std::optional<int32_t> default_bos = spm ? 1 : 11;
  const std::optional<int32_t> default_eos = spm ? 2 : 11;
  const std::optional<int32_t> default_unk =
      spm ? std::optional<int32_t>(0) : std::nullopt;
  KVD_ASSIGN_OR_RETURN(
      spec.bos_id, ReadId(file, "tokenizer.ggml.bos_token_id", n, default_bos));
  KVD_ASSIGN_OR_RETURN(
      spec.eos_id, ReadId(file, "tokenizer.ggml.eos_token_id", n, default_eos));
  KVD_ASSIGN_OR_RETURN(spec.eot_id,
                       ReadId(file, "tokenizer.ggml.eot_token_id", n, {}));
  KVD_ASSIGN_OR_RETURN(spec.eom_id,
                       ReadId(file, "tokenizer.ggml.eom_token_id", n, {}));
  KVD_ASSIGN_OR_RETURN(
      spec.unk_id,
      ReadId(file, "tokenizer.ggml.unknown_token_id", n, default_unk));
  KVD_ASSIGN_OR_RETURN(spec.pad_id,
                       ReadId(file, "tokenizer.ggml.padding_token_id", n, {}));
  KVD_ASSIGN_OR_RETURN(spec.add_bos,
                       ReadFlag(file, "tokenizer.ggml.add_bos_token"));
  KVD_ASSIGN_OR_RETURN(spec.add_eos,
                       ReadFlag(file, "tokenizer.ggml.add_eos_token"));
  KVD_ASSIGN_OR_RETURN(spec.add_space_prefix,
                       ReadFlag(file, "tokenizer.ggml.add_space_prefix"));
  return spec;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromGguf(
    const GgufFile& file) {
  KVD_ASSIGN_OR_RETURN(TokenizerSpec spec, TokenizerSpecFromGguf(file));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::Create(std::move(spec));
  if (!tok.ok()) {
    return absl::Status(tok.status().code(),
                        absl::StrCat(file.path(), ": tokenizer.ggml.*: ",
                                     tok.status().message()));
  }
  return tok;
}

}  // namespace kvd::ops
