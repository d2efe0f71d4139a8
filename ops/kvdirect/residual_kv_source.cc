#include "ops/kvdirect/residual_kv_source.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace kvd::ops {

int64_t ResidualKvSource::HotBegin(int64_t layer, int64_t cache_length) const {
  if (budget_ < 0) return 0;
  return std::max<int64_t>(0, cache_length - budget_);
}

absl::Status ResidualKvSource::Check(int64_t n_layers,
                                     int64_t cache_length) const {
  if (!store_->status().ok()) return store_->status();
  for (int64_t l = 0; l < n_layers; ++l) {
    const int64_t cold = HotBegin(l, cache_length);
    if (cold == 0) continue;
    if (!store_->HasLayer(l)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "kv-direct: layer ", l, " has cold positions [0, ", cold,
          ") but the residual store does not checkpoint it (policy must be "
          "kv-direct)"));
    }
    // Attention rebuilds cold rows only from the layer's window start on; a
    // window that starts above the hot boundary needs none.
    const int64_t from = WindowStart(store_->sliding_window(l), cache_length);
    if (from < cold && store_->first_kept(sequence_id_, l) > from) {
      return absl::FailedPreconditionError(
          absl::StrCat("kv-direct: sequence ", sequence_id_, " layer ", l,
                       " needs residuals from position ", from,
                       " but the store dropped them below ",
                       store_->first_kept(sequence_id_, l),
                       "; trim with TrimToWindows for the same policy only"));
    }
  }
  if (HotBegin(0, cache_length) > store_->length(sequence_id_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kv-direct: sequence ", sequence_id_, " needs residuals for ",
        HotBegin(0, cache_length), " positions but the store holds ",
        store_->length(sequence_id_),
        "; attach the store as the observer of every forward step"));
  }
  return absl::OkStatus();
}

void ResidualKvSource::ReadResiduals(int64_t layer, int64_t first, int64_t n,
                                     float* out) const {
  // Check() guaranteed these rows; failing here is a bug in kvd.
  if (!store_->ReadRows(sequence_id_, layer, first, n, out).ok()) std::abort();
}

}  // namespace kvd::ops
