// The codec's contract: what EncodeChunk writes DecodeChunk reads back, and
// every kind of damage (truncation, flipped payload bits, flipped header
// bytes, inconsistent row counts) is DATA_LOSS naming the chunk. CRC values
// are checked against RFC 3720 in crc32c_test.cc, so here the CRC is trusted.
#include "storage/checkpoint/codec.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/crc32c.h"

namespace kvd::storage {
namespace {

using ::testing::HasSubstr;

v1::ChunkHeader ResidualHeader(int64_t rows = 4) {
  v1::ChunkHeader h;
  h.set_layer(3);
  h.set_chunk_index(2);
  h.set_first_position(2 * 4);
  h.set_rows(rows);
  h.set_dtype(v1::DTYPE_BF16);
  h.set_row_bytes(16);
  return h;
}

std::string Payload(size_t n) {
  std::string p(n, '\0');
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(i * 37 + 11);
  return p;
}

void ExpectDataLoss(absl::string_view value, absl::string_view needle) {
  auto r = DecodeChunk(value, "acme/chat-1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("acme/chat-1"));
  EXPECT_THAT(r.status().message(), HasSubstr(needle));
}

TEST(Codec, RoundTripsAndFillsCrc) {
  const std::string payload = Payload(64);
  const std::string value = EncodeChunk(ResidualHeader(), payload);
  auto c = DecodeChunk(value, "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->payload, payload);
  EXPECT_EQ(c->header.crc32c(), Crc32c(payload));
  EXPECT_EQ(c->header.layer(), 3);
  EXPECT_EQ(c->header.chunk_index(), 2);
  EXPECT_EQ(c->header.rows(), 4);
}

TEST(Codec, LayoutIsVarintHeaderLengthThenHeaderThenPayload) {
  const std::string payload = Payload(64);
  const std::string value = EncodeChunk(ResidualHeader(), payload);
  const auto header_bytes = static_cast<uint8_t>(value[0]);
  ASSERT_LT(header_bytes, 0x80);
  v1::ChunkHeader h;
  ASSERT_TRUE(h.ParseFromString(value.substr(1, header_bytes)));
  EXPECT_EQ(h.row_bytes(), 16);
  EXPECT_EQ(value.substr(1 + header_bytes), payload);
}

TEST(Codec, TokenChunkRoundTrips) {
  v1::ChunkHeader h;
  h.set_layer(kTokenLayer);
  h.set_rows(3);
  h.set_dtype(v1::DTYPE_I32);
  h.set_row_bytes(4);
  auto c = DecodeChunk(EncodeChunk(h, Payload(12)), "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->header.layer(), kTokenLayer);
}

TEST(Codec, EveryTruncationIsDataLoss) {
  const std::string value = EncodeChunk(ResidualHeader(), Payload(64));
  for (size_t n = 0; n < value.size(); ++n) {
    auto r = DecodeChunk(value.substr(0, n), "w");
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes decoded";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  }
  ExpectDataLoss(value.substr(0, value.size() - 1),
                 "payload is 63 bytes but the header says 4 rows x 16");
  ExpectDataLoss("", "no valid header length");
}

TEST(Codec, EveryFlippedPayloadBitIsDataLoss) {
  const std::string good = EncodeChunk(ResidualHeader(), Payload(64));
  const size_t payload_start = good.size() - 64;
  for (size_t bit = payload_start * 8; bit < good.size() * 8; ++bit) {
    std::string bad = good;
    bad[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    auto r = DecodeChunk(bad, "w");
    ASSERT_FALSE(r.ok()) << "bit " << bit;
    EXPECT_THAT(r.status().message(), HasSubstr("CRC32C"));
  }
  std::string bad = good;
  bad[payload_start + 5] ^= 0x10;
  ExpectDataLoss(bad, "layer 3 chunk 2: payload CRC32C is");
}

TEST(Codec, EveryFlippedHeaderByteIsDetected) {
  const std::string good = EncodeChunk(ResidualHeader(), Payload(64));
  const size_t header_end = good.size() - 64;
  for (size_t i = 0; i < header_end; ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[i] ^= static_cast<char>(1 << bit);
      auto r = DecodeChunk(bad, "w");
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
        continue;
      }
      // A flip that still decodes may only have changed metadata the codec
      // cannot cross-check alone (layer, index, first position, dtype); the
      // payload must be intact, and SessionDb checks the rest against the key
      // and the manifest.
      const v1::ChunkHeader& h = r->header;
      EXPECT_EQ(r->payload, good.substr(header_end)) << "byte " << i;
      EXPECT_EQ(h.rows() * h.row_bytes(), 64) << "byte " << i;
      EXPECT_TRUE(h.layer() != 3 || h.chunk_index() != 2 ||
                  h.first_position() != 8 || h.rows() != 4 ||
                  h.dtype() != v1::DTYPE_BF16 || h.row_bytes() != 16)
          << "a flip at byte " << i << " bit " << bit << " changed nothing";
    }
  }
}

TEST(Codec, InconsistentHeadersAreDataLoss) {
  {
    v1::ChunkHeader h = ResidualHeader(5);  // says 5 rows, carries 4
    ExpectDataLoss(EncodeChunk(h, Payload(64)), "says 5 rows x 16");
  }
  {
    v1::ChunkHeader h = ResidualHeader(0);
    ExpectDataLoss(EncodeChunk(h, ""), "row count 0");
  }
  {
    v1::ChunkHeader h = ResidualHeader();
    h.set_row_bytes(15);  // not a whole number of bf16 values
    ExpectDataLoss(EncodeChunk(h, Payload(60)), "does not fit row_bytes 15");
  }
  {
    v1::ChunkHeader h = ResidualHeader();
    h.set_dtype(v1::DTYPE_UNSPECIFIED);
    ExpectDataLoss(EncodeChunk(h, Payload(64)), "DTYPE_UNSPECIFIED");
  }
  {
    v1::ChunkHeader h = ResidualHeader();
    h.set_layer(kTokenLayer);  // token rows must be int32
    ExpectDataLoss(EncodeChunk(h, Payload(64)), "token rows must be one int32");
  }
  {
    v1::ChunkHeader h = ResidualHeader();
    h.set_chunk_index(-1);
    ExpectDataLoss(EncodeChunk(h, Payload(64)), "negative");
  }
  // A header length pointing past the value.
  std::string value = EncodeChunk(ResidualHeader(), Payload(64));
  value[0] = static_cast<char>(0x7f);
  ExpectDataLoss(value, "header length 127 exceeds");
  // A header that is not a ChunkHeader at all.
  ExpectDataLoss(std::string("\x03\xff\xff\xff", 4), "does not parse");
}

TEST(ValidateName, AcceptsTheDocumentedAlphabet) {
  EXPECT_TRUE(ValidateName("tenant", "Acme-1.prod_eu").ok());
  EXPECT_TRUE(ValidateName("tenant", std::string(kMaxNameBytes, 'a')).ok());
  for (absl::string_view bad :
       {"", ".", "..", "a/b", "a b", "ü", "a:b", "a\nb"}) {
    absl::Status s = ValidateName("session id", bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("session id"));
  }
  EXPECT_FALSE(ValidateName("tenant", std::string("a\0b", 3)).ok());
  EXPECT_FALSE(
      ValidateName("tenant", std::string(kMaxNameBytes + 1, 'a')).ok());
}

v1::ModelIdentity Identity() {
  v1::ModelIdentity m;
  m.set_model_name("SmolLM2-135M");
  m.set_fingerprint("ab12");
  m.set_precision("bf16");
  m.set_numerics_version(1);
  return m;
}

TEST(CheckCompatible, NamesTheDifferingField) {
  EXPECT_TRUE(CheckCompatible(Identity(), Identity(), "acme/s").ok());
  v1::ModelIdentity other = Identity();
  other.set_model_name("renamed");  // for people only
  EXPECT_TRUE(CheckCompatible(Identity(), other, "acme/s").ok());

  other = Identity();
  other.set_fingerprint("cd34");
  absl::Status s = CheckCompatible(Identity(), other, "acme/s");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("model fingerprint ab12"));
  EXPECT_THAT(s.message(), HasSubstr("cd34"));
  EXPECT_THAT(s.message(), HasSubstr("acme/s"));

  other = Identity();
  other.set_precision("fp32");
  EXPECT_THAT(CheckCompatible(Identity(), other, "s").message(),
              HasSubstr("precision bf16"));
  // Other numerics leave the tokens good: compatible, but not SameNumerics.
  other = Identity();
  other.set_numerics_version(1001);
  EXPECT_TRUE(CheckCompatible(Identity(), other, "s").ok());
  EXPECT_TRUE(SameNumerics(Identity(), Identity()).ok());
  const absl::Status numerics = SameNumerics(Identity(), other);
  EXPECT_EQ(numerics.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(numerics.message(), HasSubstr("numerics version 1 and"));
  EXPECT_THAT(numerics.message(), HasSubstr("version 1001"));
}

v1::SessionManifest GoodManifest() {
  v1::SessionManifest m;
  m.set_format_version(kCheckpointFormatVersion);
  m.set_tenant("acme");
  m.set_session_id("chat-1");
  *m.mutable_model() = Identity();
  m.set_policy("stride:2");
  m.add_layers(0);
  m.add_layers(2);
  m.add_first_position(0);
  m.add_first_position(0);
  m.set_chunk_tokens(4);
  m.set_dtype(v1::DTYPE_BF16);
  m.set_row_bytes(16);
  m.set_token_count(10);
  m.set_length(9);
  m.add_turn_ends(6);
  m.add_turn_ends(10);
  return m;
}

TEST(ValidateManifest, AcceptsAGoodManifest) {
  EXPECT_TRUE(ValidateManifest(GoodManifest()).ok())
      << ValidateManifest(GoodManifest());
  v1::SessionManifest tokens = GoodManifest();
  tokens.set_policy("tokens");
  tokens.clear_layers();
  tokens.clear_first_position();
  tokens.set_dtype(v1::DTYPE_UNSPECIFIED);
  tokens.set_row_bytes(0);
  EXPECT_TRUE(ValidateManifest(tokens).ok()) << ValidateManifest(tokens);
}

TEST(ValidateManifest, OtherFormatVersionIsFailedPrecondition) {
  v1::SessionManifest m = GoodManifest();
  m.set_format_version(kCheckpointFormatVersion + 1);
  absl::Status s = ValidateManifest(m);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("format version 3"));
  EXPECT_THAT(s.message(), HasSubstr("reads versions 1 to 2"));
  // The previous format still reads.
  m.set_format_version(1);
  EXPECT_TRUE(ValidateManifest(m).ok()) << ValidateManifest(m);
}

TEST(ValidateManifest, InconsistenciesAreDataLoss) {
  struct Case {
    const char* name;
    void (*mutate)(v1::SessionManifest*);
    const char* needle;
  };
  const Case cases[] = {
      {"bad tenant", [](v1::SessionManifest* m) { m->set_tenant("a/b"); },
       "tenant"},
      {"no session", [](v1::SessionManifest* m) { m->clear_session_id(); },
       "session id"},
      {"policy", [](v1::SessionManifest* m) { m->set_policy("stride:0"); },
       "unknown checkpoint policy"},
      {"tokens with layers",
       [](v1::SessionManifest* m) { m->set_policy("tokens"); }, "stores no"},
      {"layers unsorted", [](v1::SessionManifest* m) { m->set_layers(1, 0); },
       "strictly ascending"},
      {"chunk_tokens", [](v1::SessionManifest* m) { m->set_chunk_tokens(0); },
       "chunk_tokens 0"},
      {"dtype", [](v1::SessionManifest* m) { m->set_dtype(v1::DTYPE_I32); },
       "residual dtype"},
      {"row_bytes", [](v1::SessionManifest* m) { m->set_row_bytes(15); },
       "row_bytes 15"},
      {"length", [](v1::SessionManifest* m) { m->set_length(11); },
       "length 11"},
      {"turn_ends order",
       [](v1::SessionManifest* m) { m->set_turn_ends(0, 10); }, "turn_ends"},
      {"turn_ends end", [](v1::SessionManifest* m) { m->set_turn_ends(1, 9); },
       "end at 9"},
      {"first_position count",
       [](v1::SessionManifest* m) { m->add_first_position(0); },
       "first_position has 3"},
      {"first_position range",
       [](v1::SessionManifest* m) { m->set_first_position(1, 10); },
       "first_position 10"},
      {"stored_bytes", [](v1::SessionManifest* m) { m->set_stored_bytes(-1); },
       "stored_bytes"},
  };
  for (const Case& c : cases) {
    v1::SessionManifest m = GoodManifest();
    c.mutate(&m);
    absl::Status s = ValidateManifest(m);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << c.name << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(c.needle)) << c.name;
  }
}

}  // namespace
}  // namespace kvd::storage
