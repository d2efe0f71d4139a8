// The KvSource of policy kv-direct: the last `budget` positions' K/V are hot
// in the sequence's KvCache; attention rebuilds every older chunk from the
// residuals a ResidualStore captured (DESIGN.md section 4, bounded-memory
// decoding). Logits are bit-identical to the plain cache for every budget.
//
//   ResidualStore store(config, precision, CheckpointLayers(kv_direct, L));
//   ResidualKvSource source(&store, /*sequence_id=*/7, /*budget=*/64);
//   SequenceStep step{&cache, tokens, LogitsMode::kLast, 7, &source};
//   KVD_RETURN_IF_ERROR(model->Forward({&step, 1}, &out, &store));
//
// Forward frees the cache rows below HotBegin before each step, so the cache
// holds about B + one attention chunk rows per layer however long the session
// runs. A local (sliding-window) layer reads residuals only from its window
// start, so the store may be trimmed with TrimToWindows after each step. The
// budget must not grow later for the same cache (those rows are gone; RebuildKv
// in rebuild.h brings them back).
//
// Thread-safety: const methods may run concurrently (Model::Forward's
// attention tasks) while nobody writes the store.
#ifndef KVD_OPS_KVDIRECT_RESIDUAL_KV_SOURCE_H_
#define KVD_OPS_KVDIRECT_RESIDUAL_KV_SOURCE_H_

#include <cstdint>

#include "ops/kvdirect/residual_store.h"
#include "ops/model/model_backend.h"

namespace kvd::ops {

class ResidualKvSource : public KvSource {
 public:
  static constexpr int64_t kAll = -1;  // budget: every position stays hot

  // `store` must outlive this source and checkpoint every layer.
  ResidualKvSource(const ResidualStore* store, int64_t sequence_id,
                   int64_t budget)
      : store_(store), sequence_id_(sequence_id), budget_(budget) {}

  int64_t HotBegin(int64_t layer, int64_t cache_length) const override;
  // FAILED_PRECONDITION if the store has failed, lacks a layer, or holds
  // fewer positions than the cold range needs (from the layer's window start
  // for a local layer).
  absl::Status Check(int64_t n_layers, int64_t cache_length) const override;
  void ReadResiduals(int64_t layer, int64_t first, int64_t n,
                     float* out) const override;

 private:
  const ResidualStore* store_;
  int64_t sequence_id_;
  int64_t budget_;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_KVDIRECT_RESIDUAL_KV_SOURCE_H_
