// Rebuilding a sequence's hot K/V from its session checkpoint: what resume
// after a restart and migration to another node call (DESIGN.md section 4).
//
// Given every token id of the sequence and the checkpoint its policy keeps,
// RebuildKv fills a fresh KvCache with the K/V of the last `budget` positions
// (or all), bit-identical to the rows the uninterrupted forward pass cached,
// so decoding continues with bit-identical logits:
//   kv-direct  one projection per layer (RecomputeKvIntoCache) for the hot
//              positions only; the checkpoint keeps serving the cold ones.
//   stride:k   per segment [s, s + k): a partial prefill (ForwardLayers)
//              of the segment's layers over every token, starting from the
//              residuals checkpointed at layer s.
//   tokens     a re-prefill from the token ids.
// With a bounded budget, stride:k and tokens also write the residual entering
// every layer at every position into `cold_residuals` (a kv-direct store):
// attention needs the cold K/V, and their intermediate layers' residuals are
// not in the checkpoint. The session then decodes as kv-direct.
//
// The rebuild drives the model only through ModelBackend (model_backend.h)
// and never touches the cache's rows itself, so it runs unchanged on a
// backend whose blocks live in device memory.
//
//   const ModelBackend& backend = *model;   // CPU Model or a GPU backend
//   RebuildSpec spec{.policy = policy, .tokens = ids, .checkpoint = &store,
//                    .sequence_id = 7, .budget = 64};
//   KVD_ASSIGN_OR_RETURN(KvCache cache, backend.NewCache(pool));
//   ResidualStore cold(config, precision, CheckpointLayers(kv_direct, L));
//   KVD_RETURN_IF_ERROR(RebuildKv(backend, spec, &cache, &cold));
//   ResidualKvSource source(&cold, 7, 64);   // &store for kv-direct
//   SequenceStep step{&cache, next, LogitsMode::kLast, 7, &source};
//   KVD_RETURN_IF_ERROR(backend.Forward({&step, 1}, &out, &cold));
//
// A caller that shares the model with others (the engine's batch) sets
// `between_units`: the rebuild calls it between bounded units of work, where
// the caller may let other work use the model before the rebuild goes on.
//
// Thread-safety: runs on the backend's compute (the CPU Model's thread
// pool); one rebuild per cache and store at a time.
#ifndef KVD_OPS_KVDIRECT_REBUILD_H_
#define KVD_OPS_KVDIRECT_REBUILD_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/model/kv_cache.h"
#include "ops/model/model_backend.h"

namespace kvd::ops {

// The work of one unit of a rebuild, for a caller that budgets it.
struct RebuildUnit {
  int64_t rows = 0;         // positions the unit runs
  int64_t kv_layers = 0;    // layers whose K/V it only projects (kv-direct)
  int64_t full_layers = 0;  // layers it runs in full (stride:k, tokens)

  // The unit's multiply-adds in prompt tokens of a full forward pass (every
  // layer's projections and MLP; attention and logits left out), the unit a
  // scheduler's per-step prefill budget counts in. A kv-direct row of one
  // SmolLM2-135M layer is 1/480 of a prompt token.
  double PromptTokens(const ModelConfig& config) const;
};

struct RebuildSpec {
  CheckpointPolicy policy;
  // Every token of the sequence, in order; the rebuilt cache's length.
  absl::Span<const int32_t> tokens;
  // Residuals of the policy's layers for at least tokens.size() positions
  // (kv-direct, stride:k); unused for tokens. Must outlive the call.
  const ResidualStore* checkpoint = nullptr;
  // The sequence's id in `checkpoint` and in `cold_residuals`.
  int64_t sequence_id = 0;
  // Hot positions to rebuild (the last `budget`), or ResidualKvSource::kAll.
  int64_t budget = ResidualKvSource::kAll;
  // Tokens per partial-prefill or recompute step: bounds the activations'
  // memory; the bits do not depend on it.
  int64_t block = 256;
  // Optional. Called on the calling thread between two units of work, never
  // before the first or after the last, with the size of the unit about to
  // run. A unit is one block of `block` positions of one layer (kv-direct),
  // of one segment's layers (stride:k) or of the whole model (tokens). The
  // engine's scheduler lets running sequences take a step here once the
  // restore has spent its share of the step (RebuildUnit::PromptTokens).
  // The hook must not touch the cache or the stores being rebuilt; the bits
  // never depend on it (units run in the same order with the same inputs
  // whether or not it pauses).
  std::function<void(const RebuildUnit& next)> between_units;
  // Optional, for a checkpoint that fills in while the rebuild runs (a
  // streamed resume reads layer l + 1 from disk while layer l is rebuilt).
  // Called on the calling thread, once for each checkpointed layer the
  // policy reads (kv-direct: every layer; stride:k: each segment's first),
  // in ascending order, before the first unit that reads it; that layer's
  // rows need to be in `checkpoint` only once it returns. An error ends the
  // rebuild with it. Without it, the checkpoint must hold every layer from
  // the start.
  std::function<absl::Status(int64_t layer)> await_layer;
};

// Empties `cache` and rebuilds it to length tokens.size(), each layer holding
// the rows of the positions from max(0, length - budget) on, and a local
// layer only from its WindowStart (unless the cache keeps rows past windows);
// stride:k prefills an all-local segment only from ResidualKeepBegin, so a
// checkpoint trimmed by TrimToWindows for the same policy suffices.
// `cold_residuals` (a store checkpointing every layer) receives every layer's
// residuals when the policy is stride:k or tokens and some position is cold;
// otherwise it may be null and is not touched. INVALID_ARGUMENT for policy kv,
// a bad budget or block, or a missing/unsuitable store; FAILED_PRECONDITION if
// the checkpoint lacks a layer or positions, or does not belong to this model.
absl::Status RebuildKv(const ModelBackend& model, const RebuildSpec& spec,
                       KvCache* cache, ResidualStore* cold_residuals);

}  // namespace kvd::ops

#endif  // KVD_OPS_KVDIRECT_REBUILD_H_
