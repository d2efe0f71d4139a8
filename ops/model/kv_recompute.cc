// Model::RecomputeKv: KV-Direct's exact rebuild of cached K/V from residual
// checkpoints. It runs KvProjection, the very code Forward uses to produce the
// K/V it caches, with RoPE angles from the same RopeAngles call, so the rows
// cannot differ by a bit (DESIGN.md section 3; kv_recompute_test.cc).
// Model::AttendWithSource: attention for a sequence whose old K/V live only as
// residuals (KV-Direct bounded-memory decoding; ops/kvdirect).
// Model::AttendSelected: attention over a KeySelection's kept positions, for
// the eviction baselines KV-Direct is compared with (experiments only).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "ops/model/model.h"

namespace kvd::ops {

namespace cpu = kernels::cpu;

absl::Status Model::RecomputeKv(int64_t layer, const float* residuals,
                                const int64_t* positions, int64_t n,
                                uint8_t* k_out, uint8_t* v_out,
                                cpu::ThreadPool* pool) const {
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

  const int64_t half = c.rope_dim / 2, kvd = c.kv_dim();
  std::vector<float> angles(n * 2 * half);
  for (int64_t r = 0; r < n; ++r) {
    float* cos = angles.data() + r * 2 * half;
    cpu::RopeAngles(positions[r], c.layers[layer].rope_base, c.rope_dim, cos,
                    cos + half);
  }
  std::vector<float> x(n * c.d_model), k(n * kvd), v(n * kvd);
  KvProjection(layer, residuals, n, angles.data(), x.data(), k.data(), v.data(),
               pool);

  // The dtype conversion KvCache::WriteKey/WriteValue apply.
  if (precision_ == Precision::kF32) {
    std::memcpy(k_out, k.data(), k.size() * sizeof(float));
    std::memcpy(v_out, v.data(), v.size() * sizeof(float));
  } else {
    cpu::FloatToBf16(k.data(), reinterpret_cast<uint16_t*>(k_out), k.size());
    cpu::FloatToBf16(v.data(), reinterpret_cast<uint16_t*>(v_out), v.size());
  }
  return absl::OkStatus();
}

void Model::AttendWithSource(int64_t l, const SequenceStep& step, int64_t g,
                             const float* q, int64_t q_stride, int64_t nq,
                             int64_t pos0, float* out,
                             int64_t out_stride) const {
  const ModelConfig& c = config_;
  constexpr int64_t kChunk = cpu::kAttentionChunk;
  const int64_t hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
  const int64_t window = c.layers[l].sliding_window;
  const KvCache& cache = *step.cache;
  const int64_t hot = step.kv_source->HotBegin(l, cache.length());
  const size_t rb = cache.row_bytes();
  const size_t head_offset = g * hd * (rb / c.kv_dim());
  const cpu::WeightType type = precision_ == Precision::kF32
                                   ? cpu::WeightType::kF32
                                   : cpu::WeightType::kBf16;
  auto first_of = [&](int64_t i) {
    return window > 0 ? std::max<int64_t>(0, pos0 + i - window + 1)
                      : int64_t{0};
  };
  std::vector<cpu::OnlineSoftmax> states;
  states.reserve(nq);
  for (int64_t i = 0; i < nq; ++i)
    states.emplace_back(group, hd, c.attn_scale());
  // One chunk of rebuilt rows: the bounded scratch that replaces cold rows.
  std::vector<uint8_t> k_scratch(kChunk * rb), v_scratch(kChunk * rb);
  std::vector<float> h(kChunk * c.d_model);
  std::vector<int64_t> positions(kChunk);

  // The same chunks and key ranges per query as AttendCausalBlock.
  const int64_t last = pos0 + nq - 1;
  for (int64_t c0 = first_of(0) / kChunk * kChunk; c0 <= last; c0 += kChunk) {
    const int64_t c_end = std::min(c0 + kChunk - 1, last);
    const int64_t i_begin = std::max<int64_t>(0, c0 - pos0);
    int64_t i_end = nq;
    while (i_end > i_begin && first_of(i_end - 1) > c_end) --i_end;
    if (i_begin >= i_end) continue;
    // Rows [lo, c_end] of this chunk are visible to some query.
    const int64_t lo = std::max(c0, first_of(i_begin));
    const uint8_t* k_rows;
    const uint8_t* v_rows;
    if (lo >= hot) {
      k_rows = cache.KeyBytes(l, lo);
      v_rows = cache.ValueBytes(l, lo);
    } else {
      // Partly or wholly cold: rebuild the cold part and copy the hot rest,
      // so the chunk is still folded as one piece.
      const int64_t cold_end = std::min(c_end, hot - 1);
      const int64_t n_cold = cold_end - lo + 1;
      step.kv_source->ReadResiduals(l, lo, n_cold, h.data());
      for (int64_t r = 0; r < n_cold; ++r) positions[r] = lo + r;
      // Arguments were validated by Check; a failure here is a bug.
      const absl::Status s =
          RecomputeKv(l, h.data(), positions.data(), n_cold, k_scratch.data(),
                      v_scratch.data(), /*pool=*/nullptr);
      if (!s.ok()) std::abort();
      for (int64_t p = cold_end + 1; p <= c_end; ++p) {
        std::memcpy(k_scratch.data() + (p - lo) * rb, cache.KeyBytes(l, p), rb);
        std::memcpy(v_scratch.data() + (p - lo) * rb, cache.ValueBytes(l, p),
                    rb);
      }
      k_rows = k_scratch.data();
      v_rows = v_scratch.data();
    }
    for (int64_t i = i_begin; i < i_end; ++i) {
      const int64_t b = std::max(c0, first_of(i));
      const int64_t e = std::min(c_end, pos0 + i);
      if (b > e) continue;
      const cpu::KvRows k{type, k_rows + (b - lo) * rb + head_offset,
                          c.kv_dim()};
      const cpu::KvRows v{type, v_rows + (b - lo) * rb + head_offset,
                          c.kv_dim()};
      states[i].AddChunk(q + i * q_stride, k, v, e - b + 1);
    }
  }
  for (int64_t i = 0; i < nq; ++i) states[i].Finish(out + i * out_stride);
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

}  // namespace kvd::ops
