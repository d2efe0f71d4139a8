#include "services/worker/worker_protocol.h"

#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "ops/model/model.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::worker {
namespace {

TEST(Residuals, Bf16ValuesTravelAsBf16AndComeBackBitForBit) {
  const std::vector<float> bf16 = {1.0f, -2.5f, 0.0f, 3.140625f, -0.0f, 1e-30f};
  std::vector<float> exact(bf16.size());
  for (size_t i = 0; i < bf16.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &bf16[i], 4);
    bits &= 0xffff0000u;  // every value made exactly a bf16
    std::memcpy(&exact[i], &bits, 4);
  }
  v1::ResidualRows rows;
  EncodeResiduals(exact.data(), 2, 3, &rows);
  EXPECT_TRUE(rows.bf16());
  EXPECT_EQ(rows.data().size(), exact.size() * 2);
  std::vector<float> back;
  ASSERT_TRUE(DecodeResiduals(rows, 2, 3, &back).ok());
  EXPECT_EQ(std::memcmp(back.data(), exact.data(), exact.size() * 4), 0);

  // One value that is not a bf16: all of them go as fp32, unchanged.
  std::vector<float> fp32 = exact;
  fp32[4] = 1.0f + 1.0f / 1024;
  EncodeResiduals(fp32.data(), 2, 3, &rows);
  EXPECT_FALSE(rows.bf16());
  ASSERT_TRUE(DecodeResiduals(rows, 2, 3, &back).ok());
  EXPECT_EQ(std::memcmp(back.data(), fp32.data(), fp32.size() * 4), 0);
  EXPECT_EQ(DecodeResiduals(rows, 3, 3, &back).code(),
            absl::StatusCode::kInvalidArgument);
}

// Test double: keeps every call a cache is told of, as the shard group's
// journal does.
class RecordingMirrorForTest : public ops::KvCacheMirror {
 public:
  explicit RecordingMirrorForTest(std::vector<v1::CacheOp>* ops) : ops_(ops) {}
  void Record(const ops::KvCacheOp& op) override {
    v1::CacheOp& o = ops_->emplace_back();
    o.set_cache(1);
    o.set_kind(op.kind);
    o.set_layer(op.layer);
    o.set_value(op.value);
  }

 private:
  std::vector<v1::CacheOp>* ops_;
};

// A twin that replays a cache's bookkeeping calls holds the same positions
// at every layer, through everything the engine and a rebuild do to one.
TEST(TwinCaches, ReplayingACachesCallsGivesTheSamePositions) {
  ops::testing::TinyModelSpec spec;
  spec.family = "gemma3";  // local layers: Forward trims their windows
  absl::StatusOr<std::unique_ptr<ops::Model>> m =
      ops::testing::LoadTinyModel(spec, ops::Precision::kF32, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<v1::CacheOp> journal;
  absl::StatusOr<std::unique_ptr<ops::KvBlockPool>> pool =
      (*m)->NewBlockPool({});
  ASSERT_TRUE(pool.ok());
  absl::StatusOr<ops::KvCache> made = (*m)->NewCache(pool->get());
  ASSERT_TRUE(made.ok());
  ops::KvCache cache = *std::move(made);
  cache.AttachMirror(std::make_unique<RecordingMirrorForTest>(&journal));
  v1::CacheOp create;
  create.set_cache(1);
  create.set_kind(kCacheCreated);
  create.set_value(cache.block_rows());
  journal.insert(journal.begin(), create);

  TwinCaches twins((*m)->config(), ops::Precision::kF32);
  auto replay_and_compare = [&](const char* when) {
    for (const v1::CacheOp& op : journal) ASSERT_TRUE(twins.Apply(op).ok());
    journal.clear();
    absl::StatusOr<ops::KvCache*> twin = twins.Find(1);
    ASSERT_TRUE(twin.ok());
    EXPECT_EQ((*twin)->length(), cache.length()) << when;
    for (int64_t l = 0; l < cache.n_layers(); ++l) {
      EXPECT_EQ((*twin)->first_kept(l), cache.first_kept(l)) << when;
      EXPECT_EQ((*twin)->covered_end(l), cache.covered_end(l)) << when;
    }
  };
  // What a step does to the leader's cache, its twin's own step does too.
  std::vector<int32_t> prompt(300, 3);
  ops::SequenceStep step{&cache, prompt, ops::LogitsMode::kNone};
  ops::ForwardOutput out;
  ASSERT_TRUE((*m)->Forward({&step, 1}, &out).ok());
  // The calls made before the step (the twin's creation) go with it; those
  // the step made itself go with the next command, after the twin ran it.
  ASSERT_TRUE(twins.Apply(journal.front()).ok());
  journal.erase(journal.begin());
  {
    // The twin runs the same step (a worker's Forward).
    ops::SequenceStep twin_step{*twins.Find(1), prompt, ops::LogitsMode::kNone};
    ASSERT_TRUE((*m)->Forward({&twin_step, 1}, &out).ok());
  }
  replay_and_compare("after a step");
  cache.Truncate(200);
  replay_and_compare("after Truncate");
  cache.DropBelow(2, 128);
  cache.DropBelow(64);
  replay_and_compare("after DropBelow");
  cache.Reset(100);  // a kv-direct rebuild
  cache.SetLength(250);
  ASSERT_TRUE(cache.ReserveLayer(0, 250).ok());
  ASSERT_TRUE(cache.Reserve(250).ok());
  cache.KeepRowsPastWindows();
  replay_and_compare("after a rebuild's calls");
  EXPECT_FALSE((*twins.Find(1))->trims_past_windows());

  v1::CacheOp drop;
  drop.set_cache(1);
  drop.set_kind(kCacheDropped);
  ASSERT_TRUE(twins.Apply(drop).ok());
  EXPECT_EQ(twins.Find(1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(twins.Apply(create).code(), absl::StatusCode::kOk);
  v1::CacheOp unknown = drop;
  unknown.set_cache(9);
  unknown.set_kind(ops::KvCacheOp::kTruncate);
  EXPECT_EQ(twins.Apply(unknown).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvd::worker
