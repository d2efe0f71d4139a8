// The two merge loops behind Tokenizer::Encode, ported from llama.cpp's
// llm_tokenizer_bpe_session and llm_tokenizer_spm_session with the same
// priority orders and tie-breaks, so that equal ranks/scores resolve exactly as
// there.
#include <queue>
#include <string>
#include <vector>

#include "ops/tokenizer/pretokenizer.h"
#include "ops/tokenizer/tokenizer.h"
#include "ops/tokenizer/unicode.h"

namespace kvd::ops {
namespace {

// A run of bytes in a doubly linked list of symbols; merging grows the left
// symbol and empties the right one (n = 0).
struct Symbol {
  int32_t prev;
  int32_t next;
  size_t offset;  // into the text being merged
  size_t n;       // bytes
  int32_t id;     // BPE only: token id of the symbol's text, or -1
};

// Splits `text` into one symbol per UTF-8 character, judging lengths by lead
// bytes only.
void SplitChars(std::string_view text, std::vector<Symbol>* symbols) {
  symbols->clear();
  int32_t index = 0;
  size_t offset = 0;
  while (offset < text.size()) {
    const size_t len =
        std::min(unicode::Utf8SeqLen(text[offset]), text.size() - offset);
    Symbol s;
    s.offset = offset;
    s.n = len;
    offset += len;
    s.prev = index - 1;
    s.next = offset == text.size() ? -1 : index + 1;
    s.id = -1;
    ++index;
    symbols->push_back(s);
  }
}

void MergeInto(std::vector<Symbol>& symbols, int32_t left, int32_t right) {
  Symbol& l = symbols[left];
  Symbol& r = symbols[right];
  l.n += r.n;
  r.n = 0;
  l.next = r.next;
  if (r.next >= 0) symbols[r.next].prev = left;
}

struct BpeBigram {
  int32_t left;
  int32_t right;
  int32_t rank;
  int32_t result;
  size_t size;
};

// Lowest rank first, then leftmost (llm_bigram_bpe::comparator).
struct BpeOrder {
  bool operator()(const BpeBigram& l, const BpeBigram& r) const {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  }
};

struct SpmBigram {
  int32_t left;
  int32_t right;
  float score;
  size_t size;
};

// Highest score first, then leftmost (llm_bigram_spm::comparator).
struct SpmOrder {
  bool operator()(const SpmBigram& l, const SpmBigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

}  // namespace

void Tokenizer::EncodeBpe(std::string_view text,
                          std::vector<int32_t>* out) const {
  const std::vector<uint32_t> cpts = unicode::DecodeUtf8(text);
  const std::vector<size_t> lens = PreTokenize(pre_.type, cpts);

  std::vector<Symbol> symbols;
  std::priority_queue<BpeBigram, std::vector<BpeBigram>, BpeOrder> queue;
  std::string word;
  std::string utf8;
  size_t start = 0;
  for (size_t len : lens) {
    // The word's UTF-8 bytes in GPT-2's printable byte encoding.
    word.clear();
    for (size_t i = start; i < start + len; ++i) {
      utf8.clear();
      unicode::AppendUtf8(cpts[i], &utf8);
      for (char c : utf8)
        word += unicode::ByteToUnicode(static_cast<uint8_t>(c));
    }
    start += len;

    const int32_t whole = pre_.ignore_merges ? Lookup(word) : -1;
    if (whole >= 0) {
      out->push_back(whole);
      continue;
    }
    SplitChars(word, &symbols);
    for (Symbol& s : symbols)
      s.id = Lookup(std::string_view(word).substr(s.offset, s.n));

    auto add_bigram = [&](int32_t left, int32_t right) {
      if (left < 0 || right < 0) return;
      const Symbol& l = symbols[left];
      const Symbol& r = symbols[right];
      if (l.id < 0 || r.id < 0)
        return;  // every merge half is a token (checked in Create)
      const uint64_t key =
          (static_cast<uint64_t>(l.id) << 32) | static_cast<uint32_t>(r.id);
      auto it = merges_.find(key);
      if (it == merges_.end()) return;
      queue.push({left, right, it->second.rank, it->second.result, l.n + r.n});
    };
    for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i)
      add_bigram(i - 1, i);

    while (!queue.empty()) {
      const BpeBigram b = queue.top();
      queue.pop();
      Symbol& l = symbols[b.left];
      const Symbol& r = symbols[b.right];
      // Stale if either side changed since the pair was queued (llama.cpp
      // compares the texts; with fixed start offsets, equal total length is the
      // same test).
      if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
      MergeInto(symbols, b.left, b.right);
      l.id = b.result;
      add_bigram(l.prev, b.left);
      add_bigram(b.left, l.next);
    }

    for (int32_t i = 0; i != -1 && !symbols.empty(); i = symbols[i].next) {
      const Symbol& s = symbols[i];
      if (s.id >= 0) {
        out->push_back(s.id);
        continue;
      }
      // No token for this text: its single bytes, where those are tokens.
      for (size_t k = 0; k < s.n; ++k) {
        const int32_t id =
            Lookup(std::string_view(word).substr(s.offset + k, 1));
        if (id >= 0) out->push_back(id);
      }
    }
  }
}

void Tokenizer::EncodeSpm(std::string_view text,
                          std::vector<int32_t>* out) const {
  std::vector<Symbol> symbols;
  SplitChars(text, &symbols);
  if (symbols.empty()) return;
  std::priority_queue<SpmBigram, std::vector<SpmBigram>, SpmOrder> queue;

  auto try_add_bigram = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const size_t size = l.n + symbols[right].n;
    const int32_t id = Lookup(text.substr(l.offset, size));
    if (id < 0) return;
    queue.push({left, right, scores_[id], size});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i)
    try_add_bigram(i - 1, i);

  while (!queue.empty()) {
    const SpmBigram b = queue.top();
    queue.pop();
    const Symbol& l = symbols[b.left];
    const Symbol& r = symbols[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
    MergeInto(symbols, b.left, b.right);
    try_add_bigram(symbols[b.left].prev, b.left);
    try_add_bigram(b.left, symbols[b.left].next);
  }

  // Every merged symbol is a token, so llama.cpp's resegment() reduces to: the
  // symbol's token, or else its bytes as byte tokens.
  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    const int32_t id = Lookup(text.substr(s.offset, s.n));
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (size_t k = 0; k < s.n; ++k) {
      const int32_t byte_id =
          byte_tokens_[static_cast<uint8_t>(text[s.offset + k])];
      // llama.cpp throws when a vocabulary lacks a byte token; kvd falls back
      // to <unk>.
      if (byte_id >= 0) {
        out->push_back(byte_id);
      } else if (unk_) {
        out->push_back(*unk_);
      }
    }
  }
}

}  // namespace kvd::ops
