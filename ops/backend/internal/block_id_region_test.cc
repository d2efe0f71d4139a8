// Runs without a GPU: a pool over a block-id region behaves like a pool over
// memory (block numbers, budget, block tables) while no byte of it can be
// touched from the host.
#include "ops/backend/internal/block_id_region.h"

#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "ops/backend/internal/cuda_cache_plan.h"
#include "ops/backend/testing/tiny_config.h"
#include "ops/model/kv_cache.h"

namespace kvd::ops::internal {
namespace {

ModelConfig TinyConfig() { return testing::TinyHostConfig(2); }

std::unique_ptr<KvBlockPool> PoolOver(const KvBlockPool::Region& region,
                                      size_t row_bytes, int64_t block_rows) {
  KvBlockPool::Options o;
  o.block_rows = block_rows;
  auto pool = KvBlockPool::CreateInRegion(row_bytes, o, region);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

TEST(BlockIdRegion, BlocksAreNumberedAndCountedLikeMemory) {
  const ModelConfig c = TinyConfig();
  const size_t row_bytes = KvCache::RowBytes(c, Precision::kBf16);
  const int64_t blocks = 6;
  auto region = ReserveBlockIdRegion(blocks, 2 * 32 * row_bytes);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_FALSE(region->host_accessible);
  EXPECT_NE(region->owner, nullptr);
  auto pool = PoolOver(*region, row_bytes, 32);
  ASSERT_NE(pool, nullptr);
  EXPECT_FALSE(pool->host_accessible());
  EXPECT_EQ(pool->capacity_blocks(), blocks);

  std::set<int64_t> seen;
  std::vector<uint8_t*> taken;
  for (int64_t i = 0; i < blocks; ++i) {
    auto b = pool->Allocate();
    ASSERT_TRUE(b.ok()) << b.status();
    const int64_t index = pool->BlockIndex(*b);
    EXPECT_GE(index, 0);
    EXPECT_LT(index, blocks);
    seen.insert(index);
    taken.push_back(*b);
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), blocks);
  EXPECT_EQ(pool->Allocate().status().code(),
            absl::StatusCode::kResourceExhausted);
  for (uint8_t* b : taken) pool->Release(b);
  EXPECT_TRUE(pool->Allocate().ok());
}

TEST(BlockIdRegion, CachesGetBlockTablesOfBlockNumbers) {
  const ModelConfig c = TinyConfig();
  const size_t row_bytes = KvCache::RowBytes(c, Precision::kBf16);
  auto region = ReserveBlockIdRegion(16, 2 * 32 * row_bytes);
  ASSERT_TRUE(region.ok());
  auto pool = PoolOver(*region, row_bytes, 32);
  ASSERT_NE(pool, nullptr);
  auto a = KvCache::InPool(c, Precision::kBf16, pool.get());
  auto b = KvCache::InPool(c, Precision::kBf16, pool.get());
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->Reserve(70).ok());  // 3 blocks per layer
  ASSERT_TRUE(b->Reserve(33).ok());  // 2 blocks per layer
  std::set<int32_t> numbers;
  for (const KvCache* cache : {&*a, &*b}) {
    for (int64_t l = 0; l < c.n_layers; ++l) {
      std::vector<int32_t> table(4, -1);
      ASSERT_TRUE(FillBlockTable(*cache, l, table.data(), 4).ok());
      for (size_t i = 0; i < cache->BlockTable(l).size(); ++i) {
        EXPECT_EQ(table[i], pool->BlockIndex(cache->BlockTable(l)[i]));
        EXPECT_TRUE(numbers.insert(table[i]).second)
            << "block " << table[i] << " handed out twice";
      }
    }
  }
  EXPECT_EQ(numbers.size(), 10u);
  EXPECT_EQ(*numbers.begin(), 0);
  EXPECT_EQ(*numbers.rbegin(), 9);
  // 3 blocks per layer each (12) fit, 5 for `a` (16) fit, 6 (18) do not.
  EXPECT_TRUE(b->Reserve(32 * 3).ok());
  EXPECT_TRUE(a->Reserve(32 * 5).ok());
  EXPECT_EQ(a->Reserve(32 * 6).code(), absl::StatusCode::kResourceExhausted);
}

TEST(BlockIdRegionDeathTest, TheHostCannotTouchABlock) {
  auto region = ReserveBlockIdRegion(2, 4096);
  ASSERT_TRUE(region.ok());
  volatile uint8_t* p = region->base;
  EXPECT_DEATH({ p[100] = 1; }, "");
}

TEST(BlockIdRegion, BadSizesAreRefused) {
  EXPECT_EQ(ReserveBlockIdRegion(0, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReserveBlockIdRegion(4, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ReserveBlockIdRegion(int64_t{1} << 62, size_t{1} << 20).status().code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvd::ops::internal
