#include "ops/model/model_backend.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvd::ops {
namespace {

// FAILED_PRECONDITION if attention would need rows the cache dropped.
absl::Status CheckKeptRows(const ModelConfig& c, const SequenceStep& step) {
  const KvCache& cache = *step.cache;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    // Without a KvSource attention reads every row its window reaches; with
    // one, rows from HotBegin on. A local layer never reads below its window.
    int64_t needed = step.kv_source == nullptr
                         ? 0
                         : std::min(step.kv_source->HotBegin(l, cache.length()),
                                    cache.length());
    needed = std::max(needed,
                      WindowStart(c.layers[l].sliding_window, cache.length()));
    if (cache.first_kept(l) > needed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence ", step.sequence_id, ": layer ", l,
          " needs K/V rows from position ", needed,
          " but the cache dropped them below ", cache.first_kept(l),
          step.kv_source == nullptr
              ? "; attach the KvSource the rows were dropped for"
              : "; a larger hot window needs a rebuild "
                "(ops/kvdirect/rebuild.h)"));
    }
  }
  return absl::OkStatus();
}

// Per layer, the first position the step's cache keeps: rows below the
// KvSource's hot window and a local layer's rows below its window are never
// read again, so they are freed.
std::vector<int64_t> KeepBegins(const ModelConfig& c,
                                const SequenceStep& step) {
  const KvCache& cache = *step.cache;
  const int64_t length = cache.length();
  std::vector<int64_t> keep(c.n_layers, 0);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (step.kv_source != nullptr)
      keep[l] = step.kv_source->HotBegin(l, length);
    if (cache.trims_past_windows()) {
      keep[l] =
          std::max(keep[l], WindowStart(c.layers[l].sliding_window, length));
    }
  }
  return keep;
}

// Reserves, per block pool, the blocks every cache of the batch needs for
// the step (KvCache::BlocksToPrepare), all or nothing: RESOURCE_EXHAUSTED
// with no reservation held otherwise.
absl::Status ReserveBlocks(absl::Span<const SequenceStep> batch,
                           const std::vector<std::vector<int64_t>>& keep) {
  // Per pool, in first-seen order; caches of one pool reserve together.
  std::vector<std::pair<KvBlockPool*, int64_t>> need;
  for (size_t s = 0; s < batch.size(); ++s) {
    const KvCache& cache = *batch[s].cache;
    const int64_t n = cache.BlocksToPrepare(
        keep[s], cache.length() + static_cast<int64_t>(batch[s].tokens.size()));
    auto it = std::find_if(need.begin(), need.end(), [&](const auto& p) {
      return p.first == cache.pool();
    });
    if (it == need.end()) {
      need.emplace_back(cache.pool(), n);
    } else {
      it->second += n;
    }
  }
  for (size_t i = 0; i < need.size(); ++i) {
    if (absl::Status s = need[i].first->Reserve(need[i].second); !s.ok()) {
      for (size_t j = 0; j < i; ++j) need[j].first->Unreserve(need[j].second);
      return absl::ResourceExhaustedError(
          absl::StrCat("forward step of ", batch.size(), " sequence(s) needs ",
                       need[i].second, " more K/V blocks: ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const float* ForwardOutput::Logits(size_t seq, int64_t row) const {
  if (seq >= first_row.size() || first_row[seq] < 0) return nullptr;
  const int64_t r = row < 0 ? num_rows[seq] - 1 : row;
  return logits.data() + (first_row[seq] + r) * vocab_size;
}

absl::StatusOr<int64_t> PrepareStepCaches(
    const ModelConfig& c, Precision precision,
    absl::Span<const SequenceStep> batch) {
  // Validate everything before touching any cache.
  int64_t total = 0;
  for (const SequenceStep& step : batch) {
    if (step.cache == nullptr)
      return absl::InvalidArgumentError("sequence without a K/V cache");
    if (step.cache->precision() != precision ||
        step.cache->n_layers() != c.n_layers) {
      return absl::FailedPreconditionError(
          "K/V cache was made for another model or precision");
    }
    for (int32_t t : step.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token id ", t, " out of range [0, ", c.vocab_size, ")"));
      }
    }
    if (step.kv_source != nullptr) {
      KVD_RETURN_IF_ERROR(
          step.kv_source->Check(c.n_layers, step.cache->length()));
    }
    KVD_RETURN_IF_ERROR(CheckKeptRows(c, step));
    const int64_t end =
        step.cache->length() + static_cast<int64_t>(step.tokens.size());
    if (end > c.context_length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", step.sequence_id, " would reach ", end,
          " tokens, beyond the model's context length of ", c.context_length));
    }
    total += step.tokens.size();
  }

  std::vector<std::vector<int64_t>> keep(batch.size());
  for (size_t s = 0; s < batch.size(); ++s) keep[s] = KeepBegins(c, batch[s]);
  KVD_RETURN_IF_ERROR(ReserveBlocks(batch, keep));
  for (size_t s = 0; s < batch.size(); ++s) {
    batch[s].cache->Prepare(keep[s],
                            batch[s].cache->length() + batch[s].tokens.size());
  }
  return total;
}

absl::StatusOr<bool> PrepareLayerRange(const ModelConfig& c,
                                       Precision precision, KvCache* cache,
                                       int64_t position, int64_t n,
                                       int64_t first_layer, int64_t end_layer,
                                       const float* h) {
  if (cache == nullptr || h == nullptr)
    return absl::InvalidArgumentError("ForwardLayers: null cache or residuals");
  if (cache->precision() != precision || cache->n_layers() != c.n_layers) {
    return absl::FailedPreconditionError(
        "ForwardLayers: K/V cache was made for another model or precision");
  }
  if (first_layer < 0 || first_layer > end_layer || end_layer > c.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("ForwardLayers: layers [", first_layer, ", ", end_layer,
                     ") are not a range of the model's ", c.n_layers));
  }
  if (n < 0 || position < 0 || position + n > c.context_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ForwardLayers: positions [", position, ", ", position + n,
        ") are outside the model's context of ", c.context_length));
  }
  for (int64_t l = first_layer; l < end_layer; ++l) {
    if (cache->first_kept(l) > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ForwardLayers: layer ", l, " dropped its rows below ",
          cache->first_kept(l), "; a partial prefill needs all of them"));
    }
  }
  if (n == 0 || first_layer == end_layer) return false;
  for (int64_t l = first_layer; l < end_layer; ++l)
    KVD_RETURN_IF_ERROR(cache->ReserveLayer(l, position + n));
  return true;
}

absl::Status CheckRecomputeTarget(const ModelConfig& c, Precision precision,
                                  int64_t layer, int64_t position, int64_t n,
                                  const KvCache* cache) {
  if (cache == nullptr)
    return absl::InvalidArgumentError("RecomputeKvIntoCache: null cache");
  if (cache->precision() != precision || cache->n_layers() != c.n_layers) {
    return absl::FailedPreconditionError(
        "RecomputeKvIntoCache: K/V cache was made for another model or "
        "precision");
  }
  if (layer < 0 || layer >= c.n_layers || n < 0 || position < 0 ||
      position < cache->first_kept(layer) ||
      position + n > cache->covered_end(layer)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RecomputeKvIntoCache: layer ", layer, " positions [", position, ", ",
        position + n, ") are not rows the cache holds; reserve them first"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> SelectLogitRows(absl::Span<const SequenceStep> batch,
                                     int64_t vocab_size, ForwardOutput* out) {
  out->vocab_size = vocab_size;
  out->first_row.assign(batch.size(), -1);
  out->num_rows.assign(batch.size(), 0);
  std::vector<int64_t> rows;
  int64_t r = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const int64_t n = batch[s].tokens.size();
    if (n > 0 && batch[s].logits != LogitsMode::kNone) {
      out->first_row[s] = rows.size();
      const int64_t first = batch[s].logits == LogitsMode::kAll ? 0 : n - 1;
      for (int64_t i = first; i < n; ++i) rows.push_back(r + i);
      out->num_rows[s] = n - first;
    }
    r += n;
  }
  return rows;
}

}  // namespace kvd::ops
