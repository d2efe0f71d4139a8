// Runs without a GPU: the batch checks, the all-or-nothing block reservation
// and its rollback, and the greedy loop CudaModel and TpCudaModel share,
// driven by hand-built views and a scripted fake forward.
#include "ops/backend/internal/cuda_batch.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::ops::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CudaBatch, CheckPoolOptions) {
  EXPECT_TRUE(CheckPoolOptions("Opts", 64, 0, 32).ok());
  EXPECT_TRUE(CheckPoolOptions("Opts", 32, int64_t{1} << 30, 32).ok());
  for (auto [rows, blocks] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 0}, {48, 0}, {-32, 0}, {32, -1}, {32, (int64_t{1} << 30) + 1}}) {
    const absl::Status s = CheckPoolOptions("Opts", rows, blocks, 32);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << rows;
    EXPECT_THAT(std::string(s.message()), HasSubstr("Opts: block_rows ("));
  }
}

TEST(CudaBatch, PoolBlocks) {
  EXPECT_EQ(PoolBlocks(7, 30, 2048, 64), 7);
  // min(16 * 100, 16384) = 1600 positions -> 25 blocks of 64, per layer.
  EXPECT_EQ(PoolBlocks(0, 3, 100, 64), 75);
  // Capped at 16384 positions -> 256 blocks of 64.
  EXPECT_EQ(PoolBlocks(0, 2, 8192, 64), 512);
}

struct Seq {
  std::vector<int32_t> tokens;
  int64_t length = 0;
  std::vector<std::vector<int32_t>> blocks;
  StepView View(bool ours = true) {
    return {this, ours, tokens, length, &blocks};
  }
};

TEST(CudaBatch, CheckBatchCountsTokens) {
  Seq a{{1, 2, 3}, 0, {{}}}, b{{4}, 10, {{}}};
  const std::vector<StepView> v = {a.View(), b.View()};
  absl::StatusOr<int64_t> m = CheckBatch(v, {100, 64}, "X forward");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, 4);
}

TEST(CudaBatch, CheckBatchRejectsEachBadStep) {
  Seq ok{{1}, 0, {{}}}, empty{{}, 0, {{}}}, bad_id{{100}, 0, {{}}},
      past{{1, 2}, 63, {{}}};
  auto message = [](std::vector<StepView> v) {
    absl::StatusOr<int64_t> m = CheckBatch(v, {100, 64}, "X forward");
    EXPECT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(m.status().message());
  };
  EXPECT_EQ(message({ok.View(), ok.View(false)}),
            "X forward: step 1 has no cache of this model");
  EXPECT_EQ(message({ok.View(), ok.View()}),
            "X forward: step 1's cache appears twice in the batch");
  EXPECT_EQ(message({empty.View()}), "X forward: step 0 has no tokens");
  EXPECT_EQ(message({bad_id.View()}),
            "X forward: step 0 has token id 100 outside the vocabulary [0, "
            "100)");
  EXPECT_EQ(message({past.View()}),
            "X forward: step 0 would reach position 65 past the context "
            "length 64");
  Seq big{std::vector<int32_t>(65536, 1), 0, {{}}};
  absl::StatusOr<int64_t> m = CheckBatch({big.View()}, {100, 1 << 20}, "X f");
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("65536 tokens in one step; at most 65535"));
}

TEST(CudaBatch, ReserveIsAllOrNothingAndReleaseUndoesIt) {
  absl::Mutex mu;
  std::vector<int32_t> free = {5, 4, 3, 2, 1, 0};  // 0 goes out first
  const BlockPool pool{&mu, &free, 6};
  // Two layers, block_rows 4. a holds 3 positions in one block per layer and
  // adds 2 -> 2 blocks (1 more); b is new with 1 token -> 1 block.
  Seq a{{7, 8}, 3, {{9}, {10}}}, b{{7}, 0, {{}, {}}};
  const std::vector<StepView> v = {a.View(), b.View()};
  absl::StatusOr<std::vector<int64_t>> added =
      ReserveBlocks(v, 2, 4, pool, "X pool", "XOptions");
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_THAT(*added, ElementsAre(1, 1));
  EXPECT_THAT(a.blocks[0], ElementsAre(9, 0));
  EXPECT_THAT(a.blocks[1], ElementsAre(10, 1));
  EXPECT_THAT(b.blocks[0], ElementsAre(2));
  EXPECT_THAT(b.blocks[1], ElementsAre(3));
  EXPECT_THAT(free, ElementsAre(5, 4));

  // Needs 2 layers x 2 blocks = 4 more; 2 free: nothing taken.
  Seq c{{1, 2, 3, 4, 5, 6, 7, 8}, 0, {{}, {}}};
  absl::StatusOr<std::vector<int64_t>> none =
      ReserveBlocks({c.View()}, 2, 4, pool, "X pool", "XOptions");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(none.status().message(),
            "X pool: the step needs 4 more blocks, 2 of 6 are free; finish or "
            "drop sequences, or raise XOptions::max_blocks");
  EXPECT_THAT(free, ElementsAre(5, 4));
  EXPECT_TRUE(c.blocks[0].empty());

  ReleaseBlocks(v, *added, pool);
  EXPECT_THAT(a.blocks[0], ElementsAre(9));
  EXPECT_THAT(a.blocks[1], ElementsAre(10));
  EXPECT_TRUE(b.blocks[0].empty() && b.blocks[1].empty());
  EXPECT_EQ(free.size(), 6u);
}

TEST(CudaBatch, PlanViewsUsesEachViewsTokensAndBlocks) {
  Seq a{{7, 8}, 3, {{4, 6}}};
  const StepPlan plan = PlanViews({a.View()}, 1);
  EXPECT_EQ(plan.rows, 2);
  EXPECT_EQ(plan.n_seqs, 1);
  EXPECT_EQ(plan.ints[plan.tokens_offset()], 7);
  EXPECT_EQ(plan.ints[plan.positions_offset() + 1], 4);
}

// A fake model: logits peak at (last token + 1) % 5, with a tie at 4 when
// the peak is 0 (the lower id must win).
struct FakeCache {
  std::vector<std::vector<int32_t>> calls;
};

TEST(CudaBatch, GreedyGenerateChunksThePrefillAndTakesArgmax) {
  FakeCache* seen = nullptr;
  FakeCache kept;
  auto new_cache = [] { return absl::StatusOr<FakeCache>(FakeCache{}); };
  auto forward = [&](FakeCache* cache, absl::Span<const int32_t> tokens,
                     std::vector<float>* logits) {
    cache->calls.emplace_back(tokens.begin(), tokens.end());
    seen = cache;
    kept = *cache;
    logits->assign(5, 0.0f);
    const int32_t peak = (tokens.back() + 1) % 5;
    (*logits)[peak] = 1.0f;
    if (peak == 0) (*logits)[4] = 1.0f;
    return absl::OkStatus();
  };
  std::vector<std::vector<float>> step_logits;
  absl::StatusOr<std::vector<int32_t>> out =
      GreedyGenerate("X generate", std::vector<int32_t>{1, 2, 3, 2, 3}, 4, 2,
                     &step_logits, new_cache, forward);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_NE(seen, nullptr);
  // Prefill 3 -> 4; then 4 -> 0 (tie with 4, lower id), 0 -> 1, 1 -> 2.
  EXPECT_THAT(*out, ElementsAre(4, 0, 1, 2));
  EXPECT_THAT(kept.calls,
              ElementsAre(ElementsAre(1, 2), ElementsAre(3, 2), ElementsAre(3),
                          ElementsAre(4), ElementsAre(0), ElementsAre(1)));
  ASSERT_EQ(step_logits.size(), 4u);
  EXPECT_EQ(step_logits[0][4], 1.0f);

  absl::StatusOr<std::vector<int32_t>> empty =
      GreedyGenerate("X generate", {}, 4, 0, nullptr, new_cache, forward);
  EXPECT_EQ(empty.status().message(), "X generate: empty prompt");
}

// A stand-in owner: records the blocks each handle gives back.
class BlockOwnerForTest {
 public:
  DeviceBlockCache<BlockOwnerForTest> NewCache(int64_t n_layers) {
    return DeviceBlockCache<BlockOwnerForTest>(this, n_layers);
  }
  static void Hold(DeviceBlockCache<BlockOwnerForTest>* cache, int32_t block,
                   int64_t length) {
    cache->blocks_[0].push_back(block);
    cache->length_ = length;
  }
  std::vector<int32_t> freed;

 private:
  friend DeviceBlockCache<BlockOwnerForTest>;
  void FreeBlocks(std::vector<std::vector<int32_t>>* blocks) {
    for (auto& layer : *blocks)
      freed.insert(freed.end(), layer.begin(), layer.end());
  }
};

TEST(DeviceBlockCache, BlocksGoBackOnceWhateverTheMoves) {
  BlockOwnerForTest owner;
  {
    auto a = owner.NewCache(2);
    BlockOwnerForTest::Hold(&a, 7, 30);
    auto b = std::move(a);  // a gives nothing back when it dies
    EXPECT_EQ(b.length(), 30);
    EXPECT_EQ(a.length(), 0);
    auto c = owner.NewCache(2);
    BlockOwnerForTest::Hold(&c, 9, 5);
    c = std::move(b);  // c's own block 9 goes back now
    EXPECT_THAT(owner.freed, ElementsAre(9));
    EXPECT_EQ(c.length(), 30);
  }
  EXPECT_THAT(owner.freed, ElementsAre(9, 7));
}

TEST(BackendPoolBlocks, ABudgetSizesThePoolAndMaxBlocksCapsIt) {
  // No budget: PoolBlocks' default, or max_blocks.
  EXPECT_EQ(BackendPoolBlocks(0, 1000, 0, 2, 100, 32),
            PoolBlocks(0, 2, 100, 32));
  EXPECT_EQ(BackendPoolBlocks(0, 1000, 7, 2, 100, 32), 7);
  // A budget alone: what fits, rounded down.
  EXPECT_EQ(BackendPoolBlocks(10'500, 1000, 0, 2, 100, 32), 10);
  // Both: the smaller, whichever it is.
  EXPECT_EQ(BackendPoolBlocks(10'500, 1000, 7, 2, 100, 32), 7);
  EXPECT_EQ(BackendPoolBlocks(10'500, 1000, 70, 2, 100, 32), 10);
  // A budget above the no-budget default is not capped by it.
  EXPECT_GT(BackendPoolBlocks(int64_t{1} << 40, 1000, 0, 2, 100, 32),
            PoolBlocks(0, 2, 100, 32));
}

}  // namespace
}  // namespace kvd::ops::internal
