// Converts a session's in-memory state (token ids + the rows its policy
// keeps) to storage chunks and back: the only place where the engine's
// tensors meet storage's bytes (storage knows nothing about models, DESIGN.md
// section 2).
//
// Chunks cover C = manifest.chunk_tokens consecutive positions of one stream:
// token ids (layer storage::kTokenLayer, int32), the residual entering one
// checkpointed layer (the precision's dtype, exactly as ResidualStore holds
// it), or under policy kv one layer's K row followed by its V row (exactly as
// the K/V cache holds them). A turn rewrites only the chunks it touched: the
// partly filled last chunk of each stream and the new ones.
//
//   storage::TurnUpdate u = BuildTurnUpdate(last_committed, next_manifest,
//                                           tokens, ResidualRows(store, seq));
//   ...
//   KVD_RETURN_IF_ERROR(RestoreTokens(checkpoint, &tokens));
//   KVD_RETURN_IF_ERROR(RestoreResiduals(checkpoint, &store, seq));
//   // or, policy kv:  RestoreKv(checkpoint, model, &cache)
//
// Thread-safety: pure functions; the store must not be written concurrently.
#ifndef KVD_SERVICES_ENGINE_SESSION_CHUNKS_H_
#define KVD_SERVICES_ENGINE_SESSION_CHUNKS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/model/kv_cache.h"
#include "ops/model/model_backend.h"
#include "proto/kvd/v1/checkpoint.pb.h"
#include "storage/checkpoint/session_checkpoint.h"

namespace kvd::engine {

// The rows a checkpoint stores per layer and position, whatever they are.
class CheckpointRows {
 public:
  virtual ~CheckpointRows() = default;
  // The stored layers, ascending (the manifest's `layers`).
  virtual const std::vector<int64_t>& layers() const = 0;
  virtual int64_t row_bytes() const = 0;
  // First position of `layer` worth storing: rows below it can no longer be
  // read by any later step or rebuild.
  virtual int64_t first_kept(int64_t layer) const = 0;
  // Copies rows [first, first + n) of `layer` (>= first_kept) to `out`
  // (n x row_bytes).
  virtual absl::Status CopyRows(int64_t layer, int64_t first, int64_t n,
                                char* out) const = 0;
};

// The residual rows of one sequence of a ResidualStore (kv-direct,
// stride:k, tokens).
class ResidualRows final : public CheckpointRows {
 public:
  ResidualRows(const ops::ResidualStore& store, int64_t sequence_id)
      : store_(store), sequence_id_(sequence_id) {}
  const std::vector<int64_t>& layers() const override {
    return store_.layers();
  }
  int64_t row_bytes() const override { return store_.row_bytes(); }
  int64_t first_kept(int64_t layer) const override {
    return store_.first_kept(sequence_id_, layer);
  }
  absl::Status CopyRows(int64_t layer, int64_t first, int64_t n,
                        char* out) const override;

 private:
  const ops::ResidualStore& store_;
  int64_t sequence_id_;
};

// Policy kv: every layer's K and V rows of a cache, read through its backend
// (ModelBackend::ReadKvRows), one stored row per position holding the K row
// then the V row. A sliding-window layer is stored from its window's start
// rounded down to a chunk; the rows of that first chunk the cache already
// dropped (below the window, never read again) are stored as zeros.
class CacheKvRows final : public CheckpointRows {
 public:
  // `model` and `cache` must outlive this; chunk_tokens >= 1.
  CacheKvRows(const ops::ModelBackend& model, const ops::KvCache& cache,
              int64_t chunk_tokens);
  const std::vector<int64_t>& layers() const override { return layers_; }
  int64_t row_bytes() const override;
  int64_t first_kept(int64_t layer) const override;
  absl::Status CopyRows(int64_t layer, int64_t first, int64_t n,
                        char* out) const override;

 private:
  const ops::ModelBackend& model_;
  const ops::KvCache& cache_;
  int64_t chunk_tokens_;
  std::vector<int64_t> layers_;
};

// The update that takes storage from `committed` (the manifest of the last
// commit; token_count 0 for a new session or to rewrite everything) to
// `next`, whose token_count / length say how far `tokens` and the store's
// rows now reach (next.layers must be the store's layers). Fills
// next.stored_bytes and next.first_position (each layer's first kept row,
// from the store; chunks that fell below it since `committed` are erased).
// FAILED_PRECONDITION if a layer's first kept row is not a multiple of
// chunk_tokens: stored chunks are whole.
absl::StatusOr<storage::TurnUpdate> BuildTurnUpdate(
    const v1::SessionManifest& committed, v1::SessionManifest next,
    absl::Span<const int32_t> tokens, const CheckpointRows& rows);
// The same with ResidualRows(store, sequence_id).
absl::StatusOr<storage::TurnUpdate> BuildTurnUpdate(
    const v1::SessionManifest& committed, v1::SessionManifest next,
    absl::Span<const int32_t> tokens, const ops::ResidualStore& store,
    int64_t sequence_id);

// Reads the token ids (the first manifest.token_count) of a checkpoint.
// DATA_LOSS if a token chunk is missing or malformed.
absl::Status RestoreTokens(const storage::SessionCheckpoint& checkpoint,
                           std::vector<int32_t>* tokens);
// The same from the manifest and its token chunks alone (a streamed load's
// token stream).
absl::Status RestoreTokens(
    const v1::SessionManifest& manifest,
    const std::map<storage::ChunkId, std::string>& chunks,
    std::vector<int32_t>* tokens);

// Refills `store` (empty for `sequence_id`, checkpointing exactly the
// manifest's layers) with the residual rows of positions [0, length) from
// the checkpoint's chunks (from each layer's first_position). DATA_LOSS naming
// the layer and chunk if a chunk is missing, has the wrong dtype/row size, or a
// row is not valid for the precision (the store refuses it).
absl::Status RestoreResiduals(const storage::SessionCheckpoint& checkpoint,
                              ops::ResidualStore* store, int64_t sequence_id);
// One layer of RestoreResiduals, from the manifest and chunks holding that
// layer's (a streamed load's stream of it): what a rebuild's await_layer
// does as each layer arrives. The same errors, and INVALID_ARGUMENT for a
// layer the store does not checkpoint.
absl::Status RestoreResidualLayer(
    const v1::SessionManifest& manifest,
    const std::map<storage::ChunkId, std::string>& chunks, int64_t layer,
    ops::ResidualStore* store, int64_t sequence_id);

// Policy kv: refills `cache` (any state; it is reset) to the manifest's
// length with every layer's stored K/V rows from the first position a later
// step reads (a sliding-window layer's window start; every position if the
// cache keeps rows past windows), through model.WriteKvRows. The rows are
// the bits the forward pass cached. DATA_LOSS naming the layer and chunk for
// a missing or malformed chunk, or a manifest whose layers or rows do not fit
// the model; RESOURCE_EXHAUSTED if the cache's pool is full (the cache is
// then partly filled: reset it); what WriteKvRows says otherwise.
absl::Status RestoreKv(const storage::SessionCheckpoint& checkpoint,
                       const ops::ModelBackend& model, ops::KvCache* cache);

}  // namespace kvd::engine

#endif  // KVD_SERVICES_ENGINE_SESSION_CHUNKS_H_
