// The host-side bookkeeping CudaModel (cuda_model.h) and TpCudaModel
// (tp_cuda_model.h) share, without CUDA: option checks, the default K/V pool
// size, a step batch's input checks, the all-or-nothing reservation of new
// pool blocks (and its rollback), and the greedy generate loop. Each model
// describes its batch as StepViews (it can read its caches' private fields;
// this code cannot), so the rules and the error messages live once.
//
//   std::vector<internal::StepView> views = ...;  // one per step
//   KVD_ASSIGN_OR_RETURN(int64_t m, internal::CheckBatch(views, limits,
//                                                       "CUDA forward"));
//   KVD_ASSIGN_OR_RETURN(std::vector<int64_t> added,
//                        internal::ReserveBlocks(views, pool, ...));
//
// Thread-safety: pure functions, except ReserveBlocks/ReleaseBlocks, which
// take the pool's mutex while they touch its free list.
#ifndef KVD_OPS_BACKEND_INTERNAL_CUDA_BATCH_H_
#define KVD_OPS_BACKEND_INTERNAL_CUDA_BATCH_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "ops/backend/internal/cuda_step_plan.h"

namespace kvd::ops::internal {

// One sequence's K/V in an `Owner`'s device pool (CudaModel's CudaKvCache,
// TpCudaModel's TpKvCache): the pool blocks it holds per layer and its
// length. Move-only; gives its blocks back through Owner::FreeBlocks when
// destroyed, so it must not outlive its owner. Only the owner reads and
// changes the fields.
template <typename Owner>
class DeviceBlockCache {
 public:
  DeviceBlockCache(DeviceBlockCache&& other) noexcept
      : owner_(std::exchange(other.owner_, nullptr)),
        length_(std::exchange(other.length_, 0)),
        blocks_(std::exchange(other.blocks_, {})) {}
  DeviceBlockCache& operator=(DeviceBlockCache&& other) noexcept {
    if (this != &other) {
      Release();
      owner_ = std::exchange(other.owner_, nullptr);
      length_ = std::exchange(other.length_, 0);
      blocks_ = std::exchange(other.blocks_, {});
    }
    return *this;
  }
  DeviceBlockCache(const DeviceBlockCache&) = delete;
  DeviceBlockCache& operator=(const DeviceBlockCache&) = delete;
  ~DeviceBlockCache() { Release(); }

  int64_t length() const { return length_; }

 private:
  friend Owner;
  // A cache of `n_layers` empty block tables.
  DeviceBlockCache(Owner* owner, int64_t n_layers)
      : owner_(owner), blocks_(n_layers) {}
  void Release() {
    if (owner_ != nullptr) owner_->FreeBlocks(&blocks_);
    blocks_.clear();
    length_ = 0;
  }

  Owner* owner_ = nullptr;
  int64_t length_ = 0;
  // blocks_[l][i]: pool block of layer l holding positions
  // [i * block_rows, (i + 1) * block_rows).
  std::vector<std::vector<int32_t>> blocks_;
};

// Checks block_rows and max_blocks of `options_name` (e.g.
// "CudaModelOptions"); `chunk` is the attention chunk block_rows must be a
// multiple of.
absl::Status CheckPoolOptions(absl::string_view options_name,
                              int64_t block_rows, int64_t max_blocks,
                              int64_t chunk);

// max_blocks, or when it is 0 enough blocks for every layer to hold
// min(16 * context_length, 16384) positions.
int64_t PoolBlocks(int64_t max_blocks, int64_t n_layers, int64_t context_length,
                   int64_t block_rows);

// Blocks of a CUDA backend's NewBlockPool: a budget sizes the pool
// (budget_bytes / block_bytes, capped by max_blocks when that is set too);
// without one, PoolBlocks(max_blocks, ...).
int64_t BackendPoolBlocks(size_t budget_bytes, size_t block_bytes,
                          int64_t max_blocks, int64_t n_layers,
                          int64_t context_length, int64_t block_rows);

// One step of a batch as the model sees it.
struct StepView {
  const void* cache = nullptr;  // identity, for the duplicate check
  bool ours = false;            // cache non-null and of this model
  absl::Span<const int32_t> tokens;
  int64_t length = 0;  // the cache's length; only read when `ours`
  // The cache's blocks ([layer][i]); only read when `ours`.
  std::vector<std::vector<int32_t>>* blocks = nullptr;
};

struct BatchLimits {
  int64_t vocab_size = 0;
  int64_t context_length = 0;
};

// Checks each step in order (a cache of this model, not twice, tokens, ids in
// the vocabulary, within the context) and the total against PagedAttention's
// grid limit; returns the total number of new tokens. `who` starts every
// message ("CUDA forward").
absl::StatusOr<int64_t> CheckBatch(absl::Span<const StepView> steps,
                                   const BatchLimits& limits,
                                   absl::string_view who);

// The free list of a K/V pool: block ids, popped from the back.
struct BlockPool {
  absl::Mutex* mu = nullptr;
  std::vector<int32_t>* free_blocks = nullptr;  // guarded by *mu
  int64_t max_blocks = 0;
};

// Reserves every layer's new blocks for every step, all or nothing, and
// appends them to each step's blocks; returns how many blocks each step got
// per layer. `who` names the pool ("CUDA K/V pool") and `options_name` the
// options struct to raise max_blocks in.
absl::StatusOr<std::vector<int64_t>> ReserveBlocks(
    absl::Span<const StepView> steps, int64_t n_layers, int64_t block_rows,
    const BlockPool& pool, absl::string_view who,
    absl::string_view options_name);

// Undoes ReserveBlocks: returns each step's last added[i] blocks of every
// layer to the pool.
void ReleaseBlocks(absl::Span<const StepView> steps,
                   absl::Span<const int64_t> added, const BlockPool& pool);

// The step plan of the (checked, reserved) steps.
StepPlan PlanViews(absl::Span<const StepView> steps, int64_t n_layers);

// Greedy decoding of one prompt: prefill in chunks of prefill_chunk (all at
// once when <= 0), then max_new_tokens argmax tokens (lowest id on ties, as
// the CPU sampler). new_cache() -> StatusOr<Cache>; forward(Cache*,
// absl::Span<const int32_t> tokens, std::vector<float>* logits) -> Status.
// `who` starts the empty-prompt message ("CUDA generate").
template <typename NewCacheFn, typename ForwardFn>
absl::StatusOr<std::vector<int32_t>> GreedyGenerate(
    absl::string_view who, absl::Span<const int32_t> prompt,
    int64_t max_new_tokens, int64_t prefill_chunk,
    std::vector<std::vector<float>>* step_logits, NewCacheFn new_cache,
    ForwardFn forward) {
  if (prompt.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": empty prompt"));
  }
  KVD_ASSIGN_OR_RETURN(auto cache, new_cache());
  std::vector<float> logits;
  const int64_t chunk = prefill_chunk > 0 ? prefill_chunk : prompt.size();
  for (size_t b = 0; b < prompt.size(); b += chunk) {
    KVD_RETURN_IF_ERROR(forward(&cache, prompt.subspan(b, chunk), &logits));
  }
  std::vector<int32_t> out;
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    if (step_logits != nullptr) step_logits->push_back(logits);
    // Lowest id on ties, as the CPU sampler's greedy argmax.
    const int32_t next = static_cast<int32_t>(
        std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    if (i + 1 == max_new_tokens) break;
    KVD_RETURN_IF_ERROR(
        forward(&cache, absl::Span<const int32_t>(&out.back(), 1), &logits));
  }
  return out;
}

}  // namespace kvd::ops::internal

#endif  // KVD_OPS_BACKEND_INTERNAL_CUDA_BATCH_H_
