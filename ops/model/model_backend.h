// What the engine asks of a compute backend, whichever hardware runs it: the
// batched forward step over paged K/V caches, the partial forward pass and
// the K/V recompute a KV-Direct rebuild runs, and the block pools and caches
// those read. The CPU backend is ops::Model (model.h); the CUDA backend is
// ops::CudaBackendModel (ops/backend/cuda_backend_model.h). The engine
// (services/engine) and the rebuild (ops/kvdirect/rebuild.h) hold a
// `const ModelBackend&` and never learn which one they drive.
//
// Caches are the same KvCache on every backend: its block tables, lengths
// and windows are host bookkeeping, so admission, demotion and the budget
// arithmetic do not depend on the backend. Only where the blocks' bytes live
// differs: a backend's NewBlockPool hands out blocks in the memory its
// kernels read (host memory for the CPU, a device slab for CUDA), and only
// the backend touches those bytes.
//
//   const ModelBackend& backend = *model;  // or a CudaBackendModel
//   KVD_ASSIGN_OR_RETURN(auto pool, backend.NewBlockPool({}));
//   KVD_ASSIGN_OR_RETURN(KvCache cache, backend.NewCache(pool.get()));
//   SequenceStep step{&cache, prompt_ids, LogitsMode::kLast};
//   ForwardOutput out;
//   KVD_RETURN_IF_ERROR(backend.Forward({&step, 1}, &out, &observer));
//
// Thread-safety: a backend is immutable to its callers; Forward may be called
// from several threads (a backend serialises internally if it must), each
// call with its own caches. Hooks (ResidualObserver, ResidualPatcher,
// KvSource, KeySelection) must not call back into the backend: a backend
// may call them under its own lock.
#ifndef KVD_OPS_MODEL_MODEL_BACKEND_H_
#define KVD_OPS_MODEL_MODEL_BACKEND_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "ops/model/kv_block_pool.h"
#include "ops/model/kv_cache.h"
#include "ops/model/model_config.h"

namespace kvd::ops {

enum class LogitsMode { kNone, kLast, kAll };

// KV-Direct bounded-memory attention: where a sequence's K/V older than its
// hot window come from. Attention reads cache rows only at positions >=
// HotBegin; a canonical chunk that reaches below it is rebuilt whole into a
// bounded scratch buffer from these residuals (how many rows at a time is the
// backend's: model.h, cuda_backend_model.h), so the chunk folds into the
// online softmax exactly as the cached one would.
// Forward frees the cache rows below HotBegin before the step (the hot window
// is real memory), so HotBegin must not move backwards for a cache.
// Called concurrently from attention tasks: the const methods must be safe to
// call from several threads at once.
class KvSource {
 public:
  virtual ~KvSource() = default;
  // First position of `layer` whose cache rows are kept, given the cache's
  // length before this step (<= that length: this step's rows stay hot).
  virtual int64_t HotBegin(int64_t layer, int64_t cache_length) const = 0;
  // OK if every position below HotBegin can be served at every layer; Forward
  // calls it before touching any cache.
  virtual absl::Status Check(int64_t n_layers, int64_t cache_length) const = 0;
  // Residuals entering `layer` at positions [first, first + n), fp32, into out
  // (n x d_model). Only asked for what Check promised.
  virtual void ReadResiduals(int64_t layer, int64_t first, int64_t n,
                             float* out) const = 0;
};

// Experiment-only: the eviction baselines KV-Direct is measured against
// (tools/experiments/eviction.h; the product never evicts lossily). Restricts
// which cached positions attention visits, per layer and K/V head, and can
// report the softmax weights the score-based baselines (H2O, TOVA, SnapKV)
// rank keys by. A query attends to the kept positions that its sliding window
// (if any) reaches, then to the step's own positions up to itself, grouped by
// canonical chunk: with every position kept the result is bit-identical to
// attention without a selection. Methods are called concurrently from
// attention tasks.
class KeySelection {
 public:
  virtual ~KeySelection() = default;
  // Positions below `cache_length` (the cache's length before the step) that
  // K/V head `kv_head` of `layer` attends to: strictly ascending, valid until
  // the step ends. Forward refuses the step (INVALID_ARGUMENT) otherwise.
  virtual absl::Span<const int64_t> KeptKeys(int64_t layer, int64_t kv_head,
                                             int64_t cache_length) const = 0;
  // Whether OnWeights should be called (it costs a second pass over the keys).
  virtual bool WantsWeights() const { return false; }
  // Softmax weights of the query at `position`: weights[i * keys.size() + j]
  // for query head i of the K/V head's group and key position keys[j]. Called
  // from several threads at once (different heads and query blocks).
  virtual void OnWeights(int64_t layer, int64_t kv_head, int64_t position,
                         absl::Span<const int64_t> keys, const float* weights) {
  }
};

struct SequenceStep {
  KvCache* cache = nullptr;
  // New tokens, at positions cache->length() onwards.
  absl::Span<const int32_t> tokens;
  LogitsMode logits = LogitsMode::kLast;
  int64_t sequence_id = 0;              // passed to the ResidualObserver
  const KvSource* kv_source = nullptr;  // null: every cached row is hot
  // Experiment-only (eviction baselines); not with a kv_source.
  KeySelection* key_selection = nullptr;
};

struct ForwardOutput {
  int64_t vocab_size = 0;
  std::vector<float> logits;       // rows x vocab_size
  std::vector<int64_t> first_row;  // per sequence: first row (-1 if none)
  std::vector<int64_t> num_rows;   // per sequence: how many rows
  // Row `row` of sequence `seq` (-1: its last row).
  const float* Logits(size_t seq, int64_t row = -1) const;
};

class ResidualObserver {
 public:
  virtual ~ResidualObserver() = default;
  // `residual` (d_model fp32 values; in the bf16 mode exactly
  // bf16-representable) is the input of `layer` for the token at `position` of
  // sequence `sequence_id`. layer == n_layers is the final residual (input of
  // the output norm).
  virtual void OnResidual(int64_t sequence_id, int64_t layer, int64_t position,
                          const float* residual) = 0;
};

// Overwrites residuals as they enter a layer, before the ResidualObserver sees
// them: the "residual patching" experiment of the KV-Direct paper (replace
// every position's residual entering layer l with another prompt's and the
// output must become that prompt's exactly). Also the entry point for resuming
// from a checkpointed residual.
class ResidualPatcher {
 public:
  virtual ~ResidualPatcher() = default;
  // May modify `residual` (d_model values) in place.
  virtual void Patch(int64_t sequence_id, int64_t layer, int64_t position,
                     float* residual) = 0;
};

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;

  // "cpu" or "cuda", for logs and gRPC Health.
  virtual const char* backend_name() const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual Precision precision() const = 0;
  // The numerics contract this backend computes under: two runs with the
  // same version give the same bits. A session checkpoint records it; one
  // from other numerics is re-prefilled from its tokens, not resumed from
  // its residuals (services/engine). CPU: kernels::cpu::kNumericsVersion.
  virtual uint32_t numerics_version() const = 0;
  // OK if Forward serves a KvSource whose hot window starts above position 0
  // (KV-Direct's bounded hot window: older K/V recomputed inside
  // attention); UNIMPLEMENTED saying why not. The engine checks it at start
  // for a bounded --hot-budget, so sessions do not fail turn after turn.
  virtual absl::Status BoundedHotWindowSupport() const = 0;

  // Whether every row `cache` holds is still there for this backend's
  // kernels. False only for a cache whose rows the backend lost: a CPU
  // tensor-parallel group's cache whose twins died with restarted shard
  // workers (services/worker/shard_group.h). The engine then resumes the
  // session from its checkpoint instead of failing its turn.
  virtual bool CacheIntact(const KvCache& cache) const { return true; }

  // A block pool whose blocks live where this backend's kernels read them
  // and fit this model's caches. INVALID_ARGUMENT for bad options;
  // RESOURCE_EXHAUSTED if a backend that allocates its pool up front (CUDA)
  // cannot.
  virtual absl::StatusOr<std::unique_ptr<KvBlockPool>> NewBlockPool(
      const KvBlockPool::Options& options) const = 0;
  // A cache drawing from `pool` (from this backend's NewBlockPool; it must
  // outlive the cache). INVALID_ARGUMENT if the pool was made for other rows
  // or another backend's memory.
  virtual absl::StatusOr<KvCache> NewCache(KvBlockPool* pool) const = 0;

  // Runs one step over `batch`. INVALID_ARGUMENT for out-of-range token ids
  // or a sequence that would exceed the context length, RESOURCE_EXHAUSTED
  // when a cache's block pool cannot hold the step's rows, UNIMPLEMENTED for
  // a feature this backend lacks (named in the message); nothing is written
  // to any cache in those cases. The observer sees every new token's
  // residual entering every layer, on the host.
  absl::Status Forward(absl::Span<const SequenceStep> batch, ForwardOutput* out,
                       ResidualObserver* observer = nullptr,
                       ResidualPatcher* patcher = nullptr) const {
    return RunForward(batch, out, observer, patcher);
  }

  // A partial forward pass, what a stride:k rebuild runs for one segment:
  // layers [first_layer, end_layer) for `n` tokens of one sequence at
  // positions [position, position + n), whose residuals entering first_layer
  // are `h` (n x d_model, exactly as the ResidualObserver saw them). On
  // return `h` holds the residuals entering end_layer. Writes those layers'
  // K/V rows into `cache` at those positions; their rows below `position`
  // must be there (run front to back). cache->length() is left alone. The
  // observer sees the residual entering each layer of the range (and the
  // final one if end_layer == n_layers). Rows and residuals are
  // bit-identical to Forward's on the same backend. INVALID_ARGUMENT for a
  // bad range, FAILED_PRECONDITION if the layers dropped rows,
  // RESOURCE_EXHAUSTED if the cache's block pool is full (rows are then
  // unwritten, though earlier layers of the range may hold blocks for them:
  // reset the cache).
  absl::Status ForwardLayers(KvCache* cache, int64_t position, int64_t n,
                             int64_t first_layer, int64_t end_layer, float* h,
                             ResidualObserver* observer = nullptr,
                             int64_t sequence_id = 0) const {
    return RunForwardLayers(cache, position, n, first_layer, end_layer, h,
                            observer, sequence_id);
  }

  // KV-Direct: rebuilds layer `layer`'s K and V rows for the `n` positions
  // [position, position + n) from their residuals entering that layer
  // (`residuals`: n x d_model, exactly as the ResidualObserver saw them) and
  // writes them into `cache`, whose blocks for those positions must already
  // be there (KvCache::ReserveLayer). The rows equal bit for bit the ones
  // Forward cached for those tokens on the same backend. INVALID_ARGUMENT
  // for a bad layer, range or cache, FAILED_PRECONDITION for another
  // model's cache.
  virtual absl::Status RecomputeKvIntoCache(int64_t layer,
                                            const float* residuals,
                                            int64_t position, int64_t n,
                                            KvCache* cache) const = 0;

  // Plain K/V checkpoints (the engine's policy kv). OK if ReadKvRows and
  // WriteKvRows serve this backend's caches; otherwise UNIMPLEMENTED saying
  // why, and the engine refuses the policy for new sessions and re-prefills
  // a stored kv session from its token ids.
  virtual absl::Status KvRowAccess() const {
    return absl::UnimplementedError(
        absl::StrCat("the ", backend_name(),
                     " backend cannot copy K/V rows out of its caches; use "
                     "policy kv-direct"));
  }
  // Copies `layer`'s K and V rows of positions [position, position + n) out
  // of `cache` into `rows`: row i at rows + i * 2 * row_bytes, its K row then
  // its V row, exactly as the cache holds them (KvCache::row_bytes() each).
  // INVALID_ARGUMENT unless the cache keeps those positions (first_kept to
  // length); UNIMPLEMENTED as KvRowAccess says.
  virtual absl::Status ReadKvRows(const KvCache& cache, int64_t layer,
                                  int64_t position, int64_t n,
                                  uint8_t* rows) const {
    return KvRowAccess();
  }
  // The reverse: writes rows laid out as ReadKvRows gives them into `cache`,
  // whose blocks for those positions must be there (KvCache::ReserveLayer).
  // Rows written here are bit for bit the rows read, so attention over them
  // gives the bits it gave before.
  virtual absl::Status WriteKvRows(KvCache* cache, int64_t layer,
                                   int64_t position, int64_t n,
                                   const uint8_t* rows) const {
    return KvRowAccess();
  }

 protected:
  virtual absl::Status RunForward(absl::Span<const SequenceStep> batch,
                                  ForwardOutput* out,
                                  ResidualObserver* observer,
                                  ResidualPatcher* patcher) const = 0;
  virtual absl::Status RunForwardLayers(KvCache* cache, int64_t position,
                                        int64_t n, int64_t first_layer,
                                        int64_t end_layer, float* h,
                                        ResidualObserver* observer,
                                        int64_t sequence_id) const = 0;
};

// Shared by the backends' Forward, so they accept and refuse the same
// batches and leave caches alike: checks every step against the model (a
// cache made for it, token ids, the context length, the KvSource's
// coverage, rows the cache dropped), then reserves every block the step
// needs across all pools, all or nothing, and grows and trims each cache's
// block tables to them (KvCache::Prepare). Nothing changes on error.
// Returns the batch's new-token count.
absl::StatusOr<int64_t> PrepareStepCaches(const ModelConfig& config,
                                          Precision precision,
                                          absl::Span<const SequenceStep> batch);

// Shared by the backends' ForwardLayers: checks the arguments as
// ForwardLayers documents (INVALID_ARGUMENT, FAILED_PRECONDITION), then
// reserves the range's layers' blocks up to position + n
// (RESOURCE_EXHAUSTED). False when there is nothing to run (n == 0 or an
// empty layer range).
absl::StatusOr<bool> PrepareLayerRange(const ModelConfig& config,
                                       Precision precision, KvCache* cache,
                                       int64_t position, int64_t n,
                                       int64_t first_layer, int64_t end_layer,
                                       const float* h);

// Shared by the backends' RecomputeKvIntoCache: FAILED_PRECONDITION for a
// cache made for another model or precision; INVALID_ARGUMENT for no cache,
// or one that does not hold the blocks of `layer`'s positions [position,
// position + n).
absl::Status CheckRecomputeTarget(const ModelConfig& config,
                                  Precision precision, int64_t layer,
                                  int64_t position, int64_t n,
                                  const KvCache* cache);

// The rows of a step's flattened tokens (sequence 0's, then 1's, ...) that
// want logits, with out->first_row / num_rows / vocab_size filled for them;
// out->logits is left for the backend (rows x vocab_size).
std::vector<int64_t> SelectLogitRows(absl::Span<const SequenceStep> batch,
                                     int64_t vocab_size, ForwardOutput* out);

}  // namespace kvd::ops

#endif  // KVD_OPS_MODEL_MODEL_BACKEND_H_
