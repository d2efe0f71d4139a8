// Generated codepoint classification data for the tokenizer's pre-tokenizers
// (internal).
//
// The table itself, unicode_tables.cc, is produced by
// tools/reference/make_unicode_tables.py from Unicode 15.1 (the version of
// llama.cpp's own table) so that text splits exactly as it does in llama.cpp.
// Use the lookup functions in unicode.h rather than this table directly.
#ifndef KVD_OPS_TOKENIZER_UNICODE_TABLES_H_
#define KVD_OPS_TOKENIZER_UNICODE_TABLES_H_

#include <cstddef>
#include <cstdint>

namespace kvd::ops::unicode_internal {

struct CodepointRange {
  uint32_t
      start;  // first codepoint of the range; it ends where the next one starts
  uint16_t flags;  // unicode::kFlag* bits
};

extern const CodepointRange kCodepointRanges[];
extern const size_t kNumCodepointRanges;

}  // namespace kvd::ops::unicode_internal

#endif  // KVD_OPS_TOKENIZER_UNICODE_TABLES_H_
