// A per-sequence store of residual-stream checkpoints, filled by the forward
// pass through ResidualObserver.
//
// For each sequence it keeps the residual entering each configured layer, one
// row of d_model values per position, in the precision mode's exact dtype:
// fp32 bytes, or bf16 bytes in the bf16 mode (where the forward pass keeps the
// residual bf16-representable, so storing bf16 loses nothing; the store
// verifies that for every row and reports a violation instead of rounding).
// Rows of one (sequence, layer) are contiguous by position, the layout
// Model::RecomputeKv reads after ReadRows widens them to fp32.
//
//   ResidualStore store(model->config(), model->precision(),
//                       CheckpointLayers(policy, model->config().n_layers));
//   KVD_RETURN_IF_ERROR(model->Forward(steps, &out, &store));
//   KVD_RETURN_IF_ERROR(store.status());
//   store.ReadRows(seq, layer, first, n, rows.data());
//
// Thread-safety: not thread-safe. Model::Forward calls the observer from its
// calling thread only; one store may serve all sequences of a batch.
#ifndef KVD_OPS_KVDIRECT_RESIDUAL_STORE_H_
#define KVD_OPS_KVDIRECT_RESIDUAL_STORE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "ops/model/model.h"

namespace kvd::ops {

class ResidualStore : public ResidualObserver {
 public:
  // `layers`: the checkpointed layers (each in [0, n_layers]; n_layers is the
  // final residual). Residuals of other layers are ignored.
  ResidualStore(const ModelConfig& config, Precision precision,
                std::vector<int64_t> layers);

  // Stores the row if `layer` is checkpointed. A position may overwrite an
  // earlier one (a re-run after Truncate) or append; a gap, or a bf16-mode row
  // that is not bf16-representable, sets status() and stores nothing.
  void OnResidual(int64_t sequence_id, int64_t layer, int64_t position,
                  const float* residual) override;

  // The first error OnResidual met (OK if none); sticky until Clear().
  absl::Status status() const { return status_; }

  const std::vector<int64_t>& layers() const { return layers_; }
  bool HasLayer(int64_t layer) const;
  // Positions stored for the sequence: the minimum over its checkpointed
  // layers (0 if unknown).
  int64_t length(int64_t sequence_id) const;

  // Bytes of one residual row (d_model values in the dtype), of one token's
  // rows at every checkpointed layer, and everything held (length x layers).
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

  // Drops positions >= length of a sequence (rolling back a turn), or all of
  // it.
  void Truncate(int64_t sequence_id, int64_t length);
  void Erase(int64_t sequence_id);
  void Clear();

 private:
  int64_t LayerIndex(int64_t layer) const;  // -1 if not checkpointed

  int64_t d_model_;
  Precision precision_;
  int64_t row_bytes_;
  std::vector<int64_t> layers_;
  std::vector<int64_t> layer_index_;  // by layer: index into layers_, or -1
  // Per sequence, per checkpointed layer: rows by position.
  absl::flat_hash_map<int64_t, std::vector<std::vector<uint8_t>>> rows_;
  absl::Status status_;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_KVDIRECT_RESIDUAL_STORE_H_
