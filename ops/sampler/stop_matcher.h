// Streaming stop-string detection over decoded text.
//
// Feed each token's decoded text as it is produced. Feed returns the text that
// is safe to send to the client now and holds back (a) the longest tail that
// could still be the start of a stop string and (b) an incomplete UTF-8
// sequence at the end, so a client never sees half a stop string or half a
// character, even when either is split across tokens. When a stop string
// completes, Feed reports it and returns the remaining text before it; the stop
// string itself and anything after it are never emitted.
//
// If several stop strings complete in the same piece, the one that ends first
// wins (ties: the one that starts first), which is what feeding the text one
// byte at a time would give.
//
// Thread-safety: not thread-safe; one matcher per generation.
//
//   KVD_ASSIGN_OR_RETURN(StopMatcher m,
//                        StopMatcher::Create({"</s>", "\nUser:"}));
//   for (...each token...) {
//     StopMatcher::Result r = m.Feed(detokenized_piece);
//     Send(r.emit);
//     if (r.stopped) break;
//   }
//   // Ended without a stop string: release what was held back.
//   Send(m.Flush());
#ifndef KVD_OPS_SAMPLER_STOP_MATCHER_H_
#define KVD_OPS_SAMPLER_STOP_MATCHER_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvd::ops {

class StopMatcher {
 public:
  struct Result {
    // Safe to send now (may be empty).
    std::string emit;
    // A stop string completed: `emit` ends right before it.
    bool stopped = false;
    // Which of the stop strings completed, when stopped.
    int stop_index = -1;
  };

  // INVALID_ARGUMENT if a stop string is empty or not valid UTF-8. No stop
  // strings is fine: then only incomplete UTF-8 is held back.
  static absl::StatusOr<StopMatcher> Create(
      std::vector<std::string> stop_strings);

  // Adds the next piece of generated text. After a stop, further calls return
  // an empty result with stopped = true.
  Result Feed(absl::string_view piece);

  // Ends the stream without a stop: returns everything held back. A trailing
  // incomplete UTF-8 sequence (the generation ended mid-character) becomes
  // U+FFFD. Later Feed calls start afresh.
  std::string Flush();

  bool stopped() const { return stopped_; }
  const std::vector<std::string>& stop_strings() const { return stops_; }

 private:
  explicit StopMatcher(std::vector<std::string> stops)
      : stops_(std::move(stops)) {}

  std::vector<std::string> stops_;
  std::string pending_;  // fed but not yet emitted
  bool stopped_ = false;
  int stop_index_ = -1;
};

namespace stop_matcher_internal {
// Bytes at the end of `text` that form the start of a UTF-8 sequence still
// missing bytes (0 to 3). Invalid bytes that can never become valid are not
// held.
size_t IncompleteUtf8Suffix(absl::string_view text);
}  // namespace stop_matcher_internal

}  // namespace kvd::ops

#endif  // KVD_OPS_SAMPLER_STOP_MATCHER_H_
