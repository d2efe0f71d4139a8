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
#include "ops/model/model_backend.h"
#include "ops/model/model_config.h"
#include "ops/model/rope_angle_cache.h"
#include "ops/model/shard_reducer.h"
#include "ops/model/weights.h"

namespace kvd::ops {

struct LoadOptions {
  Precision precision = Precision::kF32;
  // Keep the file's blocks (same bits, fewer bytes) or make fp32 / bf16
  // copies at load (weights.h).
  WeightStorage weights = WeightStorage::kAsStored;
  int num_threads = 0;  // 0: all hardware threads
  std::function<void(int done, int total)> progress;
};

class Model final : public ModelBackend {
 public:
  static absl::StatusOr<std::unique_ptr<Model>> Load(
      const std::string& path, const LoadOptions& options);
  // A Hugging Face checkpoint directory (config.json + *.safetensors), which
  // Load calls for a directory; has no GGUF file(). In hf_loader.cc.
  static absl::StatusOr<std::unique_ptr<Model>> LoadHuggingFace(
      const std::string& dir, const LoadOptions& options);

  // Tensor parallelism: shard `index` of `degree` of `full`. It holds K/V
  // heads [index, index + 1) x n_kv_heads / degree with their query heads,
  // the same slice of the MLP's d_ff, and copies of the replicated weights
  // (norms, embeddings, output); its config counts its own heads and d_ff.
  // Run in step with the other shards (the same batches), joined by
  // `reducer` (which must outlive it), every shard's Forward gives the bits
  // `full`'s does, and its caches and RecomputeKv hold its heads' slice of
  // full's K/V. INVALID_ARGUMENT unless degree divides the row-parallel
  // groups (ModelConfig::row_parallel_groups). In model_shard.cc.
  static absl::StatusOr<std::unique_ptr<Model>> ShardOf(const Model& full,
                                                        int64_t index,
                                                        int64_t degree,
                                                        ShardReducer* reducer,
                                                        int num_threads);
  int64_t shard_index() const { return shard_index_; }
  int64_t shard_degree() const { return shard_degree_; }

  const char* backend_name() const override { return "cpu"; }
  const ModelConfig& config() const override { return config_; }
  Precision precision() const override { return precision_; }
  uint32_t numerics_version() const override;
  absl::Status BoundedHotWindowSupport() const override {
    return absl::OkStatus();
  }
  // The GGUF file the model came from (none for Hugging Face checkpoints).
  bool has_gguf() const { return file_ != nullptr; }
  const GgufFile& file() const { return *file_; }
  const ModelWeights& weights() const { return weights_; }

  // Frees the weights once another backend holds its own copy (a GPU
  // backend uploaded them), so a GPU node does not keep a second copy in
  // host memory. config(), file() and the tokenizer data stay; Forward,
  // ForwardLayers, RecomputeKv and RecomputeKvIntoCache then fail with
  // FAILED_PRECONDITION. Not to be called while any of those runs.
  void ReleaseWeights();
  bool has_weights() const { return has_weights_; }
  kernels::cpu::ThreadPool* pool() const { return pool_.get(); }

  // A cache with its own unlimited block pool.
  KvCache NewCache() const { return KvCache(config_, precision_); }
  // A cache drawing from `pool` (shared with other caches, must outlive
  // them). INVALID_ARGUMENT if the pool was made for other rows.
  // INVALID_ARGUMENT also for a pool in memory the host cannot touch
  // (another backend's).
  absl::StatusOr<KvCache> NewCache(KvBlockPool* pool) const override;
  // A block pool whose rows fit this model's caches.
  absl::StatusOr<std::unique_ptr<KvBlockPool>> NewBlockPool(
      const KvBlockPool::Options& options) const override {
    return KvBlockPool::Create(KvCache::RowBytes(config_, precision_), options);
  }

  // Forward and ForwardLayers (model_backend.h) run Forward's layer code on
  // the CPU kernels; ForwardLayers runs the same code a full step does, so
  // its rows and residuals are bit-identical to Forward's.

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

  // RecomputeKv into the cache's rows (model_backend.h).
  absl::Status RecomputeKvIntoCache(int64_t layer, const float* residuals,
                                    int64_t position, int64_t n,
                                    KvCache* cache) const override;

  // Plain K/V rows of host caches (model_backend.h); kv_rows.cc.
  absl::Status KvRowAccess() const override { return absl::OkStatus(); }
  absl::Status ReadKvRows(const KvCache& cache, int64_t layer, int64_t position,
                          int64_t n, uint8_t* rows) const override;
  absl::Status WriteKvRows(KvCache* cache, int64_t layer, int64_t position,
                           int64_t n, const uint8_t* rows) const override;

 protected:
  absl::Status RunForward(absl::Span<const SequenceStep> batch,
                          ForwardOutput* out, ResidualObserver* observer,
                          ResidualPatcher* patcher) const override;
  absl::Status RunForwardLayers(KvCache* cache, int64_t position, int64_t n,
                                int64_t first_layer, int64_t end_layer,
                                float* h, ResidualObserver* observer,
                                int64_t sequence_id) const override;

 private:
  Model() = default;
  struct Workspace {
    std::vector<float> x, q, k, v, attn, o, gate, up;
    std::vector<float> partials;  // a shard's group partials
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
  // `q`, if not null, also gets x W_q (Forward's query projection, before
  // its bias, norm and RoPE) from the same pass over the weights.
  void KvProjection(int64_t l, const float* h, int64_t m, const float* angles,
                    float* x, float* k, float* v,
                    kernels::cpu::ThreadPool* pool, float* q = nullptr) const;
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
  // Layers [first, end) over the flattened rows, with the patcher and
  // observer hooks at each layer's input.
  void RunLayers(int64_t first, int64_t end,
                 absl::Span<const SequenceStep> batch,
                 const std::vector<int64_t>& row_seq,
                 const std::vector<int64_t>& row_pos, std::vector<float>& h,
                 Workspace& ws, ResidualObserver* observer,
                 ResidualPatcher* patcher) const;
  // y (m x d_model) = x W^T summed as the numerics contract's ordered group
  // partials: in one process GroupedGemm, in a shard this shard's
  // partials joined with the others' by the reducer.
  void RowParallel(const float* x, int64_t m, int64_t ldx,
                   const kernels::cpu::WeightView& w, float* y,
                   Workspace& ws) const;
  void Layer(int64_t l, absl::Span<const SequenceStep> batch,
             const std::vector<int64_t>& row_seq,
             const std::vector<int64_t>& row_pos, std::vector<float>& h,
             Workspace& ws) const;

  ModelConfig config_;
  Precision precision_ = Precision::kF32;
  std::unique_ptr<GgufFile> file_;
  ModelWeights weights_;
  bool has_weights_ = true;
  // FAILED_PRECONDITION naming `what` once ReleaseWeights ran.
  absl::Status CheckWeights(const char* what) const;
  std::unique_ptr<kernels::cpu::ThreadPool> pool_;
  // RoPE angles by position, kept across calls: RecomputeKv asks for the same
  // positions at every layer.
  mutable RopeAngleCache rope_angles_;
  // Tensor parallelism (ShardOf): groups of this shard; null reducer = the
  // whole model in one process.
  int64_t shard_index_ = 0;
  int64_t shard_degree_ = 1;
  int64_t shard_groups_ = 1;
  ShardReducer* reducer_ = nullptr;
};

}  // namespace kvd::ops

#endif  // KVD_OPS_MODEL_MODEL_H_
