#include "ops/sampler/stop_matcher.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::ops {
namespace {

using stop_matcher_internal::IncompleteUtf8Suffix;
using ::testing::HasSubstr;

StopMatcher Make(std::vector<std::string> stops) {
  absl::StatusOr<StopMatcher> m = StopMatcher::Create(std::move(stops));
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

// Feeds `pieces` in order; returns what each Feed emitted and the final result.
struct Fed {
  std::vector<std::string> emitted;
  bool stopped = false;
  int stop_index = -1;
  std::string All() const {
    std::string s;
    for (const std::string& e : emitted) s += e;
    return s;
  }
};

Fed FeedAll(StopMatcher& m, const std::vector<std::string>& pieces) {
  Fed run;
  for (const std::string& piece : pieces) {
    StopMatcher::Result r = m.Feed(piece);
    run.emitted.push_back(r.emit);
    if (r.stopped) {
      run.stopped = true;
      run.stop_index = r.stop_index;
      break;
    }
  }
  return run;
}

TEST(StopMatcherTest, NoStopStringsPassesTextThrough) {
  StopMatcher m = Make({});
  Fed run = FeedAll(m, {"Hello", ", ", "world"});
  EXPECT_EQ(run.emitted, (std::vector<std::string>{"Hello", ", ", "world"}));
  EXPECT_FALSE(run.stopped);
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, StopStringSplitAcrossPieces) {
  StopMatcher m = Make({"</s>"});
  Fed run = FeedAll(m, {"Hi there<", "/", "s", ">ignored"});
  EXPECT_EQ(run.emitted, (std::vector<std::string>{"Hi there", "", "", ""}));
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.stop_index, 0);
  // After a stop nothing more comes out.
  StopMatcher::Result after = m.Feed("more");
  EXPECT_TRUE(after.stopped);
  EXPECT_EQ(after.emit, "");
}

TEST(StopMatcherTest, FalseStartIsHeldThenEmitted) {
  StopMatcher m = Make({"</s>"});
  Fed run = FeedAll(m, {"a <", "/", "b> c"});
  EXPECT_EQ(run.emitted, (std::vector<std::string>{"a ", "", "</b> c"}));
  EXPECT_FALSE(run.stopped);
}

TEST(StopMatcherTest, FalseStartFollowedByRealStopInTheSamePiece) {
  // "<<" : the first "<" cannot start the stop any more once the second
  // arrives.
  StopMatcher m = Make({"<end>"});
  Fed run = FeedAll(m, {"x<", "<en", "d>y"});
  EXPECT_EQ(run.emitted, (std::vector<std::string>{"x", "<", ""}));
  EXPECT_TRUE(run.stopped);
}

TEST(StopMatcherTest, StopAtTheVeryStart) {
  StopMatcher m = Make({"STOP"});
  Fed run = FeedAll(m, {"STOP", "after"});
  EXPECT_EQ(run.emitted, (std::vector<std::string>{""}));
  EXPECT_TRUE(run.stopped);

  StopMatcher split = Make({"STOP"});
  run = FeedAll(split, {"ST", "OP"});
  EXPECT_EQ(run.All(), "");
  EXPECT_TRUE(run.stopped);
}

TEST(StopMatcherTest, TextBeforeAndInsideTheStoppingPiece) {
  StopMatcher m = Make({"\nUser:"});
  Fed run = FeedAll(m, {"The answer", " is 42.\nUs", "er: next"});
  EXPECT_EQ(run.All(), "The answer is 42.");
  EXPECT_TRUE(run.stopped);
}

TEST(StopMatcherTest, MultipleStopStrings) {
  StopMatcher m = Make({"###", "\n\n", "END"});
  Fed run = FeedAll(m, {"line one\n", "line two", "\n", "\nrest"});
  EXPECT_EQ(run.All(), "line one\nline two");
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.stop_index, 1);

  // The hold-back covers the longest prefix of any of them.
  StopMatcher m2 = Make({"ab", "xyz"});
  StopMatcher::Result r = m2.Feed("1xy");
  EXPECT_EQ(r.emit, "1");
  r = m2.Feed("a");
  // "xya" cannot become "xyz", but "a" may still become "ab".
  EXPECT_EQ(r.emit, "xy");
  r = m2.Feed("b");
  EXPECT_EQ(r.emit, "");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.stop_index, 0);
}

TEST(StopMatcherTest, TheStopThatEndsFirstWins) {
  // Both complete in one piece; fed byte by byte, "bc" would end first.
  StopMatcher m = Make({"abcd", "bc"});
  StopMatcher::Result r = m.Feed("xabcd");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.stop_index, 1);
  EXPECT_EQ(r.emit, "xa");
}

TEST(StopMatcherTest, Utf8CharacterSplitAcrossPiecesIsNeverHalved) {
  StopMatcher m = Make({});
  // "café" with é = C3 A9 split; then a 4-byte emoji (F0 9F 98 80) split three
  // ways.
  Fed run = FeedAll(m, {"caf\xC3", "\xA9 ", "\xF0\x9F", "\x98", "\x80!"});
  EXPECT_EQ(run.emitted, (std::vector<std::string>{"caf", "\xC3\xA9 ", "", "",
                                                   "\xF0\x9F\x98\x80!"}));
}

TEST(StopMatcherTest, MultiByteStopStringSplitInsideACharacter) {
  StopMatcher m = Make({"—end"});  // U+2014 EM DASH = E2 80 94
  Fed run = FeedAll(m, {"done\xE2\x80", "\x94", "en", "d"});
  EXPECT_EQ(run.All(), "done");
  EXPECT_TRUE(run.stopped);

  StopMatcher m2 = Make({"—end"});
  run = FeedAll(m2, {"a\xE2\x80", "\x94", "x"});
  EXPECT_EQ(run.emitted, (std::vector<std::string>{"a", "", "—x"}));
}

TEST(StopMatcherTest, FlushReleasesHeldTextAndReplacesAnUnfinishedCharacter) {
  StopMatcher m = Make({"</s>"});
  EXPECT_EQ(m.Feed("end </").emit, "end ");
  EXPECT_EQ(m.Flush(), "</");

  StopMatcher m2 = Make({});
  EXPECT_EQ(m2.Feed("ok\xE2\x82").emit, "ok");
  EXPECT_EQ(m2.Flush(), "\xEF\xBF\xBD");  // the euro sign never completed
}

TEST(StopMatcherTest, InvalidStopStringsAreRejected) {
  absl::StatusOr<StopMatcher> m = StopMatcher::Create({"ok", ""});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("stop string 1 is empty"));
  m = StopMatcher::Create({"\xC3"});
  EXPECT_THAT(m.status().message(),
              HasSubstr("stop string 0 is not valid UTF-8"));
  // A UTF-16 surrogate encoded as UTF-8.
  m = StopMatcher::Create({"\xED\xA0\x80"});
  EXPECT_FALSE(m.ok());
}

TEST(IncompleteUtf8SuffixTest, Cases) {
  EXPECT_EQ(IncompleteUtf8Suffix(""), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("abc"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xC3"), 1u);
  EXPECT_EQ(IncompleteUtf8Suffix("a\xC3\xA9"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("\xE2\x82"), 2u);
  EXPECT_EQ(IncompleteUtf8Suffix("\xE2\x82\xAC"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(IncompleteUtf8Suffix("\xF0\x9F\x98\x80"), 0u);
  // Bytes that can never become valid are not held: a stray continuation,
  // C0/C1, F5+, an overlong E0 80, a surrogate ED A0.
  EXPECT_EQ(IncompleteUtf8Suffix("a\x80"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("\xC0"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("\xF5"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("\xE0\x80"), 0u);
  EXPECT_EQ(IncompleteUtf8Suffix("\xED\xA0"), 0u);
}

}  // namespace
}  // namespace kvd::ops
