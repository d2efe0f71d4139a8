// A loaded transformer and its batched forward pass.
//
// One generic forward pass serves every family, driven by ModelConfig. A step
// takes several sequences at once, each with its own K/V cache and any number
// of new tokens (prefill chunks and single-token decodes mix freely); all new
// tokens of the batch go through each projection as one GEMM, attention runs
// per sequence. Because every kernel is batch-invariant, a sequence's logits do
// not depend on what else is in the batch, on the thread count or the ISA.
//
//   KVD_ASSIGN_OR_RETURN(auto model, Model::Load(path, {}));
//   KvCache cache = model->NewCache();
//   SequenceStep step{&cache, prompt_ids, LogitsMode::kLast};
//   ForwardOutput out;
//   KVD_RETURN_IF_ERROR(model->Forward({&step, 1}, &out));
//   const float* logits = out.Logits(0);  // the last prompt token's
//
// ResidualObserver sees the residual stream entering every layer for every new
// token: the hook KV-Direct checkpoints are built on.
//
// Thread-safety: a Model is immutable after Load; Forward may run concurrently
// from several threads if each call has its own pool and caches.
#ifndef KVD_OPS_MODEL_MODEL_H_
#define KVD_OPS_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cpu/thread_pool.h"
#include "ops/gguf/gguf_file.h"
#include "ops/model/kv_cache.h"
#include "ops/model/model_config.h"
#include "ops/model/weights.h"

namespace kvd::ops {

enum class LogitsMode { kNone, kLast, kAll };

// KV-Direct bounded-memory attention: where a sequence's K/V older than its
// hot window come from. Attention reads cache rows only at positions >=
// HotBegin; a canonical chunk that reaches below it is rebuilt whole into a
// bounded scratch buffer (each layer's cold rows are recomputed once per step
// for all heads, in rounds of at most kRecomputeRows rows shared by the
// batch's sequences), older rows from these residuals, so the chunk folds
// into the online softmax exactly as the cached one would.
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
// (ops/kvdirect/eviction.h; the product never evicts lossily). Restricts
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

struct LoadOptions {
  Precision precision = Precision::kF32;
  int num_threads = 0;  // 0: all hardware threads
  std::function<void(int done, int total)> progress;
};

class Model {
 public:
  static absl::StatusOr<std::unique_ptr<Model>> Load(
      const std::string& path, const LoadOptions& options);
  // A Hugging Face checkpoint directory (config.json + *.safetensors), which
  // Load calls for a directory; has no GGUF file(). In hf_loader.cc.
  static absl::StatusOr<std::unique_ptr<Model>> LoadHuggingFace(
      const std::string& dir, const LoadOptions& options);

  const ModelConfig& config() const { return config_; }
  Precision precision() const { return precision_; }
  // The GGUF file the model came from (none for Hugging Face checkpoints).
  bool has_gguf() const { return file_ != nullptr; }
  const GgufFile& file() const { return *file_; }
  const ModelWeights& weights() const { return weights_; }
  kernels::cpu::ThreadPool* pool() const { return pool_.get(); }

  // A cache with its own unlimited block pool.
  KvCache NewCache() const { return KvCache(config_, precision_); }
  // A cache drawing from `pool` (shared with other caches, must outlive
  // them). INVALID_ARGUMENT if the pool was made for other rows.
  absl::StatusOr<KvCache> NewCache(KvBlockPool* pool) const {
    return KvCache::InPool(config_, precision_, pool);
  }
  // A block pool whose rows fit this model's caches.
  absl::StatusOr<std::unique_ptr<KvBlockPool>> NewBlockPool(
      const KvBlockPool::Options& options) const {
    return KvBlockPool::Create(KvCache::RowBytes(config_, precision_), options);
  }

  // Runs one step over `batch`. INVALID_ARGUMENT for out-of-range token ids or
  // a sequence that would exceed the context length, RESOURCE_EXHAUSTED when
  // a cache's block pool cannot hold the step's rows; nothing is written to
  // any cache in those cases.
  absl::Status Forward(absl::Span<const SequenceStep> batch, ForwardOutput* out,
                       ResidualObserver* observer = nullptr,
                       ResidualPatcher* patcher = nullptr) const;

  // A partial forward pass, what a stride:k rebuild runs for one segment:
  // layers [first_layer, end_layer) for `n` tokens of one sequence at
  // positions [position, position + n), whose residuals entering first_layer
  // are `h` (n x d_model, exactly as the ResidualObserver saw them). On return
  // `h` holds the residuals entering end_layer. Writes those layers' K/V rows
  // into `cache` at those positions; their rows below `position` must be
  // there (run front to back). cache->length() is left alone. The observer
  // sees the residual entering each layer of the range (and the final one if
  // end_layer == n_layers). Runs Forward's own layer code, so rows and
  // residuals are bit-identical to Forward's. INVALID_ARGUMENT for a bad
  // range, FAILED_PRECONDITION if the layers dropped rows, RESOURCE_EXHAUSTED
  // if the cache's block pool is full (rows are then unwritten, though
  // earlier layers of the range may hold blocks for them: reset the cache).
  absl::Status ForwardLayers(KvCache* cache, int64_t position, int64_t n,
                             int64_t first_layer, int64_t end_layer, float* h,
                             ResidualObserver* observer = nullptr,
                             int64_t sequence_id = 0) const;

  // KV-Direct: rebuilds layer `layer`'s K and V rows for `n` tokens from their
  // residuals entering that layer (`residuals`: n x d_model values exactly as
  // the ResidualObserver saw them) at absolute `positions`. Writes n rows of
  // NewCache().row_bytes() bytes each to k_out / v_out, in the cache's dtype
  // and layout. The rows equal bit for bit the ones Forward cached for those
  // tokens, because both run KvProjection. `pool` null: single-threaded (for
  // callers already inside a ParallelFor of pool()). INVALID_ARGUMENT for a
  // bad layer, position or count. Implemented in kv_recompute.cc.
  absl::Status RecomputeKv(int64_t layer, const float* residuals,
                           const int64_t* positions, int64_t n, uint8_t* k_out,
                           uint8_t* v_out,
                           kernels::cpu::ThreadPool* pool = nullptr) const;

 private:
  Model() = default;
  struct Workspace {
    std::vector<float> x, q, k, v, attn, o, gate, up;
    // RoPE cos/sin per row, computed once per step for each distinct base.
    std::vector<std::pair<float, std::vector<float>>> rope;
    const ModelConfig* config = nullptr;
    const std::vector<int64_t>* row_pos = nullptr;
    kernels::cpu::ThreadPool* pool = nullptr;
    const std::vector<float>& RopeTable(float base);
    // KV-Direct recompute rounds (kv_recompute.cc): residual rows, their
    // positions, the projection's buffers and the rows in the cache's dtype.
    // At most kRecomputeRows rows each, whatever the context length.
    struct Recompute {
      std::vector<float> h, angles, x, k, v;
      std::vector<int64_t> positions;
      std::vector<uint8_t> k_rows, v_rows;
    } recompute;
  };
  // Rows recomputed per KV-Direct round, across the batch's sequences: large
  // enough for efficient GEMMs, small enough to bound the scratch.
  static constexpr int64_t kRecomputeRows = 1024;
  // The K/V half of layer l's attention input, shared by Forward and
  // RecomputeKv so the two cannot drift apart: x = RMSNorm_l(h),
  // k = RoPE(k_norm(x W_k + b_k)), v = x W_v + b_v, all fp32, m rows.
  // `angles` holds per row rope_dim / 2 cos then rope_dim / 2 sin values.
  void KvProjection(int64_t l, const float* h, int64_t m, const float* angles,
                    float* x, float* k, float* v,
                    kernels::cpu::ThreadPool* pool) const;
  // RecomputeKv's body on caller-owned scratch: K/V rows of `n` residual rows
  // in the cache's dtype, at *k_rows / *v_rows (pointing into `s`).
  void RecomputeRows(int64_t layer, const float* residuals,
                     const int64_t* positions, int64_t n,
                     Workspace::Recompute& s, const uint8_t** k_rows,
                     const uint8_t** v_rows,
                     kernels::cpu::ThreadPool* pool) const;
  // Attention of every query row whose sequence has a KvSource; same bits as
  // AttendCausalBlock over a full cache (kv_recompute.cc). Each cold row of
  // layer l is recomputed once per step for all K/V heads, in rounds of up
  // to kRecomputeRows rows across those sequences; uses pool() itself.
  void AttendFromSources(int64_t l, absl::Span<const SequenceStep> batch,
                         const std::vector<int64_t>& row_seq,
                         const std::vector<int64_t>& row_pos, const float* q,
                         float* attn, Workspace& ws) const;
  // Attention of one task whose sequence has a KeySelection: only the kept
  // positions (kv_recompute.cc).
  void AttendSelected(int64_t l, const SequenceStep& step, int64_t g,
                      const float* q, int64_t q_stride, int64_t nq,
                      int64_t pos0, float* out, int64_t out_stride) const;
  // INVALID_ARGUMENT if the KeySelection's kept positions are not ascending
  // cached positions, or it is combined with a KvSource.
  absl::Status CheckKeySelection(const SequenceStep& step) const;
  // FAILED_PRECONDITION if attention would need rows the cache dropped.
  absl::Status CheckKeptRows(const SequenceStep& step) const;
  // Per layer, the first position the step's cache keeps: rows below the
  // KvSource's hot window and below a local layer's window are released.
  std::vector<int64_t> KeepBegins(const SequenceStep& step) const;
  // Reserves, per block pool, the blocks every cache of the batch needs for
  // the step (KvCache::BlocksToPrepare), all or nothing: RESOURCE_EXHAUSTED
  // with no reservation held otherwise.
  absl::Status ReserveBlocks(
      absl::Span<const SequenceStep> batch,
      const std::vector<std::vector<int64_t>>& keep) const;
  // Layers [first, end) over the flattened rows, with the patcher and
  // observer hooks at each layer's input.
  void RunLayers(int64_t first, int64_t end,
                 absl::Span<const SequenceStep> batch,
                 const std::vector<int64_t>& row_seq,
                 const std::vector<int64_t>& row_pos, std::vector<float>& h,
                 Workspace& ws, ResidualObserver* observer,
                 ResidualPatcher* patcher) const;
  void Layer(int64_t l, absl::Span<const SequenceStep> batch,
             const std::vector<int64_t>& row_seq,
             const std::vector<int64_t>& row_pos, std::vector<float>& h,
             Workspace& ws) const;

  ModelConfig config_;
  Precision precision_ = Precision::kF32;
  std::unique_ptr<GgufFile> file_;
  ModelWeights weights_;
  std::unique_ptr<kernels::cpu::ThreadPool> pool_;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_MODEL_MODEL_H_
