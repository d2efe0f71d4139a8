#include "ops/tokenizer/unicode.h"

#include <algorithm>
#include <array>

#include "ops/tokenizer/unicode_tables.h"

namespace kvd::ops::unicode {
namespace {

using unicode_internal::CodepointRange;
using unicode_internal::kCodepointRanges;
using unicode_internal::kNumCodepointRanges;

constexpr uint32_t kMaxCodepoints = 0x110000;

// Flags of the ASCII range, looked up on every character of typical text.
const std::array<uint16_t, 128>& AsciiFlags() {
  static const std::array<uint16_t, 128> table = [] {
    std::array<uint16_t, 128> t{};
    for (uint32_t c = 0; c < 128; ++c) {
      const CodepointRange* end = kCodepointRanges + kNumCodepointRanges;
      const CodepointRange* it = std::upper_bound(
          kCodepointRanges, end, c,
          [](uint32_t v, const CodepointRange& r) { return v < r.start; });
      t[c] = (it - 1)->flags;
    }
    return t;
  }();
  return table;
}

struct ByteMaps {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 512>
      from_unicode;  // codepoint -> byte, or -1; images are all < 324
};

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the
// other 68 bytes to U+0100.. in byte order.
const ByteMaps& GetByteMaps() {
  static const ByteMaps maps = [] {
    ByteMaps m;
    m.from_unicode.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) ||
                             (b >= 0xA1 && b <= 0xAC) ||
                             (b >= 0xAE && b <= 0xFF);
      const uint32_t cpt = printable ? b : 256 + n++;
      AppendUtf8(cpt, &m.to_unicode[b]);
      m.from_unicode[cpt] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return maps;
}

}  // namespace

uint16_t Flags(uint32_t cpt) {
  if (cpt < 128) return AsciiFlags()[cpt];
  if (cpt >= kMaxCodepoints) return kUndefined;
  const CodepointRange* end = kCodepointRanges + kNumCodepointRanges;
  const CodepointRange* it = std::upper_bound(
      kCodepointRanges, end, cpt,
      [](uint32_t v, const CodepointRange& r) { return v < r.start; });
  return (it - 1)->flags;
}

size_t Utf8SeqLen(char lead) {
  static constexpr size_t kLookup[] = {1, 1, 1, 1, 1, 1, 1, 1,
                                       1, 1, 1, 1, 2, 2, 3, 4};
  return kLookup[static_cast<uint8_t>(lead) >> 4];
}

std::vector<uint32_t> DecodeUtf8(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  const size_t n = text.size();
  auto cont = [&](size_t i) {
    return i < n && (static_cast<uint8_t>(text[i]) & 0xC0) == 0x80;
  };
  size_t i = 0;
  while (i < n) {
    const uint8_t b0 = static_cast<uint8_t>(text[i]);
    if (!(b0 & 0x80)) {
      out.push_back(b0);
      i += 1;
    } else if (!(b0 & 0x40)) {
      out.push_back(kReplacementChar);  // stray continuation byte
      i += 1;
    } else if (!(b0 & 0x20)) {
      if (!cont(i + 1)) {
        out.push_back(kReplacementChar);
        i += 1;
        continue;
      }
      out.push_back(((b0 & 0x1Fu) << 6) |
                    (static_cast<uint8_t>(text[i + 1]) & 0x3Fu));
      i += 2;
    } else if (!(b0 & 0x10)) {
      if (!cont(i + 1) || !cont(i + 2)) {
        out.push_back(kReplacementChar);
        i += 1;
        continue;
      }
      out.push_back(((b0 & 0x0Fu) << 12) |
                    ((static_cast<uint8_t>(text[i + 1]) & 0x3Fu) << 6) |
                    (static_cast<uint8_t>(text[i + 2]) & 0x3Fu));
      i += 3;
    } else if (!(b0 & 0x08)) {
      if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) {
        out.push_back(kReplacementChar);
        i += 1;
        continue;
      }
      out.push_back(((b0 & 0x07u) << 18) |
                    ((static_cast<uint8_t>(text[i + 1]) & 0x3Fu) << 12) |
                    ((static_cast<uint8_t>(text[i + 2]) & 0x3Fu) << 6) |
                    (static_cast<uint8_t>(text[i + 3]) & 0x3Fu));
      i += 4;
    } else {
      out.push_back(kReplacementChar);  // 0xF8..0xFF never start a sequence
      i += 1;
    }
  }
  return out;
}

void AppendUtf8(uint32_t cpt, std::string* out) {
  if (cpt <= 0x7F) {
    out->push_back(static_cast<char>(cpt));
  } else if (cpt <= 0x7FF) {
    out->push_back(static_cast<char>(0xC0 | ((cpt >> 6) & 0x1F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt <= 0xFFFF) {
    out->push_back(static_cast<char>(0xE0 | ((cpt >> 12) & 0x0F)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt <= 0x10FFFF) {
    out->push_back(static_cast<char>(0xF0 | ((cpt >> 18) & 0x07)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    AppendUtf8(kReplacementChar, out);
  }
}

const std::string& ByteToUnicode(uint8_t byte) {
  return GetByteMaps().to_unicode[byte];
}

std::optional<uint8_t> UnicodeToByte(uint32_t cpt) {
  const ByteMaps& m = GetByteMaps();
  if (cpt >= m.from_unicode.size() || m.from_unicode[cpt] < 0)
    return std::nullopt;
  return static_cast<uint8_t>(m.from_unicode[cpt]);
}

}  // namespace kvd::ops::unicode
