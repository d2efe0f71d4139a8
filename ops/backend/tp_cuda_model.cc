#include "ops/backend/tp_cuda_model.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/paged_attention.h"
#include "ops/backend/cuda_model_support.h"
#include "ops/backend/internal/cuda_batch.h"
#include "ops/backend/internal/cuda_layer.h"
#include "ops/backend/internal/cuda_step_plan.h"
#include "ops/backend/internal/device_memory.h"

namespace kvd::ops {
namespace {

namespace kc = ::kvd::kernels::cuda;
using kc::internal::CudaStatus;

using internal::DeviceMatrix;
using internal::DeviceMemory;

}  // namespace

// The weights every shard on one device shares: norms, embedding, output.
struct TpCudaModel::Replicated {
  DeviceMemory mem;
  DeviceMatrix embedding, output;
  const float* output_norm = nullptr;
  std::vector<const float*> attn_norm, ffn_norm;
};

struct TpCudaModel::Shard {
  struct Layer {
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr;
    DeviceMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  int device = 0;
  void* stream = nullptr;  // cudaStream_t, owned by the model
  ShardSlice slice;
  int64_t n_heads = 0, n_kv_heads = 0, qd = 0, kvd = 0, ff = 0;
  const Replicated* rep = nullptr;
  std::vector<Layer> layers;
  DeviceMemory weights;
  uint16_t* pool = nullptr;  // in `weights`
  // Step buffers, grown on demand (as CudaModel's).
  DeviceMemory ws;
  int64_t rows = 0, seqs = 0, ints = 0;
  float *h = nullptr, *x = nullptr, *q = nullptr, *k = nullptr, *v = nullptr,
        *attn = nullptr, *o = nullptr, *gate = nullptr, *up = nullptr,
        *last_x = nullptr, *logits = nullptr;
  int32_t* ints_dev = nullptr;
};

absl::StatusOr<std::unique_ptr<TpCudaModel>> TpCudaModel::Create(
    const Model& model, const TpCudaModelOptions& options) {
  const ModelConfig& c = model.config();
  KVD_RETURN_IF_ERROR(CheckCudaModelSupport(c, model.precision()));
  KVD_RETURN_IF_ERROR(
      internal::CheckPoolOptions("TpCudaModelOptions", options.block_rows,
                                 options.max_blocks, kc::kAttentionChunk));
  KVD_ASSIGN_OR_RETURN(TensorParallelPlan plan,
                       TensorParallelPlan::Make(c, options.degree));
  std::vector<int> devices = options.devices;
  if (devices.empty()) devices.assign(options.degree, options.device);
  if (static_cast<int>(devices.size()) != options.degree) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TpCudaModelOptions: ", devices.size(), " devices for degree ",
        options.degree, "; give one per shard or none"));
  }
  const absl::flat_hash_set<int> distinct(devices.begin(), devices.end());
  std::shared_ptr<AllReduce> all_reduce = options.all_reduce;
  if (all_reduce == nullptr) {
    if (distinct.size() > 1) {
      return absl::InvalidArgumentError(
          "TpCudaModelOptions: shards on several devices need an all-reduce "
          "across them (all_reduce = NewNcclAllReduce(devices))");
    }
    all_reduce = NewSimulatedAllReduce(options.degree);
  }
  if (all_reduce->degree() != options.degree) {
    return absl::InvalidArgumentError(
        absl::StrCat("TpCudaModelOptions: the all-reduce has degree ",
                     all_reduce->degree(), ", the model ", options.degree));
  }

  std::unique_ptr<TpCudaModel> m(new TpCudaModel());
  m->config_ = c;
  m->options_ = options;
  m->options_.devices = devices;
  m->plan_ = std::move(plan);
  m->all_reduce_ = std::move(all_reduce);
  // One stream per device: shards on one device run one after another on it
  // (what the simulated all-reduce needs).
  absl::flat_hash_map<int, void*> stream_of;
  for (int s = 0; s < options.degree; ++s) {
    auto shard = std::make_unique<Shard>();
    shard->device = devices[s];
    shard->weights.device = shard->ws.device = devices[s];
    if (!stream_of.contains(devices[s])) {
      KVD_RETURN_IF_ERROR(
          CudaStatus(cudaSetDevice(devices[s]),
                     absl::StrCat("cudaSetDevice(", devices[s], ")")));
      cudaStream_t stream = nullptr;
      KVD_RETURN_IF_ERROR(CudaStatus(
          cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
          absl::StrCat("creating the stream of device ", devices[s])));
      m->owned_streams_.push_back(stream);
      stream_of[devices[s]] = stream;
    }
    shard->stream = stream_of[devices[s]];
    shard->slice = m->plan_.shard(s);
    shard->n_heads = shard->slice.q_heads.size();
    shard->n_kv_heads = shard->slice.kv_heads.size();
    shard->qd = shard->slice.q_rows.size();
    shard->kvd = shard->slice.kv_rows.size();
    shard->ff = shard->slice.ff.size();
    m->shards_.push_back(std::move(shard));
  }
  KVD_RETURN_IF_ERROR(m->Upload(model));

  const int64_t blocks = internal::PoolBlocks(
      options.max_blocks, c.n_layers, c.context_length, options.block_rows);
  for (auto& shard : m->shards_) {
    KVD_RETURN_IF_ERROR(m->SetDevice(*shard));
    const size_t bytes =
        static_cast<size_t>(blocks) * 2 * options.block_rows * shard->kvd * 2;
    KVD_ASSIGN_OR_RETURN(
        void* pool,
        shard->weights.Alloc(
            bytes, absl::StrCat("the K/V pool of shard ", shard->slice.shard,
                                " (", blocks, " blocks, ", bytes, " bytes)")));
    shard->pool = static_cast<uint16_t*>(pool);
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
  for (size_t i = 0; i < owned_streams_.size(); ++i) {
    cudaStream_t s = static_cast<cudaStream_t>(owned_streams_[i]);
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  shards_.clear();
  replicated_.clear();
}

absl::Status TpCudaModel::SetDevice(const Shard& shard) const {
  return CudaStatus(cudaSetDevice(shard.device),
                    absl::StrCat("cudaSetDevice(", shard.device, ") for shard ",
                                 shard.slice.shard));
}

absl::Status TpCudaModel::Upload(const Model& model) {
  const ModelWeights& w = model.weights();
  const ModelConfig& c = config_;
  for (auto& shard : shards_) {
    KVD_RETURN_IF_ERROR(SetDevice(*shard));
    Replicated* rep = nullptr;
    for (auto& r : replicated_)
      if (r->mem.device == shard->device) rep = r.get();
    if (rep == nullptr) {
      auto r = std::make_unique<Replicated>();
      r->mem.device = shard->device;
      KVD_ASSIGN_OR_RETURN(r->embedding,
                           r->mem.Matrix(w.token_embedding, "token_embd"));
      if (w.output.empty()) {
        r->output = r->embedding;  // tied
      } else {
        KVD_ASSIGN_OR_RETURN(r->output, r->mem.Matrix(w.output, "output"));
      }
      KVD_ASSIGN_OR_RETURN(r->output_norm,
                           r->mem.Vector(w.output_norm, "output_norm"));
      for (size_t l = 0; l < w.layers.size(); ++l) {
        const std::string p = absl::StrCat("blk.", l, ".");
        KVD_ASSIGN_OR_RETURN(
            const float* an,
            r->mem.Vector(w.layers[l].attn_norm, p + "attn_norm"));
        KVD_ASSIGN_OR_RETURN(
            const float* fn,
            r->mem.Vector(w.layers[l].ffn_norm, p + "ffn_norm"));
        r->attn_norm.push_back(an);
        r->ffn_norm.push_back(fn);
      }
      rep = r.get();
      replicated_.push_back(std::move(r));
    }
    shard->rep = rep;
    const ShardSlice& sl = shard->slice;
    const IndexRange all_d{0, c.d_model};
    DeviceMemory& mem = shard->weights;
    for (size_t l = 0; l < w.layers.size(); ++l) {
      const LayerWeights& lw = w.layers[l];
      Shard::Layer d;
      const std::string p = absl::StrCat("shard ", sl.shard, " blk.", l, ".");
      KVD_ASSIGN_OR_RETURN(d.bq,
                           mem.Vector(lw.bq, sl.q_rows, p + "attn_q.bias"));
      KVD_ASSIGN_OR_RETURN(d.bk,
                           mem.Vector(lw.bk, sl.kv_rows, p + "attn_k.bias"));
      KVD_ASSIGN_OR_RETURN(d.bv,
                           mem.Vector(lw.bv, sl.kv_rows, p + "attn_v.bias"));
      KVD_ASSIGN_OR_RETURN(d.wq,
                           mem.Matrix(lw.wq, sl.q_rows, all_d, p + "attn_q"));
      KVD_ASSIGN_OR_RETURN(d.wk,
                           mem.Matrix(lw.wk, sl.kv_rows, all_d, p + "attn_k"));
      KVD_ASSIGN_OR_RETURN(d.wv,
                           mem.Matrix(lw.wv, sl.kv_rows, all_d, p + "attn_v"));
      KVD_ASSIGN_OR_RETURN(
          d.wo, mem.Matrix(lw.wo, all_d, sl.q_rows, p + "attn_output"));
      KVD_ASSIGN_OR_RETURN(d.w_gate,
                           mem.Matrix(lw.w_gate, sl.ff, all_d, p + "ffn_gate"));
      KVD_ASSIGN_OR_RETURN(d.w_up,
                           mem.Matrix(lw.w_up, sl.ff, all_d, p + "ffn_up"));
      KVD_ASSIGN_OR_RETURN(d.w_down,
                           mem.Matrix(lw.w_down, all_d, sl.ff, p + "ffn_down"));
      shard->layers.push_back(d);
    }
    // cudaMemcpy from pageable memory may return before its DMA lands, and
    // the non-blocking streams do not wait for the legacy stream.
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaDeviceSynchronize(),
                   absl::StrCat("uploading shard ", sl.shard, "'s weights")));
  }
  return absl::OkStatus();
}

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

absl::Status TpCudaModel::EnsureWorkspace(int64_t rows, int64_t n_seqs,
                                          int64_t ints) {
  const ModelConfig& c = config_;
  for (auto& sp : shards_) {
    Shard& w = *sp;
    if (rows <= w.rows && n_seqs <= w.seqs && ints <= w.ints) continue;
    KVD_RETURN_IF_ERROR(SetDevice(w));
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(w.stream)),
                   "waiting for the stream before growing the step buffers"));
    w.ws.Free();
    w.rows = std::max(rows, 2 * w.rows);
    w.seqs = std::max(n_seqs, 2 * w.seqs);
    w.ints = std::max(ints, 2 * w.ints);
    const int64_t m = w.rows;
    const char* what = "the tensor-parallel CUDA model's step buffers";
    KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.h, m * c.d_model, what));
    KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.x, m * c.d_model, what));
    KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.q, m * w.qd, what));
    KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.k, m * w.kvd, what));
    KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.v, m * w.kvd, what));
    KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.attn, m * w.qd, what));
    KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.o, m * c.d_model, what));
    KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.gate, m * w.ff, what));
    KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.up, m * w.ff, what));
    KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.last_x, w.seqs * c.d_model, what));
    KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.logits, w.seqs * c.vocab_size, what));
    KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.ints_dev, w.ints, what));
  }
  return absl::OkStatus();
}

absl::Status TpCudaModel::ReduceOutputs(int64_t count) {
  std::vector<float*> buffers;
  std::vector<void*> streams;
  for (auto& s : shards_) {
    buffers.push_back(s->o);
    streams.push_back(s->stream);
  }
  // Same device for the simulation; NCCL's group call handles several.
  KVD_RETURN_IF_ERROR(SetDevice(*shards_[0]));
  return all_reduce_->SumInPlace(buffers, count, streams);
}

absl::Status TpCudaModel::RunStep(const internal::StepPlan& plan,
                                  std::vector<float>* logits,
                                  std::vector<std::vector<float>>* residuals) {
  const ModelConfig& c = config_;
  const int64_t d = c.d_model;
  const int64_t m = plan.rows, n_seqs = plan.n_seqs,
                table_stride = plan.table_stride;
  const int64_t n_ints = plan.ints.size();
  // A shard's layer, widths and step buffers as internal/cuda_layer.h takes
  // them.
  auto layer_weights = [](const Shard& w, int64_t l) {
    const Shard::Layer& lw = w.layers[l];
    return internal::CudaLayerWeights{w.rep->attn_norm[l],
                                      w.rep->ffn_norm[l],
                                      lw.bq,
                                      lw.bk,
                                      lw.bv,
                                      lw.wq.view(),
                                      lw.wk.view(),
                                      lw.wv.view(),
                                      lw.wo.view(),
                                      lw.w_gate.view(),
                                      lw.w_up.view(),
                                      lw.w_down.view()};
  };
  auto dims = [](const Shard& w) {
    return internal::CudaShardDims{w.n_heads, w.n_kv_heads, w.qd, w.kvd, w.ff};
  };
  auto buffers = [](const Shard& w) {
    return internal::CudaStepBuffers{w.h,    w.x, w.q,    w.k, w.v,
                                     w.attn, w.o, w.gate, w.up};
  };
  for (auto& sp : shards_) {
    Shard& w = *sp;
    KVD_RETURN_IF_ERROR(SetDevice(w));
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(w.ints_dev, plan.ints.data(), n_ints * 4,
                                   cudaMemcpyHostToDevice,
                                   static_cast<cudaStream_t>(w.stream)),
                   "uploading the step's tokens, positions and block tables"));
    KVD_RETURN_IF_ERROR(kc::EmbedRows(
        w.rep->embedding.data, d, w.ints_dev + plan.tokens_offset(), m, d,
        c.embedding_scale, /*round_bf16=*/true, w.h, d, w.stream));
  }
  if (residuals != nullptr) residuals->assign(c.n_layers, {});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (residuals != nullptr) {
      Shard& w0 = *shards_[0];
      KVD_RETURN_IF_ERROR(SetDevice(w0));
      (*residuals)[l].resize(m * d);
      KVD_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpyAsync((*residuals)[l].data(), w0.h, m * d * sizeof(float),
                          cudaMemcpyDeviceToHost,
                          static_cast<cudaStream_t>(w0.stream)),
          "downloading a layer's residual"));
      KVD_RETURN_IF_ERROR(CudaStatus(
          cudaStreamSynchronize(static_cast<cudaStream_t>(w0.stream)),
          "downloading a layer's residual"));
    }
    // Attention: each shard's heads, then W_o's partial over them.
    for (auto& sp : shards_) {
      Shard& w = *sp;
      KVD_RETURN_IF_ERROR(SetDevice(w));
      internal::CudaStepRows rows;
      rows.m = m;
      rows.positions = w.ints_dev + plan.positions_offset();
      rows.row_seq = w.ints_dev + plan.row_seq_offset();
      rows.table = w.ints_dev + plan.table_offset(l);
      rows.table_stride = table_stride;
      rows.block_rows = options_.block_rows;
      rows.pool = w.pool;
      KVD_RETURN_IF_ERROR(internal::AttentionPartial(
          c, l, layer_weights(w, l), dims(w), rows, buffers(w), w.stream));
    }
    KVD_RETURN_IF_ERROR(ReduceOutputs(m * d));
    // MLP: each shard's columns, then W_down's partial over them.
    for (auto& sp : shards_) {
      Shard& w = *sp;
      KVD_RETURN_IF_ERROR(SetDevice(w));
      KVD_RETURN_IF_ERROR(kc::AddRows(w.h, d, w.o, d, m, d, false, w.stream));
      KVD_RETURN_IF_ERROR(internal::MlpPartial(c, layer_weights(w, l), dims(w),
                                               m, buffers(w), w.stream));
    }
    KVD_RETURN_IF_ERROR(ReduceOutputs(m * d));
    for (auto& sp : shards_) {
      Shard& w = *sp;
      KVD_RETURN_IF_ERROR(SetDevice(w));
      // The residual leaves the layer in bf16, as the CPU's bf16 mode.
      KVD_RETURN_IF_ERROR(kc::AddRows(w.h, d, w.o, d, m, d, true, w.stream));
    }
  }
  // The LM head on shard 0 (its residual equals every other shard's).
  Shard& w = *shards_[0];
  KVD_RETURN_IF_ERROR(SetDevice(w));
  void* s = w.stream;
  KVD_RETURN_IF_ERROR(kc::GatherRows(
      w.h, d, w.ints_dev + plan.last_row_offset(), n_seqs, d, w.last_x, d, s));
  KVD_RETURN_IF_ERROR(kc::RmsNorm(w.last_x, d, w.rep->output_norm, c.rms_eps,
                                  n_seqs, d, w.last_x, d, s));
  KVD_RETURN_IF_ERROR(kc::Gemm({w.last_x, kc::ActType::kF32, n_seqs, d},
                               w.rep->output.view(), w.logits, c.vocab_size,
                               s));
  logits->resize(n_seqs * c.vocab_size);
  KVD_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(logits->data(), w.logits, logits->size() * sizeof(float),
                      cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(s)),
      "downloading logits"));
  for (auto& sp : shards_) {
    KVD_RETURN_IF_ERROR(SetDevice(*sp));
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(sp->stream)),
                   "running the tensor-parallel forward step"));
  }
  return absl::OkStatus();
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
  absl::Status st = EnsureWorkspace(m, n_seqs, plan.ints.size());
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
  if (cache.owner_ != this || shard < 0 || shard >= plan_.degree() ||
      layer < 0 || layer >= config_.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TpCudaModel::ReadKv: need a cache of this model, shard in [0, ",
        plan_.degree(), ") and layer in [0, ", config_.n_layers,
        "); got shard ", shard, ", layer ", layer));
  }
  absl::MutexLock lock(&forward_mu_);
  const Shard& w = *shards_[shard];
  KVD_RETURN_IF_ERROR(SetDevice(w));
  const int64_t br = options_.block_rows, kvs = w.kvd, n = cache.length();
  k->assign(n * kvs, 0);
  v->assign(n * kvs, 0);
  for (int64_t p0 = 0; p0 < n; p0 += br) {
    const int64_t rows = std::min(br, n - p0);
    const int64_t block = cache.blocks_[layer][p0 / br];
    const uint16_t* base = w.pool + block * 2 * br * kvs;
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
