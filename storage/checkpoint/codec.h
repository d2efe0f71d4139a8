// The checkpoint codec: how one chunk of a session checkpoint is laid out as
// bytes, checked, and named (proto/kvd/v1/checkpoint.proto has the format).
//
// A chunk value is
//   varint32 header size | ChunkHeader (serialized proto) | payload
// where the payload is `rows` rows of `row_bytes` bytes in `dtype` and the
// header's crc32c covers the payload. DecodeChunk refuses anything that does
// not add up (DATA_LOSS, naming the chunk), so callers never see a torn or
// flipped chunk as data.
//
//   v1::ChunkHeader h;
//   h.set_layer(3); h.set_chunk_index(2); h.set_first_position(2 * 64);
//   h.set_rows(64); h.set_dtype(v1::DTYPE_BF16); h.set_row_bytes(1152);
//   std::string value = EncodeChunk(h, payload);        // fills crc32c
//   KVD_ASSIGN_OR_RETURN(DecodedChunk c, DecodeChunk(value, "t/s layer 3"));
//
// Thread-safety: pure functions.
#ifndef KVD_STORAGE_CHECKPOINT_CODEC_H_
#define KVD_STORAGE_CHECKPOINT_CODEC_H_

#include <cstdint>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/kvd/v1/checkpoint.pb.h"

namespace kvd::storage {

// Bumped whenever the byte layout of anything in checkpoint.proto or of a
// chunk value changes meaning. kvd writes kCheckpointFormatVersion and reads
// every version from kOldestCheckpointFormatVersion on; another is refused.
// 2: session ownership (owner_node, epoch, role); a version-1 manifest reads
// as epoch 1 of no particular node (ownership.h).
inline constexpr uint32_t kCheckpointFormatVersion = 2;
inline constexpr uint32_t kOldestCheckpointFormatVersion = 1;
// ChunkHeader.layer of token-id chunks.
inline constexpr int64_t kTokenLayer = -1;
// Longest tenant or session id (bytes); see ValidateName.
inline constexpr size_t kMaxNameBytes = 128;

// Identifies a chunk within one session.
struct ChunkId {
  int64_t layer = kTokenLayer;
  int64_t index = 0;

  friend bool operator<(const ChunkId& a, const ChunkId& b) {
    return std::tie(a.layer, a.index) < std::tie(b.layer, b.index);
  }
  friend bool operator==(const ChunkId& a, const ChunkId& b) {
    return a.layer == b.layer && a.index == b.index;
  }
  template <typename H>
  friend H AbslHashValue(H h, const ChunkId& c) {
    return H::combine(std::move(h), c.layer, c.index);
  }
};

// Bytes of one element of `dtype` (0 for DTYPE_UNSPECIFIED).
int64_t DTypeBytes(v1::DType dtype);

// Serializes the header (with crc32c computed over `payload`) and payload.
std::string EncodeChunk(v1::ChunkHeader header, absl::string_view payload);

struct DecodedChunk {
  v1::ChunkHeader header;
  absl::string_view payload;  // points into the value passed to DecodeChunk
};
// DATA_LOSS (message names `where`, the chunk, and what is wrong) if the value
// is truncated, the header does not parse or is inconsistent (rows,
// row_bytes, dtype vs payload size), or the payload's CRC32C differs.
absl::StatusOr<DecodedChunk> DecodeChunk(absl::string_view value,
                                         absl::string_view where);

// Tenant and session ids: 1..kMaxNameBytes of [A-Za-z0-9._-], not "." or
// "..". They appear inside storage keys and file names, so nothing else is
// allowed. INVALID_ARGUMENT naming `what` ("tenant", "session id") otherwise.
absl::Status ValidateName(absl::string_view what, absl::string_view name);

// FAILED_PRECONDITION unless `stored` (from a checkpoint of `session`) and
// `loaded` (the running model) agree on fingerprint and precision: the
// session's tokens mean nothing to another model. The message says which
// field differs, both values, and what to do. The numerics version is not
// checked here (see SameNumerics).
absl::Status CheckCompatible(const v1::ModelIdentity& stored,
                             const v1::ModelIdentity& loaded,
                             absl::string_view session);

// FAILED_PRECONDITION unless `stored` and `loaded` have the same numerics
// version: the residuals of a checkpoint computed under other numerics (the
// other backend, or a kernel build with other reduction orders) would not
// give this build's bits, though its tokens are still good. The engine then
// re-prefills the session from its tokens instead of refusing it; the
// message says why, for the restore's path detail.
absl::Status SameNumerics(const v1::ModelIdentity& stored,
                          const v1::ModelIdentity& loaded);

// A manifest's internal consistency: format version, names, policy and layer
// list, chunk_tokens > 0, dtype/row_bytes, 0 <= length <= token_count,
// turn_ends ascending and ending at token_count, first_position per layer.
// FAILED_PRECONDITION for another format version, DATA_LOSS otherwise.
absl::Status ValidateManifest(const v1::SessionManifest& manifest);

}  // namespace kvd::storage

#endif  // KVD_STORAGE_CHECKPOINT_CODEC_H_
