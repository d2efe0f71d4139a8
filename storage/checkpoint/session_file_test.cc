#include "storage/checkpoint/session_file.h"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/codec.h"
#include "storage/checkpoint/crc32c.h"

namespace kvd::storage {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kC = 4;         // chunk_tokens
constexpr int64_t kRowBytes = 8;  // two f32 per residual row

std::string Payload(int64_t rows, int64_t row_bytes, int seed) {
  std::string p(rows * row_bytes, '\0');
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<char>(seed * 31 + i);
  return p;
}

std::string Chunk(int64_t layer, int64_t index, int64_t rows) {
  v1::ChunkHeader h;
  h.set_layer(layer);
  h.set_chunk_index(index);
  h.set_first_position(index * kC);
  h.set_rows(rows);
  const bool tokens = layer == kTokenLayer;
  h.set_dtype(tokens ? v1::DTYPE_I32 : v1::DTYPE_F32);
  h.set_row_bytes(tokens ? 4 : kRowBytes);
  return EncodeChunk(h, Payload(rows, h.row_bytes(), layer * 10 + index));
}

// 7 tokens, residuals for the first 6 at layers 0 and 2; layer 2 keeps
// positions 4.. only (a sliding window), so 5 chunks in all.
v1::SessionManifest Manifest() {
  v1::SessionManifest m;
  m.set_format_version(kCheckpointFormatVersion);
  m.set_tenant("acme");
  m.set_session_id("chat-1");
  m.mutable_model()->set_fingerprint("ab12");
  m.mutable_model()->set_precision("fp32");
  m.set_policy("kv-direct");
  m.add_layers(0);
  m.add_layers(2);
  m.set_chunk_tokens(kC);
  m.set_dtype(v1::DTYPE_F32);
  m.set_row_bytes(kRowBytes);
  m.set_token_count(7);
  m.set_length(6);
  m.add_turn_ends(3);
  m.add_turn_ends(7);
  m.add_first_position(0);
  m.add_first_position(4);
  (*m.mutable_labels())["title"] = "hello";
  m.set_stored_bytes(7 * 4 + (6 + 2) * kRowBytes);  // tokens + residual rows
  return m;
}

std::map<ChunkId, std::string> Chunks() {
  return {{{kTokenLayer, 0}, Chunk(kTokenLayer, 0, 4)},
          {{kTokenLayer, 1}, Chunk(kTokenLayer, 1, 3)},
          {{0, 0}, Chunk(0, 0, 4)},
          {{0, 1}, Chunk(0, 1, 2)},
          {{2, 1}, Chunk(2, 1, 2)}};
}

SessionCheckpoint Checkpoint() {
  SessionCheckpoint cp;
  cp.Reset(Manifest(), Chunks());
  return cp;
}

// The file layout written out independently of session_file.cc, from the
// format description in session_file.h.
std::string Le(uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i)
    out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}
struct Layout {
  uint32_t file_version = kSessionFileVersion;
  uint32_t format_version = kCheckpointFormatVersion;
  std::string manifest = Manifest().SerializeAsString();
  std::map<ChunkId, std::string> chunks = Chunks();
  int64_t count = -1;  // -1: the real count
};
std::string Build(const Layout& l) {
  std::string f("KVDSESS\0", 8);
  f += Le(l.file_version, 4) + Le(l.format_version, 4);
  f += Le(l.manifest.size(), 8) + l.manifest;
  for (const auto& [id, value] : l.chunks) {
    f += "C" + Le(id.layer, 8) + Le(id.index, 8) + Le(value.size(), 8) + value;
  }
  f += "E" + Le(l.count < 0 ? l.chunks.size() : l.count, 8);
  return f + Le(Crc32c(f), 4);
}

void ExpectSame(const SessionCheckpoint& a, const SessionCheckpoint& b) {
  EXPECT_EQ(a.manifest().SerializeAsString(), b.manifest().SerializeAsString());
  EXPECT_EQ(a.chunks(), b.chunks());
}

TEST(SessionFileTest, BytesMatchTheDocumentedLayout) {
  auto bytes = SerializeSessionFile(Checkpoint());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, Build(Layout{}));
}

TEST(SessionFileTest, RoundTripsThroughStringStreamAndFile) {
  const SessionCheckpoint cp = Checkpoint();
  auto bytes = SerializeSessionFile(cp);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto back = ParseSessionFile(*bytes, "test");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(cp, *back);

  std::stringstream stream;
  ASSERT_TRUE(WriteSessionStream(cp, stream).ok());
  EXPECT_EQ(stream.str(), *bytes);
  auto from_stream = ReadSessionStream(stream, "stream");
  ASSERT_TRUE(from_stream.ok()) << from_stream.status();
  ExpectSame(cp, *from_stream);

  const std::string path =
      absl::StrCat(::testing::TempDir(), "/roundtrip.kvds");
  ASSERT_TRUE(WriteSessionFile(cp, path).ok());
  auto from_file = ReadSessionFile(path);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  ExpectSame(cp, *from_file);
}

TEST(SessionFileTest, TokensOnlySessionRoundTrips) {
  v1::SessionManifest m = Manifest();
  m.set_policy("tokens");
  m.clear_layers();
  m.clear_first_position();
  m.set_stored_bytes(7 * 4);
  SessionCheckpoint cp;
  cp.Reset(m, {{{kTokenLayer, 0}, Chunk(kTokenLayer, 0, 4)},
               {{kTokenLayer, 1}, Chunk(kTokenLayer, 1, 3)}});
  auto bytes = SerializeSessionFile(cp);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto back = ParseSessionFile(*bytes, "test");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(cp, *back);
}

TEST(SessionFileTest, EveryTruncationIsRefused) {
  const std::string bytes = *SerializeSessionFile(Checkpoint());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto r = ParseSessionFile(absl::string_view(bytes).substr(0, n), "cut");
    ASSERT_FALSE(r.ok()) << "accepted the first " << n << " bytes";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << n;
    std::istringstream in(bytes.substr(0, n));
    auto s = ReadSessionStream(in, "cut");
    ASSERT_FALSE(s.ok()) << "stream accepted the first " << n << " bytes";
    EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << n;
  }
}

// In pieces (a gRPC stream's messages): the same bytes out, the same
// checkpoint back, whatever the piece size; and a stream cut at any byte is
// refused as the whole-file reader refuses it.
TEST(SessionFileTest, PiecesCarryTheSameFile) {
  const SessionCheckpoint cp = Checkpoint();
  const std::string whole = *SerializeSessionFile(cp);
  for (size_t piece_bytes : {size_t{1}, size_t{7}, size_t{4096}}) {
    std::vector<std::string> pieces;
    ASSERT_TRUE(WriteSessionPieces(cp, piece_bytes, [&](absl::string_view p) {
                  EXPECT_LE(p.size(), piece_bytes);
                  pieces.emplace_back(p);
                  return true;
                }).ok());
    EXPECT_EQ(absl::StrJoin(pieces, ""), whole) << piece_bytes;
    size_t next = 0;
    absl::StatusOr<SessionCheckpoint> back = ReadSessionPieces(
        [&](std::string* p) {
          if (next == pieces.size()) return false;
          *p = pieces[next++];
          return true;
        },
        "pieces");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->manifest().SerializeAsString(),
              cp.manifest().SerializeAsString());
    EXPECT_EQ(back->chunks(), cp.chunks());
  }
  // A receiver that goes away stops the writer.
  int calls = 0;
  EXPECT_EQ(
      WriteSessionPieces(cp, 16, [&](absl::string_view) { return ++calls < 3; })
          .code(),
      absl::StatusCode::kCancelled);
  EXPECT_EQ(calls, 3);
  for (size_t n = 0; n < whole.size(); n += 5) {
    bool given = false;
    absl::StatusOr<SessionCheckpoint> cut = ReadSessionPieces(
        [&](std::string* p) {
          if (given) return false;
          given = true;
          *p = whole.substr(0, n);
          return true;
        },
        "cut");
    ASSERT_FALSE(cut.ok()) << "accepted the first " << n << " bytes";
    EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss) << n;
  }
}

// A turn's update travels as the same kind of record stream: what comes
// out is what went in, and a stream cut or flipped anywhere is refused
// whole.
TEST(SessionFileTest, TurnUpdateStreamRoundTripsAndRefusesDamage) {
  const SessionCheckpoint cp = Checkpoint();
  TurnUpdate update;
  update.manifest = cp.manifest();
  // Given out of id order: the stream carries them in order.
  for (auto it = cp.chunks().rbegin(); it != cp.chunks().rend(); ++it) {
    if (it->first.index == 1) update.put.emplace_back(it->first, it->second);
  }
  update.erase.push_back(ChunkId{0, 0});
  update.ownership_change = true;
  std::string whole;
  ASSERT_TRUE(WriteTurnUpdatePieces(update, 5, [&](absl::string_view p) {
                whole.append(p.data(), p.size());
                return true;
              }).ok());
  auto read = [](const std::string& bytes) {
    bool given = false;
    return ReadTurnUpdatePieces(
        [&](std::string* p) {
          if (given) return false;
          given = true;
          *p = bytes;
          return true;
        },
        "turn");
  };
  absl::StatusOr<TurnUpdate> back = read(whole);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->manifest.SerializeAsString(),
            update.manifest.SerializeAsString());
  std::sort(update.put.begin(), update.put.end());
  EXPECT_EQ(back->put, update.put);
  EXPECT_EQ(back->erase, update.erase);
  EXPECT_TRUE(back->ownership_change);
  for (size_t n = 0; n < whole.size(); ++n) {
    absl::StatusOr<TurnUpdate> cut = read(whole.substr(0, n));
    ASSERT_FALSE(cut.ok()) << "accepted the first " << n << " bytes";
    EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss) << n;
  }
  for (size_t i = 0; i < whole.size(); ++i) {
    std::string bad = whole;
    bad[i] = static_cast<char>(bad[i] ^ 0x40);
    EXPECT_FALSE(read(bad).ok()) << "byte " << i;
  }
  EXPECT_FALSE(read(whole + "x").ok());
}

TEST(SessionFileTest, EveryFlippedByteIsRefused) {
  const std::string bytes = *SerializeSessionFile(Checkpoint());
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t mask : {0x01, 0x80, 0xFF}) {
      std::string bad = bytes;
      bad[i] = static_cast<char>(bad[i] ^ mask);
      EXPECT_FALSE(ParseSessionFile(bad, "flipped").ok())
          << "byte " << i << " ^ " << int{mask};
    }
  }
}

TEST(SessionFileTest, TrailingBytesAreRefused) {
  auto r = ParseSessionFile(Build(Layout{}) + "x", "long");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("after the trailer"));
}

TEST(SessionFileTest, WrongMagicIsNotASessionFile) {
  std::string bytes = Build(Layout{});
  bytes[0] = 'G';
  auto r = ParseSessionFile(bytes, "model.gguf");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("model.gguf is not a kvd session file"));
}

TEST(SessionFileTest, OtherFileVersionIsRefusedClearly) {
  Layout l;
  l.file_version = 2;
  auto r = ParseSessionFile(Build(l), "new.kvds");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("session file version 2"));
  EXPECT_THAT(r.status().message(), HasSubstr("release that exported it"));
}

TEST(SessionFileTest, OtherCheckpointFormatVersionIsRefused) {
  Layout l;
  l.format_version = kCheckpointFormatVersion + 1;
  EXPECT_EQ(ParseSessionFile(Build(l), "f").status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A header that disagrees with its manifest's version is damage.
  Layout m;
  v1::SessionManifest manifest = Manifest();
  manifest.set_format_version(kCheckpointFormatVersion + 1);
  m.manifest = manifest.SerializeAsString();
  auto r = ParseSessionFile(Build(m), "f");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(),
              HasSubstr("header says checkpoint format version 2 but the "
                        "manifest says 3"));
}

TEST(SessionFileTest, MissingExtraOrMisfiledChunksAreRefused) {
  {
    Layout l;
    l.chunks.erase(ChunkId{0, 1});
    auto r = ParseSessionFile(Build(l), "f");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(r.status().message(), HasSubstr("layer 0 chunk 1 is missing"));
  }
  {
    Layout l;
    l.chunks[ChunkId{2, 0}] = Chunk(2, 0, 4);  // below layer 2's window
    auto r = ParseSessionFile(Build(l), "f");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(r.status().message(), HasSubstr("not part of the manifest"));
  }
  {
    Layout l;
    l.chunks[ChunkId{0, 1}] = Chunk(2, 1, 2);  // right size, wrong header
    auto r = ParseSessionFile(Build(l), "f");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(r.status().message(), HasSubstr("holds the header of layer 2"));
  }
  {
    Layout l;
    l.chunks[ChunkId{0, 1}] = Chunk(0, 1, 1);  // one row short
    EXPECT_EQ(ParseSessionFile(Build(l), "f").status().code(),
              absl::StatusCode::kDataLoss);
  }
  {
    // An edited manifest (the file checksum recomputed) claiming fewer bytes
    // than it stores would get round a tenant's quota.
    Layout l;
    v1::SessionManifest m = Manifest();
    m.set_stored_bytes(0);
    l.manifest = m.SerializeAsString();
    auto r = ParseSessionFile(Build(l), "f");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(r.status().message(),
                HasSubstr("says 0 stored bytes but its chunks hold 92"));
  }
  {
    Layout l;
    l.count = 4;
    auto r = ParseSessionFile(Build(l), "f");
    EXPECT_THAT(r.status().message(), HasSubstr("trailer counts 4"));
  }
}

TEST(SessionFileTest, CorruptChunkUnderAValidFileChecksumIsRefused) {
  Layout l;
  std::string& v = l.chunks[ChunkId{0, 0}];
  v.back() = static_cast<char>(v.back() ^ 1);
  auto r = ParseSessionFile(Build(l), "f");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("CRC32C"));
}

TEST(SessionFileTest, InconsistentCheckpointIsNotWritten) {
  SessionCheckpoint cp;
  std::map<ChunkId, std::string> chunks = Chunks();
  chunks.erase(ChunkId{kTokenLayer, 1});
  cp.Reset(Manifest(), chunks);
  const std::string path = absl::StrCat(::testing::TempDir(), "/bad.kvds");
  absl::Status s = WriteSessionFile(cp, path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(SerializeSessionFile(SessionCheckpoint()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SessionFileTest, FailedWriteLeavesNothingUnderTheName) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/occupied");
  std::filesystem::create_directories(dir + "/inner");
  // `dir` is a non-empty directory, so the final rename must fail.
  absl::Status s = WriteSessionFile(Checkpoint(), dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr(dir));
  for (const auto& e :
       std::filesystem::directory_iterator(::testing::TempDir())) {
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  }
  EXPECT_EQ(WriteSessionFile(Checkpoint(), "/nonexistent-dir/x.kvds").code(),
            absl::StatusCode::kUnavailable);
}

TEST(SessionFileTest, OverwriteReplacesAWholeFile) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/over.kvds");
  ASSERT_TRUE(WriteSessionFile(Checkpoint(), path).ok());
  SessionCheckpoint cp = Checkpoint();
  v1::SessionManifest m = cp.manifest();
  m.set_session_id("chat-2");
  cp.Reset(m, cp.chunks());
  ASSERT_TRUE(WriteSessionFile(cp, path).ok());
  auto back = ReadSessionFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->manifest().session_id(), "chat-2");
}

TEST(SessionFileTest, ReadErrorsNameThePath) {
  auto missing = ReadSessionFile("/nonexistent-dir/x.kvds");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent-dir/x.kvds"));
  auto dir = ReadSessionFile(::testing::TempDir());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);

  const std::string path = absl::StrCat(::testing::TempDir(), "/cut.kvds");
  const std::string bytes = Build(Layout{});
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(bytes.data(), 1, bytes.size() - 3, f);
  std::fclose(f);
  auto cut = ReadSessionFile(path);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(cut.status().message(),
              HasSubstr(absl::StrCat("session file ", path, " ends inside")));
}

// Written by tools/reference/make_session_file_golden.py (Python protobuf +
// the PyPI crc32c package), an implementation independent of this one.
constexpr char kGoldenPath[] =
    "storage/checkpoint/testdata/session_file/golden_v1.kvds";

TEST(SessionFileTest, ReadsTheIndependentlyWrittenGoldenFile) {
  auto cp = ReadSessionFile(kGoldenPath);
  ASSERT_TRUE(cp.ok()) << cp.status();
  const v1::SessionManifest& m = cp->manifest();
  EXPECT_EQ(m.tenant(), "golden");
  EXPECT_EQ(m.session_id(), "s-1");
  EXPECT_EQ(m.model().fingerprint(), "c0ffee");
  EXPECT_EQ(m.model().numerics_version(), 2u);
  EXPECT_EQ(m.token_count(), 8);
  EXPECT_EQ(m.length(), 7);
  EXPECT_EQ(m.labels().at("title"), "golden");
  // 3 token chunks, 3 of layer 1, layer 3 from position 3: chunks 1 and 2.
  std::vector<ChunkId> ids;
  for (const auto& [id, value] : cp->chunks()) {
    ids.push_back(id);
    auto decoded = DecodeChunk(value, "golden");
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    std::string want(decoded->payload.size(), '\0');
    for (size_t i = 0; i < want.size(); ++i) {
      want[i] = static_cast<char>((id.layer * 7 + id.index * 13 + i) & 0xFF);
    }
    EXPECT_EQ(decoded->payload, want) << id.layer << "/" << id.index;
  }
  EXPECT_EQ(ids, (std::vector<ChunkId>{{kTokenLayer, 0},
                                       {kTokenLayer, 1},
                                       {kTokenLayer, 2},
                                       {1, 0},
                                       {1, 1},
                                       {1, 2},
                                       {3, 1},
                                       {3, 2}}));
  // Our writer produces the same bytes as the independent one.
  std::ifstream in(kGoldenPath, std::ios::binary);
  const std::string golden((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
  auto again = SerializeSessionFile(*cp);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, golden);
}

}  // namespace
}  // namespace kvd::storage
