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

const float* ForwardOutput::Logits(size_t seq, int64_t row) const {
  if (seq >= first_row.size() || first_row[seq] < 0) return nullptr;
  const int64_t r = row < 0 ? num_rows[seq] - 1 : row;
  return logits.data() + (first_row[seq] + r) * vocab_size;
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
  KVD_ASSIGN_OR_RETURN(m->weights_,
                       LoadWeights(*m->file_, m->config_, options.precision,
                                   m->pool_.get(), options.progress));
  return m;
}

absl::Status Model::Forward(absl::Span<const SequenceStep> batch,
                            ForwardOutput* out, ResidualObserver* observer,
                            ResidualPatcher* patcher) const {
  const ModelConfig& c = config_;
  // Validate everything before touching any cache.
  int64_t total = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceStep& step = batch[s];
    if (step.cache == nullptr)
      return absl::InvalidArgumentError("sequence without a K/V cache");
    if (step.cache->precision() != precision_ ||
        step.cache->n_layers() != c.n_layers) {
      return absl::FailedPreconditionError(
          "K/V cache was made for another model or precision");
    }
    for (int32_t t : step.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token id ", t, " out of range [0, ", c.vocab_size, ")"));
      }
    }
    if (step.kv_source != nullptr) {
      KVD_RETURN_IF_ERROR(
          step.kv_source->Check(c.n_layers, step.cache->length()));
    }
    KVD_RETURN_IF_ERROR(CheckKeySelection(step));
    KVD_RETURN_IF_ERROR(CheckKeptRows(step));
    const int64_t end =
        step.cache->length() + static_cast<int64_t>(step.tokens.size());
    if (end > c.context_length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", step.sequence_id, " would reach ", end,
          " tokens, beyond the model's context length of ", c.context_length));
    }
    total += step.tokens.size();
  }

  // Every block the step needs is reserved before any cache changes, so an
  // exhausted pool fails the whole step cleanly.
  std::vector<std::vector<int64_t>> keep(batch.size());
  for (size_t s = 0; s < batch.size(); ++s) keep[s] = KeepBegins(batch[s]);
  KVD_RETURN_IF_ERROR(ReserveBlocks(batch, keep));

  // Flatten the batch: row r is token row_pos[r] of sequence row_seq[r].
  std::vector<int64_t> row_seq, row_pos;
  row_seq.reserve(total);
  row_pos.reserve(total);
  for (size_t s = 0; s < batch.size(); ++s) {
    batch[s].cache->Prepare(keep[s],
                            batch[s].cache->length() + batch[s].tokens.size());
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
  for (const SequenceStep& step : batch) {
    step.cache->SetLength(step.cache->length() + step.tokens.size());
  }

  // Logits for the rows that want them.
  out->vocab_size = c.vocab_size;
  out->first_row.assign(batch.size(), -1);
  out->num_rows.assign(batch.size(), 0);
  std::vector<int64_t> rows;
  {
    int64_t r = 0;
    for (size_t s = 0; s < batch.size(); ++s) {
      const int64_t n = batch[s].tokens.size();
      if (n > 0 && batch[s].logits != LogitsMode::kNone) {
        out->first_row[s] = rows.size();
        const int64_t first = batch[s].logits == LogitsMode::kAll ? 0 : n - 1;
        for (int64_t i = first; i < n; ++i) rows.push_back(r + i);
        out->num_rows[s] = n - first;
      }
      r += n;
    }
  }
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

absl::Status Model::CheckKeptRows(const SequenceStep& step) const {
  const KvCache& cache = *step.cache;
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    // Without a KvSource attention reads every row its window reaches; with
    // one, rows from HotBegin on. A local layer never reads below its window.
    int64_t needed = step.kv_source == nullptr
                         ? 0
                         : std::min(step.kv_source->HotBegin(l, cache.length()),
                                    cache.length());
    needed = std::max(
        needed, WindowStart(config_.layers[l].sliding_window, cache.length()));
    if (cache.first_kept(l) > needed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence ", step.sequence_id, ": layer ", l,
          " needs K/V rows from position ", needed,
          " but the cache dropped them below ", cache.first_kept(l),
          step.kv_source == nullptr
              ? "; attach the KvSource the rows were dropped for"
              : "; a larger hot window needs a rebuild "
                "(ops/kvdirect/rebuild.h)"));
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> Model::KeepBegins(const SequenceStep& step) const {
  const KvCache& cache = *step.cache;
  const int64_t length = cache.length();
  // Rows below the KvSource's hot window, and a local layer's rows below its
  // window, are never read again, so they are freed.
  std::vector<int64_t> keep(config_.n_layers, 0);
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    if (step.kv_source != nullptr)
      keep[l] = step.kv_source->HotBegin(l, length);
    if (cache.trims_past_windows()) {
      keep[l] = std::max(keep[l],
                         WindowStart(config_.layers[l].sliding_window, length));
    }
  }
  return keep;
}

absl::Status Model::ReserveBlocks(
    absl::Span<const SequenceStep> batch,
    const std::vector<std::vector<int64_t>>& keep) const {
  // Per pool, in first-seen order; caches of one pool reserve together.
  std::vector<std::pair<KvBlockPool*, int64_t>> need;
  for (size_t s = 0; s < batch.size(); ++s) {
    const KvCache& cache = *batch[s].cache;
    const int64_t n = cache.BlocksToPrepare(
        keep[s], cache.length() + static_cast<int64_t>(batch[s].tokens.size()));
    auto it = std::find_if(need.begin(), need.end(), [&](const auto& p) {
      return p.first == cache.pool();
    });
    if (it == need.end()) {
      need.emplace_back(cache.pool(), n);
    } else {
      it->second += n;
    }
  }
  for (size_t i = 0; i < need.size(); ++i) {
    if (absl::Status s = need[i].first->Reserve(need[i].second); !s.ok()) {
      for (size_t j = 0; j < i; ++j) need[j].first->Unreserve(need[j].second);
      return absl::ResourceExhaustedError(
          absl::StrCat("forward step of ", batch.size(), " sequence(s) needs ",
                       need[i].second, " more K/V blocks: ", s.message()));
    }
  }
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

absl::Status Model::ForwardLayers(KvCache* cache, int64_t position, int64_t n,
                                  int64_t first_layer, int64_t end_layer,
                                  float* h, ResidualObserver* observer,
                                  int64_t sequence_id) const {
  const ModelConfig& c = config_;
  if (cache == nullptr || h == nullptr)
    return absl::InvalidArgumentError("ForwardLayers: null cache or residuals");
  if (cache->precision() != precision_ || cache->n_layers() != c.n_layers) {
    return absl::FailedPreconditionError(
        "ForwardLayers: K/V cache was made for another model or precision");
  }
  if (first_layer < 0 || first_layer > end_layer || end_layer > c.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("ForwardLayers: layers [", first_layer, ", ", end_layer,
                     ") are not a range of the model's ", c.n_layers));
  }
  if (n < 0 || position < 0 || position + n > c.context_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ForwardLayers: positions [", position, ", ", position + n,
        ") are outside the model's context of ", c.context_length));
  }
  for (int64_t l = first_layer; l < end_layer; ++l) {
    if (cache->first_kept(l) > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ForwardLayers: layer ", l, " dropped its rows below ",
          cache->first_kept(l), "; a partial prefill needs all of them"));
    }
  }
  if (n == 0 || first_layer == end_layer) return absl::OkStatus();
  for (int64_t l = first_layer; l < end_layer; ++l)
    KVD_RETURN_IF_ERROR(cache->ReserveLayer(l, position + n));
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
  std::copy(rows.begin(), rows.end(), h);
  return absl::OkStatus();
}

void Model::KvProjection(int64_t l, const float* h, int64_t m,
                         const float* angles, float* x, float* k, float* v,
                         cpu::ThreadPool* pool) const {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[l];
  const int64_t d = c.d_model, kvd = c.kv_dim(), hd = c.head_dim;
  const int64_t half = c.rope_dim / 2;
  ForRows(pool, m, [&](int64_t r) {
    cpu::RmsNorm(h + r * d, w.attn_norm.data(), c.rms_eps, d, x + r * d);
  });
  cpu::Gemm(x, m, d, w.wk.view(), k, kvd, pool);
  cpu::Gemm(x, m, d, w.wv.view(), v, kvd, pool);
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
               pool);
  cpu::Gemm(x.data(), m, d, w.wq.view(), q.data(), qd, pool);
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
    for (int64_t g = 0; g < c.n_kv_heads && !source; ++g)
      for (int64_t b = r; b < e; b += kQueryBlock)
        tasks.push_back({b, std::min(kQueryBlock, e - b), g});
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
  if (!tasks.empty()) pool->ParallelFor(tasks.size(), attend);
  if (any_source) {
    AttendFromSources(l, batch, row_seq, row_pos, q.data(), attn.data(), ws);
  }

  cpu::Gemm(attn.data(), m, qd, w.wo.view(), o.data(), d, pool);
  ForRows(pool, m, [&](int64_t r) {
    float* orow = o.data() + r * d;
    if (c.post_attn_norm)
      cpu::RmsNorm(orow, w.post_attn_norm.data(), c.rms_eps, d, orow);
    cpu::AddInPlace(h.data() + r * d, orow, d);
    cpu::RmsNorm(h.data() + r * d, w.ffn_norm.data(), c.rms_eps, d,
                 x.data() + r * d);
  });

  cpu::Gemm(x.data(), m, d, w.w_gate.view(), gate.data(), c.d_ff, pool);
  cpu::Gemm(x.data(), m, d, w.w_up.view(), up.data(), c.d_ff, pool);
  ForRows(pool, m, [&](int64_t r) {
    float* g = gate.data() + r * c.d_ff;
    const float* u = up.data() + r * c.d_ff;
    if (c.activation == Activation::kSilu) {
      cpu::SiluMul(g, u, c.d_ff, g);
    } else {
      cpu::GeluTanhMul(g, u, c.d_ff, g);
    }
  });
  cpu::Gemm(gate.data(), m, c.d_ff, w.w_down.view(), o.data(), d, pool);
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
