// Byte layout of the RocksDB tier's keys (session_db.h). Deterministic: no
// hashing, no per-process seeds, so a key written by one process is found by
// any other, and the layout is pinned by a test against hand-written bytes.
//
//   manifest key:  <tenant> "/" <session>
//   chunk key:     <tenant> "/" <session> "/" layer(8) index(8)
//     layer(8): the int64 layer as big-endian with the sign bit flipped, so
//               byte order is numeric order and the token layer (-1) sorts
//               before layer 0;
//     index(8): the chunk index (>= 0) as big-endian uint64.
//
// Names never contain '/' (ValidateName), so "<tenant>/" and
// "<tenant>/<session>/" are unambiguous prefixes: one tenant's sessions, one
// session's chunks in (layer, position) order.
//
// Thread-safety: pure functions.
#ifndef KVD_STORAGE_ROCKSDB_KEYS_H_
#define KVD_STORAGE_ROCKSDB_KEYS_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "storage/checkpoint/codec.h"

namespace kvd::storage {

std::string SessionKey(absl::string_view tenant, absl::string_view session);
// "<tenant>/": every manifest key of the tenant starts with it.
std::string TenantPrefix(absl::string_view tenant);
// "<tenant>/<session>/": every chunk key of the session starts with it.
std::string ChunkPrefix(absl::string_view tenant, absl::string_view session);
std::string ChunkKey(absl::string_view tenant, absl::string_view session,
                     const ChunkId& id);

struct ParsedChunkKey {
  absl::string_view prefix;  // "<tenant>/<session>/", into the parsed key
  absl::string_view tenant;
  absl::string_view session;
  ChunkId id;
};
// nullopt unless `key` has the chunk key layout.
std::optional<ParsedChunkKey> ParseChunkKey(absl::string_view key);

// The smallest key greater than every key starting with `prefix` (prefixes
// here end in '/', so incrementing the last byte never carries).
std::string PrefixUpperBound(absl::string_view prefix);

}  // namespace kvd::storage

#endif  // KVD_STORAGE_ROCKSDB_KEYS_H_
