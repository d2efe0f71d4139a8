#include "ops/backend/internal/cuda_forward.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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

struct CudaForward::DeviceWeights {
  struct Layer {
    const float* attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr;
    DeviceMatrix wq, wk, wv, wo, w_gate, w_up, w_down;

    CudaLayerWeights kernel_view() const {
      return {attn_norm, ffn_norm,      bq,          bk,
              bv,        wq.view(),     wk.view(),   wv.view(),
              wo.view(), w_gate.view(), w_up.view(), w_down.view()};
    }
  };
  DeviceMatrix embedding, output;
  const float* output_norm = nullptr;
  std::vector<Layer> layers;
  DeviceMemory mem;
};

struct CudaForward::Workspace {
  int64_t rows = 0, gather = 0, ints = 0;
  float *h = nullptr, *x = nullptr, *q = nullptr, *k = nullptr, *v = nullptr,
        *attn = nullptr, *o = nullptr, *gate = nullptr, *up = nullptr;
  float *gathered = nullptr, *logits = nullptr;
  int32_t* ints_dev = nullptr;
  DeviceMemory mem;

  void Free() {
    mem.Free();
    rows = gather = ints = 0;
  }
  template <typename T>
  absl::Status Alloc(T** p, int64_t n) {
    return mem.Alloc(p, n, "the CUDA model's step buffers");
  }
  CudaStepBuffers buffers() const { return {h, x, q, k, v, attn, o, gate, up}; }
};

absl::StatusOr<std::unique_ptr<CudaForward>> CudaForward::Create(
    const Model& model, int device) {
  KVD_RETURN_IF_ERROR(CheckCudaModelSupport(model.config(), model.precision()));
  std::unique_ptr<CudaForward> f(new CudaForward());
  f->config_ = model.config();
  f->device_ = device;
  f->ws_ = std::make_unique<Workspace>();
  f->ws_->mem.device = device;
  KVD_RETURN_IF_ERROR(f->SetDevice());
  cudaStream_t stream = nullptr;
  KVD_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                 "creating the CUDA model's stream"));
  f->stream_ = stream;
  KVD_RETURN_IF_ERROR(f->Upload(model));
  // cudaMemcpy from pageable memory may return before its DMA lands, and the
  // non-blocking stream does not wait for the legacy stream.
  KVD_RETURN_IF_ERROR(
      CudaStatus(cudaDeviceSynchronize(), "uploading the model's weights"));
  return f;
}

CudaForward::~CudaForward() {
  cudaSetDevice(device_);
  if (stream_ != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
  ws_.reset();
  weights_.reset();
  if (cold_ws_ != nullptr) cudaFree(cold_ws_);
  if (cold_res_ != nullptr) cudaFree(cold_res_);
}

absl::Status CudaForward::SetDevice() const {
  return CudaStatus(cudaSetDevice(device_),
                    absl::StrCat("cudaSetDevice(", device_, ")"));
}

absl::Status CudaForward::Upload(const Model& model) {
  const ModelWeights& w = model.weights();
  auto dw = std::make_unique<DeviceWeights>();
  dw->mem.device = device_;
  KVD_ASSIGN_OR_RETURN(dw->embedding,
                       dw->mem.Matrix(w.token_embedding, "token_embd"));
  if (w.output.empty()) {
    dw->output = dw->embedding;  // tied
  } else {
    KVD_ASSIGN_OR_RETURN(dw->output, dw->mem.Matrix(w.output, "output"));
  }
  KVD_ASSIGN_OR_RETURN(dw->output_norm,
                       dw->mem.Vector(w.output_norm, "output_norm"));
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& lw = w.layers[l];
    DeviceWeights::Layer d;
    const std::string p = absl::StrCat("blk.", l, ".");
    KVD_ASSIGN_OR_RETURN(d.attn_norm,
                         dw->mem.Vector(lw.attn_norm, p + "attn_norm"));
    KVD_ASSIGN_OR_RETURN(d.ffn_norm,
                         dw->mem.Vector(lw.ffn_norm, p + "ffn_norm"));
    KVD_ASSIGN_OR_RETURN(d.bq, dw->mem.Vector(lw.bq, p + "attn_q.bias"));
    KVD_ASSIGN_OR_RETURN(d.bk, dw->mem.Vector(lw.bk, p + "attn_k.bias"));
    KVD_ASSIGN_OR_RETURN(d.bv, dw->mem.Vector(lw.bv, p + "attn_v.bias"));
    KVD_ASSIGN_OR_RETURN(d.wq, dw->mem.Matrix(lw.wq, p + "attn_q"));
    KVD_ASSIGN_OR_RETURN(d.wk, dw->mem.Matrix(lw.wk, p + "attn_k"));
    KVD_ASSIGN_OR_RETURN(d.wv, dw->mem.Matrix(lw.wv, p + "attn_v"));
    KVD_ASSIGN_OR_RETURN(d.wo, dw->mem.Matrix(lw.wo, p + "attn_output"));
    KVD_ASSIGN_OR_RETURN(d.w_gate, dw->mem.Matrix(lw.w_gate, p + "ffn_gate"));
    KVD_ASSIGN_OR_RETURN(d.w_up, dw->mem.Matrix(lw.w_up, p + "ffn_up"));
    KVD_ASSIGN_OR_RETURN(d.w_down, dw->mem.Matrix(lw.w_down, p + "ffn_down"));
    dw->layers.push_back(d);
  }
  weights_ = std::move(dw);
  return absl::OkStatus();
}

absl::Status CudaForward::EnsureWorkspace(int64_t rows, int64_t gather_rows,
                                          int64_t ints) {
  Workspace& w = *ws_;
  if (rows <= w.rows && gather_rows <= w.gather && ints <= w.ints)
    return absl::OkStatus();
  KVD_RETURN_IF_ERROR(
      Sync("waiting for the stream before growing the step buffers"));
  // Each size grows (doubling, to amortise) only when it is short itself:
  // the block tables' ints grow with the context every few steps, and must
  // not drag the d_ff-wide row buffers along.
  auto grown = [](int64_t want, int64_t have) {
    return want <= have ? have : std::max(want, 2 * have);
  };
  const int64_t new_rows = grown(rows, w.rows);
  const int64_t new_gather = grown(gather_rows, w.gather);
  const int64_t new_ints = grown(ints, w.ints);
  w.Free();
  const ModelConfig& c = config_;
  const int64_t m = new_rows;
  absl::Status st = [&]() -> absl::Status {
    KVD_RETURN_IF_ERROR(w.Alloc(&w.h, m * c.d_model));
    KVD_RETURN_IF_ERROR(w.Alloc(&w.x, m * c.d_model));
    KVD_RETURN_IF_ERROR(w.Alloc(&w.q, m * c.q_dim()));
    KVD_RETURN_IF_ERROR(w.Alloc(&w.k, m * c.kv_dim()));
    KVD_RETURN_IF_ERROR(w.Alloc(&w.v, m * c.kv_dim()));
    KVD_RETURN_IF_ERROR(w.Alloc(&w.attn, m * c.q_dim()));
    KVD_RETURN_IF_ERROR(w.Alloc(&w.o, m * c.d_model));
    KVD_RETURN_IF_ERROR(w.Alloc(&w.gate, m * c.d_ff));
    KVD_RETURN_IF_ERROR(w.Alloc(&w.up, m * c.d_ff));
    KVD_RETURN_IF_ERROR(w.Alloc(&w.gathered, new_gather * c.d_model));
    KVD_RETURN_IF_ERROR(w.Alloc(&w.logits, new_gather * c.vocab_size));
    return w.Alloc(&w.ints_dev, new_ints);
  }();
  if (!st.ok()) {
    // Nothing half-grown: the next step starts from empty buffers.
    w.Free();
    return st;
  }
  w.rows = new_rows;
  w.gather = new_gather;
  w.ints = new_ints;
  return absl::OkStatus();
}

absl::StatusOr<float*> CudaForward::PinnedFloats(int64_t floats) {
  return pinned_.Get(floats, [this] {
    return Sync("waiting for the stream before growing the pinned buffer");
  });
}

absl::Status CudaForward::EnsureColdBuffers(int64_t bytes,
                                            int64_t residual_values) {
  if (bytes <= cold_ws_bytes_ && residual_values <= cold_res_values_)
    return absl::OkStatus();
  KVD_RETURN_IF_ERROR(
      Sync("waiting for the stream before growing the cold K/V scratch"));
  if (bytes > cold_ws_bytes_) {
    const int64_t n = std::max(bytes, 2 * cold_ws_bytes_);
    if (cold_ws_ != nullptr) cudaFree(cold_ws_);
    cold_ws_ = nullptr;
    cold_ws_bytes_ = 0;
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&cold_ws_, n),
                   "cudaMalloc for attention over recomputed cold K/V"));
    cold_ws_bytes_ = n;
  }
  if (residual_values > cold_res_values_) {
    const int64_t n = std::max(residual_values, 2 * cold_res_values_);
    if (cold_res_ != nullptr) cudaFree(cold_res_);
    cold_res_ = nullptr;
    cold_res_values_ = 0;
    void* p = nullptr;
    KVD_RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&p, n * sizeof(uint16_t)),
                   "cudaMalloc for the cold positions' residuals"));
    cold_res_ = static_cast<uint16_t*>(p);
    cold_res_values_ = n;
  }
  return absl::OkStatus();
}

absl::Status CudaForward::UploadBf16(uint16_t* device, const uint16_t* host,
                                     int64_t n) {
  return CudaStatus(cudaMemcpyAsync(device, host, n * sizeof(uint16_t),
                                    cudaMemcpyHostToDevice,
                                    static_cast<cudaStream_t>(stream_)),
                    "uploading cold residuals");
}

absl::Status CudaForward::UploadPlan(const StepPlan& plan) {
  return CudaStatus(
      cudaMemcpyAsync(ws_->ints_dev, plan.ints.data(), plan.ints.size() * 4,
                      cudaMemcpyHostToDevice,
                      static_cast<cudaStream_t>(stream_)),
      "uploading the step's tokens, positions and block tables");
}

absl::Status CudaForward::Embed(const StepPlan& plan) {
  const ModelConfig& c = config_;
  return kc::EmbedRows(weights_->embedding.data, c.d_model,
                       ws_->ints_dev + plan.tokens_offset(), plan.rows,
                       c.d_model, c.embedding_scale,
                       /*round_bf16=*/true, ws_->h, c.d_model, stream_);
}

absl::Status CudaForward::UploadResiduals(const float* h, int64_t m) {
  return CudaStatus(
      cudaMemcpyAsync(ws_->h, h, m * config_.d_model * sizeof(float),
                      cudaMemcpyHostToDevice,
                      static_cast<cudaStream_t>(stream_)),
      "uploading residuals");
}

absl::Status CudaForward::DownloadResiduals(float* h, int64_t m) {
  return CudaStatus(
      cudaMemcpyAsync(h, ws_->h, m * config_.d_model * sizeof(float),
                      cudaMemcpyDeviceToHost,
                      static_cast<cudaStream_t>(stream_)),
      "downloading residuals");
}

namespace {

CudaStepRows PlanRows(const StepPlan& plan, const int32_t* ints,
                      const CudaPool& pool, int64_t layer,
                      const CudaColdRows* cold = nullptr) {
  CudaStepRows rows;
  rows.m = plan.rows;
  rows.positions = ints + plan.positions_offset();
  rows.row_seq = ints + plan.row_seq_offset();
  rows.table = ints + plan.table_offset(layer);
  rows.table_stride = plan.table_stride;
  rows.block_rows = pool.block_rows;
  rows.pool = pool.base;
  rows.cold = cold;
  return rows;
}

}  // namespace

absl::Status CudaForward::RunLayers(
    const StepPlan& plan, const CudaPool& pool, int64_t first, int64_t end,
    const std::function<absl::Status(int64_t)>& before_layer,
    absl::Span<const CudaColdRows* const> cold) {
  const ModelConfig& c = config_;
  const Workspace& w = *ws_;
  void* s = stream_;
  const int64_t d = c.d_model, m = plan.rows;
  const CudaShardDims dims{c.n_heads, c.n_kv_heads, c.q_dim(), c.kv_dim(),
                           c.d_ff};
  const CudaStepBuffers buf = w.buffers();
  for (int64_t l = first; l < end; ++l) {
    if (before_layer) KVD_RETURN_IF_ERROR(before_layer(l));
    const CudaLayerWeights lw = weights_->layers[l].kernel_view();
    const CudaColdRows* cold_l = cold.empty() ? nullptr : cold[l];
    KVD_RETURN_IF_ERROR(AttentionPartial(
        c, l, lw, dims, PlanRows(plan, w.ints_dev, pool, l, cold_l), buf, s));
    KVD_RETURN_IF_ERROR(kc::AddRows(w.h, d, w.o, d, m, d, false, s));
    KVD_RETURN_IF_ERROR(MlpPartial(c, lw, dims, m, buf, s));
    // The residual leaves the layer in bf16, as the CPU's bf16 mode.
    KVD_RETURN_IF_ERROR(kc::AddRows(w.h, d, w.o, d, m, d, true, s));
  }
  return absl::OkStatus();
}

absl::Status CudaForward::ProjectKv(const StepPlan& plan, const CudaPool& pool,
                                    int64_t layer) {
  const ModelConfig& c = config_;
  const Workspace& w = *ws_;
  const int64_t d = c.d_model;
  const CudaShardDims dims{c.n_heads, c.n_kv_heads, c.q_dim(), c.kv_dim(),
                           c.d_ff};
  const CudaLayerWeights lw = weights_->layers[layer].kernel_view();
  KVD_RETURN_IF_ERROR(kc::RmsNorm(w.h, d, lw.attn_norm, c.rms_eps, plan.rows, d,
                                  w.x, d, stream_));
  return KvPartial(c, layer, lw, dims, PlanRows(plan, w.ints_dev, pool, layer),
                   w.buffers(), stream_);
}

absl::Status CudaForward::Logits(const StepPlan& plan, float* logits) {
  const ModelConfig& c = config_;
  const Workspace& w = *ws_;
  void* s = stream_;
  const int64_t n = plan.n_gather, d = c.d_model;
  if (n == 0) return absl::OkStatus();
  KVD_RETURN_IF_ERROR(kc::GatherRows(
      w.h, d, w.ints_dev + plan.last_row_offset(), n, d, w.gathered, d, s));
  KVD_RETURN_IF_ERROR(kc::RmsNorm(w.gathered, d, weights_->output_norm,
                                  c.rms_eps, n, d, w.gathered, d, s));
  KVD_RETURN_IF_ERROR(kc::Gemm({w.gathered, kc::ActType::kF32, n, d},
                               weights_->output.view(), w.logits, c.vocab_size,
                               s));
  return CudaStatus(
      cudaMemcpyAsync(logits, w.logits, n * c.vocab_size * sizeof(float),
                      cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(s)),
      "downloading logits");
}

absl::Status CudaForward::Sync(absl::string_view what) {
  return CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
                    what);
}

}  // namespace kvd::ops::internal
