// Canonical chunked attention with an online softmax.
//
// For one query position, a group of query heads that share one K/V head visits
// the keys in chunks of kAttentionChunk absolute positions ([0, C), [C, 2C),
// ...), clipped to the query's visible range, always from low to high
// positions. Each chunk is folded into a running (max, sum, accumulator) state
// in a fixed order. Where a chunk's K/V come from -- the hot cache, or rows
// just recomputed from residual checkpoints into a scratch buffer -- cannot
// change a bit, and prefill and decode take the same path for the same query.
//
//   OnlineSoftmax state(group, head_dim, scale);
//   for (each chunk c overlapping [first, last]) state.AddChunk(q, k_rows,
//   v_rows, n); state.Finish(out);
//
// Thread-safety: one OnlineSoftmax per thread; the K/V it reads must not change
// meanwhile.
#ifndef KVD_KERNELS_CPU_ATTENTION_H_
#define KVD_KERNELS_CPU_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace kvd::kernels::cpu {

// Key positions per chunk of the canonical attention order.
inline constexpr int64_t kAttentionChunk = 32;

// Rows of K or V. Contiguous (blocks null): row r's head_dim values start at
// data + r * stride (elements). Paged (blocks set): row r starts at
// blocks[r / block_rows] + offset_bytes + (r % block_rows) * stride elements,
// and data is unused. block_rows must be a multiple of kAttentionChunk, so
// the rows of one canonical chunk are contiguous at `stride` inside one block
// and the kernels read them exactly as from a contiguous store.
struct KvRows {
  WeightType type = WeightType::kF32;  // fp32 or bf16 storage
  const void* data = nullptr;
  int64_t stride = 0;
  const uint8_t* const* blocks = nullptr;
  int64_t block_rows = 0;
  size_t offset_bytes = 0;

  // Address of row r.
  const void* Row(int64_t r) const {
    const size_t elem = type == WeightType::kBf16 ? 2 : 4;
    if (blocks == nullptr)
      return static_cast<const char*>(data) + r * stride * elem;
    return blocks[r / block_rows] + offset_bytes +
           (r % block_rows) * stride * elem;
  }
  // The same rows, `elements` further into each (e.g. one K/V head's slice).
  KvRows Shifted(int64_t elements) const {
    const size_t bytes = elements * (type == WeightType::kBf16 ? 2 : 4);
    KvRows r = *this;
    if (blocks == nullptr) {
      r.data = static_cast<const char*>(data) + bytes;
    } else {
      r.offset_bytes += bytes;
    }
    return r;
  }
};

class OnlineSoftmax {
 public:
  // `group` query heads of `head_dim` values share the K/V; scores are scaled
  // by `scale`.
  OnlineSoftmax(int64_t group, int64_t head_dim, float scale);

  // Folds in n <= kAttentionChunk consecutive keys/values (rows 0..n-1 of k
  // and v; paged rows must not cross a block). q holds group x head_dim
  // values.
  void AddChunk(const float* q, const KvRows& k, const KvRows& v, int64_t n);

  // As AddChunk, with the raw scores q_i . k_j already computed by the
  // canonical GEMM: scores[i * stride + j] for query head i < group and key j <
  // n.
  void AddScores(const float* scores, int64_t stride, const KvRows& v,
                 int64_t n);

  // Whether the group's query heads take each value row together (one load
  // for all of them) or one head after another (the default). Same bits
  // either way; which is faster depends on where the rows come from: a block
  // of queries finds them in cache, where fewer loads win, while one query at
  // depth streams them from DRAM, where whole rows per pass win (measured end
  // to end on Zen 4: fusing cost single-thread decode at 8064 keys 5-10%).
  void set_fuse_heads(bool fuse) { fuse_heads_ = fuse; }

  // out[group x head_dim] = softmax-weighted sum of values (zeros if no key was
  // added).
  void Finish(float* out) const;

 private:
  int64_t group_;
  int64_t head_dim_;
  float scale_;
  std::vector<float> max_;
  std::vector<float> sum_;
  std::vector<float> acc_;
  std::vector<float> scores_;
  // Per query head, where Fold finds its weights and accumulator.
  std::vector<const float*> weights_;
  std::vector<float*> accs_;
  bool fuse_heads_ = false;

  void Fold(const KvRows& v, int64_t n);
};

// Attention for one query position over keys [first, last] of a K/V store
// (rows indexed by absolute position, contiguous or paged), visiting them in
// canonical chunks.
void AttendRange(const float* q, int64_t group, int64_t head_dim, float scale,
                 const KvRows& k, const KvRows& v, int64_t first, int64_t last,
                 float* out);

// AttendRange for one query position and every K/V head of a layer at once,
// spread over the pool's threads: q and out hold n_kv_heads x group x
// head_dim values, K/V head g's rows are k.Shifted(g * head_dim) (likewise
// v). At decode there is one query, and a layer's few K/V heads (SmolLM2
// has 3) do not share out evenly over a pool's threads, so the work is cut
// across the parts of the computation that are independent instead: the
// scores by spans of key chunks, the softmax weights by query head, the
// weighted values by slices of head_dim. Every output element sees the same
// operations in the same order as in AttendRange, so the result is
// bit-identical to it. `pool` null runs AttendRange per K/V head.
void AttendRangeAcrossThreads(const float* q, int64_t n_kv_heads, int64_t group,
                              int64_t head_dim, float scale, const KvRows& k,
                              const KvRows& v, int64_t first, int64_t last,
                              float* out, ThreadPool* pool);

// Causal attention for `nq` consecutive query positions pos0, pos0 + 1, ... of
// one sequence and one K/V head: query i sees keys [max(0, pos_i - window + 1),
// pos_i] (window 0: all). Query row i holds group x head_dim values at q + i *
// q_stride; its output goes to out + i * out_stride. Scores for the whole block
// come from one GEMM per key chunk, but each query folds in exactly the chunks
// and keys AttendRange would, in the same order: the result is bit-identical to
// calling AttendRange once per query.
void AttendCausalBlock(const float* q, int64_t q_stride, int64_t nq,
                       int64_t group, int64_t head_dim, float scale,
                       const KvRows& k, const KvRows& v, int64_t pos0,
                       int64_t window, float* out, int64_t out_stride);

}  // namespace kvd::kernels::cpu

#endif  // KVD_KERNELS_CPU_ATTENTION_H_
