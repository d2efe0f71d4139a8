// Runs without a GPU: the CUDA backend's host side over region pools in host
// memory. The kernels' own paged index arithmetic (attention_index.h), fed
// the plan's tables, finds each K and V row exactly where KvCache's host
// layout puts it (so the device pool and the CPU pool share one layout);
// dropped blocks read as 0; PlannedInts predicts the plan's size before
// PrepareStepCaches; and the features the backend lacks are refused
// (UNIMPLEMENTED) before any cache changes.
#include "ops/backend/internal/cuda_cache_plan.h"

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/internal/attention_index.h"
#include "ops/backend/testing/tiny_config.h"

namespace kvd::ops::internal {
namespace {

namespace ai = ::kvd::kernels::cuda::internal;

ModelConfig TinyConfig(int64_t n_layers = 3) {
  return testing::TinyHostConfig(n_layers);
}

// A region pool over host memory; `host_accessible` chooses whether the
// host may read rows back (to compare layouts) or not (a stand-in for a
// device slab).
struct HostRegion {
  std::vector<uint8_t> bytes;
  std::unique_ptr<KvBlockPool> pool;
  HostRegion(const ModelConfig& c, int64_t blocks, int64_t block_rows,
             bool host_accessible) {
    const size_t row_bytes = KvCache::RowBytes(c, Precision::kBf16);
    bytes.assign(blocks * 2 * block_rows * row_bytes, 0);
    KvBlockPool::Region r;
    r.base = bytes.data();
    r.blocks = blocks;
    r.host_accessible = host_accessible;
    KvBlockPool::Options o;
    o.block_rows = block_rows;
    pool = *KvBlockPool::CreateInRegion(row_bytes, o, r);
  }
};

class StubSource : public KvSource {
 public:
  explicit StubSource(int64_t hot) : hot_(hot) {}
  int64_t HotBegin(int64_t, int64_t) const override { return hot_; }
  absl::Status Check(int64_t, int64_t) const override {
    return absl::OkStatus();
  }
  void ReadResiduals(int64_t, int64_t, int64_t, float*) const override {}

 private:
  int64_t hot_;
};

class StubSelection : public KeySelection {
 public:
  absl::Span<const int64_t> KeptKeys(int64_t, int64_t, int64_t) const override {
    return {};
  }
};

class StubPatcher : public ResidualPatcher {
 public:
  void Patch(int64_t, int64_t, int64_t, float*) override {}
};

TEST(CudaCachePlan, KernelsFindEveryRowWhereTheCacheLaysItOut) {
  const ModelConfig c = TinyConfig();
  for (int64_t block_rows : {32, 64, 96}) {
    HostRegion region(c, 200, block_rows, /*host_accessible=*/true);
    auto a = KvCache::InPool(c, Precision::kBf16, region.pool.get());
    auto b = KvCache::InPool(c, Precision::kBf16, region.pool.get());
    ASSERT_TRUE(a.ok() && b.ok());
    // Interleaved growth so a cache's blocks are not consecutive.
    std::mt19937 rng(block_rows);
    int64_t la = 0, lb = 0;
    for (int i = 0; i < 6; ++i) {
      la += 1 + rng() % 70;
      lb += 1 + rng() % 70;
      ASSERT_TRUE(a->Reserve(la).ok());
      ASSERT_TRUE(b->Reserve(lb).ok());
    }
    a->SetLength(la - 5);
    b->SetLength(lb - 9);
    const std::vector<int32_t> ta(5, 7), tb(9, 11);
    const CacheRows seqs[] = {{&*a, ta, la - 5, 5}, {&*b, tb, lb - 9, 9}};
    auto plan = PlanCacheRows(seqs, c.n_layers, {4, 13});
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->rows, 14);
    ASSERT_EQ(plan->n_gather, 2);
    ASSERT_EQ(plan->ints.size(), plan->table_offset(c.n_layers));
    const int32_t* ints = plan->ints.data();
    EXPECT_EQ(ints[plan->last_row_offset()], 4);
    EXPECT_EQ(ints[plan->last_row_offset() + 1], 13);
    for (int64_t r = 0; r < 14; ++r) {
      const bool first = r < 5;
      EXPECT_EQ(ints[plan->tokens_offset() + r], first ? 7 : 11);
      EXPECT_EQ(ints[plan->row_seq_offset() + r], first ? 0 : 1);
      EXPECT_EQ(ints[plan->positions_offset() + r],
                first ? la - 5 + r : lb - 9 + r - 5);
    }
    const uint8_t* base = region.bytes.data();
    const ai::KvPageLayout layout{block_rows, c.kv_dim()};
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (int s = 0; s < 2; ++s) {
        const KvCache& cache = s == 0 ? *a : *b;
        const int32_t* row =
            ints + plan->table_offset(l) + s * plan->table_stride;
        for (int64_t p = 0; p < cache.length(); ++p) {
          // bf16 values -> bytes.
          EXPECT_EQ(2 * ai::PagedKRowOffset(row, layout, p),
                    cache.KeyBytes(l, p) - base)
              << "layer " << l << " seq " << s << " position " << p;
          EXPECT_EQ(2 * ai::PagedVRowOffset(row, layout, p),
                    cache.ValueBytes(l, p) - base)
              << "layer " << l << " seq " << s << " position " << p;
        }
      }
    }
    auto base_a = RegionBase(*a);
    ASSERT_TRUE(base_a.ok());
    EXPECT_EQ(*base_a, base);
  }
}

TEST(CudaCachePlan, DroppedBlocksReadAsZeroAndForeignBlocksAreRefused) {
  const ModelConfig c = TinyConfig();
  HostRegion region(c, 64, 32, /*host_accessible=*/false);
  auto cache = KvCache::InPool(c, Precision::kBf16, region.pool.get());
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE(cache->Reserve(32 * 5).ok());
  cache->SetLength(32 * 5);
  cache->DropBelow(1, 64);
  std::vector<int32_t> table(8, -1);
  ASSERT_TRUE(FillBlockTable(*cache, 1, table.data(), 8).ok());
  EXPECT_EQ(table[0], 0);
  EXPECT_EQ(table[1], 0);
  for (int i = 2; i < 5; ++i) {
    EXPECT_EQ(table[i], region.pool->BlockIndex(cache->BlockTable(1)[i]));
    EXPECT_GE(table[i], 0);
  }
  EXPECT_EQ(table[5], -1) << "entries past the table are left alone";
  EXPECT_EQ(FillBlockTable(*cache, 1, table.data(), 4).code(),
            absl::StatusCode::kInvalidArgument);

  // Blocks of a heap pool have no block numbers.
  KvCache host(c, Precision::kBf16);
  ASSERT_TRUE(host.Reserve(10).ok());
  EXPECT_EQ(FillBlockTable(host, 0, table.data(), 8).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RegionBase(host).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Known before the cache holds any block: checked before a step starts.
  auto empty = KvCache::InPool(c, Precision::kBf16, region.pool.get());
  ASSERT_TRUE(empty.ok());
  auto empty_base = RegionBase(*empty);
  ASSERT_TRUE(empty_base.ok()) << empty_base.status();
  EXPECT_EQ(*empty_base, region.bytes.data());

  const CacheRows rows{&*cache, {}, 0, 3};
  EXPECT_EQ(PlanCacheRows({&rows, 1}, c.n_layers, {3}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> two = {1, 2};
  const CacheRows wrong{&*cache, two, 0, 3};
  EXPECT_EQ(PlanCacheRows({&wrong, 1}, c.n_layers, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaCachePlan, PlannedIntsPredictsThePlanAfterPrepare) {
  ModelConfig c = TinyConfig(4);
  c.layers[1].sliding_window = 40;  // trimmed by Prepare, table length kept
  HostRegion region(c, 400, 32, /*host_accessible=*/false);
  std::vector<KvCache> caches;
  for (int i = 0; i < 3; ++i)
    caches.push_back(*KvCache::InPool(c, Precision::kBf16, region.pool.get()));
  caches[0].SetLength(0);
  ASSERT_TRUE(caches[1].Reserve(70).ok());
  caches[1].SetLength(70);
  ASSERT_TRUE(caches[2].Reserve(300).ok());  // reserved ahead of its length
  caches[2].SetLength(10);
  const std::vector<int32_t> t0(50, 1), t1(1, 2), t2(3, 3);
  std::vector<SequenceStep> batch = {{&caches[0], t0, LogitsMode::kAll, 0},
                                     {&caches[1], t1, LogitsMode::kLast, 1},
                                     {&caches[2], t2, LogitsMode::kNone, 2}};
  ForwardOutput out;
  const std::vector<int64_t> logit_rows =
      SelectLogitRows(batch, c.vocab_size, &out);
  const int64_t predicted = PlannedInts(batch, c.n_layers, logit_rows.size());
  std::vector<int64_t> old(3);
  for (int i = 0; i < 3; ++i) old[i] = caches[i].length();
  ASSERT_TRUE(PrepareStepCaches(c, Precision::kBf16, batch).ok());
  std::vector<CacheRows> seqs;
  for (int i = 0; i < 3; ++i)
    seqs.push_back({&caches[i], batch[i].tokens, old[i],
                    static_cast<int64_t>(batch[i].tokens.size())});
  auto plan = PlanCacheRows(seqs, c.n_layers, logit_rows);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(static_cast<int64_t>(plan->ints.size()), predicted);
  EXPECT_EQ(plan->table_stride, 10);  // caches[2]: 300 rows / 32
}

// HotBegin(l, length) = hot[l], whatever the length.
class LayerSource : public KvSource {
 public:
  explicit LayerSource(std::vector<int64_t> hot) : hot_(std::move(hot)) {}
  int64_t HotBegin(int64_t l, int64_t) const override { return hot_[l]; }
  absl::Status Check(int64_t, int64_t) const override {
    return absl::OkStatus();
  }
  void ReadResiduals(int64_t, int64_t, int64_t, float*) const override {}

 private:
  std::vector<int64_t> hot_;
};

TEST(CudaCachePlan, ColdSpansSwitchSourceAtChunksAndSkipInvisibleRows) {
  ModelConfig c = TinyConfig(5);
  c.layers[3].sliding_window = 40;
  c.layers[4].sliding_window = 40;
  HostRegion region(c, 400, 32, /*host_accessible=*/false);
  auto cache = *KvCache::InPool(c, Precision::kBf16, region.pool.get());
  ASSERT_TRUE(cache.Reserve(200).ok());
  cache.SetLength(200);
  auto plain = *KvCache::InPool(c, Precision::kBf16, region.pool.get());
  // Layer 0: nothing cold; 1: a boundary inside a chunk; 2: on a chunk
  // boundary; 3: a window starting above the boundary; 4: below it.
  LayerSource source({0, 70, 96, 100, 190});
  const std::vector<int32_t> t(1, 1);
  std::vector<SequenceStep> batch = {{&plain, t}, {&cache, t}};
  batch[1].kv_source = &source;
  const auto spans = PlanColdSpans(batch, c, 32);
  ASSERT_EQ(spans.size(), 2u);
  for (const ColdSpan& s : spans[0]) EXPECT_EQ(s.hot, 0) << "no source";
  const std::vector<ColdSpan>& s = spans[1];
  EXPECT_EQ(s[0].cold, 0);
  EXPECT_EQ(s[0].hot, 0);
  EXPECT_EQ(s[1].from, 0);
  EXPECT_EQ(s[1].cold, 64);
  EXPECT_EQ(s[1].boundary, 64);
  EXPECT_EQ(s[1].hot, 70);
  EXPECT_EQ(s[2].cold, 96);
  EXPECT_EQ(s[2].boundary, 96);
  EXPECT_EQ(s[2].hot, 96) << "nothing to recompute into the cache";
  const int64_t window_start = WindowStart(40, 200);
  ASSERT_GT(window_start, 100);
  ASSERT_LT(window_start, 190);
  EXPECT_EQ(s[3].cold, 0) << "the window starts above the boundary";
  EXPECT_EQ(s[3].hot, 0);
  EXPECT_EQ(s[4].from, window_start);
  EXPECT_EQ(s[4].boundary, 160);
  EXPECT_EQ(s[4].cold, 0) << "nothing below the window start is visible";
  EXPECT_EQ(s[4].hot, 190);
  // A boundary inside the first chunk: only the cache rows.
  LayerSource early({20, 0, 0, 0, 0});
  batch[1].kv_source = &early;
  const ColdSpan e = PlanColdSpans(batch, c, 32)[1][0];
  EXPECT_EQ(e.cold, 0);
  EXPECT_EQ(e.boundary, 0);
  EXPECT_EQ(e.hot, 20);
}

TEST(CudaCachePlan, RefusesWhatTheBackendCannotRun) {
  const ModelConfig c = TinyConfig();
  HostRegion region(c, 64, 32, /*host_accessible=*/false);
  HostRegion other(c, 64, 32, /*host_accessible=*/false);
  auto a = *KvCache::InPool(c, Precision::kBf16, region.pool.get());
  auto b = *KvCache::InPool(c, Precision::kBf16, region.pool.get());
  auto foreign = *KvCache::InPool(c, Precision::kBf16, other.pool.get());
  KvCache host(c, Precision::kBf16);
  const std::vector<int32_t> t(3, 1);

  std::vector<SequenceStep> ok = {{&a, t}, {&b, t}};
  auto check = CheckCudaBackendBatch(ok, nullptr, c.n_layers);
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_EQ(check->rows, 6);
  EXPECT_EQ(check->pool, region.pool.get());

  StubPatcher patcher;
  EXPECT_EQ(CheckCudaBackendBatch(ok, &patcher, c.n_layers).status().code(),
            absl::StatusCode::kUnimplemented);
  StubSelection selection;
  std::vector<SequenceStep> sel = {{&a, t}};
  sel[0].key_selection = &selection;
  EXPECT_EQ(CheckCudaBackendBatch(sel, nullptr, c.n_layers).status().code(),
            absl::StatusCode::kUnimplemented);
  // A KvSource with cold positions is the backends' to recompute.
  StubSource cold(32);
  std::vector<SequenceStep> src = {{&a, t}};
  src[0].kv_source = &cold;
  EXPECT_TRUE(CheckCudaBackendBatch(src, nullptr, c.n_layers).ok());

  for (const std::vector<SequenceStep>& bad :
       std::vector<std::vector<SequenceStep>>{{{&host, t}},
                                              {{&a, t}, {&foreign, t}},
                                              {{&a, t}, {&a, t}},
                                              {{nullptr, t}}}) {
    EXPECT_EQ(CheckCudaBackendBatch(bad, nullptr, c.n_layers).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  const ModelConfig deeper = TinyConfig(5);
  HostRegion deeper_region(deeper, 64, 32, /*host_accessible=*/false);
  auto wrong_model =
      *KvCache::InPool(deeper, Precision::kBf16, deeper_region.pool.get());
  std::vector<SequenceStep> mismatch = {{&wrong_model, t}};
  EXPECT_EQ(
      CheckCudaBackendBatch(mismatch, nullptr, c.n_layers).status().code(),
      absl::StatusCode::kFailedPrecondition);
  const std::vector<int32_t> huge(kMaxCudaStepRows + 1, 1);
  std::vector<SequenceStep> too_many = {{&a, huge}};
  EXPECT_EQ(
      CheckCudaBackendBatch(too_many, nullptr, c.n_layers).status().code(),
      absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(CheckDeviceCache(&host, "test").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckDeviceCache(&a, "test").ok());
  // Nothing was reserved or changed by any refusal.
  EXPECT_EQ(region.pool->stats().blocks_in_use, 0);
  EXPECT_EQ(region.pool->stats().blocks_reserved, 0);
}

}  // namespace
}  // namespace kvd::ops::internal
