// A per-sequence store of residual-stream checkpoints, filled by the forward
// pass through ResidualObserver.
//
// For each sequence it keeps the residual entering each configured layer, one
// row of d_model values per position, in the precision mode's exact dtype:
// fp32 bytes, or bf16 bytes in the bf16 mode (where the forward pass keeps the
// residual bf16-representable, so storing bf16 loses nothing; the store
// verifies that for every row and reports a violation instead of rounding).
// Rows of one (sequence, layer) are contiguous by position, the layout
// Model::RecomputeKv reads after ReadRows widens them to fp32. Like KvCache,
// rows are addressed by absolute position and each (sequence, layer) keeps a
// range [first_kept, length): DropBelow frees older rows, and TrimToWindows
// drops what Gemma 3's sliding windows make unreachable, so a session's store
// grows only by its global layers (checkpoint_policy.h, state_past_window).
//
//   ResidualStore store(model->config(), model->precision(),
//                       CheckpointLayers(policy, model->config().n_layers));
//   KVD_RETURN_IF_ERROR(model->Forward(steps, &out, &store));
//   KVD_RETURN_IF_ERROR(store.status());
//   store.ReadRows(seq, layer, first, n, rows.data());
//   TrimToWindows(model->config(), policy, seq, cache.length(), &store);
//
// Thread-safety: not thread-safe. Model::Forward calls the observer from its
// calling thread only; one store may serve all sequences of a batch.
#ifndef KVD_OPS_KVDIRECT_RESIDUAL_STORE_H_
#define KVD_OPS_KVDIRECT_RESIDUAL_STORE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/model/model_backend.h"

namespace kvd::ops {

class ResidualStore : public ResidualObserver {
 public:
  // `layers`: the checkpointed layers (each in [0, n_layers]; n_layers is the
  // final residual). Residuals of other layers are ignored.
  ResidualStore(const ModelConfig& config, Precision precision,
                std::vector<int64_t> layers);

  // Stores the row if `layer` is checkpointed. A position may overwrite a kept
  // one (a re-run after Truncate) or append; a gap, a dropped position, or a
  // bf16-mode row that is not bf16-representable sets status() and stores
  // nothing.
  void OnResidual(int64_t sequence_id, int64_t layer, int64_t position,
                  const float* residual) override;

  // Stores `n` rows for positions [position, position + n) of a
  // checkpointed layer, given as bytes in the store's dtype (n x row_bytes,
  // any alignment): a restore from a checkpoint that holds them so, with no
  // widening to fp32 and back. Positions follow OnResidual's rules;
  // FAILED_PRECONDITION (and nothing stored) otherwise, or NOT_FOUND for a
  // layer the store does not checkpoint.
  absl::Status PutRowBytes(int64_t sequence_id, int64_t layer, int64_t position,
                           int64_t n, const void* bytes);

  // The first error OnResidual met (OK if none); sticky until Clear().
  absl::Status status() const { return status_; }

  const std::vector<int64_t>& layers() const { return layers_; }
  bool HasLayer(int64_t layer) const;
  // The model's sliding window of `layer` (0: global), so a reader can tell
  // which rows TrimToWindows may have dropped.
  int64_t sliding_window(int64_t layer) const { return windows_[layer]; }
  // Positions stored for the sequence: the minimum over its checkpointed
  // layers of one past the last row (0 if unknown); rows below first_kept
  // count, though they are gone.
  int64_t length(int64_t sequence_id) const;
  // First position whose row (sequence, layer) still holds (0 if unknown).
  int64_t first_kept(int64_t sequence_id, int64_t layer) const;

  // Bytes of one residual row (d_model values in the dtype), of one token's
  // rows at every checkpointed layer, and of every kept row.
  int64_t row_bytes() const { return row_bytes_; }
  int64_t bytes_per_token() const { return row_bytes_ * layers_.size(); }
  int64_t size_bytes() const;

  // Raw stored bytes of one row (null if absent): for bit-level tests and the
  // checkpoint codec.
  const uint8_t* RowBytes(int64_t sequence_id, int64_t layer,
                          int64_t position) const;
  // Widens rows [first, first + n) of one layer to fp32 (exact) into out
  // (n x d_model). NOT_FOUND if the layer is not checkpointed or a row is
  // missing.
  absl::Status ReadRows(int64_t sequence_id, int64_t layer, int64_t first,
                        int64_t n, float* out) const;

  // Makes room for rows of (sequence, layer) up to position `end` without
  // storing any, so a restore that appends them chunk by chunk copies each
  // byte once (no regrowth). No-op for a layer that is not checkpointed.
  void Reserve(int64_t sequence_id, int64_t layer, int64_t end);
  // Frees the rows of (sequence, layer) below `position`; later rows keep
  // their positions. On a sequence or layer with no rows it sets where the
  // first row may arrive (a rebuild that starts past position 0). No-op for a
  // layer that is not checkpointed.
  void DropBelow(int64_t sequence_id, int64_t layer, int64_t position);
  // Drops positions >= length of a sequence (rolling back a turn), or all of
  // it.
  void Truncate(int64_t sequence_id, int64_t length);
  void Erase(int64_t sequence_id);
  void Clear();

 private:
  // One (sequence, layer): rows [begin, begin + bytes.size() / row_bytes),
  // of which [first, ...) are kept; the dropped prefix is reclaimed once it
  // outweighs the kept rows, so trimming costs amortised O(1) per row.
  struct Rows {
    int64_t begin = 0;
    int64_t first = 0;
    std::vector<uint8_t> bytes;
  };
  int64_t LayerIndex(int64_t layer) const;  // -1 if not checkpointed
  int64_t End(const Rows& r) const {
    return r.begin + r.bytes.size() / row_bytes_;
  }
  const Rows* Find(int64_t sequence_id, int64_t layer) const;

  int64_t d_model_;
  Precision precision_;
  int64_t row_bytes_;
  std::vector<int64_t> layers_;
  std::vector<int64_t> layer_index_;  // by layer: index into layers_, or -1
  std::vector<int64_t> windows_;      // by layer, n_layers + 1 entries
  // Per sequence, per checkpointed layer: rows by position.
  absl::flat_hash_map<int64_t, std::vector<Rows>> rows_;
  absl::Status status_;
};

// The first position of checkpointed layer `layer`'s residual that a later
// step or a RebuildKv of a sequence now `length` tokens long can read under
// `policy` (its windows only move forward, so older rows can go):
//   kv-direct  a local layer's window start (KvCache's WindowStart), 0 for a
//              global layer;
//   stride:k   for the checkpoint of a segment whose layers are all local,
//              each layer's window start applied from the segment's last layer
//              down to its first (about segment length x window back); 0 if
//              the segment has a global layer.
// 0 for layers the policy does not checkpoint.
int64_t ResidualKeepBegin(const ModelConfig& config,
                          const CheckpointPolicy& policy, int64_t layer,
                          int64_t length);

// Drops every row of `sequence_id` that ResidualKeepBegin says nobody can
// read any more. Call it after each forward step (and after a rebuild), with
// the sequence's length after the step; the logits do not change.
void TrimToWindows(const ModelConfig& config, const CheckpointPolicy& policy,
                   int64_t sequence_id, int64_t length, ResidualStore* store);

}  // namespace kvd::ops

#endif  // KVD_OPS_KVDIRECT_RESIDUAL_STORE_H_
