// Runs without a GPU: the index arithmetic the CUDA attention kernels share
// (internal/attention_index.h) compiled for the host. Checks that paged row
// lookup finds every row where a block-wise scatter put it, for shuffled
// block placement and several block sizes; that a chunk never straddles two
// blocks; and that the chunks one launch (or the fused recompute's split into
// cold groups + hot tail) folds are exactly the canonical chunks of the
// visible keys, in order, each once and whole. The expected chunk lists come
// from a brute-force enumeration of visible positions grouped by p / 32.
#include "kernels/cuda/internal/attention_index.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"

namespace kvd::kernels::cuda::internal {
namespace {

static_assert(kChunkRows == kvd::kernels::cpu::kAttentionChunk,
              "the GPU walks the CPU's canonical chunks");

using Chunks = std::vector<std::pair<int64_t, int64_t>>;

// Brute force: visible positions, split wherever p / 32 changes.
Chunks Reference(int64_t last, int64_t window) {
  Chunks out;
  for (int64_t p = 0; p <= last; ++p) {
    if (window > 0 && p < last - window + 1) continue;
    if (out.empty() || out.back().second / 32 != p / 32) {
      out.push_back({p, p});
    } else {
      out.back().second = p;
    }
  }
  return out;
}

// The kernel's loop (attention_core.cuh AttendSpan) over one launch's span.
void Walk(KeySpan span, Chunks* out) {
  for (int64_t c = ChunkOf(span.lo); c <= span.hi; c += kChunkRows) {
    const KeySpan ch = ClipChunk(c, span);
    out->push_back({ch.lo, ch.hi});
  }
}

TEST(AttentionIndex, OneLaunchWalksTheCanonicalChunks) {
  for (int64_t window : {0, 1, 5, 31, 32, 33, 64, 100}) {
    for (int64_t last = -1; last < 300; ++last) {
      Chunks got;
      Walk(LaunchSpan(last, window, 0, INT64_MAX), &got);
      ASSERT_EQ(got, Reference(last, window))
          << "last=" << last << " window=" << window;
    }
  }
}

TEST(AttentionIndex, FusedSplitWalksTheSameChunks) {
  // Cold groups [g * gr, min((g + 1) * gr, hot)) then the hot tail [hot, inf),
  // as PagedAttentionRecompute launches them.
  for (int64_t gr : {32, 64, 96, 256}) {
    for (int64_t hot : {0, 32, 64, 96, 160, 256, 288}) {
      for (int64_t window : {0, 1, 40, 64, 129}) {
        for (int64_t last = -1; last < 330; last += 3) {
          Chunks got;
          for (int64_t g = 0; g < ColdGroups(hot, gr); ++g) {
            const int64_t end = std::min((g + 1) * gr, hot);
            Walk(LaunchSpan(last, window, g * gr, end), &got);
          }
          Walk(LaunchSpan(last, window, hot, INT64_MAX), &got);
          ASSERT_EQ(got, Reference(last, window))
              << "gr=" << gr << " hot=" << hot << " window=" << window
              << " last=" << last;
        }
      }
    }
  }
}

TEST(AttentionIndex, ColdGroups) {
  EXPECT_EQ(ColdGroups(0, 64), 0);
  EXPECT_EQ(ColdGroups(32, 64), 1);
  EXPECT_EQ(ColdGroups(64, 64), 1);
  EXPECT_EQ(ColdGroups(96, 64), 2);
}

TEST(AttentionIndex, PagedRowsAreWhereABlockwiseScatterPutThem) {
  std::mt19937_64 rng(12345);
  for (int64_t block_rows : {32, 64, 96, 128}) {
    const int64_t stride = 24;  // kv heads * head_dim plus padding
    const int64_t positions = 5 * block_rows + 17;
    const int64_t seq_blocks = (positions + block_rows - 1) / block_rows;
    const int64_t pool_blocks = seq_blocks + 3;  // some never used
    std::vector<int32_t> table(pool_blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    table.resize(seq_blocks);
    // Distinct values per (K/V, position, column).
    auto kval = [&](int64_t p, int64_t d) {
      return static_cast<uint16_t>(2 * (p * stride + d) % 65521);
    };
    auto vval = [&](int64_t p, int64_t d) {
      return static_cast<uint16_t>((2 * (p * stride + d) + 1) % 65521);
    };
    std::vector<uint16_t> pool(pool_blocks * 2 * block_rows * stride, 0xffff);
    for (int64_t i = 0; i < seq_blocks; ++i) {
      uint16_t* blk = &pool[table[i] * 2 * block_rows * stride];
      for (int64_t r = 0; r < block_rows; ++r) {
        const int64_t p = i * block_rows + r;
        if (p >= positions) break;
        for (int64_t d = 0; d < stride; ++d) {
          blk[r * stride + d] = kval(p, d);
          blk[(block_rows + r) * stride + d] = vval(p, d);
        }
      }
    }
    const KvPageLayout layout{block_rows, stride};
    for (int64_t p = 0; p < positions; ++p) {
      const int64_t ko = PagedKRowOffset(table.data(), layout, p);
      const int64_t vo = PagedVRowOffset(table.data(), layout, p);
      for (int64_t d = 0; d < stride; ++d) {
        ASSERT_EQ(pool[ko + d], kval(p, d)) << "K p=" << p << " d=" << d;
        ASSERT_EQ(pool[vo + d], vval(p, d)) << "V p=" << p << " d=" << d;
      }
    }
    // The kernel reads row j of a chunk at K(chunk lo) + j * stride: valid
    // only if the chunk stays inside one block.
    for (int64_t last = 0; last < positions; last += 7) {
      Chunks chunks;
      Walk(LaunchSpan(last, 45, 0, INT64_MAX), &chunks);
      for (const auto& [lo, hi] : chunks) {
        EXPECT_EQ(lo / block_rows, hi / block_rows);
        EXPECT_EQ(
            PagedKRowOffset(table.data(), layout, hi),
            PagedKRowOffset(table.data(), layout, lo) + (hi - lo) * stride);
      }
    }
  }
}

}  // namespace
}  // namespace kvd::kernels::cuda::internal
