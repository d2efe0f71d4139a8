// Converts a session's in-memory state (token ids + the residual rows a
// ResidualStore captured) to storage chunks and back: the only place where
// the engine's tensors meet storage's bytes (storage knows nothing about
// models, DESIGN.md section 2).
//
// Chunks cover C = manifest.chunk_tokens consecutive positions of one stream:
// token ids (layer storage::kTokenLayer, int32) or the residual entering one
// checkpointed layer (the precision's dtype, exactly as ResidualStore holds
// it). A turn rewrites only the chunks it touched: the partly filled last
// chunk of each stream and the new ones.
//
//   storage::TurnUpdate u = BuildTurnUpdate(last_committed, next_manifest,
//                                           tokens, store, seq);
//   ...
//   KVD_RETURN_IF_ERROR(RestoreSession(checkpoint, &tokens, &store, seq));
//
// Thread-safety: pure functions; the store must not be written concurrently.
#ifndef KVD_SERVICES_ENGINE_SESSION_CHUNKS_H_
#define KVD_SERVICES_ENGINE_SESSION_CHUNKS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "ops/kvdirect/residual_store.h"
#include "proto/kvd/v1/checkpoint.pb.h"
#include "storage/checkpoint/session_checkpoint.h"

namespace kvd::engine {

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
    absl::Span<const int32_t> tokens, const ops::ResidualStore& store,
    int64_t sequence_id);

// Reads the token ids (the first manifest.token_count) of a checkpoint.
// DATA_LOSS if a token chunk is missing or malformed.
absl::Status RestoreTokens(const storage::SessionCheckpoint& checkpoint,
                           std::vector<int32_t>* tokens);

// Refills `store` (empty for `sequence_id`, checkpointing exactly the
// manifest's layers) with the residual rows of positions [0, length) from
// the checkpoint's chunks (from each layer's first_position). DATA_LOSS naming
// the layer and chunk if a chunk is missing, has the wrong dtype/row size, or a
// row is not valid for the precision (the store refuses it).
absl::Status RestoreResiduals(const storage::SessionCheckpoint& checkpoint,
                              ops::ResidualStore* store, int64_t sequence_id);

}  // namespace kvd::engine

#endif  // KVD_SERVICES_ENGINE_SESSION_CHUNKS_H_
