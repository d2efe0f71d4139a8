#include "ops/sampler/stop_matcher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvd::ops {
namespace stop_matcher_internal {
namespace {

// Expected length of a sequence starting with `lead`, or 0 if `lead` cannot
// start one (ASCII counts as length 1).
int SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;  // a continuation byte, an overlong lead (C0, C1) or past U+10FFFF
             // (F5..FF)
}

// Whether `b` may follow `lead` as the second byte (RFC 3629's table: no
// overlongs, no surrogates, nothing past U+10FFFF).
bool ValidSecond(unsigned char lead, unsigned char b) {
  switch (lead) {
    case 0xE0:
      return b >= 0xA0 && b <= 0xBF;
    case 0xED:
      return b >= 0x80 && b <= 0x9F;
    case 0xF0:
      return b >= 0x90 && b <= 0xBF;
    case 0xF4:
      return b >= 0x80 && b <= 0x8F;
    default:
      return b >= 0x80 && b <= 0xBF;
  }
}

bool IsContinuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// Whether text[start, start + n) is a valid prefix (n bytes) of some UTF-8
// sequence.
bool ValidPrefix(absl::string_view text, size_t start, size_t n) {
  const auto lead = static_cast<unsigned char>(text[start]);
  for (size_t i = 1; i < n; ++i) {
    const auto b = static_cast<unsigned char>(text[start + i]);
    if (i == 1 ? !ValidSecond(lead, b) : !IsContinuation(b)) return false;
  }
  return true;
}

bool IsValidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const int len = SequenceLength(static_cast<unsigned char>(text[i]));
    if (len == 0 || i + len > text.size() || !ValidPrefix(text, i, len))
      return false;
    i += len;
  }
  return true;
}

}  // namespace

size_t IncompleteUtf8Suffix(absl::string_view text) {
  // A sequence is at most 4 bytes, so an unfinished one starts within the
  // last 3.
  const size_t lookback = std::min<size_t>(3, text.size());
  for (size_t back = 1; back <= lookback; ++back) {
    const size_t start = text.size() - back;
    const auto b = static_cast<unsigned char>(text[start]);
    if (IsContinuation(b)) continue;
    const int len = SequenceLength(b);
    if (len <= static_cast<int>(back))
      return 0;  // ASCII, invalid, or already complete
    return ValidPrefix(text, start, back) ? back : 0;
  }
  return 0;
}

}  // namespace stop_matcher_internal

absl::StatusOr<StopMatcher> StopMatcher::Create(
    std::vector<std::string> stop_strings) {
  for (size_t i = 0; i < stop_strings.size(); ++i) {
    if (stop_strings[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop string ", i, " is empty"));
    }
    if (!stop_matcher_internal::IsValidUtf8(stop_strings[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop string ", i, " is not valid UTF-8"));
    }
  }
  return StopMatcher(std::move(stop_strings));
}

StopMatcher::Result StopMatcher::Feed(absl::string_view piece) {
  Result result;
  if (stopped_) {
    result.stopped = true;
    result.stop_index = stop_index_;
    return result;
  }
  pending_.append(piece.data(), piece.size());

  // Text before `pending_` was emitted only when no stop string could start in
  // it, so every occurrence lies wholly inside `pending_`.
  size_t best_start = std::string::npos;
  size_t best_end = std::string::npos;
  for (size_t k = 0; k < stops_.size(); ++k) {
    const size_t start = pending_.find(stops_[k]);
    if (start == std::string::npos) continue;
    const size_t end = start + stops_[k].size();
    if (end < best_end || (end == best_end && start < best_start)) {
      best_start = start;
      best_end = end;
      stop_index_ = static_cast<int>(k);
    }
  }
  if (best_start != std::string::npos) {
    result.emit = pending_.substr(0, best_start);
    result.stopped = true;
    result.stop_index = stop_index_;
    stopped_ = true;
    pending_.clear();
    return result;
  }

  size_t hold = stop_matcher_internal::IncompleteUtf8Suffix(pending_);
  const absl::string_view text(pending_);
  for (const std::string& stop : stops_) {
    // Only proper prefixes: a whole stop string would have been found above.
    for (size_t len = std::min(stop.size() - 1, text.size()); len > hold;
         --len) {
      if (absl::EndsWith(text, absl::string_view(stop).substr(0, len))) {
        hold = len;
        break;
      }
    }
  }
  result.emit = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return result;
}

std::string StopMatcher::Flush() {
  std::string out = std::move(pending_);
  pending_.clear();
  stopped_ = false;
  stop_index_ = -1;
  const size_t incomplete = stop_matcher_internal::IncompleteUtf8Suffix(out);
  if (incomplete > 0) {
    out.resize(out.size() - incomplete);
    out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
  }
  return out;
}

}  // namespace kvd::ops
