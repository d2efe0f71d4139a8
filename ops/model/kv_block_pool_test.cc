#include "ops/model/kv_block_pool.h"

#include <cstring>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::ops {
namespace {

using ::testing::HasSubstr;

constexpr size_t kRowBytes = 96;

std::unique_ptr<KvBlockPool> MakePool(int64_t block_rows, size_t budget,
                                      bool retain = true) {
  KvBlockPool::Options o;
  o.block_rows = block_rows;
  o.budget_bytes = budget;
  o.retain_free_blocks = retain;
  auto pool = KvBlockPool::Create(kRowBytes, o);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return *std::move(pool);
}

TEST(KvBlockPool, RefusesBlocksThatSplitAnAttentionChunk) {
  for (int64_t rows : {0, -32, 16, 48}) {
    KvBlockPool::Options o;
    o.block_rows = rows;
    const auto pool = KvBlockPool::Create(kRowBytes, o);
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument) << rows;
    EXPECT_THAT(pool.status().message(), HasSubstr("attention chunk"));
  }
  KvBlockPool::Options tiny;
  tiny.budget_bytes = 100;  // below one block
  EXPECT_EQ(KvBlockPool::Create(kRowBytes, tiny).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvBlockPool::Create(0, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvBlockPool, BudgetIsAHardLimitWithAHelpfulMessage) {
  const size_t block = 2 * 64 * kRowBytes;
  auto pool = MakePool(64, 3 * block + block / 2);  // 3.5 blocks: 3 usable
  EXPECT_EQ(pool->block_bytes(), block);
  EXPECT_EQ(pool->capacity_blocks(), 3);
  std::vector<uint8_t*> held;
  for (int i = 0; i < 3; ++i) {
    auto b = pool->Allocate();
    ASSERT_TRUE(b.ok()) << b.status();
    std::memset(*b, i, block);  // the whole block is writable
    held.push_back(*b);
  }
  const auto over = pool->Allocate();
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(),
              HasSubstr("K/V block pool of 0.04102 MiB (3 blocks of 64 rows"));
  EXPECT_THAT(over.status().message(), HasSubstr("3 in use"));
  EXPECT_THAT(over.status().message(), HasSubstr("raise the pool budget"));
  EXPECT_EQ(pool->stats().blocks_in_use, 3);
  EXPECT_EQ(pool->available_blocks(), 0);

  pool->Release(held.back());
  held.pop_back();
  EXPECT_EQ(pool->available_blocks(), 1);
  auto again = pool->Allocate();
  ASSERT_TRUE(again.ok());
  held.push_back(*again);
  for (uint8_t* b : held) pool->Release(b);
  const KvBlockPool::Stats s = pool->stats();
  EXPECT_EQ(s.blocks_in_use, 0);
  EXPECT_EQ(s.peak_blocks_in_use, 3);
  EXPECT_EQ(s.free_list_blocks, 3);  // kept for reuse
  pool->ReleaseFreeMemory();
  EXPECT_EQ(pool->stats().free_list_blocks, 0);
}

TEST(KvBlockPool, ReservationsAreAllOrNothingAndCount) {
  auto pool = MakePool(32, 4 * 2 * 32 * kRowBytes);
  ASSERT_TRUE(pool->Reserve(3).ok());
  EXPECT_EQ(pool->stats().blocks_reserved, 3);
  // 3 reserved + 2 > 4: refused, and nothing more is reserved.
  EXPECT_EQ(pool->Reserve(2).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->stats().blocks_reserved, 3);
  auto last = pool->Allocate();  // the 4th block is still free
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(pool->Allocate().status().code(),
            absl::StatusCode::kResourceExhausted);
  pool->Release(*last);
  uint8_t* a = pool->Take();
  uint8_t* b = pool->Take();
  EXPECT_EQ(pool->stats().blocks_reserved, 1);
  EXPECT_EQ(pool->stats().blocks_in_use, 2);
  pool->Unreserve(1);
  EXPECT_EQ(pool->available_blocks(), 2);
  pool->Release(a);
  pool->Release(b);
}

TEST(KvBlockPool, UnlimitedPoolWithoutRetentionFreesBlocks) {
  auto pool = MakePool(32, 0, /*retain=*/false);
  EXPECT_EQ(pool->capacity_blocks(), 0);
  std::vector<uint8_t*> held;
  for (int i = 0; i < 100; ++i) held.push_back(*pool->Allocate());
  for (uint8_t* b : held) pool->Release(b);
  EXPECT_EQ(pool->stats().blocks_in_use, 0);
  EXPECT_EQ(pool->stats().free_list_blocks, 0);
  EXPECT_EQ(pool->stats().peak_blocks_in_use, 100);
}

// A region pool (what a GPU backend makes over device memory; host memory
// stands in here) hands out the region's own blocks, lowest first, maps
// them back to block numbers, and never frees them.
TEST(KvBlockPool, RegionPoolHandsOutTheRegionsBlocks) {
  const size_t block = 2 * 32 * kRowBytes;
  std::vector<uint8_t> memory(5 * block);
  bool freed = false;
  KvBlockPool::Region region;
  region.base = memory.data();
  region.blocks = 5;
  region.owner = std::shared_ptr<void>(nullptr, [&](void*) { freed = true; });
  KvBlockPool::Options o;
  o.budget_bytes = 4 * block;    // the budget is below the region: 4 blocks
  o.retain_free_blocks = false;  // ignored: region blocks are never freed
  auto pool = KvBlockPool::CreateInRegion(kRowBytes, o, region);
  ASSERT_TRUE(pool.ok()) << pool.status();
  region.owner.reset();
  EXPECT_FALSE((*pool)->host_accessible());
  EXPECT_EQ((*pool)->region_base(), memory.data());
  EXPECT_EQ((*pool)->capacity_blocks(), 4);
  std::vector<uint8_t*> held;
  for (int64_t i = 0; i < 4; ++i) {
    auto b = (*pool)->Allocate();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(*b, memory.data() + i * block);
    EXPECT_EQ((*pool)->BlockIndex(*b), i);
    held.push_back(*b);
  }
  EXPECT_EQ((*pool)->Allocate().status().code(),
            absl::StatusCode::kResourceExhausted);
  (*pool)->Release(held[2]);
  auto again = (*pool)->Allocate();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, held[2]);
  EXPECT_EQ((*pool)->BlockIndex(memory.data() + 1), -1);  // not a block start
  EXPECT_EQ((*pool)->BlockIndex(memory.data() + 5 * block), -1);  // past end
  uint8_t elsewhere = 0;
  EXPECT_EQ((*pool)->BlockIndex(&elsewhere), -1);
  for (uint8_t* b : held) (*pool)->Release(b);
  (*pool)->ReleaseFreeMemory();  // a no-op: the memory is the region's
  EXPECT_EQ((*pool)->stats().free_list_blocks, 4);
  EXPECT_FALSE(freed);
  pool->reset();
  EXPECT_TRUE(freed);  // the pool kept the region's owner until now

  // A heap pool is host memory and has no block numbers.
  auto heap = MakePool(32, 0);
  EXPECT_TRUE(heap->host_accessible());
  EXPECT_EQ(heap->region_base(), nullptr);
  auto b = heap->Allocate();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(heap->BlockIndex(*b), -1);
  heap->Release(*b);
}

TEST(KvBlockPool, RegionPoolRefusesAnEmptyRegion) {
  KvBlockPool::Region none;
  EXPECT_EQ(KvBlockPool::CreateInRegion(kRowBytes, {}, none).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> memory(2 * 32 * kRowBytes);
  KvBlockPool::Region zero;
  zero.base = memory.data();
  EXPECT_EQ(KvBlockPool::CreateInRegion(kRowBytes, {}, zero).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvBlockPool, ThreadsNeverExceedTheBudget) {
  constexpr int kThreads = 4, kCapacity = 10, kRounds = 2000;
  auto pool = MakePool(32, kCapacity * 2 * 32 * kRowBytes);
  std::vector<std::thread> threads;
  std::vector<int> refused(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t*> mine;
      for (int i = 0; i < kRounds; ++i) {
        if ((i + t) % 3 != 2) {
          auto b = pool->Allocate();
          if (b.ok()) {
            (*b)[0] = static_cast<uint8_t>(t);  // owned by this thread alone
            mine.push_back(*b);
          } else {
            ++refused[t];
          }
        } else if (!mine.empty()) {
          EXPECT_EQ(mine.back()[0], t);
          pool->Release(mine.back());
          mine.pop_back();
        }
      }
      for (uint8_t* b : mine) pool->Release(b);
    });
  }
  for (std::thread& t : threads) t.join();
  const KvBlockPool::Stats s = pool->stats();
  EXPECT_EQ(s.blocks_in_use, 0);
  EXPECT_EQ(s.blocks_reserved, 0);
  EXPECT_EQ(s.peak_blocks_in_use, kCapacity);  // reached, never passed
  int total_refused = 0;
  for (int r : refused) total_refused += r;
  EXPECT_GT(total_refused, 0);
}

}  // namespace
}  // namespace kvd::ops
