#include "ops/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "base/status_macros.h"
#include "ops/tokenizer/unicode.h"

namespace kvd::ops {
namespace {

constexpr uint32_t kAttrSpecial =
    Tokenizer::kAttrUnknown | Tokenizer::kAttrControl;
constexpr char kSpmSpace[] =
    "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

// Debian's Abseil has its own string_view type.
absl::string_view AsAbsl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

uint32_t AttrFromType(int32_t type) {
  switch (static_cast<TokenType>(type)) {
    case TokenType::kNormal:
      return Tokenizer::kAttrNormal;
    case TokenType::kUnknown:
      return Tokenizer::kAttrUnknown;
    case TokenType::kControl:
      return Tokenizer::kAttrControl;
    case TokenType::kUserDefined:
      return Tokenizer::kAttrUserDefined;
    case TokenType::kUnused:
      return Tokenizer::kAttrUnused;
    case TokenType::kByte:
      return Tokenizer::kAttrByte;
    case TokenType::kUndefined:
      break;
  }
  return 0;
}

// Parses a byte token's "<0xAB>" text, as llama.cpp's token_to_byte (which
// reads the two hex digits at offset 3).
std::optional<uint8_t> ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>')
    return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(text[3]);
  const int lo = hex(text[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

// Token texts llama.cpp's llama_vocab::impl::load recognises
// (src/llama-vocab.cpp). Lists other than kEogTexts name one role each;
// llama.cpp takes the first hit in hash-map order, kvd the lowest id.
const char* const kEotTexts[] = {"<|eot_id|>",
                                 "<|im_end|>",
                                 "<|end|>",
                                 "<end_of_turn>",
                                 "<|endoftext|>",
                                 "<|end_of_text|>",
                                 "<EOT>",
                                 "_<EOT>",
                                 "[EOT]",
                                 "<｜end▁of▁sentence｜>",
                                 "<end_of_utterance>"};
const char* const kEomTexts[] = {"<|eom_id|>"};
const char* const kFimPreTexts[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",    "<｜fim▁begin｜>",
    "<PRE>",          "▁<PRE>",       "<|code_prefix|>", "<|prefix|>"};
const char* const kFimSufTexts[] = {
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",    "<｜fim▁hole｜>",
    "<SUF>",          "▁<SUF>",       "<|code_suffix|>", "<|suffix|>"};
const char* const kFimMidTexts[] = {
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>",    "<｜fim▁end｜>",
    "<MID>",          "▁<MID>",       "<|code_middle|>", "<|middle|>"};
const char* const kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>",
                                    "<PAD>", "[PAD]"};
const char* const kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>",
                                    "<fim-repo>", "<REPO>", "<reponame>"};
const char* const kFimSepTexts[] = {"<|file_sep|>"};
const char* const kEogTexts[] = {"<|eot_id|>",
                                 "<|im_end|>",
                                 "<|end|>",
                                 "<|return|>",
                                 "<|call|>",
                                 "<|flush|>",
                                 "<|calls|>",
                                 "<end_of_turn>",
                                 "<|endoftext|>",
                                 "</s>",
                                 "<|eom_id|>",
                                 "<EOT>",
                                 "_<EOT>",
                                 "[EOT]",
                                 "[EOS]",
                                 "<|end_of_text|>",
                                 "<end_of_utterance>",
                                 "<eos>",
                                 "<turn|>",
                                 "<|tool_response>",
                                 "<｜end▁of▁sentence｜>",
                                 "[e~["};
const char* const kAlwaysRenderedTexts[] = {"<|channel|>", "<|message|>",
                                            "<|start|>", "<|constrain|>"};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(
    TokenizerSpec spec) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  KVD_RETURN_IF_ERROR(tok->Init(std::move(spec)));
  return tok;
}

absl::Status Tokenizer::Init(TokenizerSpec spec) {
  model_ = spec.model;
  if (model_ == TokenizerModel::kGpt2) {
    KVD_ASSIGN_OR_RETURN(pre_, LookupPreTokenizer(spec.pre));
  } else {
    pre_ = PreTokenizerInfo{PreTokenizer::kDefault, /*clean_spaces=*/false,
                            /*ignore_merges=*/false, /*add_bos=*/true};
  }
  const size_t n = spec.tokens.size();
  if (n == 0) return absl::InvalidArgumentError("tokenizer has no tokens");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer has too many tokens: ", n));
  }
  if (!spec.scores.empty() && spec.scores.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer has ", spec.scores.size(), " scores for ", n, " tokens"));
  }
  if (!spec.token_types.empty() && spec.token_types.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer has ", spec.token_types.size(),
                     " token types for ", n, " tokens"));
  }

  tokens_ = std::move(spec.tokens);
  scores_ = std::move(spec.scores);
  if (scores_.empty()) scores_.assign(n, 0.0f);
  attrs_.assign(n, kAttrNormal);
  token_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (tokens_[i].empty()) tokens_[i] = absl::StrCat("[EMPTY_", i, "]");
    auto [it, inserted] =
        token_to_id_.emplace(tokens_[i], static_cast<int32_t>(i));
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrFormat("duplicate token '%s': ids %d and %d",
                          absl::CHexEscape(tokens_[i]), it->second, i));
    }
    if (!spec.token_types.empty()) {
      const int32_t type = spec.token_types[i];
      if (type < 0 || type > static_cast<int32_t>(TokenType::kByte)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "token %d has invalid type %d (expected 0..6)", i, type));
      }
      attrs_[i] = AttrFromType(type);
      if ((attrs_[i] & kAttrByte) && !ParseByteToken(tokens_[i])) {
        return absl::InvalidArgumentError(
            absl::StrFormat("byte token %d is '%s', expected the form <0xAB>",
                            i, absl::CHexEscape(tokens_[i])));
      }
    }
  }

  const std::pair<const char*, std::optional<int32_t>*> ids[] = {
      {"bos", &spec.bos_id}, {"eos", &spec.eos_id}, {"eot", &spec.eot_id},
      {"eom", &spec.eom_id}, {"unk", &spec.unk_id}, {"pad", &spec.pad_id}};
  for (const auto& [name, id] : ids) {
    if (id->has_value() && (**id < 0 || static_cast<size_t>(**id) >= n)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s token id %d is out of range for a vocabulary of %d tokens", name,
          **id, n));
    }
  }
  bos_ = spec.bos_id;
  eos_ = spec.eos_id;
  eot_ = spec.eot_id;
  eom_ = spec.eom_id;
  unk_ = spec.unk_id;
  pad_ = spec.pad_id;
  add_bos_ = spec.add_bos.value_or(pre_.add_bos);
  add_eos_ = spec.add_eos.value_or(false);
  add_space_prefix_ =
      spec.add_space_prefix.value_or(model_ == TokenizerModel::kLlama);
  if (add_bos_ && !bos_) {
    return absl::InvalidArgumentError(
        "add_bos is set but the vocabulary names no BOS token");
  }
  if (add_eos_ && !eos_) {
    return absl::InvalidArgumentError(
        "add_eos is set but the vocabulary names no EOS token");
  }

  if (model_ == TokenizerModel::kGpt2) {
    KVD_RETURN_IF_ERROR(InitMerges(spec.merges));
  } else {
    byte_tokens_.assign(256, -1);
    for (int b = 0; b < 256; ++b) {
      int32_t id = Lookup(absl::StrFormat("<0x%02X>", b));
      if (id < 0) id = Lookup(std::string(1, static_cast<char>(b)));
      byte_tokens_[b] = id;
    }
  }

  ApplyLoadFixups();
  BuildSpecialTokens();
  pieces_.resize(n);
  for (size_t i = 0; i < n; ++i)
    pieces_[i] = ComputePiece(static_cast<int32_t>(i));
  return absl::OkStatus();
}

absl::Status Tokenizer::InitMerges(const std::vector<std::string>& merges) {
  merges_.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& m = merges[rank];
    // llama.cpp splits at the first space after the first byte, so a merge may
    // start with ' '.
    const size_t pos = m.find(' ', 1);
    if (pos == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrFormat("merge %d '%s' is not of the form 'left right'", rank,
                          absl::CHexEscape(m)));
    }
    const std::string_view left = std::string_view(m).substr(0, pos);
    const std::string_view right = std::string_view(m).substr(pos + 1);
    const int32_t left_id = Lookup(left);
    const int32_t right_id = Lookup(right);
    if (left_id < 0 || right_id < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "merge %d '%s' refers to '%s', which is not a token", rank,
          absl::CHexEscape(m),
          absl::CHexEscape(AsAbsl(left_id < 0 ? left : right))));
    }
    joined.assign(left);
    joined.append(right);
    const uint64_t key = (static_cast<uint64_t>(left_id) << 32) |
                         static_cast<uint32_t>(right_id);
    // The first occurrence of a pair keeps its rank, as llama.cpp's
    // bpe_ranks.emplace.
    merges_.emplace(key, Merge{static_cast<int32_t>(rank), Lookup(joined)});
  }
  return absl::OkStatus();
}

void Tokenizer::ApplyLoadFixups() {
  auto make_control = [&](int32_t id) { attrs_[id] |= kAttrControl; };
  auto find_first = [&](const auto& texts) -> int32_t {
    int32_t best = -1;
    for (const char* t : texts) {
      const int32_t id = Lookup(t);
      if (id >= 0 && (best < 0 || id < best)) best = id;
    }
    return best;
  };
  // Tokens found by text for roles the file did not name become control tokens.
  if (!eot_) {
    for (const char* t : kEotTexts) {
      if (const int32_t id = Lookup(t); id >= 0) make_control(id);
    }
    if (const int32_t id = find_first(kEotTexts); id >= 0) eot_ = id;
  }
  if (!eom_) {
    if (const int32_t id = find_first(kEomTexts); id >= 0) {
      eom_ = id;
      make_control(id);
    }
  }
  for (const auto* texts : {&kFimPreTexts, &kFimSufTexts, &kFimMidTexts}) {
    if (const int32_t id = find_first(*texts); id >= 0) make_control(id);
  }
  std::vector<int32_t> fim_eog;
  auto add_fim = [&](const auto& texts) {
    if (const int32_t id = find_first(texts); id >= 0) {
      make_control(id);
      fim_eog.push_back(id);
    }
  };
  add_fim(kFimPadTexts);
  add_fim(kFimRepTexts);
  add_fim(kFimSepTexts);

  // Control tokens named "unused" are unused (llama.cpp does this before the
  // EOG pass below).
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if ((attrs_[i] & kAttrControl) &&
        tokens_[i].find("unused") != std::string::npos) {
      attrs_[i] |= kAttrUnused;
    }
  }

  eog_ids_.insert(fim_eog.begin(), fim_eog.end());
  for (const char* t : kEogTexts) {
    if (const int32_t id = Lookup(t); id >= 0) {
      eog_ids_.insert(id);
      make_control(id);
    }
  }
  for (const char* t : kAlwaysRenderedTexts) {
    if (const int32_t id = Lookup(t); id >= 0) attrs_[id] = kAttrUserDefined;
  }
  for (const std::optional<int32_t>& id : {eos_, eot_, eom_}) {
    if (id) eog_ids_.insert(*id);
  }
  // gpt-oss / solar-open: "<|end|>" ends a message there, not the generation.
  auto eog_has = [&](const char* text) {
    const int32_t id = Lookup(text);
    return id >= 0 && eog_ids_.contains(id);
  };
  const bool has_call = eog_has("<|call|>") || eog_has("<|calls|>");
  if (eog_has("<|end|>") && has_call &&
      (eog_has("<|return|>") || eog_has("<|flush|>"))) {
    const int32_t end_id = Lookup("<|end|>");
    eog_ids_.erase(end_id);
    attrs_[end_id] = kAttrUserDefined;
  }
  // gemma4 / paddleocr: "</s>" is text there.
  if (eog_has("<|tool_response>") && eog_has("</s>")) {
    const int32_t s_id = Lookup("</s>");
    eog_ids_.erase(s_id);
    attrs_[s_id] = kAttrNormal;
  }
  eog_ids_sorted_.assign(eog_ids_.begin(), eog_ids_.end());
  std::sort(eog_ids_sorted_.begin(), eog_ids_sorted_.end());
}

void Tokenizer::BuildSpecialTokens() {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (attrs_[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      special_ids_.push_back(static_cast<int32_t>(i));
    }
  }
  // Longest first, as llama.cpp's cache_special_tokens (which leaves ties
  // unordered).
  std::stable_sort(special_ids_.begin(), special_ids_.end(),
                   [&](int32_t a, int32_t b) {
                     return tokens_[a].size() > tokens_[b].size();
                   });
  trie_nodes_.assign(1, TrieNode{});
  for (size_t rank = 0; rank < special_ids_.size(); ++rank) {
    int32_t node = 0;
    for (char c : tokens_[special_ids_[rank]]) {
      const uint64_t key =
          (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
      auto [it, inserted] =
          trie_edges_.emplace(key, static_cast<int32_t>(trie_nodes_.size()));
      if (inserted) trie_nodes_.push_back(TrieNode{});
      node = it->second;
    }
    trie_nodes_[node].token = static_cast<int32_t>(rank);
  }
}

int32_t Tokenizer::Lookup(std::string_view text) const {
  auto it = token_to_id_.find(AsAbsl(text));
  return it == token_to_id_.end() ? -1 : it->second;
}

std::optional<int32_t> Tokenizer::FindToken(std::string_view text) const {
  const int32_t id = Lookup(text);
  if (id < 0) return std::nullopt;
  return id;
}

std::string_view Tokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return tokens_[id];
}

bool Tokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < vocab_size() && (attrs_[id] & kAttrControl);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  // Cut special tokens out of the text: for each special token, longest first,
  // split every remaining text fragment at each of its occurrences (llama.cpp's
  // tokenizer_st_partition).
  struct Fragment {
    int32_t token;  // -1 for text
    size_t offset;
    size_t length;
  };
  std::vector<Fragment> frags;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});

  // Which special tokens occur at all; the rest cannot split anything.
  std::vector<int32_t> present;  // ranks in special_ids_
  if (special_ids_.size() > 0) {
    for (size_t i = 0; i < text.size(); ++i) {
      int32_t node = 0;
      for (size_t j = i; j < text.size(); ++j) {
        const uint64_t key =
            (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[j]);
        auto it = trie_edges_.find(key);
        if (it == trie_edges_.end()) break;
        node = it->second;
        if (trie_nodes_[node].token >= 0)
          present.push_back(trie_nodes_[node].token);
      }
    }
    std::sort(present.begin(), present.end());
    present.erase(std::unique(present.begin(), present.end()), present.end());
  }

  std::vector<Fragment> next;
  for (int32_t rank : present) {
    const int32_t special = special_ids_[rank];
    if (!parse_special && (attrs_[special] & kAttrSpecial)) continue;
    const std::string_view needle = tokens_[special];
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t base = f.offset;
      size_t len = f.length;
      while (len > 0) {
        const size_t match = text.substr(0, base + len).find(needle, base);
        if (match == std::string_view::npos) break;
        if (match > base) next.push_back({-1, base, match - base});
        next.push_back({special, 0, 0});
        const size_t right = match + needle.size();
        len = base + len - right;
        base = right;
      }
      if (len > 0) next.push_back({-1, base, len});
    }
    frags.swap(next);
  }

  std::vector<int32_t> out;
  if (add_special && add_bos_) out.push_back(*bos_);
  // SentencePiece prefixes a space to text at the start and after specials.
  bool prev_special = true;
  std::string buf;
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    const std::string_view piece = text.substr(f.offset, f.length);
    if (model_ == TokenizerModel::kGpt2) {
      EncodeBpe(piece, &out);
    } else {
      buf.clear();
      if (add_space_prefix_ && prev_special) buf.push_back(' ');
      buf.append(piece);
      EncodeSpm(absl::StrReplaceAll(buf, {{" ", kSpmSpace}}), &out);
    }
    prev_special = false;
  }
  if (add_special && add_eos_) out.push_back(*eos_);
  return out;
}

std::string Tokenizer::ComputePiece(int32_t id) const {
  const uint32_t attr = attrs_[id];
  const std::string& text = tokens_[id];
  if (attr & (kAttrSpecial | kAttrUserDefined)) return text;
  if (attr & kAttrNormal) {
    if (model_ == TokenizerModel::kLlama)
      return absl::StrReplaceAll(text, {{kSpmSpace, " "}});
    // Undo the byte-level encoding (llama.cpp's llama_decode_text), codepoint
    // by codepoint.
    std::string out;
    std::string utf8;
    for (uint32_t cpt : unicode::DecodeUtf8(text)) {
      if (std::optional<uint8_t> b = unicode::UnicodeToByte(cpt)) {
        out.push_back(static_cast<char>(*b));
        continue;
      }
      utf8.clear();
      unicode::AppendUtf8(cpt, &utf8);
      out += "[UNK_BYTE_0x";
      for (char c : utf8)
        absl::StrAppendFormat(&out, "%02x", static_cast<uint8_t>(c));
      out += text + "]";
    }
    return out;
  }
  if (attr & kAttrByte)
    return std::string(1, static_cast<char>(*ParseByteToken(text)));
  return "";
}

std::string Tokenizer::TokenToPiece(int32_t id, bool special) const {
  if (id < 0 || id >= vocab_size()) return "";
  if (!special && (attrs_[id] & kAttrSpecial)) return "";
  return pieces_[id];
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids,
                              bool special) const {
  std::string text;
  bool remove_space = add_space_prefix_;
  for (int32_t id : ids) {
    std::string piece = TokenToPiece(id, special);
    if (remove_space && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    remove_space = false;
    text += piece;
  }
  if (!pre_.clean_spaces || model_ != TokenizerModel::kGpt2) return text;

  // A literal port of llama_detokenize's three clean-up passes, which edit the
  // buffer in place (including the '\0' the second pass writes), so that the
  // output matches byte for byte.
  std::string& t = text;
  const int32_t total1 = static_cast<int32_t>(t.size());
  int32_t total = total1 ? 1 : 0;
  for (int32_t i = 1; i < total1; ++i) {  // " ?", " !", " .", " ,"
    const char x = t[i];
    if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','))
      --total;
    t[total++] = x;
  }
  const int32_t total2 = total;
  total = total ? 1 : 0;
  for (int32_t i = 1; i < total2; ++i) {  // " ' "
    const char x = t[i];
    if (x == '\'' && i + 1 < total2 && t[i - 1] == ' ' && t[i + 1] == ' ') {
      --total;
      t[++i] = '\0';
    }
    t[total++] = x;
  }
  const int32_t total3 = total;
  total = total ? 1 : 0;
  for (int32_t i = 1; i < total3; ++i) {  // " 's", " 'm", " 're", " 've"
    const char x = t[i];
    if (t[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
      const char x1 = t[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --total;
      } else if (x1 != 't' && x1 != 'd' && i + 2 < total3) {
        const char x2 = t[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
      }
    }
    t[total++] = x;
  }
  t.resize(total);
  return text;
}

}  // namespace kvd::ops
