// Test helper: a synthetic session whose turns produce TurnUpdates with
// deterministic rows, so tests can check what comes back byte for byte.
// Not a model: rows are a function of (seed, layer, position).
#ifndef KVD_STORAGE_ROCKSDB_SESSION_DB_TEST_UTIL_H_
#define KVD_STORAGE_ROCKSDB_SESSION_DB_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "proto/kvd/v1/checkpoint.pb.h"
#include "storage/checkpoint/session_checkpoint.h"

namespace kvd::storage::testing {

struct SyntheticSessionOptions {
  std::string tenant = "acme";
  std::string session = "chat-1";
  std::vector<int64_t> layers = {0, 2};
  int64_t chunk_tokens = 4;
  int64_t row_bytes = 16;  // bf16 x 8
  uint32_t seed = 1;
};

class SyntheticSession {
 public:
  explicit SyntheticSession(SyntheticSessionOptions options = {});

  // The update for a turn that appends `tokens` tokens (all of them run
  // through the model, so length == token_count).
  TurnUpdate AppendTurn(int64_t tokens);

  // The bytes a row must have (residual rows; token ids for kTokenLayer).
  std::string Row(int64_t layer, int64_t position) const;
  // The full chunk value SessionDb::Load should return for `id` now.
  std::string ChunkValue(const ChunkId& id) const;
  const v1::SessionManifest& manifest() const { return manifest_; }

 private:
  SyntheticSessionOptions options_;
  v1::SessionManifest manifest_;
};

}  // namespace kvd::storage::testing

#endif  // KVD_STORAGE_ROCKSDB_SESSION_DB_TEST_UTIL_H_
