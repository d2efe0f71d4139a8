#include "storage/rocksdb/session_db_test_util.h"

#include <algorithm>

#include "storage/checkpoint/codec.h"

namespace kvd::storage::testing {

SyntheticSession::SyntheticSession(SyntheticSessionOptions options)
    : options_(std::move(options)) {
  manifest_.set_format_version(kCheckpointFormatVersion);
  manifest_.set_tenant(options_.tenant);
  manifest_.set_session_id(options_.session);
  manifest_.mutable_model()->set_model_name("synthetic");
  manifest_.mutable_model()->set_fingerprint("00ff");
  manifest_.mutable_model()->set_precision("bf16");
  manifest_.mutable_model()->set_numerics_version(1);
  manifest_.set_policy(options_.layers.empty() ? "tokens" : "kv-direct");
  for (int64_t l : options_.layers) {
    manifest_.add_layers(l);
    manifest_.add_first_position(0);
  }
  manifest_.set_chunk_tokens(options_.chunk_tokens);
  if (!options_.layers.empty()) {
    manifest_.set_dtype(v1::DTYPE_BF16);
    manifest_.set_row_bytes(options_.row_bytes);
  }
}

std::string SyntheticSession::Row(int64_t layer, int64_t position) const {
  const int64_t n = layer == kTokenLayer ? 4 : options_.row_bytes;
  std::string row(n, '\0');
  uint32_t x = options_.seed * 2654435761u +
               static_cast<uint32_t>(layer + 1) * 40503u +
               static_cast<uint32_t>(position) * 69069u;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    row[i] = static_cast<char>(x >> 24);
  }
  return row;
}

std::string SyntheticSession::ChunkValue(const ChunkId& id) const {
  const int64_t c = options_.chunk_tokens;
  const int64_t end =
      id.layer == kTokenLayer ? manifest_.token_count() : manifest_.length();
  const int64_t first = id.index * c;
  const int64_t rows = std::min(c, end - first);
  std::string payload;
  for (int64_t p = first; p < first + rows; ++p) payload += Row(id.layer, p);
  v1::ChunkHeader h;
  h.set_layer(id.layer);
  h.set_chunk_index(id.index);
  h.set_first_position(first);
  h.set_rows(rows);
  h.set_dtype(id.layer == kTokenLayer ? v1::DTYPE_I32 : v1::DTYPE_BF16);
  h.set_row_bytes(id.layer == kTokenLayer ? 4 : options_.row_bytes);
  return EncodeChunk(h, payload);
}

TurnUpdate SyntheticSession::AppendTurn(int64_t tokens) {
  const int64_t c = options_.chunk_tokens;
  const int64_t old_count = manifest_.token_count();
  const int64_t new_count = old_count + tokens;
  manifest_.set_token_count(new_count);
  manifest_.set_length(new_count);
  manifest_.add_turn_ends(new_count);
  const int64_t per_token =
      4 + options_.row_bytes * static_cast<int64_t>(options_.layers.size());
  manifest_.set_stored_bytes(new_count * per_token);
  TurnUpdate update;
  update.manifest = manifest_;
  std::vector<int64_t> streams = {kTokenLayer};
  streams.insert(streams.end(), options_.layers.begin(), options_.layers.end());
  for (int64_t layer : streams) {
    for (int64_t i = old_count / c; i * c < new_count; ++i) {
      update.put.emplace_back(ChunkId{layer, i}, ChunkValue({layer, i}));
    }
  }
  return update;
}

}  // namespace kvd::storage::testing
