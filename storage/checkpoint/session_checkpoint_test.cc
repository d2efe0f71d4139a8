// SessionCheckpoint applies turns in order: puts overwrite, erases remove,
// the manifest is replaced, byte accounting follows, and a bad update changes
// nothing.
#include "storage/checkpoint/session_checkpoint.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/testing/recording_observer.h"

namespace kvd::storage {
namespace {

using ::testing::HasSubstr;

v1::SessionManifest Manifest(const std::string& session, int64_t tokens) {
  v1::SessionManifest m;
  m.set_format_version(kCheckpointFormatVersion);
  m.set_tenant("acme");
  m.set_session_id(session);
  m.set_policy("tokens");
  m.set_chunk_tokens(4);
  m.set_token_count(tokens);
  m.set_length(tokens);
  if (tokens > 0) m.add_turn_ends(tokens);
  return m;
}

TEST(SessionCheckpoint, AppliesPutsErasesAndCountsBytes) {
  SessionCheckpoint cp;
  EXPECT_TRUE(cp.empty());
  TurnUpdate t1;
  t1.manifest = Manifest("s", 5);
  t1.put = {{ChunkId{kTokenLayer, 0}, std::string(10, 'a')},
            {ChunkId{0, 0}, std::string(20, 'b')},
            {ChunkId{kTokenLayer, 1}, std::string(3, 'c')}};
  ASSERT_TRUE(cp.Apply(t1).ok());
  EXPECT_FALSE(cp.empty());
  EXPECT_EQ(cp.bytes(),
            33 + static_cast<int64_t>(t1.manifest.SerializeAsString().size()));
  // Token chunks sort first, then layers by index.
  EXPECT_EQ(cp.chunks().begin()->first, (ChunkId{kTokenLayer, 0}));

  TurnUpdate t2;
  t2.manifest = Manifest("s", 6);
  t2.put = {{ChunkId{kTokenLayer, 1}, std::string(7, 'd')}};
  t2.erase = {ChunkId{0, 0}, ChunkId{9, 9}};  // unknown ids are ignored
  ASSERT_TRUE(cp.Apply(t2).ok());
  EXPECT_EQ(cp.chunks().size(), 2u);
  EXPECT_EQ(cp.chunks().at(ChunkId{kTokenLayer, 1}), "ddddddd");
  EXPECT_EQ(cp.manifest().token_count(), 6);
  EXPECT_EQ(cp.bytes(),
            17 + static_cast<int64_t>(t2.manifest.SerializeAsString().size()));
}

TEST(SessionCheckpoint, RefusesABadUpdateWithoutChangingAnything) {
  SessionCheckpoint cp;
  TurnUpdate t1;
  t1.manifest = Manifest("s", 4);
  t1.put = {{ChunkId{kTokenLayer, 0}, "x"}};
  ASSERT_TRUE(cp.Apply(t1).ok());
  const int64_t before = cp.bytes();

  TurnUpdate other = t1;
  other.manifest = Manifest("t", 4);
  other.put = {{ChunkId{kTokenLayer, 0}, "yy"}};
  absl::Status s = cp.Apply(other);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("acme/t"));

  TurnUpdate invalid = t1;
  invalid.manifest.set_length(99);
  invalid.put = {{ChunkId{kTokenLayer, 0}, "yy"}};
  s = cp.Apply(invalid);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("length 99"));

  EXPECT_EQ(cp.bytes(), before);
  EXPECT_EQ(cp.chunks().at(ChunkId{kTokenLayer, 0}), "x");
  EXPECT_EQ(cp.manifest().session_id(), "s");
}

TEST(SessionCheckpoint, ResetReplacesEverything) {
  SessionCheckpoint cp;
  cp.Reset(Manifest("s", 4), {{ChunkId{0, 0}, "abc"}, {ChunkId{0, 1}, "de"}});
  EXPECT_EQ(cp.bytes(),
            5 + static_cast<int64_t>(Manifest("s", 4).ByteSizeLong()));
  cp.Reset(Manifest("s", 0), {});
  EXPECT_TRUE(cp.chunks().empty());
}

// ReplayLoad keeps LoadObserver's promise (RecordingObserver checks at
// OnEnd that every stream still holds its chunks).
TEST(SessionCheckpoint, ReplayLoadKeepsEveryStreamUntilTheEnd) {
  testing::RecordingObserver seen;
  SessionCheckpoint cp;
  cp.Reset(Manifest("s", 5), {{ChunkId{kTokenLayer, 0}, "t0"},
                              {ChunkId{kTokenLayer, 1}, "t1"},
                              {ChunkId{0, 0}, "a"},
                              {ChunkId{0, 1}, "b"},
                              {ChunkId{3, 0}, "c"}});
  ReplayLoad(cp, &seen);
  EXPECT_THAT(seen.events,
              ::testing::ElementsAre("manifest s", "stream -1 x2",
                                     "stream 0 x2", "stream 3 x1", "end OK"));
  EXPECT_EQ(seen.streamed, cp.chunks());
}

}  // namespace
}  // namespace kvd::storage
