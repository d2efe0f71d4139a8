#include "ops/model/model.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/numerics_version.h"
#include "kernels/cpu/row_parallel_gemm.h"
#include "ops/model/architecture.h"

namespace kvd::ops {

namespace cpu = kernels::cpu;

namespace {

// Runs fn(row) for every row, split over the pool when there are enough rows to
// pay for it. Rows are independent, so the split cannot change any result.
void ForRows(cpu::ThreadPool* pool, int64_t m,
             const std::function<void(int64_t)>& fn) {
  constexpr int64_t kMinRowsToSplit = 4;
  if (pool == nullptr || m < kMinRowsToSplit) {
    for (int64_t r = 0; r < m; ++r) fn(r);
    return;
  }
  pool->ParallelFor(m, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) fn(r);
  });
}

}  // namespace

const std::vector<float>& Model::Workspace::RopeTable(float base) {
  for (const auto& [b, table] : rope) {
    if (b == base) return table;
  }
  // One table per distinct RoPE base and step (not per layer): cos then sin,
  // half values each, per row.
  const int64_t half = config->rope_dim / 2;
  std::vector<float> table(row_pos->size() * 2 * half);
  ForRows(pool, row_pos->size(), [&](int64_t r) {
    cpu::RopeAngles((*row_pos)[r], base, config->rope_dim,
                    table.data() + r * 2 * half,
                    table.data() + r * 2 * half + half);
  });
  rope.emplace_back(base, std::move(table));
  return rope.back().second;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path,
                                                   const LoadOptions& options) {
  std::error_code is_dir_error;
  if (std::filesystem::is_directory(path, is_dir_error)) {
    return LoadHuggingFace(path, options);
  }
  if (!cpu::IsaSupported(cpu::Isa::kAvx2)) {
    return absl::FailedPreconditionError(
        "kvd needs an x86-64 CPU with AVX2, FMA and F16C (Intel Haswell / AMD "
        "Zen or newer)");
  }
  std::unique_ptr<Model> m(new Model());
  KVD_ASSIGN_OR_RETURN(m->file_, GgufFile::Open(path));
  const std::string arch(m->file_->architecture());
  KVD_ASSIGN_OR_RETURN(const ArchitectureEntry* entry, FindArchitecture(arch));
  KVD_ASSIGN_OR_RETURN(m->config_, entry->read_config(*m->file_));
  if (absl::Status s = m->config_.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", s.message(),
                     "; the file's metadata is corrupt or unsupported"));
  }
  m->precision_ = options.precision;
  m->pool_ = std::make_unique<cpu::ThreadPool>(options.num_threads);
  KVD_ASSIGN_OR_RETURN(
      m->weights_,
      LoadWeights(*m->file_, m->config_, options.precision, options.weights,
                  m->pool_.get(), options.progress));
  // Every tensor was copied out; the mapping stays for metadata lookups.
  m->file_->ReleaseResidentPages();
  return m;
}

uint32_t Model::numerics_version() const {
  return kernels::cpu::kNumericsVersion;
}

void Model::ReleaseWeights() {
  weights_ = ModelWeights();
  has_weights_ = false;
}

absl::Status Model::CheckWeights(const char* what) const {
  if (has_weights_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(what,
                   ": the CPU model's weights were released (the model runs on "
                   "another backend, which holds its own copy)"));
}

absl::StatusOr<KvCache> Model::NewCache(KvBlockPool* pool) const {
  if (pool != nullptr && !pool->host_accessible()) {
    return absl::InvalidArgumentError(
        "the CPU backend cannot use a K/V pool in device memory; make the "
        "pool with this model's NewBlockPool");
  }
  return KvCache::InPool(config_, precision_, pool);
}

absl::Status Model::RunForward(absl::Span<const SequenceStep> batch,
                               ForwardOutput* out, ResidualObserver* observer,
                               ResidualPatcher* patcher) const {
  KVD_RETURN_IF_ERROR(CheckWeights("Forward"));
  const ModelConfig& c = config_;
  for (const SequenceStep& step : batch) {
    if (step.cache == nullptr) continue;  // PrepareStepCaches refuses it
    if (!step.cache->pool()->host_accessible()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", step.sequence_id,
          ": its K/V cache lives in device memory; the CPU backend cannot "
          "run it"));
    }
    KVD_RETURN_IF_ERROR(CheckKeySelection(step));
  }
  // Every block the step needs is reserved before any cache changes, so an
  // exhausted pool fails the whole step cleanly.
  KVD_ASSIGN_OR_RETURN(const int64_t total,
                       PrepareStepCaches(c, precision_, batch));

  // Flatten the batch: row r is token row_pos[r] of sequence row_seq[r].
  // Prepare has grown the caches; their lengths are still the old ones.
  std::vector<int64_t> row_seq, row_pos;
  row_seq.reserve(total);
  row_pos.reserve(total);
  for (size_t s = 0; s < batch.size(); ++s) {
    for (size_t i = 0; i < batch[s].tokens.size(); ++i) {
      row_seq.push_back(s);
      row_pos.push_back(batch[s].cache->length() + i);
    }
  }

  std::vector<float> h(total * c.d_model);
  Workspace ws;
  ws.config = &c;
  ws.row_pos = &row_pos;
  ws.pool = pool_.get();
  {
    int64_t r = 0;
    for (const SequenceStep& step : batch) {
      for (int32_t t : step.tokens) {
        float* row = h.data() + r++ * c.d_model;
        weights_.token_embedding.RowToFloat(t, row);
        if (c.embedding_scale != 1.0f)
          cpu::Scale(row, c.embedding_scale, c.d_model);
        if (precision_ == Precision::kBf16) cpu::RoundToBf16(row, c.d_model);
      }
    }
  }

  RunLayers(0, c.n_layers, batch, row_seq, row_pos, h, ws, observer, patcher);
  // A shard whose peers failed computed garbage: nothing of it counts.
  if (reducer_ != nullptr) KVD_RETURN_IF_ERROR(reducer_->status());
  for (const SequenceStep& step : batch) {
    step.cache->SetLength(step.cache->length() + step.tokens.size());
  }

  // Logits for the rows that want them.
  const std::vector<int64_t> rows = SelectLogitRows(batch, c.vocab_size, out);
  std::vector<float> normed(rows.size() * c.d_model);
  for (size_t i = 0; i < rows.size(); ++i) {
    cpu::RmsNorm(h.data() + rows[i] * c.d_model, weights_.output_norm.data(),
                 c.rms_eps, c.d_model, normed.data() + i * c.d_model);
  }
  out->logits.resize(rows.size() * c.vocab_size);
  cpu::Gemm(normed.data(), rows.size(), c.d_model,
            weights_.output_matrix().view(), out->logits.data(), c.vocab_size,
            pool_.get());
  return absl::OkStatus();
}

void Model::RunLayers(int64_t first, int64_t end,
                      absl::Span<const SequenceStep> batch,
                      const std::vector<int64_t>& row_seq,
                      const std::vector<int64_t>& row_pos,
                      std::vector<float>& h, Workspace& ws,
                      ResidualObserver* observer,
                      ResidualPatcher* patcher) const {
  const ModelConfig& c = config_;
  const int64_t total = row_seq.size();
  // The final residual (layer n_layers) is shown only by a run that ends
  // there.
  const int64_t last_seen = end == c.n_layers ? end : end - 1;
  for (int64_t l = first; l <= last_seen; ++l) {
    if (patcher != nullptr) {
      for (int64_t r = 0; r < total; ++r) {
        patcher->Patch(batch[row_seq[r]].sequence_id, l, row_pos[r],
                       h.data() + r * c.d_model);
      }
    }
    if (observer != nullptr) {
      for (int64_t r = 0; r < total; ++r) {
        observer->OnResidual(batch[row_seq[r]].sequence_id, l, row_pos[r],
                             h.data() + r * c.d_model);
      }
    }
    if (l < end) Layer(l, batch, row_seq, row_pos, h, ws);
  }
}

absl::Status Model::RunForwardLayers(KvCache* cache, int64_t position,
                                     int64_t n, int64_t first_layer,
                                     int64_t end_layer, float* h,
                                     ResidualObserver* observer,
                                     int64_t sequence_id) const {
  KVD_RETURN_IF_ERROR(CheckWeights("ForwardLayers"));
  const ModelConfig& c = config_;
  if (cache != nullptr && !cache->pool()->host_accessible()) {
    return absl::InvalidArgumentError(
        "ForwardLayers: the cache lives in device memory; the CPU backend "
        "cannot run it");
  }
  KVD_ASSIGN_OR_RETURN(const bool work,
                       PrepareLayerRange(c, precision_, cache, position, n,
                                         first_layer, end_layer, h));
  if (!work) return absl::OkStatus();
  const SequenceStep step{cache, {}, LogitsMode::kNone, sequence_id};
  std::vector<int64_t> row_seq(n, 0), row_pos(n);
  for (int64_t i = 0; i < n; ++i) row_pos[i] = position + i;
  std::vector<float> rows(h, h + n * c.d_model);
  Workspace ws;
  ws.config = &c;
  ws.row_pos = &row_pos;
  ws.pool = pool_.get();
  RunLayers(first_layer, end_layer, {&step, 1}, row_seq, row_pos, rows, ws,
            observer, /*patcher=*/nullptr);
  if (reducer_ != nullptr) KVD_RETURN_IF_ERROR(reducer_->status());
  std::copy(rows.begin(), rows.end(), h);
  return absl::OkStatus();
}

void Model::KvProjection(int64_t l, const float* h, int64_t m,
                         const float* angles, float* x, float* k, float* v,
                         cpu::ThreadPool* pool, float* q) const {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[l];
  const int64_t d = c.d_model, kvd = c.kv_dim(), hd = c.head_dim;
  const int64_t half = c.rope_dim / 2;
  ForRows(pool, m, [&](int64_t r) {
    cpu::RmsNorm(h + r * d, w.attn_norm.data(), c.rms_eps, d, x + r * d);
  });
  if (q != nullptr) {
    cpu::GemmShared(x, m, d,
                    {{w.wq.view(), q, c.q_dim()},
                     {w.wk.view(), k, kvd},
                     {w.wv.view(), v, kvd}},
                    pool);
  } else {
    cpu::GemmShared(x, m, d, {{w.wk.view(), k, kvd}, {w.wv.view(), v, kvd}},
                    pool);
  }
  ForRows(pool, m, [&](int64_t r) {
    float* kr = k + r * kvd;
    if (c.qkv_bias) {
      cpu::AddInPlace(kr, w.bk.data(), kvd);
      cpu::AddInPlace(v + r * kvd, w.bv.data(), kvd);
    }
    if (c.qk_norm) {
      for (int64_t hh = 0; hh < c.n_kv_heads; ++hh)
        cpu::RmsNorm(kr + hh * hd, w.k_norm.data(), c.rms_eps, hd,
                     kr + hh * hd);
    }
    const float* cos = angles + r * 2 * half;
    cpu::Rope(kr, c.n_kv_heads, hd, c.rope_dim, cos, cos + half, c.rope_style);
  });
}

void Model::RowParallel(const float* x, int64_t m, int64_t ldx,
                        const cpu::WeightView& w, float* y,
                        Workspace& ws) const {
  if (reducer_ == nullptr) {
    cpu::GroupedGemm(x, m, ldx, w, config_.row_parallel_groups(), y, w.rows,
                     pool_.get());
    return;
  }
  const int64_t n = m * w.rows;
  ws.partials.resize(shard_groups_ * n);
  std::vector<const float*> parts;
  for (int64_t g = 0; g < shard_groups_; ++g) {
    float* p = ws.partials.data() + g * n;
    cpu::GroupPartial(x, m, ldx, w, shard_groups_, g, p, w.rows, pool_.get());
    parts.push_back(p);
  }
  reducer_->Reduce(shard_index_, parts, n, y);
}

void Model::Layer(int64_t l, absl::Span<const SequenceStep> batch,
                  const std::vector<int64_t>& row_seq,
                  const std::vector<int64_t>& row_pos, std::vector<float>& h,
                  Workspace& ws) const {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[l];
  const LayerConfig& lc = c.layers[l];
  const int64_t m = row_seq.size();
  const int64_t d = c.d_model, qd = c.q_dim(), kvd = c.kv_dim(),
                hd = c.head_dim;
  cpu::ThreadPool* pool = pool_.get();

  // Scratch reused by every layer of this step: allocating it per layer made
  // the kernel zero fresh pages 30 times per forward pass.
  std::vector<float>& x = ws.x;
  std::vector<float>& q = ws.q;
  std::vector<float>& k = ws.k;
  std::vector<float>& v = ws.v;
  std::vector<float>& attn = ws.attn;
  std::vector<float>& o = ws.o;
  std::vector<float>& gate = ws.gate;
  std::vector<float>& up = ws.up;
  x.resize(m * d);
  q.resize(m * qd);
  k.resize(m * kvd);
  v.resize(m * kvd);
  attn.resize(m * qd);
  o.resize(m * d);
  gate.resize(m * c.d_ff);
  up.resize(m * c.d_ff);
  const std::vector<float>& angles = ws.RopeTable(lc.rope_base);
  const int64_t half = c.rope_dim / 2;
  KvProjection(l, h.data(), m, angles.data(), x.data(), k.data(), v.data(),
               pool, q.data());
  ForRows(pool, m, [&](int64_t r) {
    float* qr = q.data() + r * qd;
    const float* kr = k.data() + r * kvd;
    const float* vr = v.data() + r * kvd;
    if (c.qkv_bias) cpu::AddInPlace(qr, w.bq.data(), qd);
    if (c.qk_norm) {
      for (int64_t hh = 0; hh < c.n_heads; ++hh)
        cpu::RmsNorm(qr + hh * hd, w.q_norm.data(), c.rms_eps, hd,
                     qr + hh * hd);
    }
    const float* cos = angles.data() + r * 2 * half;
    const float* sin = cos + half;
    cpu::Rope(qr, c.n_heads, hd, c.rope_dim, cos, sin, c.rope_style);
    KvCache* cache = batch[row_seq[r]].cache;
    cache->WriteKey(l, row_pos[r], kr);
    cache->WriteValue(l, row_pos[r], vr);
  });

  // Attention: one task per (sequence, K/V head, block of up to kQueryBlock
  // consecutive queries); a block shares its score GEMMs, and each query still
  // visits its keys in the canonical chunk order, so the bits do not depend on
  // the blocking.
  constexpr int64_t kQueryBlock = 64;
  struct Task {
    int64_t row, n, g;
  };
  std::vector<Task> tasks;
  bool any_source = false;
  for (int64_t r = 0; r < m;) {
    int64_t e = r + 1;
    while (e < m && row_seq[e] == row_seq[r]) ++e;
    // Sequences with a KvSource attend together below: their cold rows are
    // recomputed once for all heads and sequences.
    const bool source = batch[row_seq[r]].kv_source != nullptr;
    any_source |= source;
    // A block's causal work grows with its position, and the pool hands
    // each thread a contiguous run of tasks: the blocks go in zigzag order
    // (last, first, second last, ...) so that every run holds about the
    // same work.
    const int64_t n_blocks = (e - r + kQueryBlock - 1) / kQueryBlock;
    for (int64_t g = 0; g < c.n_kv_heads && !source; ++g) {
      for (int64_t i = 0; i < n_blocks; ++i) {
        const int64_t k = i % 2 == 0 ? n_blocks - 1 - i / 2 : i / 2;
        const int64_t b = r + k * kQueryBlock;
        tasks.push_back({b, std::min(kQueryBlock, e - b), g});
      }
    }
    r = e;
  }
  const int64_t group = c.n_heads / c.n_kv_heads;
  const float scale = c.attn_scale();
  auto attend = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const Task& task = tasks[t];
      const SequenceStep& step = batch[row_seq[task.row]];
      if (step.key_selection != nullptr) {
        const int64_t offset = task.row * qd + task.g * group * hd;
        AttendSelected(l, step, task.g, q.data() + offset, qd, task.n,
                       row_pos[task.row], attn.data() + offset, qd);
        continue;
      }
      const KvCache* cache = step.cache;
      const cpu::KvRows keys = cache->Keys(l).Shifted(task.g * hd);
      const cpu::KvRows values = cache->Values(l).Shifted(task.g * hd);
      const int64_t offset = task.row * qd + task.g * group * hd;
      cpu::AttendCausalBlock(q.data() + offset, qd, task.n, group, hd, scale,
                             keys, values, row_pos[task.row], lc.sliding_window,
                             attn.data() + offset, qd);
    }
  };
  // One query over many keys (decode at depth): a task per K/V head would
  // leave threads idle (SmolLM2's 3 heads on 2 threads; Gemma 3's one head),
  // so the query's attention is cut across the threads instead, with the
  // same bits. (With one thread the per-head path stays: end to end it was
  // 5-10% faster there, though BM_DecodeAllHeads shows the opposite.)
  constexpr int64_t kSpreadMinKeys = 512;
  const int64_t first_key =
      lc.sliding_window > 0
          ? std::max<int64_t>(0, row_pos[0] - lc.sliding_window + 1)
          : 0;
  const bool spread = m == 1 && pool->num_threads() > 1 &&
                      batch[0].kv_source == nullptr &&
                      batch[0].key_selection == nullptr &&
                      row_pos[0] - first_key + 1 >= kSpreadMinKeys;
  if (spread) {
    const KvCache* cache = batch[0].cache;
    cpu::AttendRangeAcrossThreads(q.data(), c.n_kv_heads, group, hd, scale,
                                  cache->Keys(l), cache->Values(l), first_key,
                                  row_pos[0], attn.data(), pool);
  } else if (!tasks.empty()) {
    pool->ParallelFor(tasks.size(), attend);
  }
  if (any_source) {
    AttendFromSources(l, batch, row_seq, row_pos, q.data(), attn.data(), ws);
  }

  // The row-parallel projections sum G ordered partials (one per K/V head
  // group), so that tensor-parallel shards reproduce these bits.
  RowParallel(attn.data(), m, qd, w.wo.view(), o.data(), ws);
  ForRows(pool, m, [&](int64_t r) {
    float* orow = o.data() + r * d;
    if (c.post_attn_norm)
      cpu::RmsNorm(orow, w.post_attn_norm.data(), c.rms_eps, d, orow);
    cpu::AddInPlace(h.data() + r * d, orow, d);
    cpu::RmsNorm(h.data() + r * d, w.ffn_norm.data(), c.rms_eps, d,
                 x.data() + r * d);
  });

  cpu::GemmShared(x.data(), m, d,
                  {{w.w_gate.view(), gate.data(), c.d_ff},
                   {w.w_up.view(), up.data(), c.d_ff}},
                  pool);
  ForRows(pool, m, [&](int64_t r) {
    float* g = gate.data() + r * c.d_ff;
    const float* u = up.data() + r * c.d_ff;
    if (c.activation == Activation::kSilu) {
      cpu::SiluMul(g, u, c.d_ff, g);
    } else {
      cpu::GeluTanhMul(g, u, c.d_ff, g);
    }
  });
  RowParallel(gate.data(), m, c.d_ff, w.w_down.view(), o.data(), ws);
  ForRows(pool, m, [&](int64_t r) {
    float* orow = o.data() + r * d;
    if (c.post_ffn_norm)
      cpu::RmsNorm(orow, w.post_ffn_norm.data(), c.rms_eps, d, orow);
    cpu::AddInPlace(h.data() + r * d, orow, d);
    // The bf16 mode keeps the residual stream in bf16 at layer boundaries.
    if (precision_ == Precision::kBf16) cpu::RoundToBf16(h.data() + r * d, d);
  });
}

}  // namespace kvd::ops
