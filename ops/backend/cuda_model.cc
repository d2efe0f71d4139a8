#include "ops/backend/cuda_model.h"

#include <cuda_runtime.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "ops/backend/cuda_model_support.h"
#include "ops/backend/internal/cuda_batch.h"
#include "ops/backend/internal/cuda_forward.h"
#include "ops/backend/internal/cuda_step_plan.h"

namespace kvd::ops {
namespace {

namespace kc = ::kvd::kernels::cuda;
using kc::internal::CudaStatus;

}  // namespace

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(
    const Model& model, const CudaModelOptions& options) {
  const ModelConfig& c = model.config();
  KVD_RETURN_IF_ERROR(CheckCudaModelSupport(c, model.precision()));
  KVD_RETURN_IF_ERROR(
      internal::CheckPoolOptions("CudaModelOptions", options.block_rows,
                                 options.max_blocks, kc::kAttentionChunk));
  std::unique_ptr<CudaModel> m(new CudaModel());
  m->config_ = c;
  m->options_ = options;
  KVD_ASSIGN_OR_RETURN(m->fwd_,
                       internal::CudaForward::Create(model, options.device));

  const int64_t blocks = internal::PoolBlocks(
      options.max_blocks, c.n_layers, c.context_length, options.block_rows);
  const size_t pool_bytes =
      static_cast<size_t>(blocks) * 2 * options.block_rows * c.kv_dim() * 2;
  void* pool = nullptr;
  KVD_RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(&pool, pool_bytes),
                 absl::StrCat("cudaMalloc of the K/V pool (", blocks,
                              " blocks, ", pool_bytes, " bytes)")));
  m->pool_ = static_cast<uint16_t*>(pool);
  m->max_blocks_ = blocks;
  {
    absl::MutexLock lock(&m->blocks_mu_);
    // Popped from the back: the lowest block ids go out first.
    for (int64_t b = blocks - 1; b >= 0; --b)
      m->free_blocks_.push_back(static_cast<int32_t>(b));
  }
  return m;
}

CudaModel::~CudaModel() {
  fwd_.reset();  // waits for its stream
  if (pool_ != nullptr) cudaFree(pool_);
}

int64_t CudaModel::free_blocks() const {
  absl::MutexLock lock(&blocks_mu_);
  return free_blocks_.size();
}

absl::StatusOr<CudaKvCache> CudaModel::NewCache() {
  return CudaKvCache(this, config_.n_layers);
}

void CudaModel::FreeBlocks(std::vector<std::vector<int32_t>>* blocks) {
  absl::MutexLock lock(&blocks_mu_);
  for (auto& layer : *blocks) {
    free_blocks_.insert(free_blocks_.end(), layer.rbegin(), layer.rend());
    layer.clear();
  }
}

absl::Status CudaModel::Forward(absl::Span<const CudaStep> batch,
                                std::vector<float>* logits) {
  const ModelConfig& c = config_;
  const int64_t n_seqs = batch.size();
  if (n_seqs == 0) {
    logits->clear();
    return absl::OkStatus();
  }
  absl::MutexLock lock(&forward_mu_);
  std::vector<internal::StepView> views(n_seqs);
  for (int64_t i = 0; i < n_seqs; ++i) {
    CudaKvCache* cache = batch[i].cache;
    const bool ours = cache != nullptr && cache->owner_ == this;
    views[i] = {cache, ours, batch[i].tokens, ours ? cache->length() : 0,
                ours ? &cache->blocks_ : nullptr};
  }
  KVD_ASSIGN_OR_RETURN(
      const int64_t m,
      internal::CheckBatch(views, {c.vocab_size, c.context_length},
                           "CUDA forward"));

  // Reserve every layer's new blocks for every sequence, all or nothing.
  const internal::BlockPool pool{&blocks_mu_, &free_blocks_, max_blocks_};
  KVD_ASSIGN_OR_RETURN(
      const std::vector<int64_t> added,
      internal::ReserveBlocks(views, c.n_layers, options_.block_rows, pool,
                              "CUDA K/V pool", "CudaModelOptions"));

  const internal::StepPlan plan = internal::PlanViews(views, c.n_layers);
  absl::Status st = [&]() -> absl::Status {
    internal::CudaForward& f = *fwd_;
    KVD_RETURN_IF_ERROR(f.SetDevice());
    KVD_RETURN_IF_ERROR(f.EnsureWorkspace(m, plan.n_gather, plan.ints.size()));
    KVD_RETURN_IF_ERROR(f.UploadPlan(plan));
    KVD_RETURN_IF_ERROR(f.Embed(plan));
    KVD_RETURN_IF_ERROR(
        f.RunLayers(plan, {pool_, options_.block_rows}, 0, c.n_layers));
    logits->resize(n_seqs * c.vocab_size);
    KVD_RETURN_IF_ERROR(f.Logits(plan, logits->data()));
    return f.Sync("running the forward step");
  }();
  if (!st.ok()) {
    internal::ReleaseBlocks(views, added, pool);
    return st;
  }
  for (int64_t i = 0; i < n_seqs; ++i)
    batch[i].cache->length_ += batch[i].tokens.size();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> CudaModel::Generate(
    absl::Span<const int32_t> prompt, int64_t max_new_tokens,
    int64_t prefill_chunk, std::vector<std::vector<float>>* step_logits) {
  return internal::GreedyGenerate(
      "CUDA generate", prompt, max_new_tokens, prefill_chunk, step_logits,
      [this] { return NewCache(); },
      [this](CudaKvCache* cache, absl::Span<const int32_t> tokens,
             std::vector<float>* logits) {
        CudaStep step{cache, tokens};
        return Forward({&step, 1}, logits);
      });
}

}  // namespace kvd::ops
