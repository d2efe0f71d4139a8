// Test-only, for the paged attention device tests: scatters per-sequence
// contiguous K/V rows into a paged pool (paged_attention.h's layout) with
// shuffled block placement, every byte not written left NaN (0xffff) so a
// wrong lookup shows up as NaN output; the query schedule both tests run;
// the contiguous Attention reference they compare against, bit for bit.
#ifndef KVD_KERNELS_CUDA_INTERNAL_PAGED_TEST_UTIL_H_
#define KVD_KERNELS_CUDA_INTERNAL_PAGED_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/internal/test_util.h"

namespace kvd::kernels::cuda::testing {

struct HostPages {
  std::vector<uint16_t> pool;
  std::vector<int32_t> table;  // n_seqs * table_stride
  int64_t table_stride = 0;
};

// k[s], v[s]: len[s] rows of kv_stride values. Rows below skip_below[s] (if
// given) are left NaN, as if never cached. Three spare blocks stay NaN.
inline HostPages ScatterToPages(const std::vector<std::vector<uint16_t>>& k,
                                const std::vector<std::vector<uint16_t>>& v,
                                const std::vector<int64_t>& len,
                                int64_t kv_stride, int64_t block_rows,
                                std::mt19937_64* rng,
                                const std::vector<int64_t>& skip_below = {}) {
  HostPages h;
  int64_t total = 3;
  for (int64_t n : len) {
    const int64_t b = (n + block_rows - 1) / block_rows;
    h.table_stride = std::max(h.table_stride, b);
    total += b;
  }
  h.table_stride = std::max<int64_t>(h.table_stride, 1);
  std::vector<int32_t> order(total);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), *rng);
  h.pool.assign(total * 2 * block_rows * kv_stride, 0xffff);
  h.table.assign(len.size() * h.table_stride, -1);
  int64_t next = 0;
  for (size_t s = 0; s < len.size(); ++s) {
    const int64_t skip = skip_below.empty() ? 0 : skip_below[s];
    for (int64_t i = 0; i * block_rows < len[s]; ++i) {
      const int32_t blk = order[next++];
      h.table[s * h.table_stride + i] = blk;
      uint16_t* base = &h.pool[blk * 2 * block_rows * kv_stride];
      for (int64_t r = 0; r < block_rows; ++r) {
        const int64_t p = i * block_rows + r;
        if (p >= len[s]) break;
        if (p < skip) continue;
        std::copy_n(&k[s][p * kv_stride], kv_stride, base + r * kv_stride);
        std::copy_n(&v[s][p * kv_stride], kv_stride,
                    base + (block_rows + r) * kv_stride);
      }
    }
  }
  return h;
}

// The queries of a paged test: a causal prefill over every position of
// sequence 0, a decode query at each sequence's end, then one query with no
// keys (last -1) on sequence `empty_seq`.
struct Queries {
  std::vector<int32_t> seq, last;  // per query
  int64_t size() const { return static_cast<int64_t>(seq.size()); }
};

inline Queries MakeQueries(const std::vector<int64_t>& len, int32_t empty_seq) {
  Queries qs;
  for (int64_t p = 0; p < len[0]; ++p) {
    qs.seq.push_back(0);
    qs.last.push_back(static_cast<int32_t>(p));
  }
  for (size_t s = 0; s < len.size(); ++s) {
    qs.seq.push_back(static_cast<int32_t>(s));
    qs.last.push_back(static_cast<int32_t>(len[s] - 1));
  }
  qs.seq.push_back(empty_seq);
  qs.last.push_back(-1);
  return qs;
}

// The AttentionArgs fields ContiguousReference takes from `shape`; queries
// and outputs both q_stride apart.
inline AttentionArgs AttentionShape(int64_t n_heads, int64_t n_kv_heads,
                                    int64_t head_dim, float scale,
                                    int64_t kv_stride, int64_t window,
                                    int64_t q_stride) {
  AttentionArgs a;
  a.q_stride = q_stride;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.head_dim = head_dim;
  a.scale = scale;
  a.kv_stride = kv_stride;
  a.window = window;
  a.out_stride = q_stride;
  return a;
}

// Uploads q and the queries' last/seq, then fills ref (downloaded from dref,
// NaN-poisoned first) with the contiguous reference bits: one Attention
// launch per query over its sequence's rows dk/dv[seq[i]] (a query's bits do
// not depend on its batch: tested in attention_test). `shape` gives n_heads,
// n_kv_heads, head_dim, scale, kv_stride, window, q_stride and out_stride;
// the pointers and nq are set here. Call under ASSERT_NO_FATAL_FAILURE.
inline void ContiguousReference(
    const AttentionArgs& shape, const std::vector<float>& q, const Queries& qs,
    const std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>>& dk,
    const std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>>& dv,
    DeviceBuffer<float>* dq, DeviceBuffer<int32_t>* dlast,
    DeviceBuffer<int32_t>* dseq, DeviceBuffer<float>* dref,
    std::vector<float>* ref) {
  KVD_CUDA_ASSERT(dq->Upload(q));
  KVD_CUDA_ASSERT(dlast->Upload(qs.last));
  KVD_CUDA_ASSERT(dseq->Upload(qs.seq));
  KVD_CUDA_ASSERT(dref->Poison());
  for (int64_t i = 0; i < qs.size(); ++i) {
    AttentionArgs a = shape;
    a.q = dq->get() + i * shape.q_stride;
    a.nq = 1;
    a.k = dk[qs.seq[i]]->get();
    a.v = dv[qs.seq[i]]->get();
    a.last = dlast->get() + i;
    a.out = dref->get() + i * shape.q_stride;
    ASSERT_TRUE(Attention(a, nullptr).ok());
  }
  KVD_CUDA_SYNC();
  KVD_CUDA_ASSERT(dref->Download(ref));
}

// Each query's first q_width outputs have ref's bits and its row padding up
// to q_stride is still NaN; describe(i) names query i in a failure (only
// evaluated then). Call under ASSERT_NO_FATAL_FAILURE.
template <typename Describe>
void ExpectReferenceBits(const std::vector<float>& out,
                         const std::vector<float>& ref, int64_t nq,
                         int64_t q_width, int64_t q_stride, Describe describe) {
  for (int64_t i = 0; i < nq; ++i) {
    ASSERT_EQ(std::memcmp(&out[i * q_stride], &ref[i * q_stride], q_width * 4),
              0)
        << describe(i);
    for (int64_t j = q_width; j < q_stride; ++j)
      ASSERT_TRUE(std::isnan(out[i * q_stride + j])) << "padding overwritten";
  }
}

}  // namespace kvd::kernels::cuda::testing

#endif  // KVD_KERNELS_CUDA_INTERNAL_PAGED_TEST_UTIL_H_
