// Model::RecomputeKv: KV-Direct's exact rebuild of cached K/V from residual
// checkpoints. It runs KvProjection, the very code Forward uses to produce the
// K/V it caches, with RoPE angles from the same RopeAngles call, so the rows
// cannot differ by a bit (DESIGN.md section 3; kv_recompute_test.cc).
// Model::AttendFromSources: attention for the sequences whose old K/V live
// only as residuals (KV-Direct bounded-memory decoding; ops/kvdirect).
// Model::AttendSelected: attention over a KeySelection's kept positions, for
// the eviction baselines KV-Direct is compared with (experiments only).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "ops/model/model.h"

namespace kvd::ops {

namespace cpu = kernels::cpu;

namespace {

// The recompute buffers are kept per thread between calls (thread_local in
// RecomputeKv and RecomputeKvIntoCache):
// fresh ones cost a page fault per 4 KiB written, a sixth of a 4096-row
// recompute's time (//services/planner:recompute_benchmark). Large calls (a
// whole long session at once) do not pin theirs.
template <class Scratch>
void ReleaseIfLarge(Scratch& s) {
  constexpr size_t kKeepBytes = size_t{32} << 20;
  const size_t held = (s.h.capacity() + s.angles.capacity() + s.x.capacity() +
                       s.k.capacity() + s.v.capacity()) *
                          sizeof(float) +
                      s.k_rows.capacity() + s.v_rows.capacity();
  if (held > kKeepBytes) s = Scratch();
}

}  // namespace

absl::Status Model::RecomputeKv(int64_t layer, const float* residuals,
                                const int64_t* positions, int64_t n,
                                uint8_t* k_out, uint8_t* v_out,
                                cpu::ThreadPool* pool) const {
  KVD_RETURN_IF_ERROR(CheckWeights("RecomputeKv"));
  const ModelConfig& c = config_;
  if (layer < 0 || layer >= c.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("RecomputeKv: layer ", layer, " is outside [0, ",
                     c.n_layers, ") of model ", c.name));
  }
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RecomputeKv: negative token count ", n));
  }
  if (n == 0) return absl::OkStatus();
  if (residuals == nullptr || positions == nullptr || k_out == nullptr ||
      v_out == nullptr) {
    return absl::InvalidArgumentError("RecomputeKv: null buffer");
  }
  for (int64_t r = 0; r < n; ++r) {
    if (positions[r] < 0 || positions[r] >= c.context_length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RecomputeKv: position ", positions[r], " of row ", r,
          " is outside the model's context [0, ", c.context_length, ")"));
    }
  }

  thread_local Workspace::Recompute scratch;
  const uint8_t* k_rows;
  const uint8_t* v_rows;
  RecomputeRows(layer, residuals, positions, n, scratch, &k_rows, &v_rows,
                pool);
  const size_t bytes = n * c.kv_dim() * (precision_ == Precision::kF32 ? 4 : 2);
  std::memcpy(k_out, k_rows, bytes);
  std::memcpy(v_out, v_rows, bytes);
  ReleaseIfLarge(scratch);
  return absl::OkStatus();
}

void Model::RecomputeRows(int64_t layer, const float* residuals,
                          const int64_t* positions, int64_t n,
                          Workspace::Recompute& s, const uint8_t** k_rows,
                          const uint8_t** v_rows, cpu::ThreadPool* pool) const {
  const ModelConfig& c = config_;
  const int64_t half = c.rope_dim / 2, kvd = c.kv_dim();
  s.angles.resize(n * 2 * half);
  s.x.resize(n * c.d_model);
  s.k.resize(n * kvd);
  s.v.resize(n * kvd);
  // RopeAngles's values, kept by position: every layer asks again. Rows
  // past the table's cap are computed, so large calls still share them out.
  auto angles = [&](int64_t begin, int64_t end) {
    rope_angles_.Angles(c.layers[layer].rope_base, c.rope_dim,
                        positions + begin, end - begin,
                        s.angles.data() + begin * 2 * half);
  };
  if (pool != nullptr && n >= 64) {
    pool->ParallelFor(n, angles);
  } else {
    angles(0, n);
  }
  KvProjection(layer, residuals, n, s.angles.data(), s.x.data(), s.k.data(),
               s.v.data(), pool);
  // The dtype conversion KvCache::WriteKey/WriteValue apply.
  if (precision_ == Precision::kF32) {
    *k_rows = reinterpret_cast<const uint8_t*>(s.k.data());
    *v_rows = reinterpret_cast<const uint8_t*>(s.v.data());
    return;
  }
  s.k_rows.resize(n * kvd * 2);
  s.v_rows.resize(n * kvd * 2);
  cpu::FloatToBf16(s.k.data(), reinterpret_cast<uint16_t*>(s.k_rows.data()),
                   n * kvd);
  cpu::FloatToBf16(s.v.data(), reinterpret_cast<uint16_t*>(s.v_rows.data()),
                   n * kvd);
  *k_rows = s.k_rows.data();
  *v_rows = s.v_rows.data();
}

namespace {

constexpr int64_t kChunk = cpu::kAttentionChunk;

// One sequence of the batch that has a KvSource, at one layer.
struct SourceSeq {
  const SequenceStep* step;
  int64_t pos0, nq;  // its query positions pos0 .. pos0 + nq - 1
  int64_t window;    // the layer's sliding window (0: none)
  int64_t hot;       // HotBegin: rows below come from residuals
  int64_t first_of(int64_t i) const {
    return window > 0 ? std::max<int64_t>(0, pos0 + i - window + 1)
                      : int64_t{0};
  }
  int64_t last() const { return pos0 + nq - 1; }
  // Cold rows [first_of(0), hot): exactly the rows below `hot` that
  // AttendCausalBlock's chunk loop visits (a chunk below HotBegin <= pos0
  // is seen by query 0 on, so its visible part starts at max(c0,
  // first_of(0))).
  int64_t cold_begin() const { return std::min(first_of(0), hot); }
};

// Cold rows [first, first + n) of sequence `seq` at rows [offset, offset + n)
// of a round's scratch; `first` .. first + n are whole chunks' cold parts.
struct Segment {
  int64_t seq, first, n, offset;
};

// One (sequence, K/V head, block of queries): its online-softmax states live
// across the rounds, so every query folds its chunks in the canonical order.
struct SourceTask {
  int64_t seq, g, i0, nq;  // queries i0 .. i0 + nq - 1 of the sequence
  const float* q;          // query i0's group x head_dim values, stride qd
  float* out;
  std::vector<cpu::OnlineSoftmax> states;
  std::vector<float> qm;      // queries packed for the score GEMM
  std::vector<float> scores;  // nq x group x kChunk
};

}  // namespace

void Model::AttendFromSources(int64_t l, absl::Span<const SequenceStep> batch,
                              const std::vector<int64_t>& row_seq,
                              const std::vector<int64_t>& row_pos,
                              const float* q, float* attn,
                              Workspace& ws) const {
  const ModelConfig& c = config_;
  const int64_t hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
  const int64_t qd = c.q_dim(), d = c.d_model;
  const cpu::WeightType type = precision_ == Precision::kF32
                                   ? cpu::WeightType::kF32
                                   : cpu::WeightType::kBf16;
  cpu::ThreadPool* pool = pool_.get();
  constexpr int64_t kQueryBlock = 64;

  std::vector<SourceSeq> seqs;
  std::vector<SourceTask> tasks;
  const int64_t m = row_seq.size();
  for (int64_t r = 0; r < m;) {
    int64_t e = r + 1;
    while (e < m && row_seq[e] == row_seq[r]) ++e;
    const SequenceStep& step = batch[row_seq[r]];
    if (step.kv_source != nullptr) {
      const int64_t s = seqs.size();
      seqs.push_back({&step, row_pos[r], e - r, c.layers[l].sliding_window,
                      step.kv_source->HotBegin(l, step.cache->length())});
      for (int64_t g = 0; g < c.n_kv_heads; ++g) {
        for (int64_t b = r; b < e; b += kQueryBlock) {
          SourceTask t;
          t.seq = s;
          t.g = g;
          t.i0 = b - r;
          t.nq = std::min(kQueryBlock, e - b);
          t.q = q + b * qd + g * group * hd;
          t.out = attn + b * qd + g * group * hd;
          tasks.push_back(std::move(t));
        }
      }
    }
    r = e;
  }
  if (seqs.empty()) return;

  const size_t rb = seqs[0].step->cache->row_bytes();
  const size_t elem = rb / c.kv_dim();
  auto prepare = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      SourceTask& task = tasks[t];
      task.states.reserve(task.nq);
      for (int64_t i = 0; i < task.nq; ++i)
        task.states.emplace_back(group, hd, c.attn_scale());
      task.qm.resize(task.nq * group * hd);
      for (int64_t i = 0; i < task.nq; ++i) {
        std::copy(task.q + i * qd, task.q + i * qd + group * hd,
                  task.qm.data() + i * group * hd);
      }
      task.scores.resize(task.nq * group * kChunk);
    }
  };
  pool->ParallelFor(tasks.size(), prepare);

  // Folds the chunk starting at c0 whose visible rows [lo, c_end] are at
  // k_rows / v_rows, for the task's queries, exactly as AttendCausalBlock:
  // one score GEMM for the block's queries that see the chunk, then each
  // query adds its own key range [max(c0, first_i), min(c_end, pos_i)].
  auto fold = [&](SourceTask& task, int64_t c0, int64_t lo, int64_t c_end,
                  const uint8_t* k_rows, const uint8_t* v_rows) {
    const SourceSeq& sq = seqs[task.seq];
    const size_t head = task.g * hd * elem;
    int64_t ja = std::max<int64_t>(0, c0 - sq.pos0 - task.i0);
    int64_t jb = task.nq;
    while (jb > ja && sq.first_of(task.i0 + jb - 1) > c_end) --jb;
    if (ja >= jb) return;
    const cpu::WeightView kw{type, k_rows + head, c_end - lo + 1, hd,
                             c.kv_dim()};
    cpu::Gemm(task.qm.data() + ja * group * hd, (jb - ja) * group, hd, kw,
              task.scores.data(), kChunk, nullptr);
    for (int64_t j = ja; j < jb; ++j) {
      const int64_t i = task.i0 + j;
      const int64_t b = std::max(c0, sq.first_of(i));
      const int64_t e = std::min(c_end, sq.pos0 + i);
      if (b > e) continue;
      const cpu::KvRows v{type, v_rows + (b - lo) * rb + head, c.kv_dim()};
      task.states[j].AddScores(
          task.scores.data() + (j - ja) * group * kChunk + (b - lo), kChunk, v,
          e - b + 1);
    }
  };

  // Cold rows, in rounds. Each round takes whole chunks' cold parts, in
  // position order per sequence, so a task folds its cold chunks in order.
  Workspace::Recompute& s = ws.recompute;
  std::vector<Segment> round;
  std::vector<int64_t> next(seqs.size());  // next cold row per sequence
  for (size_t i = 0; i < seqs.size(); ++i) next[i] = seqs[i].cold_begin();
  // A chunk straddling the hot boundary, rebuilt whole (cold part recomputed,
  // hot part copied from the cache), so it still folds as one piece.
  std::vector<uint8_t> k_straddle, v_straddle;
  for (;;) {
    round.clear();
    int64_t rows = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      while (next[i] < seqs[i].hot) {
        const int64_t end =
            std::min((next[i] / kChunk + 1) * kChunk, seqs[i].hot);
        const int64_t n = end - next[i];
        if (rows + n > kRecomputeRows) break;
        if (!round.empty() && round.back().seq == static_cast<int64_t>(i)) {
          round.back().n += n;
        } else {
          round.push_back({static_cast<int64_t>(i), next[i], n, rows});
        }
        rows += n;
        next[i] = end;
      }
      if (rows + kChunk > kRecomputeRows) break;
    }
    if (rows == 0) break;

    s.h.resize(rows * d);
    s.positions.resize(rows);
    // Gather the residual rows in pieces of up to one chunk.
    std::vector<Segment> pieces;
    for (const Segment& g : round) {
      for (int64_t p = 0; p < g.n; p += kChunk)
        pieces.push_back(
            {g.seq, g.first + p, std::min(kChunk, g.n - p), g.offset + p});
    }
    pool->ParallelFor(pieces.size(), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const Segment& p = pieces[i];
        seqs[p.seq].step->kv_source->ReadResiduals(l, p.first, p.n,
                                                   s.h.data() + p.offset * d);
        for (int64_t r = 0; r < p.n; ++r)
          s.positions[p.offset + r] = p.first + r;
      }
    });
    const uint8_t* k_rows;
    const uint8_t* v_rows;
    RecomputeRows(l, s.h.data(), s.positions.data(), rows, s, &k_rows, &v_rows,
                  pool);

    // Chunks straddling the hot boundary, one per sequence at most.
    std::vector<int64_t> straddle(seqs.size(), -1);  // index into buffers
    int64_t n_straddle = 0;
    for (const Segment& g : round) {
      const SourceSeq& sq = seqs[g.seq];
      const int64_t end = g.first + g.n;
      if (end == sq.hot && end % kChunk != 0) straddle[g.seq] = n_straddle++;
    }
    k_straddle.resize(n_straddle * kChunk * rb);
    v_straddle.resize(n_straddle * kChunk * rb);
    for (const Segment& g : round) {
      if (straddle[g.seq] < 0) continue;
      const SourceSeq& sq = seqs[g.seq];
      const KvCache& cache = *sq.step->cache;
      const int64_t c0 = (sq.hot - 1) / kChunk * kChunk;
      const int64_t lo = std::max(c0, g.first);
      const int64_t c_end = std::min(c0 + kChunk - 1, sq.last());
      uint8_t* kb = k_straddle.data() + straddle[g.seq] * kChunk * rb;
      uint8_t* vb = v_straddle.data() + straddle[g.seq] * kChunk * rb;
      const int64_t n_cold = sq.hot - lo;
      const int64_t from = g.offset + (lo - g.first);
      std::memcpy(kb, k_rows + from * rb, n_cold * rb);
      std::memcpy(vb, v_rows + from * rb, n_cold * rb);
      for (int64_t p = sq.hot; p <= c_end; ++p) {
        std::memcpy(kb + (p - lo) * rb, cache.KeyBytes(l, p), rb);
        std::memcpy(vb + (p - lo) * rb, cache.ValueBytes(l, p), rb);
      }
    }

    // Fold this round's chunks into every task of the sequences it served.
    std::vector<int64_t> seg_of(seqs.size(), -1);
    for (size_t i = 0; i < round.size(); ++i) seg_of[round[i].seq] = i;
    pool->ParallelFor(tasks.size(), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        SourceTask& task = tasks[t];
        if (seg_of[task.seq] < 0) continue;
        const Segment& g = round[seg_of[task.seq]];
        const SourceSeq& sq = seqs[task.seq];
        for (int64_t lo = g.first; lo < g.first + g.n;) {
          const int64_t c0 = lo / kChunk * kChunk;
          const int64_t c_end = std::min(c0 + kChunk - 1, sq.last());
          const int64_t cold_end = std::min(c0 + kChunk, sq.hot);
          if (c_end >= sq.hot) {
            const int64_t b = straddle[task.seq] * kChunk * rb;
            fold(task, c0, lo, c_end, k_straddle.data() + b,
                 v_straddle.data() + b);
          } else {
            const int64_t from = g.offset + (lo - g.first);
            fold(task, c0, lo, c_end, k_rows + from * rb, v_rows + from * rb);
          }
          lo = cold_end;
        }
      }
    });
  }

  // Hot chunks straight from the cache, then the outputs.
  pool->ParallelFor(tasks.size(), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      SourceTask& task = tasks[t];
      const SourceSeq& sq = seqs[task.seq];
      const KvCache& cache = *sq.step->cache;
      const int64_t first = std::max(sq.hot, sq.first_of(task.i0));
      for (int64_t c0 = first / kChunk * kChunk; c0 <= sq.last();
           c0 += kChunk) {
        // Visible rows [lo, c_end] for the block, as AttendCausalBlock's lo.
        const int64_t c_end = std::min(c0 + kChunk - 1, sq.last());
        const int64_t i_begin = std::max<int64_t>(0, c0 - sq.pos0);
        const int64_t lo = std::max(c0, sq.first_of(i_begin));
        if (lo < sq.hot) continue;  // folded in a round
        fold(task, c0, lo, c_end, cache.KeyBytes(l, lo),
             cache.ValueBytes(l, lo));
      }
      for (int64_t i = 0; i < task.nq; ++i)
        task.states[i].Finish(task.out + i * qd);
    }
  });
}

absl::Status Model::CheckKeySelection(const SequenceStep& step) const {
  if (step.key_selection == nullptr) return absl::OkStatus();
  if (step.kv_source != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence ", step.sequence_id,
        ": a KeySelection (eviction experiment) cannot be combined with a "
        "KvSource"));
  }
  const int64_t length = step.cache->length();
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    for (int64_t g = 0; g < config_.n_kv_heads; ++g) {
      const absl::Span<const int64_t> kept =
          step.key_selection->KeptKeys(l, g, length);
      for (size_t j = 0; j < kept.size(); ++j) {
        if (kept[j] < 0 || kept[j] >= length ||
            (j > 0 && kept[j] <= kept[j - 1])) {
          return absl::InvalidArgumentError(absl::StrCat(
              "sequence ", step.sequence_id, ": KeySelection of layer ", l,
              ", K/V head ", g, " lists position ", kept[j], " at index ", j,
              "; kept positions must ascend strictly within the ", length,
              " cached ones"));
        }
      }
    }
  }
  return absl::OkStatus();
}

void Model::AttendSelected(int64_t l, const SequenceStep& step, int64_t g,
                           const float* q, int64_t q_stride, int64_t nq,
                           int64_t pos0, float* out, int64_t out_stride) const {
  const ModelConfig& c = config_;
  constexpr int64_t kChunk = cpu::kAttentionChunk;
  const int64_t hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
  const int64_t kvd = c.kv_dim(), window = c.layers[l].sliding_window;
  const KvCache& cache = *step.cache;
  const int64_t cached = cache.length();  // this step's rows start here
  KeySelection& selection = *step.key_selection;
  const absl::Span<const int64_t> kept = selection.KeptKeys(l, g, cached);
  const bool want_weights = selection.WantsWeights();
  const size_t rb = cache.row_bytes();
  const size_t head_offset = g * hd * (rb / kvd);
  const cpu::WeightType type = precision_ == Precision::kF32
                                   ? cpu::WeightType::kF32
                                   : cpu::WeightType::kBf16;
  std::vector<uint8_t> k_scratch(kChunk * rb), v_scratch(kChunk * rb);
  std::vector<int64_t> keys;
  std::vector<float> weights;
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t pos = pos0 + i;
    const int64_t first =
        window > 0 ? std::max<int64_t>(0, pos - window + 1) : int64_t{0};
    keys.clear();
    for (int64_t p : kept) {
      if (p >= first) keys.push_back(p);
    }
    for (int64_t p = std::max(cached, first); p <= pos; ++p) keys.push_back(p);
    // The visible keys of one canonical chunk fold as one piece, so a full
    // selection folds exactly the pieces AttendCausalBlock does.
    cpu::OnlineSoftmax state(group, hd, c.attn_scale());
    if (want_weights) weights.resize(group * keys.size());
    for (size_t b = 0; b < keys.size();) {
      size_t e = b + 1;
      while (e < keys.size() && keys[e] / kChunk == keys[b] / kChunk) ++e;
      const int64_t n = e - b;
      const uint8_t* k_rows = cache.KeyBytes(l, keys[b]);
      const uint8_t* v_rows = cache.ValueBytes(l, keys[b]);
      if (keys[e - 1] - keys[b] != n - 1) {  // gaps: gather the rows
        for (int64_t j = 0; j < n; ++j) {
          std::memcpy(k_scratch.data() + j * rb, cache.KeyBytes(l, keys[b + j]),
                      rb);
          std::memcpy(v_scratch.data() + j * rb,
                      cache.ValueBytes(l, keys[b + j]), rb);
        }
        k_rows = k_scratch.data();
        v_rows = v_scratch.data();
      }
      state.AddChunk(q + i * q_stride,
                     cpu::KvRows{type, k_rows + head_offset, kvd},
                     cpu::KvRows{type, v_rows + head_offset, kvd}, n);
      if (want_weights) {  // raw scores into columns [b, e) of `weights`
        cpu::Gemm(q + i * q_stride, group, hd,
                  cpu::WeightView{type, k_rows + head_offset, n, hd, kvd},
                  weights.data() + b, keys.size(), nullptr);
      }
      b = e;
    }
    state.Finish(out + i * out_stride);
    if (!want_weights) continue;
    // A plain softmax of the same scores (accumulated in double); only the
    // baselines' rankings read it, never the attention output.
    const int64_t n = keys.size();
    for (int64_t h = 0; h < group; ++h) {
      float* w = weights.data() + h * n;
      const double max = double{*std::max_element(w, w + n)} * c.attn_scale();
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        w[j] =
            static_cast<float>(std::exp(double{w[j]} * c.attn_scale() - max));
        sum += w[j];
      }
      for (int64_t j = 0; j < n; ++j) w[j] = static_cast<float>(w[j] / sum);
    }
    selection.OnWeights(l, g, pos, keys, weights.data());
  }
}

absl::Status Model::RecomputeKvIntoCache(int64_t layer, const float* residuals,
                                         int64_t position, int64_t n,
                                         KvCache* cache) const {
  KVD_RETURN_IF_ERROR(CheckWeights("RecomputeKvIntoCache"));
  KVD_RETURN_IF_ERROR(
      CheckRecomputeTarget(config_, precision_, layer, position, n, cache));
  if (!cache->pool()->host_accessible()) {
    return absl::InvalidArgumentError(
        "RecomputeKvIntoCache: the cache lives in device memory; the CPU "
        "backend cannot write it");
  }
  if (n == 0) return absl::OkStatus();
  std::vector<int64_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = position + i;
  thread_local Workspace::Recompute scratch;
  const uint8_t* k_rows;
  const uint8_t* v_rows;
  RecomputeRows(layer, residuals, positions.data(), n, scratch, &k_rows,
                &v_rows, pool_.get());
  cache->WriteRows(layer, position, n, k_rows, v_rows);
  ReleaseIfLarge(scratch);
  return absl::OkStatus();
}

}  // namespace kvd::ops
