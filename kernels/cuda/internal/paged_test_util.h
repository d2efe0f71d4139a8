// Test-only: scatters per-sequence contiguous K/V rows into a paged pool
// (paged_attention.h's layout) with shuffled block placement, every byte not
// written left NaN (0xffff) so a wrong lookup shows up as NaN output.
#ifndef KVD_KERNELS_CUDA_INTERNAL_PAGED_TEST_UTIL_H_
#define KVD_KERNELS_CUDA_INTERNAL_PAGED_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

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

}  // namespace kvd::kernels::cuda::testing

#endif  // KVD_KERNELS_CUDA_INTERNAL_PAGED_TEST_UTIL_H_
