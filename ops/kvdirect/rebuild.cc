#include "ops/kvdirect/rebuild.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvd::ops {

namespace {

using Kind = CheckpointPolicy::Kind;

// Calls the spec's between_units hook before every unit but the first.
class Units {
 public:
  explicit Units(const std::function<void(const RebuildUnit&)>& between)
      : between_(between) {}
  void Next(const RebuildUnit& unit) {
    if (started_ && between_) between_(unit);
    started_ = true;
  }

 private:
  const std::function<void(const RebuildUnit&)>& between_;
  bool started_ = false;
};

// `length` 0 skips the check of the rows (a checkpoint still filling in:
// AwaitLayer checks each layer as it arrives).
absl::Status CheckStore(const ResidualStore& store, const ModelBackend& model,
                        int64_t sequence_id, absl::Span<const int64_t> layers,
                        int64_t length, const char* what) {
  const ModelConfig& c = model.config();
  const int64_t elem = model.precision() == Precision::kF32 ? 4 : 2;
  if (store.row_bytes() != c.d_model * elem) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rebuild: the ", what, " holds ", store.row_bytes(),
        "-byte residual rows but model ", c.name, " in ",
        PrecisionName(model.precision()), " needs ", c.d_model * elem));
  }
  KVD_RETURN_IF_ERROR(store.status());
  for (int64_t l : layers) {
    if (!store.HasLayer(l)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rebuild: the ", what, " does not checkpoint layer ", l));
    }
  }
  if (length > 0 && store.length(sequence_id) < length) {
    return absl::FailedPreconditionError(
        absl::StrCat("rebuild: the ", what, " holds ",
                     store.length(sequence_id), " positions of sequence ",
                     sequence_id, " but the sequence has ", length, " tokens"));
  }
  return absl::OkStatus();
}

// Waits for checkpoint layer `layer` if the spec streams it in, then checks
// that its rows reach the sequence's length (rows are contiguous from the
// first kept one, so the last row stands for all).
absl::Status AwaitLayer(const RebuildSpec& spec, int64_t layer,
                        int64_t length) {
  if (!spec.await_layer) return absl::OkStatus();
  KVD_RETURN_IF_ERROR(spec.await_layer(layer));
  if (length > 0 && spec.checkpoint->RowBytes(spec.sequence_id, layer,
                                              length - 1) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("rebuild: the checkpoint's layer ", layer,
                     " arrived without its row at position ", length - 1,
                     " of sequence ", spec.sequence_id));
  }
  return absl::OkStatus();
}

// First position of layer l a rebuilt cache keeps: the hot window's start,
// or a local layer's window start if later (older rows are never read again;
// a cache that keeps rows past windows gets them all).
int64_t KeepBegin(const ModelBackend& model, const KvCache& cache, int64_t l,
                  int64_t hot, int64_t length) {
  if (!cache.trims_past_windows()) return hot;
  return std::max(hot,
                  WindowStart(model.config().layers[l].sliding_window, length));
}

// kv-direct: one projection per layer for the kept positions only.
absl::Status RecomputeHot(const ModelBackend& model, const RebuildSpec& spec,
                          int64_t hot, int64_t length, KvCache* cache,
                          Units& units) {
  const ModelConfig& c = model.config();
  std::vector<float> h;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    KVD_RETURN_IF_ERROR(AwaitLayer(spec, l, length));
    const int64_t first = KeepBegin(model, *cache, l, hot, length);
    if (first < length &&
        spec.checkpoint->first_kept(spec.sequence_id, l) > first) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rebuild: the checkpoint dropped layer ", l, "'s residuals below ",
          spec.checkpoint->first_kept(spec.sequence_id, l),
          " but the hot window starts at ", first));
    }
    cache->DropBelow(l, first);
    KVD_RETURN_IF_ERROR(cache->ReserveLayer(l, length));
    for (int64_t p = first; p < length; p += spec.block) {
      const int64_t n = std::min(spec.block, length - p);
      units.Next({.rows = n, .kv_layers = 1});
      h.resize(n * c.d_model);
      KVD_RETURN_IF_ERROR(
          spec.checkpoint->ReadRows(spec.sequence_id, l, p, n, h.data()));
      // Positions [p, p + n), whose blocks ReserveLayer took above: the
      // backend writes the rows wherever its blocks live.
      KVD_RETURN_IF_ERROR(model.RecomputeKvIntoCache(l, h.data(), p, n, cache));
    }
  }
  return absl::OkStatus();
}

// stride:k: a partial prefill per segment from its checkpointed residuals,
// starting where the segment's windows reach back to (ResidualKeepBegin: 0
// for a segment with a global layer). The first positions of an all-local
// segment attend to rows below that start that were never written; those
// outputs only feed rows below each later layer's own start, which are
// dropped (and trimmed from `cold`) before anyone reads them. Each segment
// needs all its layers' rows while it runs; they shrink to what is kept
// before the next segment starts.
absl::Status PrefillSegments(const ModelBackend& model, const RebuildSpec& spec,
                             int64_t hot, int64_t length, KvCache* cache,
                             ResidualStore* cold, Units& units) {
  const ModelConfig& c = model.config();
  std::vector<float> h;
  for (int64_t s = 0; s < c.n_layers; s += spec.policy.stride) {
    const int64_t e = std::min(s + spec.policy.stride, c.n_layers);
    KVD_RETURN_IF_ERROR(AwaitLayer(spec, s, length));
    const int64_t start = cache->trims_past_windows()
                              ? ResidualKeepBegin(c, spec.policy, s, length)
                              : 0;
    if (spec.checkpoint->first_kept(spec.sequence_id, s) > start) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rebuild: the checkpoint dropped layer ", s, "'s residuals below ",
          spec.checkpoint->first_kept(spec.sequence_id, s),
          " but the rebuild needs them from ", start,
          " (trimmed for another policy, or the cache keeps rows past "
          "windows)"));
    }
    if (cold != nullptr) {
      for (int64_t l = s; l < e; ++l)
        cold->DropBelow(spec.sequence_id, l, start);
    }
    // The segment's last layer only needs its K/V: the next segment starts
    // from its own checkpoint, and the final residual feeds only logits.
    const int64_t tail = e - 1;
    for (int64_t p = start; p < length; p += spec.block) {
      const int64_t n = std::min(spec.block, length - p);
      units.Next({.rows = n, .full_layers = e - s});
      h.resize(n * c.d_model);
      KVD_RETURN_IF_ERROR(
          spec.checkpoint->ReadRows(spec.sequence_id, s, p, n, h.data()));
      KVD_RETURN_IF_ERROR(model.ForwardLayers(cache, p, n, s, tail, h.data(),
                                              cold, spec.sequence_id));
      if (cold != nullptr) {
        for (int64_t i = 0; i < n; ++i) {
          cold->OnResidual(spec.sequence_id, tail, p + i,
                           h.data() + i * c.d_model);
        }
      }
      KVD_RETURN_IF_ERROR(cache->ReserveLayer(tail, p + n));
      KVD_RETURN_IF_ERROR(
          model.RecomputeKvIntoCache(tail, h.data(), p, n, cache));
    }
    for (int64_t l = s; l < e; ++l)
      cache->DropBelow(l, KeepBegin(model, *cache, l, hot, length));
  }
  return absl::OkStatus();
}

// tokens: a re-prefill (Forward drops local layers' rows past their windows
// as it goes).
absl::Status Prefill(const ModelBackend& model, const RebuildSpec& spec,
                     int64_t hot, int64_t length, KvCache* cache,
                     ResidualStore* cold, Units& units) {
  ForwardOutput out;
  for (int64_t p = 0; p < length; p += spec.block) {
    const int64_t n = std::min(spec.block, length - p);
    units.Next({.rows = n, .full_layers = model.config().n_layers});
    const SequenceStep step{cache, spec.tokens.subspan(p, n), LogitsMode::kNone,
                            spec.sequence_id};
    KVD_RETURN_IF_ERROR(model.Forward({&step, 1}, &out, cold));
  }
  for (int64_t l = 0; l < model.config().n_layers; ++l)
    cache->DropBelow(l, KeepBegin(model, *cache, l, hot, length));
  return absl::OkStatus();
}

}  // namespace

double RebuildUnit::PromptTokens(const ModelConfig& c) const {
  const double d = c.d_model;
  const double kv = 2 * d * c.kv_dim();
  const double layer = kv + 2 * d * c.q_dim() + 3 * d * c.d_ff;
  if (c.n_layers <= 0 || layer <= 0) return 0;
  return rows * (kv_layers * kv + full_layers * layer) / (c.n_layers * layer);
}

absl::Status RebuildKv(const ModelBackend& model, const RebuildSpec& spec,
                       KvCache* cache, ResidualStore* cold_residuals) {
  const ModelConfig& c = model.config();
  const int64_t length = spec.tokens.size();
  if (spec.policy.kind == Kind::kKv) {
    return absl::InvalidArgumentError(
        "rebuild: policy kv keeps the K/V themselves; there is nothing to "
        "rebuild from");
  }
  if (spec.budget < 0 && spec.budget != ResidualKvSource::kAll) {
    return absl::InvalidArgumentError(
        absl::StrCat("rebuild: budget ", spec.budget, " must be >= 0 or kAll"));
  }
  if (spec.block < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rebuild: block ", spec.block, " must be >= 1"));
  }
  if (cache == nullptr) return absl::InvalidArgumentError("rebuild: no cache");
  if (cache->precision() != model.precision() ||
      cache->n_layers() != c.n_layers) {
    return absl::FailedPreconditionError(
        "rebuild: the K/V cache was made for another model or precision");
  }
  if (length > c.context_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("rebuild: ", length, " tokens exceed model ", c.name,
                     "'s context length of ", c.context_length));
  }
  const int64_t hot = spec.budget == ResidualKvSource::kAll
                          ? 0
                          : std::max<int64_t>(0, length - spec.budget);
  const std::vector<int64_t> layers = CheckpointLayers(spec.policy, c.n_layers);
  if (spec.policy.kind != Kind::kTokens) {
    if (spec.checkpoint == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rebuild: policy ", spec.policy.Name(), " needs its checkpoint"));
    }
    KVD_RETURN_IF_ERROR(CheckStore(*spec.checkpoint, model, spec.sequence_id,
                                   layers, spec.await_layer ? 0 : length,
                                   "checkpoint"));
  }
  ResidualStore* cold = nullptr;
  if (spec.policy.kind != Kind::kKvDirect && hot > 0) {
    if (cold_residuals == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rebuild: policy ", spec.policy.Name(), " with a hot window of ",
          spec.budget, " of ", length,
          " tokens needs a store for the cold positions' residuals"));
    }
    std::vector<int64_t> all(c.n_layers);
    for (int64_t l = 0; l < c.n_layers; ++l) all[l] = l;
    KVD_RETURN_IF_ERROR(CheckStore(*cold_residuals, model, spec.sequence_id,
                                   all, 0, "cold-residual store"));
    cold = cold_residuals;
    cold->Erase(spec.sequence_id);
  }
  for (int32_t t : spec.tokens) {
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rebuild: token id ", t, " out of range [0, ", c.vocab_size, ")"));
    }
  }

  Units units(spec.between_units);
  switch (spec.policy.kind) {
    case Kind::kKvDirect:
      // Length first, so each layer can drop up to its window start.
      cache->Reset(hot);
      cache->SetLength(length);
      KVD_RETURN_IF_ERROR(RecomputeHot(model, spec, hot, length, cache, units));
      break;
    case Kind::kStride:
      cache->Reset(0);
      KVD_RETURN_IF_ERROR(
          PrefillSegments(model, spec, hot, length, cache, cold, units));
      cache->SetLength(length);
      break;
    case Kind::kTokens:
      cache->Reset(0);
      KVD_RETURN_IF_ERROR(
          Prefill(model, spec, hot, length, cache, cold, units));
      break;
    case Kind::kKv:
      break;
  }
  if (cold != nullptr) {
    KVD_RETURN_IF_ERROR(cold->status());
    if (cache->trims_past_windows()) {
      TrimToWindows(c, CheckpointPolicy{CheckpointPolicy::Kind::kKvDirect},
                    spec.sequence_id, length, cold);
    }
  }
  return absl::OkStatus();
}

}  // namespace kvd::ops
