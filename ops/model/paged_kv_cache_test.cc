// Paged K/V storage cannot change a bit: a cache of the smallest blocks (one
// attention chunk, shared pool) gives logits and K/V rows bit-identical to a
// cache whose single huge block is as good as contiguous, through prefill
// chunks that straddle blocks, batched decoding, sliding-window trimming,
// KV-Direct's hot window (rows dropped below it and recomputed from
// residuals) and a KV-Direct rebuild written block by block. And a pool that
// runs dry fails the step with RESOURCE_EXHAUSTED before touching any cache.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/kvdirect/rebuild.h"
#include "ops/kvdirect/residual_kv_source.h"
#include "ops/kvdirect/residual_store.h"
#include "ops/model/kv_block_pool.h"
#include "ops/model/model.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::ops {
namespace {

using ::testing::HasSubstr;
using Case = testing::FamilyCase;

// Every kept row of every layer, K then V bytes, and the layers' first kept
// positions: what must match bit for bit.
struct Snapshot {
  std::vector<int64_t> first_kept;
  std::vector<uint8_t> bytes;
  bool operator==(const Snapshot& o) const {
    return first_kept == o.first_kept && bytes == o.bytes;
  }
};

Snapshot Snap(const KvCache& cache) {
  Snapshot s;
  for (int64_t l = 0; l < cache.n_layers(); ++l) {
    s.first_kept.push_back(cache.first_kept(l));
    for (int64_t p = cache.first_kept(l); p < cache.length(); ++p) {
      const uint8_t* k = cache.KeyBytes(l, p);
      const uint8_t* v = cache.ValueBytes(l, p);
      s.bytes.insert(s.bytes.end(), k, k + cache.row_bytes());
      s.bytes.insert(s.bytes.end(), v, v + cache.row_bytes());
    }
  }
  return s;
}

// Steps of a conversation: prompt chunks of 7, 50, 33 and 90 tokens (most
// straddle a 32-row block), then 40 greedy decodes.
struct RunResult {
  std::vector<std::vector<float>> logits;  // per step, for each sequence
  std::vector<Snapshot> snaps;             // per sequence, at the end
};

class PagedKvCache : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    testing::TinyModelSpec spec;
    spec.family = GetParam().family;
    if (spec.family == "gemma3") spec.n_layers = 6;  // 5 local + 1 global
    auto model = testing::LoadTinyModel(spec, GetParam().precision);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
  }

  std::unique_ptr<KvBlockPool> Pool(int64_t block_rows, size_t budget = 0) {
    KvBlockPool::Options o;
    o.block_rows = block_rows;
    o.budget_bytes = budget;
    auto pool = model_->NewBlockPool(o);
    EXPECT_TRUE(pool.ok()) << pool.status();
    return *std::move(pool);
  }

  // Two sequences decoded together from `pool`; with `budget` >= 0 each has
  // a KV-Direct hot window of that many rows (older rows are dropped and
  // recomputed from residuals).
  RunResult Conversation(KvBlockPool* pool, int64_t budget, bool keep_rows) {
    const ModelConfig& c = model_->config();
    RunResult run;
    std::vector<KvCache> caches;
    ResidualStore store(
        c, model_->precision(),
        CheckpointLayers(*ParseCheckpointPolicy("kv-direct"), c.n_layers));
    std::vector<std::unique_ptr<ResidualKvSource>> sources;
    for (int s = 0; s < 2; ++s) {
      auto cache = model_->NewCache(pool);
      EXPECT_TRUE(cache.ok()) << cache.status();
      caches.push_back(*std::move(cache));
      if (keep_rows) caches.back().KeepRowsPastWindows();
      if (budget >= 0)
        sources.push_back(
            std::make_unique<ResidualKvSource>(&store, s, budget));
    }
    std::vector<std::vector<int32_t>> next(2);
    uint32_t seed = 3;
    auto step = [&](std::vector<std::vector<int32_t>>& tokens) {
      std::vector<SequenceStep> batch;
      for (int s = 0; s < 2; ++s) {
        batch.push_back({&caches[s], tokens[s], LogitsMode::kAll, s,
                         budget >= 0 ? sources[s].get() : nullptr});
      }
      ForwardOutput out;
      const absl::Status st = model_->Forward(batch, &out, &store);
      EXPECT_TRUE(st.ok()) << st;
      run.logits.push_back(out.logits);
      for (int s = 0; s < 2; ++s) {
        const float* l = out.Logits(s);
        tokens[s] = {
            static_cast<int32_t>(std::max_element(l, l + c.vocab_size) - l)};
      }
    };
    for (int n : {7, 50, 33, 90}) {
      for (int s = 0; s < 2; ++s)
        next[s] = testing::RandomTokens(n + s, seed++, c.vocab_size);
      step(next);
    }
    for (int g = 0; g < 40; ++g) step(next);
    for (const KvCache& cache : caches) run.snaps.push_back(Snap(cache));
    return run;
  }

  std::unique_ptr<Model> model_;
};

TEST_P(PagedKvCache, SmallBlocksAreBitIdenticalToOneHugeBlock) {
  // 4096 rows: each layer's rows of the whole conversation sit in one block.
  std::unique_ptr<KvBlockPool> huge = Pool(4096);
  for (int64_t budget : {int64_t{-1}, int64_t{16}, int64_t{70}}) {
    for (bool keep_rows : {false, true}) {
      const RunResult want = Conversation(huge.get(), budget, keep_rows);
      for (int64_t rows : {32, 64}) {
        std::unique_ptr<KvBlockPool> small = Pool(rows, 64 << 20);
        const RunResult got = Conversation(small.get(), budget, keep_rows);
        ASSERT_EQ(got.logits.size(), want.logits.size());
        int64_t differing = 0;
        for (size_t i = 0; i < want.logits.size(); ++i) {
          differing += got.logits[i].size() != want.logits[i].size() ||
                       std::memcmp(got.logits[i].data(), want.logits[i].data(),
                                   want.logits[i].size() * sizeof(float)) != 0;
        }
        EXPECT_EQ(differing, 0) << "budget " << budget << " rows " << rows;
        EXPECT_TRUE(got.snaps == want.snaps)
            << "budget " << budget << " rows " << rows;
        // Everything went back to the pool with the caches.
        EXPECT_EQ(small->stats().blocks_in_use, 0);
        EXPECT_GT(small->stats().peak_blocks_in_use, 0);
      }
    }
  }
  EXPECT_EQ(huge->stats().blocks_in_use, 0);
}

TEST_P(PagedKvCache, KvDirectRebuildWritesAcrossBlocksBitIdentically) {
  const ModelConfig& c = model_->config();
  const std::vector<int32_t> tokens =
      testing::RandomTokens(150, 9, c.vocab_size);
  ResidualStore store(
      c, model_->precision(),
      CheckpointLayers(*ParseCheckpointPolicy("kv-direct"), c.n_layers));
  KvCache plain = model_->NewCache();
  const SequenceStep step{&plain, tokens, LogitsMode::kNone, 0};
  ForwardOutput out;
  ASSERT_TRUE(model_->Forward({&step, 1}, &out, &store).ok());

  std::unique_ptr<KvBlockPool> huge = Pool(4096), small = Pool(32);
  for (int64_t budget : {ResidualKvSource::kAll, int64_t{50}}) {
    RebuildSpec spec;
    spec.policy = *ParseCheckpointPolicy("kv-direct");
    spec.tokens = tokens;
    spec.checkpoint = &store;
    spec.budget = budget;
    spec.block = 45;  // recompute segments that straddle blocks
    KvCache a = *model_->NewCache(huge.get());
    KvCache b = *model_->NewCache(small.get());
    ASSERT_TRUE(RebuildKv(*model_, spec, &a, nullptr).ok());
    ASSERT_TRUE(RebuildKv(*model_, spec, &b, nullptr).ok());
    EXPECT_TRUE(Snap(a) == Snap(b)) << "budget " << budget;
    // The rebuilt rows are the ones Forward cached (local layers rebuild
    // only their window).
    for (int64_t l = 0; l < c.n_layers; ++l)
      plain.DropBelow(l, b.first_kept(l));
    EXPECT_TRUE(Snap(b) == Snap(plain)) << "budget " << budget;
  }
}

TEST_P(PagedKvCache, ExhaustedPoolFailsTheStepAndLeavesEveryCacheAlone) {
  const ModelConfig& c = model_->config();
  const size_t block = 2 * 32 * KvCache::RowBytes(c, model_->precision());
  // Room for two 32-row blocks per layer: 64 positions of one sequence.
  std::unique_ptr<KvBlockPool> pool = Pool(32, 2 * c.n_layers * block);
  KvCache a = *model_->NewCache(pool.get());
  KvCache b = *model_->NewCache(pool.get());
  KvCache reference = model_->NewCache();
  const std::vector<int32_t> first = testing::RandomTokens(40, 1, c.vocab_size);
  const std::vector<int32_t> second =
      testing::RandomTokens(20, 2, c.vocab_size);
  for (KvCache* cache : {&a, &reference}) {
    a.KeepRowsPastWindows();
    reference.KeepRowsPastWindows();
    const SequenceStep step{cache, first, LogitsMode::kLast, 0};
    ForwardOutput out;
    ASSERT_TRUE(model_->Forward({&step, 1}, &out).ok());
  }
  EXPECT_EQ(pool->stats().blocks_in_use, 2 * c.n_layers);
  ASSERT_EQ(pool->available_blocks(), 0);

  // b's first block and a's growth both need blocks the pool lacks.
  const Snapshot a_before = Snap(a);
  std::vector<SequenceStep> batch = {{&a, second, LogitsMode::kLast, 0},
                                     {&b, second, LogitsMode::kLast, 1}};
  ForwardOutput out;
  const absl::Status st = model_->Forward(batch, &out);
  ASSERT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(st.message(), HasSubstr("K/V block pool of"));
  EXPECT_THAT(st.message(), HasSubstr("raise the pool budget"));
  EXPECT_EQ(a.length(), 40);
  EXPECT_EQ(b.length(), 0);
  EXPECT_TRUE(Snap(a) == a_before);
  EXPECT_EQ(b.blocks_held(), 0);
  EXPECT_EQ(pool->stats().blocks_in_use, 2 * c.n_layers);
  EXPECT_EQ(pool->stats().blocks_reserved, 0);

  // Rolling a back frees its second blocks; now a's step fits (40 + 20 rows
  // need two blocks per layer again) and matches the unpooled reference.
  a.Truncate(30);
  EXPECT_EQ(pool->stats().blocks_in_use, c.n_layers);
  reference.Truncate(30);
  for (KvCache* cache : {&a, &reference}) {
    const SequenceStep step{cache, second, LogitsMode::kLast, 0};
    ASSERT_TRUE(model_->Forward({&step, 1}, &out).ok());
  }
  EXPECT_TRUE(Snap(a) == Snap(reference));
  a.Reset(0);
  EXPECT_EQ(pool->stats().blocks_in_use, 0);
}

TEST_P(PagedKvCache, CopiesAreDeepAndLiveOutsideThePool) {
  const ModelConfig& c = model_->config();
  std::unique_ptr<KvBlockPool> pool = Pool(32);
  KvCache a = *model_->NewCache(pool.get());
  const std::vector<int32_t> t = testing::RandomTokens(70, 4, c.vocab_size);
  const SequenceStep step{&a, t, LogitsMode::kNone, 0};
  ForwardOutput out;
  ASSERT_TRUE(model_->Forward({&step, 1}, &out).ok());
  const int64_t in_use = pool->stats().blocks_in_use;
  {
    KvCache copy = a;
    EXPECT_TRUE(Snap(copy) == Snap(a));
    EXPECT_NE(copy.pool(), a.pool());
    EXPECT_EQ(pool->stats().blocks_in_use, in_use);
    KvCache moved = std::move(a);
    EXPECT_EQ(moved.pool(), pool.get());
    EXPECT_EQ(pool->stats().blocks_in_use, in_use);
    a = std::move(moved);
  }
  EXPECT_EQ(pool->stats().blocks_in_use, in_use);
}

TEST(PagedKvCacheOptions, PoolMustFitTheModelsRows) {
  auto model = testing::LoadTinyModel({}, Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  auto pool = KvBlockPool::Create(
      KvCache::RowBytes((*model)->config(), Precision::kF32) + 4, {});
  ASSERT_TRUE(pool.ok());
  const auto cache = (*model)->NewCache(pool->get());
  EXPECT_EQ(cache.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cache.status().message(), HasSubstr("one pool per model"));
}

// A cache over a pool in memory the host cannot touch (a GPU backend's
// device slab; host memory stands in for it here, flagged not host
// accessible) keeps its block tables on the host, in the region's block
// numbers, but the CPU backend refuses it and host row access aborts.
TEST(PagedKvCacheOptions, DevicePoolCachesAreBookkeepingOnlyOnTheHost) {
  auto model = testing::LoadTinyModel({}, Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  const size_t row_bytes = KvCache::RowBytes(c, Precision::kF32);
  const int64_t blocks = 4 * c.n_layers;
  std::vector<uint8_t> memory(blocks * 2 * 32 * row_bytes);
  KvBlockPool::Region region;
  region.base = memory.data();
  region.blocks = blocks;
  auto pool = KvBlockPool::CreateInRegion(row_bytes, {}, region);
  ASSERT_TRUE(pool.ok()) << pool.status();

  EXPECT_EQ((*model)->NewCache(pool->get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto cache = KvCache::InPool(c, Precision::kF32, pool->get());
  ASSERT_TRUE(cache.ok()) << cache.status();
  ASSERT_TRUE(cache->Reserve(40).ok());  // two blocks per layer
  std::vector<int64_t> numbers;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    ASSERT_EQ(cache->BlockTable(l).size(), 2u);
    EXPECT_EQ(cache->covered_end(l), 64);
    for (uint8_t* b : cache->BlockTable(l))
      numbers.push_back((*pool)->BlockIndex(b));
  }
  std::sort(numbers.begin(), numbers.end());
  std::vector<int64_t> expected(2 * c.n_layers);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = i;
  EXPECT_EQ(numbers, expected);  // distinct blocks, lowest first

  const std::vector<int32_t> t = {1, 2, 3};
  const SequenceStep step{&*cache, t, LogitsMode::kLast, 7};
  ForwardOutput out;
  const absl::Status refused = (*model)->Forward({&step, 1}, &out);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("device memory"));
  EXPECT_EQ(cache->length(), 0);
  std::vector<float> h(c.d_model, 0.5f);
  EXPECT_EQ((*model)->ForwardLayers(&*cache, 0, 1, 0, 1, h.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*model)->RecomputeKvIntoCache(0, h.data(), 0, 1, &*cache).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_DEATH(cache->KeyBytes(0, 0), "not host memory");
  EXPECT_DEATH({ KvCache copy = *cache; }, "not host memory");
}

INSTANTIATE_TEST_SUITE_P(Families, PagedKvCache,
                         ::testing::ValuesIn(testing::AllFamilyCases()),
                         testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::ops
