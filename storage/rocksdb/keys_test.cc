// Pins the key layout documented in keys.h against hand-written bytes, so a
// change to it (which would orphan every stored session) cannot go unnoticed.
#include "storage/rocksdb/keys.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvd::storage {
namespace {

std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(static_cast<char>(x));
  return s;
}

TEST(Keys, AreExactlyTheDocumentedBytes) {
  EXPECT_EQ(SessionKey("acme", "chat-1"), "acme/chat-1");
  EXPECT_EQ(TenantPrefix("acme"), "acme/");
  EXPECT_EQ(ChunkPrefix("acme", "chat-1"), "acme/chat-1/");
  EXPECT_EQ(ChunkKey("acme", "chat-1", {kTokenLayer, 0}),
            "acme/chat-1/" + Bytes({0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                    0xff, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ChunkKey("acme", "chat-1", {3, 258}),
            "acme/chat-1/" +
                Bytes({0x80, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 1, 2}));
  EXPECT_EQ(PrefixUpperBound("acme/chat-1/"), "acme/chat-10");
}

TEST(Keys, SortByLayerThenPosition) {
  const std::vector<ChunkId> order = {
      {kTokenLayer, 0}, {kTokenLayer, 1}, {0, 0},  {0, 255},
      {0, 256},         {1, 0},           {29, 1}, {300, 0}};
  for (size_t i = 1; i < order.size(); ++i) {
    EXPECT_LT(ChunkKey("t", "s", order[i - 1]), ChunkKey("t", "s", order[i]))
        << i;
  }
  // Every chunk key of a session lies within [prefix, upper bound).
  const std::string prefix = ChunkPrefix("t", "s");
  for (const ChunkId& id : order) {
    const std::string k = ChunkKey("t", "s", id);
    EXPECT_GE(k, prefix);
    EXPECT_LT(k, PrefixUpperBound(prefix));
  }
  // ...and another session's do not, even one whose id extends this one's.
  EXPECT_GE(ChunkKey("t", "s0", {kTokenLayer, 0}), PrefixUpperBound(prefix));
  EXPECT_LT(ChunkKey("t", "s-", {300, 0}), prefix);
}

TEST(Keys, ParseInvertsChunkKey) {
  for (const ChunkId id : {ChunkId{kTokenLayer, 7}, ChunkId{0, 0},
                           ChunkId{47, int64_t{1} << 40}}) {
    const std::string key = ChunkKey("acme", "chat-1", id);
    auto p = ParseChunkKey(key);
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->tenant, "acme");
    EXPECT_EQ(p->session, "chat-1");
    EXPECT_EQ(p->prefix, "acme/chat-1/");
    EXPECT_EQ(p->id, id);
  }
  EXPECT_FALSE(ParseChunkKey("acme/chat-1").has_value());
  EXPECT_FALSE(ParseChunkKey(std::string(20, 'x')).has_value());
  EXPECT_FALSE(ParseChunkKey("a/b/c/" + std::string(16, '\0')).has_value());
}

}  // namespace
}  // namespace kvd::storage
