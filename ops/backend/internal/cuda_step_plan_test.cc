// Runs without a GPU: the step layout CudaModel uploads, read back through
// the paged kernels' own index arithmetic (attention_index.h), puts every
// (layer, sequence, position) K and V row in its own pool rows, inside blocks
// that sequence holds for that layer, and the flattened rows carry the right
// token, position, sequence and last row.
#include "ops/backend/internal/cuda_step_plan.h"

#include <algorithm>
#include <map>
#include <random>
#include <tuple>

#include "gtest/gtest.h"
#include "kernels/cuda/internal/attention_index.h"

namespace kvd::ops::internal {
namespace {

namespace ai = ::kvd::kernels::cuda::internal;

TEST(CudaStepPlan, BlocksFor) {
  EXPECT_EQ(BlocksFor(0, 32), 0);
  EXPECT_EQ(BlocksFor(1, 32), 1);
  EXPECT_EQ(BlocksFor(32, 32), 1);
  EXPECT_EQ(BlocksFor(33, 32), 2);
  EXPECT_EQ(BlocksFor(100, 64), 2);
}

TEST(CudaStepPlan, EveryRowLandsInItsOwnBlocks) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t n_layers = 1 + rng() % 4;
    const int64_t block_rows = 32 * (1 + rng() % 3);
    const int64_t kv_stride = 8 * (1 + rng() % 4);
    const int64_t n_seqs = 1 + rng() % 5;
    // Shuffled pool, enough blocks for everyone.
    std::vector<int32_t> free(400);
    for (size_t b = 0; b < free.size(); ++b) free[b] = b;
    std::shuffle(free.begin(), free.end(), rng);
    std::vector<std::vector<int32_t>> tokens(n_seqs);
    std::vector<std::vector<std::vector<int32_t>>> blocks(n_seqs);
    std::vector<StepSequence> seqs(n_seqs);
    for (int64_t i = 0; i < n_seqs; ++i) {
      const int64_t length = rng() % 150;
      tokens[i].resize(1 + rng() % 70);
      for (int32_t& t : tokens[i]) t = rng() % 1000;
      blocks[i].resize(n_layers);
      const int64_t need = BlocksFor(length + tokens[i].size(), block_rows);
      for (auto& layer : blocks[i]) {
        for (int64_t b = 0; b < need; ++b) {
          layer.push_back(free.back());
          free.pop_back();
        }
      }
      seqs[i] = {tokens[i], length, &blocks[i]};
    }
    const StepPlan plan = PlanStep(seqs, n_layers);
    ASSERT_EQ(plan.n_seqs, n_seqs);
    ASSERT_EQ(static_cast<int64_t>(plan.ints.size()),
              plan.table_offset(n_layers));
    const int32_t* ints = plan.ints.data();

    int64_t r = 0;
    for (int64_t i = 0; i < n_seqs; ++i) {
      for (size_t j = 0; j < tokens[i].size(); ++j, ++r) {
        EXPECT_EQ(ints[plan.tokens_offset() + r], tokens[i][j]);
        EXPECT_EQ(ints[plan.positions_offset() + r], seqs[i].length + j);
        EXPECT_EQ(ints[plan.row_seq_offset() + r], i);
      }
      EXPECT_EQ(ints[plan.last_row_offset() + i], r - 1);
    }
    ASSERT_EQ(r, plan.rows);

    // Where each (layer, sequence, position) row lives, as the kernels
    // compute it from the uploaded tables.
    std::map<int64_t, std::tuple<int64_t, int64_t, int64_t>> owner;
    const ai::KvPageLayout layout{block_rows, kv_stride};
    const int64_t block_values = 2 * block_rows * kv_stride;
    for (int64_t l = 0; l < n_layers; ++l) {
      for (int64_t i = 0; i < n_seqs; ++i) {
        const int32_t* table =
            ints + plan.table_offset(l) + i * plan.table_stride;
        const int64_t end = seqs[i].length + tokens[i].size();
        for (int64_t p = 0; p < end; ++p) {
          const int64_t k = ai::PagedKRowOffset(table, layout, p);
          const int64_t v = ai::PagedVRowOffset(table, layout, p);
          const int64_t block = k / block_values;
          EXPECT_EQ(v / block_values, block);
          EXPECT_EQ(block, blocks[i][l][p / block_rows]);
          for (int64_t off : {k, v}) {
            ASSERT_TRUE(owner.emplace(off, std::make_tuple(l, i, p)).second)
                << "two rows at pool offset " << off;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvd::ops::internal
