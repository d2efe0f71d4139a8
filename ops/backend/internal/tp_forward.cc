#include "ops/backend/internal/tp_forward.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/internal/cuda_check.h"
#include "kernels/cuda/model_ops.h"
#include "ops/backend/cuda_model_support.h"
#include "ops/backend/internal/cuda_layer.h"
#include "ops/backend/internal/device_memory.h"

namespace kvd::ops::internal {
namespace {

namespace kc = ::kvd::kernels::cuda;
using kc::internal::CudaStatus;

}  // namespace

// The weights every shard on one device shares: norms, embedding, output.
struct TpForward::Replicated {
  DeviceMemory mem;
  DeviceMatrix embedding, output;
  const float* output_norm = nullptr;
  std::vector<const float*> attn_norm, ffn_norm;
};

struct TpForward::Shard {
  struct Layer {
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr;
    DeviceMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  int device = 0;
  void* stream = nullptr;  // cudaStream_t, owned by the TpForward
  ShardSlice slice;
  CudaShardDims dims;
  const Replicated* rep = nullptr;
  std::vector<Layer> layers;
  DeviceMemory weights;
  // Step buffers, grown on demand (as CudaForward's).
  DeviceMemory ws;
  int64_t rows = 0, gather = 0, ints = 0;
  float *h = nullptr, *x = nullptr, *q = nullptr, *k = nullptr, *v = nullptr,
        *attn = nullptr, *o = nullptr, *gate = nullptr, *up = nullptr,
        *gathered = nullptr, *logits = nullptr;
  int32_t* ints_dev = nullptr;
  // Cold-chunk recompute scratch, grown on demand (as CudaForward's).
  DeviceMemory cold_ws_mem, cold_res_mem;
  void* cold_ws = nullptr;
  int64_t cold_ws_bytes = 0;
  uint16_t* cold_res = nullptr;
  int64_t cold_res_values = 0;

  CudaLayerWeights layer(int64_t l) const {
    const Layer& lw = layers[l];
    return {rep->attn_norm[l],
            rep->ffn_norm[l],
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
  }
  CudaStepBuffers buffers() const { return {h, x, q, k, v, attn, o, gate, up}; }
  CudaStepRows step_rows(const StepPlan& plan, const CudaPool& pool, int64_t l,
                         const CudaColdRows* cold = nullptr) const {
    CudaStepRows r;
    r.m = plan.rows;
    r.positions = ints_dev + plan.positions_offset();
    r.row_seq = ints_dev + plan.row_seq_offset();
    r.table = ints_dev + plan.table_offset(l);
    r.table_stride = plan.table_stride;
    r.block_rows = pool.block_rows;
    r.pool = pool.base;
    r.cold = cold;
    return r;
  }
};

absl::StatusOr<std::unique_ptr<TpForward>> TpForward::Create(
    const Model& model, const TpForwardOptions& options,
    absl::string_view who) {
  const ModelConfig& c = model.config();
  KVD_RETURN_IF_ERROR(CheckCudaModelSupport(c, model.precision()));
  KVD_ASSIGN_OR_RETURN(TensorParallelPlan plan,
                       TensorParallelPlan::Make(c, options.degree));
  std::vector<int> devices = options.devices;
  if (devices.empty()) devices.assign(options.degree, options.device);
  if (static_cast<int>(devices.size()) != options.degree) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": ", devices.size(), " devices for degree ",
                     options.degree, "; give one per shard or none"));
  }
  for (int d : devices) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": device ordinal ", d, " is negative"));
    }
  }
  const absl::flat_hash_set<int> distinct(devices.begin(), devices.end());
  std::shared_ptr<AllReduce> all_reduce = options.all_reduce;
  if (all_reduce == nullptr) {
    if (distinct.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          who,
          ": shards on several devices need an all-reduce across them "
          "(NewNcclAllReduce(devices))"));
    }
    all_reduce = NewSimulatedAllReduce(options.degree);
  }
  if (all_reduce->degree() != options.degree) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": the all-reduce has degree ", all_reduce->degree(),
                     ", the model ", options.degree));
  }
  // Rank s sums shard s's buffer on its stream: it must run on its device.
  const std::vector<int> ranks = all_reduce->devices();
  if (!ranks.empty() && ranks != devices) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": the all-reduce's ranks run on devices [",
        absl::StrJoin(ranks, ", "), "], the shards on [",
        absl::StrJoin(devices, ", "), "]; make it over the shards' devices"));
  }

  std::unique_ptr<TpForward> f(new TpForward());
  f->config_ = c;
  f->plan_ = std::move(plan);
  f->all_reduce_ = std::move(all_reduce);
  // One stream per device: shards on one device run one after another on it
  // (what the simulated all-reduce needs).
  absl::flat_hash_map<int, void*> stream_of;
  for (int s = 0; s < options.degree; ++s) {
    auto shard = std::make_unique<Shard>();
    shard->device = devices[s];
    shard->weights.device = shard->ws.device = devices[s];
    shard->cold_ws_mem.device = shard->cold_res_mem.device = devices[s];
    if (!stream_of.contains(devices[s])) {
      KVD_RETURN_IF_ERROR(
          CudaStatus(cudaSetDevice(devices[s]),
                     absl::StrCat("cudaSetDevice(", devices[s], ")")));
      cudaStream_t stream = nullptr;
      KVD_RETURN_IF_ERROR(CudaStatus(
          cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
          absl::StrCat("creating the stream of device ", devices[s])));
      f->owned_streams_.push_back(stream);
      stream_of[devices[s]] = stream;
    }
    shard->stream = stream_of[devices[s]];
    shard->slice = f->plan_.shard(s);
    shard->dims = {static_cast<int64_t>(shard->slice.q_heads.size()),
                   static_cast<int64_t>(shard->slice.kv_heads.size()),
                   static_cast<int64_t>(shard->slice.q_rows.size()),
                   static_cast<int64_t>(shard->slice.kv_rows.size()),
                   static_cast<int64_t>(shard->slice.ff.size())};
    f->shards_.push_back(std::move(shard));
  }
  KVD_RETURN_IF_ERROR(f->Upload(model));
  return f;
}

TpForward::~TpForward() {
  for (void* p : owned_streams_) {
    cudaStream_t s = static_cast<cudaStream_t>(p);
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  shards_.clear();
  replicated_.clear();
}

int TpForward::device(int shard) const { return shards_[shard]->device; }

int64_t TpForward::kv_width(int shard) const {
  return shards_[shard]->dims.kvd;
}

absl::Status TpForward::SetDevice(int shard) const {
  const Shard& w = *shards_[shard];
  return CudaStatus(
      cudaSetDevice(w.device),
      absl::StrCat("cudaSetDevice(", w.device, ") for shard ", shard));
}

absl::Status TpForward::Upload(const Model& model) {
  const ModelWeights& w = model.weights();
  const ModelConfig& c = config_;
  for (int s = 0; s < degree(); ++s) {
    Shard& shard = *shards_[s];
    KVD_RETURN_IF_ERROR(SetDevice(s));
    Replicated* rep = nullptr;
    for (auto& r : replicated_)
      if (r->mem.device == shard.device) rep = r.get();
    if (rep == nullptr) {
      auto r = std::make_unique<Replicated>();
      r->mem.device = shard.device;
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
    shard.rep = rep;
    const ShardSlice& sl = shard.slice;
    const IndexRange all_d{0, c.d_model};
    DeviceMemory& mem = shard.weights;
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
      shard.layers.push_back(d);
    }
    // cudaMemcpy from pageable memory may return before its DMA lands, and
    // the non-blocking streams do not wait for the legacy stream.
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaDeviceSynchronize(),
                   absl::StrCat("uploading shard ", sl.shard, "'s weights")));
  }
  return absl::OkStatus();
}

absl::Status TpForward::EnsureWorkspace(int64_t rows, int64_t gather_rows,
                                        int64_t ints) {
  const ModelConfig& c = config_;
  // Each size grows (doubling, to amortise) only when it is short itself,
  // as CudaForward's: the block tables grow with the context and must not
  // drag the d_ff-wide row buffers along.
  auto grown = [](int64_t want, int64_t have) {
    return want <= have ? have : std::max(want, 2 * have);
  };
  for (int s = 0; s < degree(); ++s) {
    Shard& w = *shards_[s];
    if (rows <= w.rows && gather_rows <= w.gather && ints <= w.ints) continue;
    KVD_RETURN_IF_ERROR(SetDevice(s));
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(w.stream)),
                   "waiting for the stream before growing the step buffers"));
    const int64_t m = grown(rows, w.rows), g = grown(gather_rows, w.gather),
                  n_ints = grown(ints, w.ints);
    w.ws.Free();
    w.rows = w.gather = w.ints = 0;
    const CudaShardDims& dims = w.dims;
    const char* what = "the tensor-parallel CUDA model's step buffers";
    absl::Status st = [&]() -> absl::Status {
      KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.h, m * c.d_model, what));
      KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.x, m * c.d_model, what));
      KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.q, m * dims.qd, what));
      KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.k, m * dims.kvd, what));
      KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.v, m * dims.kvd, what));
      KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.attn, m * dims.qd, what));
      KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.o, m * c.d_model, what));
      KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.gate, m * dims.ff, what));
      KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.up, m * dims.ff, what));
      KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.gathered, g * c.d_model, what));
      KVD_RETURN_IF_ERROR(w.ws.Alloc(&w.logits, g * c.vocab_size, what));
      return w.ws.Alloc(&w.ints_dev, n_ints, what);
    }();
    if (!st.ok()) {
      // Nothing half-grown: the next step starts from empty buffers.
      w.ws.Free();
      return st;
    }
    w.rows = m;
    w.gather = g;
    w.ints = n_ints;
  }
  // The all-reduce's scratch for `rows` rows of d_model partials, so no
  // step allocates once it has changed a cache.
  std::vector<void*> streams;
  for (auto& sp : shards_) streams.push_back(sp->stream);
  KVD_RETURN_IF_ERROR(SetDevice(0));
  return all_reduce_->Reserve(rows * c.d_model, streams);
}

absl::StatusOr<float*> TpForward::PinnedFloats(int64_t floats) {
  return pinned_.Get(floats, [this] {
    return Sync("waiting for the streams before growing the pinned buffer");
  });
}

int64_t TpForward::n_heads(int shard) const {
  return shards_[shard]->dims.n_heads;
}

int64_t TpForward::n_kv_heads(int shard) const {
  return shards_[shard]->dims.n_kv_heads;
}

absl::Status TpForward::EnsureColdBuffers(int shard, int64_t bytes,
                                          int64_t residual_values) {
  Shard& w = *shards_[shard];
  if (bytes <= w.cold_ws_bytes && residual_values <= w.cold_res_values)
    return absl::OkStatus();
  KVD_RETURN_IF_ERROR(SetDevice(shard));
  KVD_RETURN_IF_ERROR(
      CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(w.stream)),
                 "waiting for the stream before growing the cold K/V scratch"));
  if (bytes > w.cold_ws_bytes) {
    const int64_t n = std::max(bytes, 2 * w.cold_ws_bytes);
    w.cold_ws_mem.Free();
    w.cold_ws = nullptr;
    w.cold_ws_bytes = 0;
    KVD_ASSIGN_OR_RETURN(
        w.cold_ws,
        w.cold_ws_mem.Alloc(n, "attention over recomputed cold K/V"));
    w.cold_ws_bytes = n;
  }
  if (residual_values > w.cold_res_values) {
    const int64_t n = std::max(residual_values, 2 * w.cold_res_values);
    w.cold_res_mem.Free();
    w.cold_res = nullptr;
    w.cold_res_values = 0;
    KVD_RETURN_IF_ERROR(
        w.cold_res_mem.Alloc(&w.cold_res, n, "the cold positions' residuals"));
    w.cold_res_values = n;
  }
  return absl::OkStatus();
}

void* TpForward::cold_workspace(int shard) const {
  return shards_[shard]->cold_ws;
}

int64_t TpForward::cold_workspace_bytes(int shard) const {
  return shards_[shard]->cold_ws_bytes;
}

uint16_t* TpForward::cold_residuals(int shard) const {
  return shards_[shard]->cold_res;
}

absl::Status TpForward::UploadBf16(int shard, uint16_t* device,
                                   const uint16_t* host, int64_t n) {
  KVD_RETURN_IF_ERROR(SetDevice(shard));
  return CudaStatus(
      cudaMemcpyAsync(device, host, n * sizeof(uint16_t),
                      cudaMemcpyHostToDevice,
                      static_cast<cudaStream_t>(shards_[shard]->stream)),
      "uploading cold residuals");
}

absl::Status TpForward::UploadPlan(const StepPlan& plan) {
  for (int s = 0; s < degree(); ++s) {
    Shard& w = *shards_[s];
    KVD_RETURN_IF_ERROR(SetDevice(s));
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(w.ints_dev, plan.ints.data(),
                                   plan.ints.size() * 4, cudaMemcpyHostToDevice,
                                   static_cast<cudaStream_t>(w.stream)),
                   "uploading the step's tokens, positions and block tables"));
  }
  return absl::OkStatus();
}

absl::Status TpForward::Embed(const StepPlan& plan) {
  const ModelConfig& c = config_;
  const int64_t d = c.d_model;
  for (int s = 0; s < degree(); ++s) {
    Shard& w = *shards_[s];
    KVD_RETURN_IF_ERROR(SetDevice(s));
    KVD_RETURN_IF_ERROR(kc::EmbedRows(
        w.rep->embedding.data, d, w.ints_dev + plan.tokens_offset(), plan.rows,
        d, c.embedding_scale, /*round_bf16=*/true, w.h, d, w.stream));
  }
  return absl::OkStatus();
}

absl::Status TpForward::UploadResiduals(const float* h, int64_t m) {
  for (int s = 0; s < degree(); ++s) {
    Shard& w = *shards_[s];
    KVD_RETURN_IF_ERROR(SetDevice(s));
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(w.h, h, m * config_.d_model * sizeof(float),
                                   cudaMemcpyHostToDevice,
                                   static_cast<cudaStream_t>(w.stream)),
                   "uploading residuals"));
  }
  return absl::OkStatus();
}

absl::Status TpForward::DownloadResiduals(float* h, int64_t m) {
  // Every shard's residual stream is the same after each layer (the sums
  // are replicated); shard 0's is read.
  Shard& w = *shards_[0];
  KVD_RETURN_IF_ERROR(SetDevice(0));
  return CudaStatus(cudaMemcpyAsync(h, w.h, m * config_.d_model * sizeof(float),
                                    cudaMemcpyDeviceToHost,
                                    static_cast<cudaStream_t>(w.stream)),
                    "downloading residuals");
}

absl::Status TpForward::CheckPools(absl::Span<const CudaPool> pools) const {
  if (static_cast<int>(pools.size()) != degree()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel step: ", pools.size(), " K/V pools for ",
                     degree(), " shards"));
  }
  return absl::OkStatus();
}

absl::Status TpForward::ReduceOutputs(int64_t count) {
  std::vector<float*> buffers;
  std::vector<void*> streams;
  for (auto& s : shards_) {
    buffers.push_back(s->o);
    streams.push_back(s->stream);
  }
  // Same device for the simulation; NCCL's group call handles several.
  KVD_RETURN_IF_ERROR(SetDevice(0));
  return all_reduce_->SumInPlace(buffers, count, streams);
}

absl::Status TpForward::RunLayers(
    const StepPlan& plan, absl::Span<const CudaPool> pools, int64_t first,
    int64_t end, const std::function<absl::Status(int64_t)>& before_layer,
    absl::Span<const absl::Span<const CudaColdRows* const>> cold) {
  KVD_RETURN_IF_ERROR(CheckPools(pools));
  if (!cold.empty() && static_cast<int>(cold.size()) != degree()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel step: cold rows for ", cold.size(),
                     " shards, not ", degree()));
  }
  const ModelConfig& c = config_;
  const int64_t d = c.d_model, m = plan.rows;
  for (int64_t l = first; l < end; ++l) {
    if (before_layer) KVD_RETURN_IF_ERROR(before_layer(l));
    // Attention: each shard's heads, then W_o's partial over them.
    for (int s = 0; s < degree(); ++s) {
      const Shard& w = *shards_[s];
      KVD_RETURN_IF_ERROR(SetDevice(s));
      const CudaColdRows* cold_l = cold.empty() ? nullptr : cold[s][l];
      KVD_RETURN_IF_ERROR(AttentionPartial(
          c, l, w.layer(l), w.dims, w.step_rows(plan, pools[s], l, cold_l),
          w.buffers(), w.stream));
    }
    KVD_RETURN_IF_ERROR(ReduceOutputs(m * d));
    // MLP: each shard's columns, then W_down's partial over them.
    for (int s = 0; s < degree(); ++s) {
      const Shard& w = *shards_[s];
      KVD_RETURN_IF_ERROR(SetDevice(s));
      KVD_RETURN_IF_ERROR(kc::AddRows(w.h, d, w.o, d, m, d, false, w.stream));
      KVD_RETURN_IF_ERROR(
          MlpPartial(c, w.layer(l), w.dims, m, w.buffers(), w.stream));
    }
    KVD_RETURN_IF_ERROR(ReduceOutputs(m * d));
    for (int s = 0; s < degree(); ++s) {
      const Shard& w = *shards_[s];
      KVD_RETURN_IF_ERROR(SetDevice(s));
      // The residual leaves the layer in bf16, as the CPU's bf16 mode.
      KVD_RETURN_IF_ERROR(kc::AddRows(w.h, d, w.o, d, m, d, true, w.stream));
    }
  }
  return absl::OkStatus();
}

absl::Status TpForward::ProjectKv(const StepPlan& plan,
                                  absl::Span<const CudaPool> pools,
                                  int64_t layer) {
  KVD_RETURN_IF_ERROR(CheckPools(pools));
  const ModelConfig& c = config_;
  const int64_t d = c.d_model;
  for (int s = 0; s < degree(); ++s) {
    const Shard& w = *shards_[s];
    KVD_RETURN_IF_ERROR(SetDevice(s));
    const CudaLayerWeights lw = w.layer(layer);
    // AttentionPartial's first launch, then its K/V launches: this shard's
    // heads only, from the replicated residual.
    KVD_RETURN_IF_ERROR(kc::RmsNorm(w.h, d, lw.attn_norm, c.rms_eps, plan.rows,
                                    d, w.x, d, w.stream));
    KVD_RETURN_IF_ERROR(KvPartial(c, layer, lw, w.dims,
                                  w.step_rows(plan, pools[s], layer),
                                  w.buffers(), w.stream));
  }
  return absl::OkStatus();
}

absl::Status TpForward::Logits(const StepPlan& plan, float* logits) {
  const ModelConfig& c = config_;
  const int64_t n = plan.n_gather, d = c.d_model;
  if (n == 0) return absl::OkStatus();
  // The LM head on shard 0 (its residual equals every other shard's).
  const Shard& w = *shards_[0];
  KVD_RETURN_IF_ERROR(SetDevice(0));
  void* s = w.stream;
  KVD_RETURN_IF_ERROR(kc::GatherRows(
      w.h, d, w.ints_dev + plan.last_row_offset(), n, d, w.gathered, d, s));
  KVD_RETURN_IF_ERROR(kc::RmsNorm(w.gathered, d, w.rep->output_norm, c.rms_eps,
                                  n, d, w.gathered, d, s));
  KVD_RETURN_IF_ERROR(kc::Gemm({w.gathered, kc::ActType::kF32, n, d},
                               w.rep->output.view(), w.logits, c.vocab_size,
                               s));
  return CudaStatus(
      cudaMemcpyAsync(logits, w.logits, n * c.vocab_size * sizeof(float),
                      cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(s)),
      "downloading logits");
}

absl::Status TpForward::Sync(absl::string_view what) {
  for (int s = 0; s < degree(); ++s) {
    KVD_RETURN_IF_ERROR(SetDevice(s));
    KVD_RETURN_IF_ERROR(CudaStatus(
        cudaStreamSynchronize(static_cast<cudaStream_t>(shards_[s]->stream)),
        what));
  }
  return absl::OkStatus();
}

}  // namespace kvd::ops::internal
