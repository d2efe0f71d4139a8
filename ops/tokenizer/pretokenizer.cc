#include "ops/tokenizer/pretokenizer.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ops/tokenizer/unicode.h"

namespace kvd::ops {
namespace {

using unicode::Flags;

constexpr uint32_t kOutOfRange = 0xFFFFFFFF;

// One piece of the text being split: codepoints [begin, end) of `cpts`. Lookups
// outside the piece see kOutOfRange and no flags, as llama.cpp's
// _get_cpt/_get_flags do.
class Piece {
 public:
  Piece(const std::vector<uint32_t>& cpts, size_t begin, size_t end,
        std::vector<size_t>* out)
      : cpts_(cpts), begin_(begin), end_(end), prev_end_(begin), out_(out) {}

  size_t begin() const { return begin_; }
  size_t end() const { return end_; }
  uint32_t Cpt(size_t pos) const {
    return pos >= begin_ && pos < end_ ? cpts_[pos] : kOutOfRange;
  }
  uint16_t Fl(size_t pos) const {
    return pos >= begin_ && pos < end_ ? Flags(cpts_[pos]) : 0;
  }

  // Closes the word ending at `end` (if non-empty); returns its length.
  size_t AddToken(size_t end) {
    const size_t len = end - prev_end_;
    if (len > 0) out_->push_back(len);
    prev_end_ = end;
    return len;
  }

 private:
  const std::vector<uint32_t>& cpts_;
  size_t begin_;
  size_t end_;
  size_t prev_end_;
  std::vector<size_t>* out_;
};

bool IsLetter(uint16_t f) { return f & unicode::kLetter; }
bool IsNumber(uint16_t f) { return f & unicode::kNumber; }
bool IsSpace(uint16_t f) { return f & unicode::kWhitespace; }
// [^\s\p{L}\p{N}] as llama.cpp's matchers test it: a real codepoint (flags !=
// 0) outside the three classes.
bool IsOther(uint16_t f) {
  return !(f & (unicode::kWhitespace | unicode::kLetter | unicode::kNumber)) &&
         f != 0;
}

// Runs `split_piece` over every piece described by `lens` and returns the new
// lengths.
template <typename F>
std::vector<size_t> ForEachPiece(const std::vector<uint32_t>& cpts,
                                 const std::vector<size_t>& lens,
                                 F split_piece) {
  std::vector<size_t> out;
  out.reserve(lens.size());
  size_t start = 0;
  for (size_t len : lens) {
    Piece piece(cpts, start, start + len, &out);
    split_piece(piece);
    start += len;
  }
  return out;
}

// llama.cpp's unicode_regex_split_custom_gpt2, whose alternatives are
//   's  't  're  've  'm  'll  'd  " ?\p{L}+"  " ?\p{N}+"
//   " ?[^\s\p{L}\p{N}]+"  \s+(?!\S)  \s+
void SplitGpt2(Piece& p) {
  for (size_t pos = p.begin(); pos < p.end();) {
    const uint32_t cpt = p.Cpt(pos);
    const uint16_t flags = p.Fl(pos);
    if (cpt == '\'' && pos + 1 < p.end()) {
      const uint32_t next = p.Cpt(pos + 1);
      if (next == 's' || next == 't' || next == 'm' || next == 'd') {
        pos += p.AddToken(pos + 2);
        continue;
      }
      if (pos + 2 < p.end()) {
        const uint32_t next2 = p.Cpt(pos + 2);
        if ((next == 'r' && next2 == 'e') || (next == 'v' && next2 == 'e') ||
            (next == 'l' && next2 == 'l')) {
          pos += p.AddToken(pos + 3);
          continue;
        }
      }
    }
    uint16_t flags2 = cpt == ' ' ? p.Fl(pos + 1) : flags;
    if (IsLetter(flags2) || IsNumber(flags2) || IsOther(flags2)) {
      bool (*in_class)(uint16_t) = IsLetter(flags2)   ? IsLetter
                                   : IsNumber(flags2) ? IsNumber
                                                      : IsOther;
      pos += (cpt == ' ');
      while (in_class(flags2)) flags2 = p.Fl(++pos);
      p.AddToken(pos);
      continue;
    }
    size_t num_ws = 0;
    while (IsSpace(p.Fl(pos + num_ws))) ++num_ws;
    if (num_ws > 1 && p.Cpt(pos + num_ws) != kOutOfRange) {  // \s+(?!\S)
      pos += num_ws - 1;
      p.AddToken(pos);
      continue;
    }
    if (num_ws > 0) {  // \s+
      pos += num_ws;
      p.AddToken(pos);
      continue;
    }
    p.AddToken(++pos);  // no match
  }
}

uint32_t AsciiLower(uint32_t c) {
  return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
}

// Matches (?i:'s|'t|'re|'ve|'m|'ll|'d) at `pos`; returns its length or 0. Only
// ASCII letters lowercase to these (checked against Unicode 15.1), so ASCII
// lowering equals llama.cpp's.
size_t MatchContraction(const Piece& p, size_t pos) {
  if (p.Cpt(pos) != '\'' || pos + 1 >= p.end()) return 0;
  const uint32_t next = AsciiLower(p.Cpt(pos + 1));
  if (next == 's' || next == 't' || next == 'm' || next == 'd') return 2;
  if (pos + 2 >= p.end()) return 0;
  const uint32_t next2 = AsciiLower(p.Cpt(pos + 2));
  if ((next == 'r' && next2 == 'e') || (next == 'v' && next2 == 'e') ||
      (next == 'l' && next2 == 'l')) {
    return 3;
  }
  return 0;
}

// llama.cpp's unicode_regex_split_custom_llama3, whose alternatives are
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)   [^\r\n\p{L}\p{N}]?\p{L}+   \p{N}{1,3}
//   " ?[^\s\p{L}\p{N}]+[\r\n]*"   \s*[\r\n]+   \s+(?!\S)   \s+
void SplitLlama3(Piece& p) {
  for (size_t pos = p.begin(); pos < p.end();) {
    const uint32_t cpt = p.Cpt(pos);
    const uint16_t flags = p.Fl(pos);
    if (const size_t n = MatchContraction(p, pos)) {
      pos += p.AddToken(pos + n);
      continue;
    }
    if (!(cpt == '\r' || cpt == '\n' || IsNumber(flags))) {
      if (IsLetter(flags) || IsLetter(p.Fl(pos + 1))) {
        ++pos;
        while (IsLetter(p.Fl(pos))) ++pos;
        p.AddToken(pos);
        continue;
      }
    }
    if (IsNumber(flags)) {
      size_t ini = pos;
      while (IsNumber(p.Fl(pos))) {
        if (++pos - ini >= 3) {
          p.AddToken(pos);
          ini = pos;
        }
      }
      p.AddToken(pos);
      continue;
    }
    uint16_t flags2 = cpt == ' ' ? p.Fl(pos + 1) : flags;
    // llama.cpp tests the current codepoint's flags here (not flags2) for "is a
    // codepoint".
    if (!(flags2 &
          (unicode::kWhitespace | unicode::kLetter | unicode::kNumber)) &&
        flags != 0) {
      pos += (cpt == ' ');
      while (IsOther(flags2)) flags2 = p.Fl(++pos);
      uint32_t cpt2 = p.Cpt(pos);
      while (cpt2 == '\r' || cpt2 == '\n') cpt2 = p.Cpt(++pos);
      p.AddToken(pos);
      continue;
    }
    size_t num_ws = 0;
    size_t last_end_rn = 0;
    while (IsSpace(p.Fl(pos + num_ws))) {
      const uint32_t cpt2 = p.Cpt(pos + num_ws);
      if (cpt2 == '\r' || cpt2 == '\n') last_end_rn = pos + num_ws + 1;
      ++num_ws;
    }
    if (last_end_rn > 0) {  // \s*[\r\n]+
      pos = last_end_rn;
      p.AddToken(pos);
      continue;
    }
    if (num_ws > 1 && p.Cpt(pos + num_ws) != kOutOfRange) {  // \s+(?!\S)
      pos += num_ws - 1;
      p.AddToken(pos);
      continue;
    }
    if (num_ws > 0) {  // \s+
      pos += num_ws;
      p.AddToken(pos);
      continue;
    }
    p.AddToken(++pos);
  }
}

// The Qwen2 regex, which llama.cpp runs through std::regex (ECMAScript) on
// category-collapsed text. Its alternatives, in order:
//   (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])
//   [^\r\n\p{L}\p{N}]?\p{L}+   \p{N}   " ?[^\s\p{L}\p{N}]+[\r\n]*"
//   \s*[\r\n]+   \s+(?!\S)   \s+
// In the collapsed text \s, \p{L} and \p{N} test exactly the whitespace, letter
// and number flags. Every codepoint starts a match of some alternative, so
// matches tile the piece; at each position the first alternative that matches
// wins, each with its greedy-with-backtracking length worked out below.
void SplitQwen2(Piece& p) {
  const size_t end = p.end();
  auto is_rn = [&](size_t i) { return p.Cpt(i) == '\r' || p.Cpt(i) == '\n'; };
  auto letter = [&](size_t i) { return IsLetter(p.Fl(i)); };
  auto number = [&](size_t i) { return IsNumber(p.Fl(i)); };
  auto space = [&](size_t i) { return IsSpace(p.Fl(i)); };
  // [^\s\p{L}\p{N}]: inside the piece, anything not in the three classes.
  auto other = [&](size_t i) {
    return i < end && !space(i) && !letter(i) && !number(i);
  };
  for (size_t pos = p.begin(); pos < end;) {
    size_t stop = pos;
    if (const size_t n = MatchContraction(p, pos)) {
      stop = pos + n;
    } else if (letter(pos) ||
               (!is_rn(pos) && !number(pos) && letter(pos + 1))) {
      // [^\r\n\p{L}\p{N}]?\p{L}+: the optional char is taken only if a letter
      // follows it.
      stop = letter(pos) ? pos : pos + 1;
      while (letter(stop)) ++stop;
    } else if (number(pos)) {
      stop = pos + 1;
    } else if (other(pos) || (p.Cpt(pos) == ' ' && other(pos + 1))) {
      stop = other(pos) ? pos : pos + 1;
      while (other(stop)) ++stop;
      while (stop < end && is_rn(stop)) ++stop;
    } else {
      // Only whitespace is left: \s*[\r\n]+ ends after the run's last \r or \n;
      // otherwise \s+(?!\S) gives back the run's last char when a non-space
      // follows; otherwise \s+.
      size_t run_end = pos;
      size_t last_rn_end = 0;
      while (run_end < end && space(run_end)) {
        if (is_rn(run_end)) last_rn_end = run_end + 1;
        ++run_end;
      }
      if (last_rn_end > 0) {
        stop = last_rn_end;
      } else if (run_end - pos > 1 && run_end < end) {
        stop = run_end - 1;
      } else {
        stop = run_end;
      }
    }
    p.AddToken(stop);
    pos = stop;
  }
}

// A single-class regex such as \p{N}+ run through std::regex: maximal runs of
// members are matches, the runs between them become pieces too.
template <typename Pred>
void SplitRuns(Piece& p, Pred member) {
  for (size_t pos = p.begin(); pos < p.end();) {
    const bool m = member(p.Cpt(pos));
    size_t stop = pos + 1;
    while (stop < p.end() && member(p.Cpt(stop)) == m) ++stop;
    p.AddToken(stop);
    pos = stop;
  }
}

// \p{N} through std::regex: each number codepoint alone; the runs between them
// as pieces.
void SplitEachNumber(Piece& p) {
  for (size_t pos = p.begin(); pos < p.end();) {
    size_t stop = pos + 1;
    if (!IsNumber(p.Fl(pos))) {
      while (stop < p.end() && !IsNumber(p.Fl(stop))) ++stop;
    }
    p.AddToken(stop);
    pos = stop;
  }
}

// [0-9][0-9][0-9] through std::wregex: leftmost non-overlapping triples of
// ASCII digits.
void SplitDigitTriples(Piece& p) {
  auto digit = [&](size_t i) {
    return i < p.end() && p.Cpt(i) >= '0' && p.Cpt(i) <= '9';
  };
  for (size_t pos = p.begin(); pos < p.end();) {
    if (digit(pos) && digit(pos + 1) && digit(pos + 2)) {
      p.AddToken(pos);  // the gap before the match, if any
      p.AddToken(pos + 3);
      pos += 3;
    } else {
      ++pos;
    }
  }
  p.AddToken(p.end());
}

bool IsDefaultPunct(uint32_t cpt) {  // [\p{P}\$\+<=>\^~\|]
  if (cpt == '$' || cpt == '+' || cpt == '<' || cpt == '=' || cpt == '>' ||
      cpt == '^' || cpt == '~' || cpt == '|') {
    return true;
  }
  return Flags(cpt) & unicode::kPunctuation;
}

bool IsNumberCpt(uint32_t cpt) { return Flags(cpt) & unicode::kNumber; }

struct NamedPre {
  const char* name;
  PreTokenizerInfo info;
};

// From llama.cpp's llama_vocab::impl::load; only the names whose regexes kvd
// implements. Fields: type, clean_spaces, ignore_merges, add_bos.
const NamedPre kPreTokenizers[] = {
    {"default", {PreTokenizer::kDefault, true, false, false}},
    {"gpt-2", {PreTokenizer::kGpt2, true, false, false}},
    // Not a llama.cpp name, but the spelling people expect.
    {"gpt2", {PreTokenizer::kGpt2, true, false, false}},
    {"phi-2", {PreTokenizer::kGpt2, true, false, false}},
    {"mpt", {PreTokenizer::kGpt2, true, false, false}},
    {"olmo", {PreTokenizer::kGpt2, true, false, false}},
    {"jais", {PreTokenizer::kGpt2, true, false, false}},
    {"exaone4", {PreTokenizer::kGpt2, true, false, false}},
    {"llama3", {PreTokenizer::kLlama3, true, true, true}},
    {"llama-v3", {PreTokenizer::kLlama3, true, true, true}},
    {"llama-bpe", {PreTokenizer::kLlama3, true, true, true}},
    {"falcon3", {PreTokenizer::kLlama3, true, true, true}},
    {"dbrx", {PreTokenizer::kLlama3, true, false, false}},
    {"smaug-bpe", {PreTokenizer::kLlama3, true, false, false}},
    {"qwen2", {PreTokenizer::kQwen2, false, false, false}},
    {"deepseek-r1-qwen", {PreTokenizer::kQwen2, false, false, false}},
    {"megrez", {PreTokenizer::kQwen2, true, false, false}},
    {"stablelm2", {PreTokenizer::kQwen2, true, false, false}},
    {"smollm", {PreTokenizer::kDigitsThenGpt2, false, false, false}},
    {"starcoder", {PreTokenizer::kDigitsThenGpt2, true, false, false}},
    {"refact", {PreTokenizer::kDigitsThenGpt2, true, false, false}},
    {"command-r", {PreTokenizer::kDigitsThenGpt2, false, false, false}},
    {"codeshell", {PreTokenizer::kDigitsThenGpt2, true, false, false}},
    {"exaone", {PreTokenizer::kDigitsThenGpt2, true, false, false}},
    {"minerva-7b", {PreTokenizer::kDigitsThenGpt2, true, false, false}},
};

}  // namespace

absl::StatusOr<PreTokenizerInfo> LookupPreTokenizer(std::string_view name) {
  if (name.empty()) name = "default";
  for (const NamedPre& p : kPreTokenizers) {
    if (name == p.name) return p.info;
  }
  std::string supported;
  for (const NamedPre& p : kPreTokenizers) {
    absl::StrAppend(&supported, supported.empty() ? "" : ", ", p.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported pre-tokenizer '", std::string(name),
                   "' (tokenizer.ggml.pre); supported: ", supported));
}

std::vector<size_t> PreTokenize(PreTokenizer type,
                                const std::vector<uint32_t>& cpts) {
  std::vector<size_t> lens;
  if (cpts.empty()) return lens;
  lens.push_back(cpts.size());
  auto apply = [&](auto split_piece) {
    lens = ForEachPiece(cpts, lens, split_piece);
  };
  switch (type) {
    case PreTokenizer::kDefault:
      apply([](Piece& p) { SplitRuns(p, IsDefaultPunct); });
      apply(SplitGpt2);
      apply([](Piece& p) { SplitRuns(p, IsNumberCpt); });
      apply(SplitDigitTriples);
      break;
    case PreTokenizer::kGpt2:
      apply(SplitGpt2);
      break;
    case PreTokenizer::kLlama3:
      apply(SplitLlama3);
      break;
    case PreTokenizer::kQwen2:
      apply(SplitQwen2);
      break;
    case PreTokenizer::kDigitsThenGpt2:
      apply(SplitEachNumber);
      apply(SplitGpt2);
      break;
  }
  return lens;
}

}  // namespace kvd::ops
