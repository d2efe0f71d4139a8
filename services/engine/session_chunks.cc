#include "services/engine/session_chunks.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/checkpoint/codec.h"

namespace kvd::engine {
namespace {

using storage::ChunkId;

v1::ChunkHeader Header(int64_t layer, int64_t index, int64_t c, int64_t rows,
                       v1::DType dtype, int64_t row_bytes) {
  v1::ChunkHeader h;
  h.set_layer(layer);
  h.set_chunk_index(index);
  h.set_first_position(index * c);
  h.set_rows(rows);
  h.set_dtype(dtype);
  h.set_row_bytes(row_bytes);
  return h;
}

// Chunks of a stream grown from `from` to `to` positions: the one holding
// position `from` (rewritten: it may be partly filled) up to the last.
std::pair<int64_t, int64_t> TouchedChunks(int64_t from, int64_t to, int64_t c) {
  if (to <= from) return {0, 0};
  return {from / c, (to + c - 1) / c};
}

absl::StatusOr<storage::DecodedChunk> FindChunk(
    const v1::SessionManifest& m, const std::map<ChunkId, std::string>& chunks,
    ChunkId id, int64_t expected_rows, v1::DType dtype, int64_t row_bytes) {
  const std::string where = absl::StrCat(
      "session ", m.tenant(), "/", m.session_id(), " ",
      id.layer == storage::kTokenLayer ? std::string("token ids")
                                       : absl::StrCat("layer ", id.layer),
      " chunk ", id.index);
  auto it = chunks.find(id);
  if (it == chunks.end()) {
    return absl::DataLossError(
        absl::StrCat(where, " is missing from the checkpoint"));
  }
  absl::StatusOr<storage::DecodedChunk> chunk =
      storage::DecodeChunk(it->second, where);
  if (!chunk.ok()) return chunk.status();
  const v1::ChunkHeader& h = chunk->header;
  if (h.layer() != id.layer || h.chunk_index() != id.index ||
      h.dtype() != dtype || h.row_bytes() != row_bytes ||
      h.rows() < expected_rows) {
    return absl::DataLossError(absl::StrCat(
        where, " does not match its manifest: header says layer ", h.layer(),
        " chunk ", h.chunk_index(), ", ", h.rows(), " rows of ", h.row_bytes(),
        " bytes, dtype ", v1::DType_Name(h.dtype()), "; expected ",
        expected_rows, " rows of ", row_bytes, " bytes, dtype ",
        v1::DType_Name(dtype)));
  }
  return chunk;
}

}  // namespace

absl::Status ResidualRows::CopyRows(int64_t layer, int64_t first, int64_t n,
                                    char* out) const {
  const int64_t rb = store_.row_bytes();
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* row = store_.RowBytes(sequence_id_, layer, first + r);
    if (row == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", layer, " has no residual row at position ",
                       first + r, " to store"));
    }
    std::memcpy(out + r * rb, row, rb);
  }
  return absl::OkStatus();
}

CacheKvRows::CacheKvRows(const ops::ModelBackend& model,
                         const ops::KvCache& cache, int64_t chunk_tokens)
    : model_(model), cache_(cache), chunk_tokens_(chunk_tokens) {
  for (int64_t l = 0; l < model.config().n_layers; ++l) layers_.push_back(l);
}

int64_t CacheKvRows::row_bytes() const { return 2 * cache_.row_bytes(); }

int64_t CacheKvRows::first_kept(int64_t layer) const {
  if (!cache_.trims_past_windows()) return 0;
  const int64_t start = ops::WindowStart(
      model_.config().layers[layer].sliding_window, cache_.length());
  return start / chunk_tokens_ * chunk_tokens_;
}

absl::Status CacheKvRows::CopyRows(int64_t layer, int64_t first, int64_t n,
                                   char* out) const {
  // Rows below the cache's first kept one are below the window: stored as
  // zeros, never restored (RestoreKv starts at the window).
  const int64_t gone =
      std::clamp<int64_t>(cache_.first_kept(layer) - first, 0, n);
  std::memset(out, 0, gone * row_bytes());
  if (gone == n) return absl::OkStatus();
  return model_.ReadKvRows(
      cache_, layer, first + gone, n - gone,
      reinterpret_cast<uint8_t*>(out) + gone * row_bytes());
}

absl::StatusOr<storage::TurnUpdate> BuildTurnUpdate(
    const v1::SessionManifest& committed, v1::SessionManifest next,
    absl::Span<const int32_t> tokens, const ops::ResidualStore& store,
    int64_t sequence_id) {
  return BuildTurnUpdate(committed, std::move(next), tokens,
                         ResidualRows(store, sequence_id));
}

absl::StatusOr<storage::TurnUpdate> BuildTurnUpdate(
    const v1::SessionManifest& committed, v1::SessionManifest next,
    absl::Span<const int32_t> tokens, const CheckpointRows& source) {
  storage::TurnUpdate update;
  const int64_t c = next.chunk_tokens();
  // Token ids.
  {
    const auto [first, end] =
        TouchedChunks(committed.token_count(), next.token_count(), c);
    for (int64_t i = first; i < end; ++i) {
      const int64_t rows = std::min(c, next.token_count() - i * c);
      std::string payload(rows * 4, '\0');
      for (int64_t r = 0; r < rows; ++r) {
        const uint32_t t = static_cast<uint32_t>(tokens[i * c + r]);
        for (int b = 0; b < 4; ++b) payload[r * 4 + b] = char(t >> (8 * b));
      }
      update.put.emplace_back(
          ChunkId{storage::kTokenLayer, i},
          storage::EncodeChunk(
              Header(storage::kTokenLayer, i, c, rows, v1::DTYPE_I32, 4),
              payload));
    }
  }
  // The policy's rows, per stored layer, from the first one it keeps (the
  // engine trims sliding-window layers at chunk boundaries).
  const int64_t rb = source.row_bytes();
  const auto [first, end] = TouchedChunks(committed.length(), next.length(), c);
  next.clear_first_position();
  int64_t stored_rows = 0;
  for (size_t i = 0; i < source.layers().size(); ++i) {
    const int64_t layer = source.layers()[i];
    const int64_t kept = source.first_kept(layer);
    if (kept % c != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", layer, " keeps rows from position ", kept,
                       ", not a multiple of the chunk size ", c,
                       "; trim at chunk boundaries"));
    }
    next.add_first_position(kept);
    stored_rows += next.length() - kept;
    // Chunks that fell out of reach since the last commit.
    const int64_t was = static_cast<int>(i) < committed.first_position_size()
                            ? committed.first_position(i)
                            : 0;
    for (int64_t j = was / c; j < kept / c; ++j)
      update.erase.push_back(ChunkId{layer, j});
    for (int64_t j = std::max(first, kept / c); j < end; ++j) {
      const int64_t rows = std::min(c, next.length() - j * c);
      std::string payload(rows * rb, '\0');
      KVD_RETURN_IF_ERROR(source.CopyRows(layer, j * c, rows, payload.data()));
      update.put.emplace_back(
          ChunkId{layer, j},
          storage::EncodeChunk(Header(layer, j, c, rows, next.dtype(), rb),
                               payload));
    }
  }
  // Payload bytes of everything stored after this turn.
  next.set_stored_bytes(next.token_count() * 4 + stored_rows * rb);
  update.manifest = std::move(next);
  return update;
}

absl::Status RestoreTokens(const storage::SessionCheckpoint& checkpoint,
                           std::vector<int32_t>* tokens) {
  return RestoreTokens(checkpoint.manifest(), checkpoint.chunks(), tokens);
}

absl::Status RestoreTokens(
    const v1::SessionManifest& m,
    const std::map<storage::ChunkId, std::string>& chunks,
    std::vector<int32_t>* tokens) {
  const int64_t c = m.chunk_tokens();
  tokens->assign(m.token_count(), 0);
  for (int64_t i = 0; i * c < m.token_count(); ++i) {
    const int64_t rows = std::min(c, m.token_count() - i * c);
    absl::StatusOr<storage::DecodedChunk> chunk =
        FindChunk(m, chunks, {storage::kTokenLayer, i}, rows, v1::DTYPE_I32, 4);
    if (!chunk.ok()) return chunk.status();
    const auto* p = reinterpret_cast<const uint8_t*>(chunk->payload.data());
    for (int64_t r = 0; r < rows; ++r) {
      uint32_t t = 0;
      for (int b = 0; b < 4; ++b) t |= uint32_t{p[r * 4 + b]} << (8 * b);
      (*tokens)[i * c + r] = static_cast<int32_t>(t);
    }
  }
  return absl::OkStatus();
}

absl::Status RestoreResiduals(const storage::SessionCheckpoint& checkpoint,
                              ops::ResidualStore* store, int64_t sequence_id) {
  for (int64_t layer : store->layers()) {
    KVD_RETURN_IF_ERROR(RestoreResidualLayer(
        checkpoint.manifest(), checkpoint.chunks(), layer, store, sequence_id));
  }
  return absl::OkStatus();
}

absl::Status RestoreResidualLayer(
    const v1::SessionManifest& m,
    const std::map<storage::ChunkId, std::string>& chunks, int64_t layer,
    ops::ResidualStore* store, int64_t sequence_id) {
  const int64_t c = m.chunk_tokens(), rb = store->row_bytes();
  const auto& layers = store->layers();
  const auto li = std::find(layers.begin(), layers.end(), layer);
  if (li == layers.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " is not checkpointed by the store"));
  }
  const int index = li - layers.begin();
  const int64_t kept =
      index < m.first_position_size() ? m.first_position(index) : 0;
  if (kept % c != 0 || kept > m.length()) {
    return absl::DataLossError(
        absl::StrCat("session ", m.tenant(), "/", m.session_id(), " layer ",
                     layer, ": first stored position ", kept,
                     " is not a chunk boundary within the session's ",
                     m.length(), " positions"));
  }
  store->DropBelow(sequence_id, layer, kept);
  store->Reserve(sequence_id, layer, m.length());
  for (int64_t i = kept / c; i * c < m.length(); ++i) {
    const int64_t rows = std::min(c, m.length() - i * c);
    absl::StatusOr<storage::DecodedChunk> chunk =
        FindChunk(m, chunks, {layer, i}, rows, m.dtype(), rb);
    if (!chunk.ok()) return chunk.status();
    // The chunk's bytes are the store's own dtype: copied as they are
    // (a bf16 row is bf16-representable by construction).
    if (absl::Status put = store->PutRowBytes(sequence_id, layer, i * c, rows,
                                              chunk->payload.data());
        !put.ok()) {
      return absl::DataLossError(
          absl::StrCat("session ", m.tenant(), "/", m.session_id(), " layer ",
                       layer, " chunk ", i, ": ", put.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status RestoreKv(const storage::SessionCheckpoint& checkpoint,
                       const ops::ModelBackend& model, ops::KvCache* cache) {
  const v1::SessionManifest& m = checkpoint.manifest();
  const ops::ModelConfig& config = model.config();
  const int64_t c = m.chunk_tokens(), length = m.length();
  const int64_t rb = 2 * cache->row_bytes();
  const std::string name =
      absl::StrCat("session ", m.tenant(), "/", m.session_id());
  if (m.layers_size() != config.n_layers || m.row_bytes() != rb ||
      m.first_position_size() != config.n_layers) {
    return absl::DataLossError(absl::StrCat(
        name, ": its kv checkpoint stores ", m.layers_size(), " layers of ",
        m.row_bytes(), "-byte rows, but model ", config.name, " has ",
        config.n_layers, " layers of ", rb, "-byte K/V row pairs"));
  }
  cache->Reset(0);
  cache->SetLength(length);
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const int64_t stored = m.first_position(l);
    const int64_t keep =
        cache->trims_past_windows()
            ? ops::WindowStart(config.layers[l].sliding_window, length)
            : 0;
    if (m.layers(l) != l || stored % c != 0 || stored > keep) {
      return absl::DataLossError(
          absl::StrCat(name, " layer ", l, ": stored from position ", stored,
                       ", which is not a chunk boundary at or below ", keep,
                       ", the first position a later step reads"));
    }
    cache->DropBelow(l, keep);
    KVD_RETURN_IF_ERROR(cache->ReserveLayer(l, length));
    for (int64_t i = keep / c; i * c < length; ++i) {
      const int64_t rows = std::min(c, length - i * c);
      absl::StatusOr<storage::DecodedChunk> chunk =
          FindChunk(m, checkpoint.chunks(), {l, i}, rows, m.dtype(), rb);
      if (!chunk.ok()) return chunk.status();
      const int64_t from = std::max(keep, i * c);
      KVD_RETURN_IF_ERROR(model.WriteKvRows(
          cache, l, from, i * c + rows - from,
          reinterpret_cast<const uint8_t*>(chunk->payload.data()) +
              (from - i * c) * rb));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvd::engine
