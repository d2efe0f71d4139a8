// Model's plain K/V row copies (model_backend.h ReadKvRows / WriteKvRows):
// what a policy-kv checkpoint stores and restores. Rows are copied as bytes,
// so a restored cache holds the bits the forward pass wrote.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ops/model/model.h"

namespace kvd::ops {
namespace {

// INVALID_ARGUMENT unless `cache` is this model's host cache and `layer`'s
// positions [position, position + n) lie in [first_kept, end).
absl::Status CheckRows(const char* what, const ModelConfig& config,
                       Precision precision, const KvCache* cache, int64_t layer,
                       int64_t position, int64_t n, int64_t end) {
  if (cache == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null cache"));
  }
  if (cache->precision() != precision || cache->n_layers() != config.n_layers) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the K/V cache was made for another model or precision"));
  }
  if (!cache->pool()->host_accessible()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the cache lives in memory the host cannot touch"));
  }
  if (layer < 0 || layer >= config.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": layer ", layer, " is not one of the model's ",
                     config.n_layers, " layers"));
  }
  if (n < 0 || position < cache->first_kept(layer) || position + n > end) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": layer ", layer, " positions [", position, ", ",
                     position + n, ") are not rows the cache holds (it keeps [",
                     cache->first_kept(layer), ", ", end, "))"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Model::ReadKvRows(const KvCache& cache, int64_t layer,
                               int64_t position, int64_t n,
                               uint8_t* rows) const {
  if (absl::Status s = CheckRows("ReadKvRows", config_, precision_, &cache,
                                 layer, position, n, cache.length());
      !s.ok()) {
    return s;
  }
  const size_t rb = cache.row_bytes();
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(rows + i * 2 * rb, cache.KeyBytes(layer, position + i), rb);
    std::memcpy(rows + i * 2 * rb + rb, cache.ValueBytes(layer, position + i),
                rb);
  }
  return absl::OkStatus();
}

absl::Status Model::WriteKvRows(KvCache* cache, int64_t layer, int64_t position,
                                int64_t n, const uint8_t* rows) const {
  if (absl::Status s =
          CheckRows("WriteKvRows", config_, precision_, cache, layer, position,
                    n, cache == nullptr ? 0 : cache->covered_end(layer));
      !s.ok()) {
    return s;
  }
  const size_t rb = cache->row_bytes();
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(cache->MutableKeyBytes(layer, position + i), rows + i * 2 * rb,
                rb);
    std::memcpy(cache->MutableValueBytes(layer, position + i),
                rows + i * 2 * rb + rb, rb);
  }
  return absl::OkStatus();
}

}  // namespace kvd::ops
