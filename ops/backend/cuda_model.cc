#include "ops/backend/cuda_model.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/paged_attention.h"
#include "ops/backend/cuda_model_support.h"
#include "ops/backend/internal/cuda_batch.h"
#include "ops/backend/internal/cuda_layer.h"
#include "ops/backend/internal/cuda_step_plan.h"

namespace kvd::ops {
namespace {

namespace kc = ::kvd::kernels::cuda;
using kc::internal::CudaStatus;

// A bf16 matrix on the device in the GEMM's layout (rows x cols, dense).
struct DeviceMatrix {
  const uint16_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  kc::Bf16Weights view() const { return {data, rows, cols, cols}; }
};

}  // namespace

struct CudaModel::DeviceWeights {
  struct Layer {
    const float* attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr;
    DeviceMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  DeviceMatrix embedding, output;
  const float* output_norm = nullptr;
  std::vector<Layer> layers;
  std::vector<void*> allocations;

  ~DeviceWeights() {
    for (void* p : allocations) cudaFree(p);
  }
  absl::StatusOr<void*> Alloc(size_t bytes, absl::string_view what) {
    void* p = nullptr;
    KVD_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, std::max<size_t>(bytes, 16)),
                                   absl::StrCat("cudaMalloc for ", what)));
    allocations.push_back(p);
    return p;
  }
  absl::StatusOr<const float*> Vector(const std::vector<float>& v,
                                      absl::string_view what) {
    if (v.empty()) return nullptr;
    KVD_ASSIGN_OR_RETURN(void* p, Alloc(v.size() * 4, what));
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyDefault),
                   absl::StrCat("uploading ", what)));
    return static_cast<const float*>(p);
  }
  absl::StatusOr<DeviceMatrix> Matrix(const ops::Matrix& m,
                                      absl::string_view what) {
    const kernels::cpu::WeightView v = m.view();
    if (v.type != kernels::cpu::WeightType::kBf16) {
      return absl::UnimplementedError(absl::StrCat(
          "CUDA model: weight ", what,
          " is not bf16 in the loaded model; load it with precision bf16"));
    }
    const int64_t ld = v.stride();
    KVD_ASSIGN_OR_RETURN(void* p, Alloc(v.rows * v.cols * 2, what));
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy2D(p, v.cols * 2, v.data, ld * 2, v.cols * 2,
                                v.rows, cudaMemcpyDefault),
                   absl::StrCat("uploading ", what)));
    return DeviceMatrix{static_cast<const uint16_t*>(p), v.rows, v.cols};
  }
};

// Step buffers, grown on demand (never shrunk) so a steady decode loop does
// not allocate.
struct CudaModel::Workspace {
  int64_t rows = 0, seqs = 0, ints = 0;
  float *h = nullptr, *x = nullptr, *q = nullptr, *k = nullptr, *v = nullptr,
        *attn = nullptr, *o = nullptr, *gate = nullptr, *up = nullptr;
  float *last_x = nullptr, *logits = nullptr;
  int32_t* ints_dev = nullptr;
  std::vector<void*> allocations;

  void Free() {
    for (void* p : allocations) cudaFree(p);
    allocations.clear();
  }
  ~Workspace() { Free(); }
  template <typename T>
  absl::Status Alloc(T** p, int64_t n) {
    void* raw = nullptr;
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&raw, std::max<int64_t>(n, 1) * sizeof(T)),
                   "cudaMalloc for the CUDA model's step buffers"));
    allocations.push_back(raw);
    *p = static_cast<T*>(raw);
    return absl::OkStatus();
  }
};

CudaKvCache::CudaKvCache(CudaKvCache&& other) noexcept
    : model_(std::exchange(other.model_, nullptr)),
      length_(std::exchange(other.length_, 0)),
      blocks_(std::move(other.blocks_)) {
  other.blocks_.clear();
}

CudaKvCache& CudaKvCache::operator=(CudaKvCache&& other) noexcept {
  if (this != &other) {
    Release();
    model_ = std::exchange(other.model_, nullptr);
    length_ = std::exchange(other.length_, 0);
    blocks_ = std::move(other.blocks_);
    other.blocks_.clear();
  }
  return *this;
}

CudaKvCache::~CudaKvCache() { Release(); }

void CudaKvCache::Release() {
  if (model_ != nullptr) model_->FreeBlocks(&blocks_);
  blocks_.clear();
  length_ = 0;
}

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
  KVD_RETURN_IF_ERROR(
      CudaStatus(cudaSetDevice(options.device),
                 absl::StrCat("cudaSetDevice(", options.device, ")")));
  cudaStream_t stream = nullptr;
  KVD_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                 "creating the CUDA model's stream"));
  m->stream_ = stream;
  m->ws_ = std::make_unique<Workspace>();
  KVD_RETURN_IF_ERROR(m->Upload(model));
  // cudaMemcpy from pageable memory may return before its DMA lands, and the
  // non-blocking stream does not wait for the legacy stream.
  KVD_RETURN_IF_ERROR(
      CudaStatus(cudaDeviceSynchronize(), "uploading the model's weights"));

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
  if (stream_ != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
  ws_.reset();
  weights_.reset();
  if (pool_ != nullptr) cudaFree(pool_);
}

absl::Status CudaModel::Upload(const Model& model) {
  const ModelWeights& w = model.weights();
  auto dw = std::make_unique<DeviceWeights>();
  KVD_ASSIGN_OR_RETURN(dw->embedding,
                       dw->Matrix(w.token_embedding, "token_embd"));
  if (w.output.empty()) {
    dw->output = dw->embedding;  // tied
  } else {
    KVD_ASSIGN_OR_RETURN(dw->output, dw->Matrix(w.output, "output"));
  }
  KVD_ASSIGN_OR_RETURN(dw->output_norm,
                       dw->Vector(w.output_norm, "output_norm"));
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& lw = w.layers[l];
    DeviceWeights::Layer d;
    const std::string p = absl::StrCat("blk.", l, ".");
    KVD_ASSIGN_OR_RETURN(d.attn_norm,
                         dw->Vector(lw.attn_norm, p + "attn_norm"));
    KVD_ASSIGN_OR_RETURN(d.ffn_norm, dw->Vector(lw.ffn_norm, p + "ffn_norm"));
    KVD_ASSIGN_OR_RETURN(d.bq, dw->Vector(lw.bq, p + "attn_q.bias"));
    KVD_ASSIGN_OR_RETURN(d.bk, dw->Vector(lw.bk, p + "attn_k.bias"));
    KVD_ASSIGN_OR_RETURN(d.bv, dw->Vector(lw.bv, p + "attn_v.bias"));
    KVD_ASSIGN_OR_RETURN(d.wq, dw->Matrix(lw.wq, p + "attn_q"));
    KVD_ASSIGN_OR_RETURN(d.wk, dw->Matrix(lw.wk, p + "attn_k"));
    KVD_ASSIGN_OR_RETURN(d.wv, dw->Matrix(lw.wv, p + "attn_v"));
    KVD_ASSIGN_OR_RETURN(d.wo, dw->Matrix(lw.wo, p + "attn_output"));
    KVD_ASSIGN_OR_RETURN(d.w_gate, dw->Matrix(lw.w_gate, p + "ffn_gate"));
    KVD_ASSIGN_OR_RETURN(d.w_up, dw->Matrix(lw.w_up, p + "ffn_up"));
    KVD_ASSIGN_OR_RETURN(d.w_down, dw->Matrix(lw.w_down, p + "ffn_down"));
    dw->layers.push_back(d);
  }
  weights_ = std::move(dw);
  return absl::OkStatus();
}

int64_t CudaModel::free_blocks() const {
  absl::MutexLock lock(&blocks_mu_);
  return free_blocks_.size();
}

absl::StatusOr<CudaKvCache> CudaModel::NewCache() {
  CudaKvCache cache(this);
  cache.blocks_.resize(config_.n_layers);
  return cache;
}

void CudaModel::FreeBlocks(std::vector<std::vector<int32_t>>* blocks) {
  absl::MutexLock lock(&blocks_mu_);
  for (auto& layer : *blocks) {
    free_blocks_.insert(free_blocks_.end(), layer.rbegin(), layer.rend());
    layer.clear();
  }
}

absl::Status CudaModel::EnsureWorkspace(int64_t rows, int64_t n_seqs,
                                        int64_t ints) {
  Workspace& w = *ws_;
  if (rows <= w.rows && n_seqs <= w.seqs && ints <= w.ints)
    return absl::OkStatus();
  KVD_RETURN_IF_ERROR(
      CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
                 "waiting for the stream before growing the step buffers"));
  w.Free();
  w.rows = std::max(rows, 2 * w.rows);
  w.seqs = std::max(n_seqs, 2 * w.seqs);
  w.ints = std::max(ints, 2 * w.ints);
  const ModelConfig& c = config_;
  const int64_t m = w.rows;
  KVD_RETURN_IF_ERROR(w.Alloc(&w.h, m * c.d_model));
  KVD_RETURN_IF_ERROR(w.Alloc(&w.x, m * c.d_model));
  KVD_RETURN_IF_ERROR(w.Alloc(&w.q, m * c.q_dim()));
  KVD_RETURN_IF_ERROR(w.Alloc(&w.k, m * c.kv_dim()));
  KVD_RETURN_IF_ERROR(w.Alloc(&w.v, m * c.kv_dim()));
  KVD_RETURN_IF_ERROR(w.Alloc(&w.attn, m * c.q_dim()));
  KVD_RETURN_IF_ERROR(w.Alloc(&w.o, m * c.d_model));
  KVD_RETURN_IF_ERROR(w.Alloc(&w.gate, m * c.d_ff));
  KVD_RETURN_IF_ERROR(w.Alloc(&w.up, m * c.d_ff));
  KVD_RETURN_IF_ERROR(w.Alloc(&w.last_x, w.seqs * c.d_model));
  KVD_RETURN_IF_ERROR(w.Alloc(&w.logits, w.seqs * c.vocab_size));
  KVD_RETURN_IF_ERROR(w.Alloc(&w.ints_dev, w.ints));
  return absl::OkStatus();
}

absl::Status CudaModel::RunLayers(const internal::StepPlan& plan) {
  const ModelConfig& c = config_;
  Workspace& w = *ws_;
  void* s = stream_;
  const int64_t d = c.d_model;
  const int64_t m = plan.rows;
  const internal::CudaShardDims dims{c.n_heads, c.n_kv_heads, c.q_dim(),
                                     c.kv_dim(), c.d_ff};
  const internal::CudaStepBuffers buf{w.h,    w.x, w.q,    w.k, w.v,
                                      w.attn, w.o, w.gate, w.up};
  internal::CudaStepRows rows;
  rows.m = m;
  rows.positions = w.ints_dev + plan.positions_offset();
  rows.row_seq = w.ints_dev + plan.row_seq_offset();
  rows.table_stride = plan.table_stride;
  rows.block_rows = options_.block_rows;
  rows.pool = pool_;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const DeviceWeights::Layer& lw = weights_->layers[l];
    const internal::CudaLayerWeights weights{
        lw.attn_norm, lw.ffn_norm,      lw.bq,          lw.bk,
        lw.bv,        lw.wq.view(),     lw.wk.view(),   lw.wv.view(),
        lw.wo.view(), lw.w_gate.view(), lw.w_up.view(), lw.w_down.view()};
    rows.table = w.ints_dev + plan.table_offset(l);
    KVD_RETURN_IF_ERROR(
        internal::AttentionPartial(c, l, weights, dims, rows, buf, s));
    KVD_RETURN_IF_ERROR(kc::AddRows(w.h, d, w.o, d, m, d, false, s));
    KVD_RETURN_IF_ERROR(internal::MlpPartial(c, weights, dims, m, buf, s));
    // The residual leaves the layer in bf16, as the CPU's bf16 mode.
    KVD_RETURN_IF_ERROR(kc::AddRows(w.h, d, w.o, d, m, d, true, s));
  }
  return absl::OkStatus();
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
    const bool ours = cache != nullptr && cache->model_ == this;
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
  const int64_t n_ints = plan.ints.size();
  absl::Status st = [&]() -> absl::Status {
    KVD_RETURN_IF_ERROR(EnsureWorkspace(m, n_seqs, n_ints));
    Workspace& w = *ws_;
    cudaStream_t s = static_cast<cudaStream_t>(stream_);
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(w.ints_dev, plan.ints.data(), n_ints * 4,
                                   cudaMemcpyHostToDevice, s),
                   "uploading the step's tokens, positions and block tables"));
    KVD_RETURN_IF_ERROR(kc::EmbedRows(weights_->embedding.data, c.d_model,
                                      w.ints_dev + plan.tokens_offset(), m,
                                      c.d_model, c.embedding_scale,
                                      /*round_bf16=*/true, w.h, c.d_model, s));
    KVD_RETURN_IF_ERROR(RunLayers(plan));
    KVD_RETURN_IF_ERROR(
        kc::GatherRows(w.h, c.d_model, w.ints_dev + plan.last_row_offset(),
                       n_seqs, c.d_model, w.last_x, c.d_model, s));
    KVD_RETURN_IF_ERROR(kc::RmsNorm(w.last_x, c.d_model, weights_->output_norm,
                                    c.rms_eps, n_seqs, c.d_model, w.last_x,
                                    c.d_model, s));
    KVD_RETURN_IF_ERROR(
        kc::Gemm({w.last_x, kc::ActType::kF32, n_seqs, c.d_model},
                 weights_->output.view(), w.logits, c.vocab_size, s));
    logits->resize(n_seqs * c.vocab_size);
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(logits->data(), w.logits,
                                   logits->size() * sizeof(float),
                                   cudaMemcpyDeviceToHost, s),
                   "downloading logits"));
    return CudaStatus(cudaStreamSynchronize(s), "running the forward step");
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
