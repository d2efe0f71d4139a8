#include "ops/backend/tp_cuda_model.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "kernels/cuda/paged_attention.h"
#include "ops/backend/internal/cuda_batch.h"
#include "ops/backend/internal/cuda_forward.h"
#include "ops/backend/internal/cuda_step_plan.h"
#include "ops/backend/internal/tp_forward.h"

namespace kvd::ops {
namespace {

namespace kc = ::kvd::kernels::cuda;
using kc::internal::CudaStatus;

}  // namespace

absl::StatusOr<std::unique_ptr<TpCudaModel>> TpCudaModel::Create(
    const Model& model, const TpCudaModelOptions& options) {
  const ModelConfig& c = model.config();
  KVD_RETURN_IF_ERROR(
      internal::CheckPoolOptions("TpCudaModelOptions", options.block_rows,
                                 options.max_blocks, kc::kAttentionChunk));
  internal::TpForwardOptions fo;
  fo.degree = options.degree;
  fo.devices = options.devices;
  fo.device = options.device;
  fo.all_reduce = options.all_reduce;
  std::unique_ptr<TpCudaModel> m(new TpCudaModel());
  KVD_ASSIGN_OR_RETURN(
      m->fwd_, internal::TpForward::Create(model, fo, "TpCudaModelOptions"));
  m->config_ = c;
  m->options_ = options;

  const int64_t blocks = internal::PoolBlocks(
      options.max_blocks, c.n_layers, c.context_length, options.block_rows);
  for (int s = 0; s < options.degree; ++s) {
    KVD_RETURN_IF_ERROR(m->fwd_->SetDevice(s));
    auto mem = std::make_unique<internal::DeviceMemory>();
    mem->device = m->fwd_->device(s);
    const size_t bytes = static_cast<size_t>(blocks) * 2 * options.block_rows *
                         m->fwd_->kv_width(s) * 2;
    KVD_ASSIGN_OR_RETURN(
        void* pool,
        mem->Alloc(bytes, absl::StrCat("the K/V pool of shard ", s, " (",
                                       blocks, " blocks, ", bytes, " bytes)")));
    m->pools_.push_back(static_cast<uint16_t*>(pool));
    m->pool_memory_.push_back(std::move(mem));
  }
  m->max_blocks_ = blocks;
  {
    absl::MutexLock lock(&m->blocks_mu_);
    for (int64_t b = blocks - 1; b >= 0; --b)
      m->free_blocks_.push_back(static_cast<int32_t>(b));
  }
  return m;
}

TpCudaModel::~TpCudaModel() {
  // The streams finish before the pools go.
  fwd_.reset();
  pool_memory_.clear();
}

const TensorParallelPlan& TpCudaModel::plan() const { return fwd_->plan(); }

int64_t TpCudaModel::free_blocks() const {
  absl::MutexLock lock(&blocks_mu_);
  return free_blocks_.size();
}

absl::StatusOr<TpKvCache> TpCudaModel::NewCache() {
  return TpKvCache(this, config_.n_layers);
}

void TpCudaModel::FreeBlocks(std::vector<std::vector<int32_t>>* blocks) {
  absl::MutexLock lock(&blocks_mu_);
  for (auto& layer : *blocks) {
    free_blocks_.insert(free_blocks_.end(), layer.rbegin(), layer.rend());
    layer.clear();
  }
}

absl::Status TpCudaModel::RunStep(const internal::StepPlan& plan,
                                  std::vector<float>* logits,
                                  std::vector<std::vector<float>>* residuals) {
  const ModelConfig& c = config_;
  const int64_t d = c.d_model, m = plan.rows;
  internal::TpForward& f = *fwd_;
  std::vector<internal::CudaPool> pools;
  for (uint16_t* base : pools_) pools.push_back({base, options_.block_rows});
  KVD_RETURN_IF_ERROR(f.UploadPlan(plan));
  KVD_RETURN_IF_ERROR(f.Embed(plan));
  std::function<absl::Status(int64_t)> capture;
  if (residuals != nullptr) {
    residuals->assign(c.n_layers, std::vector<float>(m * d));
    capture = [&](int64_t l) {
      return f.DownloadResiduals((*residuals)[l].data(), m);
    };
  }
  KVD_RETURN_IF_ERROR(f.RunLayers(plan, pools, 0, c.n_layers, capture));
  logits->resize(plan.n_gather * c.vocab_size);
  KVD_RETURN_IF_ERROR(f.Logits(plan, logits->data()));
  return f.Sync("running the tensor-parallel forward step");
}

absl::Status TpCudaModel::Forward(absl::Span<const TpStep> batch,
                                  std::vector<float>* logits,
                                  std::vector<std::vector<float>>* residuals) {
  const ModelConfig& c = config_;
  const int64_t n_seqs = batch.size();
  if (n_seqs == 0) {
    logits->clear();
    return absl::OkStatus();
  }
  absl::MutexLock lock(&forward_mu_);
  std::vector<internal::StepView> views(n_seqs);
  for (int64_t i = 0; i < n_seqs; ++i) {
    TpKvCache* cache = batch[i].cache;
    const bool ours = cache != nullptr && cache->owner_ == this;
    views[i] = {cache, ours, batch[i].tokens, ours ? cache->length() : 0,
                ours ? &cache->blocks_ : nullptr};
  }
  KVD_ASSIGN_OR_RETURN(
      const int64_t m,
      internal::CheckBatch(views, {c.vocab_size, c.context_length},
                           "TP CUDA forward"));

  // Every layer's new blocks for every sequence, all or nothing; the same
  // block ids serve every shard's pool.
  const internal::BlockPool pool{&blocks_mu_, &free_blocks_, max_blocks_};
  KVD_ASSIGN_OR_RETURN(
      const std::vector<int64_t> added,
      internal::ReserveBlocks(views, c.n_layers, options_.block_rows, pool,
                              "TP CUDA K/V pool", "TpCudaModelOptions"));
  const internal::StepPlan plan = internal::PlanViews(views, c.n_layers);
  absl::Status st = fwd_->EnsureWorkspace(m, plan.n_gather, plan.ints.size());
  if (st.ok()) st = RunStep(plan, logits, residuals);
  if (!st.ok()) {
    internal::ReleaseBlocks(views, added, pool);
    return st;
  }
  for (int64_t i = 0; i < n_seqs; ++i)
    batch[i].cache->length_ += batch[i].tokens.size();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> TpCudaModel::Generate(
    absl::Span<const int32_t> prompt, int64_t max_new_tokens,
    int64_t prefill_chunk, std::vector<std::vector<float>>* step_logits) {
  return internal::GreedyGenerate(
      "TP CUDA generate", prompt, max_new_tokens, prefill_chunk, step_logits,
      [this] { return NewCache(); },
      [this](TpKvCache* cache, absl::Span<const int32_t> tokens,
             std::vector<float>* logits) {
        TpStep step{cache, tokens};
        return Forward({&step, 1}, logits);
      });
}

absl::Status TpCudaModel::ReadKv(const TpKvCache& cache, int shard,
                                 int64_t layer, std::vector<uint16_t>* k,
                                 std::vector<uint16_t>* v) {
  if (cache.owner_ != this || shard < 0 || shard >= fwd_->degree() ||
      layer < 0 || layer >= config_.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TpCudaModel::ReadKv: need a cache of this model, shard in [0, ",
        fwd_->degree(), ") and layer in [0, ", config_.n_layers,
        "); got shard ", shard, ", layer ", layer));
  }
  absl::MutexLock lock(&forward_mu_);
  KVD_RETURN_IF_ERROR(fwd_->SetDevice(shard));
  const int64_t br = options_.block_rows, kvs = fwd_->kv_width(shard),
                n = cache.length();
  k->assign(n * kvs, 0);
  v->assign(n * kvs, 0);
  for (int64_t p0 = 0; p0 < n; p0 += br) {
    const int64_t rows = std::min(br, n - p0);
    const int64_t block = cache.blocks_[layer][p0 / br];
    const uint16_t* base = pools_[shard] + block * 2 * br * kvs;
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(k->data() + p0 * kvs, base, rows * kvs * 2,
                              cudaMemcpyDeviceToHost),
                   "TpCudaModel::ReadKv: downloading K rows"));
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(v->data() + p0 * kvs, base + br * kvs,
                              rows * kvs * 2, cudaMemcpyDeviceToHost),
                   "TpCudaModel::ReadKv: downloading V rows"));
  }
  return absl::OkStatus();
}

}  // namespace kvd::ops
