#include "storage/checkpoint/codec.h"

#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "storage/checkpoint/crc32c.h"

namespace kvd::storage {
namespace {

// A ChunkHeader is 7 small fields (< 64 bytes); anything much larger is
// corruption, and refusing it early keeps a flipped length byte from
// steering the parse.
constexpr uint32_t kMaxHeaderBytes = 256;
// Bounds that keep row arithmetic far from int64 overflow.
constexpr int64_t kMaxRowBytes = int64_t{1} << 24;
constexpr int64_t kMaxChunkTokens = int64_t{1} << 20;

const char kRepair[] =
    "; the stored chunk is torn or corrupt: delete the session and re-import "
    "it, or resume it from its token ids";

void PutVarint32(std::string* out, uint32_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Advances `in` past a varint32; false if it is truncated or longer than 5
// bytes.
bool GetVarint32(absl::string_view* in, uint32_t* v) {
  uint32_t result = 0;
  for (int shift = 0, i = 0; i < 5 && i < static_cast<int>(in->size());
       ++i, shift += 7) {
    const uint8_t byte = static_cast<uint8_t>((*in)[i]);
    if (i == 4 && byte > 0x0F) return false;
    result |= uint32_t{byte & 0x7Fu} << shift;
    if ((byte & 0x80) == 0) {
      in->remove_prefix(i + 1);
      *v = result;
      return true;
    }
  }
  return false;
}

std::string ChunkName(const v1::ChunkHeader& h) {
  return h.layer() == kTokenLayer
             ? absl::StrCat("token chunk ", h.chunk_index())
             : absl::StrCat("layer ", h.layer(), " chunk ", h.chunk_index());
}

absl::Status Corrupt(absl::string_view where, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(where, ": ", what, kRepair));
}

bool IsValidPolicy(absl::string_view policy) {
  if (policy == "kv" || policy == "kv-direct" || policy == "tokens") {
    return true;
  }
  int64_t stride = 0;
  return absl::ConsumePrefix(&policy, "stride:") &&
         absl::SimpleAtoi(policy, &stride) && stride >= 1;
}

}  // namespace

int64_t DTypeBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32:
    case v1::DTYPE_I32:
      return 4;
    case v1::DTYPE_BF16:
      return 2;
    default:
      return 0;
  }
}

std::string EncodeChunk(v1::ChunkHeader header, absl::string_view payload) {
  header.set_crc32c(Crc32c(payload));
  const std::string h = header.SerializeAsString();
  std::string out;
  out.reserve(5 + h.size() + payload.size());
  PutVarint32(&out, static_cast<uint32_t>(h.size()));
  out.append(h);
  out.append(payload.data(), payload.size());
  return out;
}

absl::StatusOr<DecodedChunk> DecodeChunk(absl::string_view value,
                                         absl::string_view where) {
  absl::string_view in = value;
  uint32_t header_bytes = 0;
  if (!GetVarint32(&in, &header_bytes)) {
    return Corrupt(where, absl::StrCat("chunk value of ", value.size(),
                                       " bytes has no valid header length"));
  }
  if (header_bytes > kMaxHeaderBytes || header_bytes > in.size()) {
    return Corrupt(
        where,
        absl::StrCat("chunk header length ", header_bytes, " exceeds the ",
                     in.size(), " bytes left in the value (or the limit ",
                     kMaxHeaderBytes, ")"));
  }
  DecodedChunk chunk;
  if (!chunk.header.ParseFromArray(in.data(), static_cast<int>(header_bytes))) {
    return Corrupt(where, "chunk header does not parse");
  }
  in.remove_prefix(header_bytes);
  const v1::ChunkHeader& h = chunk.header;
  const std::string name = ChunkName(h);
  const int64_t elem = DTypeBytes(h.dtype());
  if (h.layer() < kTokenLayer || h.chunk_index() < 0 ||
      h.first_position() < 0) {
    return Corrupt(where, absl::StrCat(name,
                                       ": negative layer, index or "
                                       "first position (first position ",
                                       h.first_position(), ")"));
  }
  if (elem == 0 || h.row_bytes() <= 0 || h.row_bytes() > kMaxRowBytes ||
      h.row_bytes() % elem != 0) {
    return Corrupt(where,
                   absl::StrCat(name, ": dtype ", v1::DType_Name(h.dtype()),
                                " does not fit row_bytes ", h.row_bytes()));
  }
  if (h.layer() == kTokenLayer &&
      (h.dtype() != v1::DTYPE_I32 || h.row_bytes() != 4)) {
    return Corrupt(where, absl::StrCat(name,
                                       ": token rows must be one int32 "
                                       "(dtype ",
                                       v1::DType_Name(h.dtype()),
                                       ", row_bytes ", h.row_bytes(), ")"));
  }
  if (h.rows() < 1 || h.rows() > kMaxChunkTokens) {
    return Corrupt(where, absl::StrCat(name, ": row count ", h.rows(),
                                       " is outside 1..", kMaxChunkTokens));
  }
  const int64_t want = h.rows() * h.row_bytes();
  if (static_cast<int64_t>(in.size()) != want) {
    return Corrupt(
        where, absl::StrCat(name, ": payload is ", in.size(),
                            " bytes but the header says ", h.rows(), " rows x ",
                            h.row_bytes(), " bytes = ", want));
  }
  const uint32_t crc = Crc32c(in);
  if (crc != h.crc32c()) {
    return Corrupt(
        where, absl::StrCat(name, ": payload CRC32C is ", absl::Hex(crc),
                            " but the header says ", absl::Hex(h.crc32c())));
  }
  chunk.payload = in;
  return chunk;
}

absl::Status ValidateName(absl::string_view what, absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", absl::CHexEscape(name.substr(0, 160)),
                     "\" must be 1..", kMaxNameBytes, " bytes long"));
  }
  if (name == "." || name == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", name, "\" is reserved; choose another"));
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " \"", absl::CHexEscape(name),
          "\" may contain only letters, digits, '.', '_' and '-' (it becomes "
          "part of storage keys and file names)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckCompatible(const v1::ModelIdentity& stored,
                             const v1::ModelIdentity& loaded,
                             absl::string_view session) {
  auto mismatch = [&](absl::string_view field, absl::string_view a,
                      absl::string_view b) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", session, " was checkpointed with ", field, " ", a,
        " but the loaded model has ", field, " ", b,
        "; resume it on a node serving the same model (\"", stored.model_name(),
        "\") and precision, or start a new session"));
  };
  if (stored.fingerprint() != loaded.fingerprint()) {
    return mismatch("model fingerprint", stored.fingerprint(),
                    loaded.fingerprint());
  }
  if (stored.precision() != loaded.precision()) {
    return mismatch("precision", stored.precision(), loaded.precision());
  }
  return absl::OkStatus();
}

absl::Status SameNumerics(const v1::ModelIdentity& stored,
                          const v1::ModelIdentity& loaded) {
  if (stored.numerics_version() == loaded.numerics_version())
    return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "its residuals were computed under numerics version ",
      stored.numerics_version(), " and this node runs version ",
      loaded.numerics_version(),
      " (another backend or kernel build), so they would not give this "
      "node's bits"));
}

absl::Status ValidateManifest(const v1::SessionManifest& m) {
  const std::string where =
      absl::StrCat("manifest of session ", absl::CHexEscape(m.tenant()), "/",
                   absl::CHexEscape(m.session_id()));
  if (m.format_version() < kOldestCheckpointFormatVersion ||
      m.format_version() > kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, " has checkpoint format version ", m.format_version(),
        " but this kvd reads versions ", kOldestCheckpointFormatVersion, " to ",
        kCheckpointFormatVersion,
        "; resume it with the kvd release that wrote it"));
  }
  auto bad = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(where, ": ", what));
  };
  if (absl::Status s = ValidateName("tenant", m.tenant()); !s.ok()) {
    return bad(s.message());
  }
  if (absl::Status s = ValidateName("session id", m.session_id()); !s.ok()) {
    return bad(s.message());
  }
  if (!IsValidPolicy(m.policy())) {
    return bad(absl::StrCat("unknown checkpoint policy \"",
                            absl::CHexEscape(m.policy()), "\""));
  }
  if (m.policy() == "tokens" && m.layers_size() != 0) {
    return bad("policy \"tokens\" stores no layers but the manifest lists " +
               absl::StrCat(m.layers_size()));
  }
  for (int i = 0; i < m.layers_size(); ++i) {
    if (m.layers(i) < 0 || (i > 0 && m.layers(i) <= m.layers(i - 1))) {
      return bad(absl::StrCat("layer list [", absl::StrJoin(m.layers(), ","),
                              "] is not strictly ascending from 0 or more"));
    }
  }
  if (m.chunk_tokens() <= 0 || m.chunk_tokens() > kMaxChunkTokens) {
    return bad(absl::StrCat("chunk_tokens ", m.chunk_tokens(),
                            " is outside 1..", kMaxChunkTokens));
  }
  if (m.layers_size() > 0) {
    const int64_t elem = DTypeBytes(m.dtype());
    if ((m.dtype() != v1::DTYPE_F32 && m.dtype() != v1::DTYPE_BF16) ||
        m.row_bytes() <= 0 || m.row_bytes() > kMaxRowBytes ||
        m.row_bytes() % elem != 0) {
      return bad(absl::StrCat("residual dtype ", v1::DType_Name(m.dtype()),
                              " with row_bytes ", m.row_bytes(),
                              " is not a valid row layout"));
    }
  }
  if (m.token_count() < 0 || m.length() < 0 || m.length() > m.token_count()) {
    return bad(absl::StrCat("length ", m.length(), " and token_count ",
                            m.token_count(),
                            " must satisfy 0 <= length <= token_count"));
  }
  for (int i = 0; i < m.turn_ends_size(); ++i) {
    if (m.turn_ends(i) <= (i == 0 ? 0 : m.turn_ends(i - 1))) {
      return bad(absl::StrCat("turn_ends [", absl::StrJoin(m.turn_ends(), ","),
                              "] are not strictly ascending and positive"));
    }
  }
  const int64_t last_end =
      m.turn_ends_size() == 0 ? 0 : m.turn_ends(m.turn_ends_size() - 1);
  if (last_end != m.token_count()) {
    return bad(absl::StrCat("turn_ends end at ", last_end,
                            " but token_count is ", m.token_count()));
  }
  if (m.first_position_size() != m.layers_size()) {
    return bad(absl::StrCat("first_position has ", m.first_position_size(),
                            " entries for ", m.layers_size(), " layers"));
  }
  for (int i = 0; i < m.first_position_size(); ++i) {
    if (m.first_position(i) < 0 || m.first_position(i) > m.length()) {
      return bad(absl::StrCat("first_position ", m.first_position(i),
                              " of layer ", m.layers(i), " is outside 0..",
                              m.length()));
    }
  }
  if (m.stored_bytes() < 0) {
    return bad(absl::StrCat("stored_bytes ", m.stored_bytes(), " < 0"));
  }
  return absl::OkStatus();
}

}  // namespace kvd::storage
