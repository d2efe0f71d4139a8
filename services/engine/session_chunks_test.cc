// Session state survives the trip to storage chunks bit for bit: token ids
// and every residual row read back equal what the forward pass produced,
// turns rewrite only the chunks they touched, and damaged chunks are
// reported with their layer and index.
#include "services/engine/session_chunks.h"

#include <cstring>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "ops/kvdirect/checkpoint_policy.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::engine {
namespace {

using ops::testing::FamilyCase;

class SessionChunksTest : public ::testing::TestWithParam<FamilyCase> {
 protected:
  void SetUp() override {
    ops::testing::TinyModelSpec spec;
    spec.family = GetParam().family;
    absl::StatusOr<std::unique_ptr<ops::Model>> m =
        ops::testing::LoadTinyModel(spec, GetParam().precision, 1);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }

  std::unique_ptr<ops::ResidualStore> NewStore() const {
    return std::make_unique<ops::ResidualStore>(
        model_->config(), model_->precision(),
        ops::CheckpointLayers(*ops::ParseCheckpointPolicy("kv-direct"),
                              model_->config().n_layers));
  }

  // Runs `tokens` through the model after what `cache` holds.
  void Run(ops::KvCache* cache, ops::ResidualStore* store,
           const std::vector<int32_t>& tokens) {
    ops::ForwardOutput out;
    ops::SequenceStep step{cache, tokens, ops::LogitsMode::kNone, 0};
    ASSERT_TRUE(model_->Forward({&step, 1}, &out, store).ok());
    ASSERT_TRUE(store->status().ok());
  }

  v1::SessionManifest Manifest(const ops::ResidualStore& store) const {
    v1::SessionManifest m;
    m.set_format_version(storage::kCheckpointFormatVersion);
    m.set_tenant("acme");
    m.set_session_id("chat-1");
    m.mutable_model()->set_fingerprint("sha256:test");
    m.mutable_model()->set_precision(ops::PrecisionName(model_->precision()));
    m.mutable_model()->set_numerics_version(1);
    m.set_policy("kv-direct");
    for (int64_t l : store.layers()) {
      m.add_layers(l);
      m.add_first_position(0);
    }
    m.set_chunk_tokens(16);
    m.set_dtype(model_->precision() == ops::Precision::kBf16 ? v1::DTYPE_BF16
                                                             : v1::DTYPE_F32);
    m.set_row_bytes(store.row_bytes());
    return m;
  }

  std::unique_ptr<ops::Model> model_;
};

TEST_P(SessionChunksTest, TwoTurnsRoundTripBitForBit) {
  auto store = NewStore();
  ops::KvCache cache = model_->NewCache();
  const int64_t vocab = model_->config().vocab_size;
  std::vector<int32_t> tokens = ops::testing::RandomTokens(37, 1, vocab);
  Run(&cache, store.get(), tokens);

  storage::SessionCheckpoint cp;
  v1::SessionManifest empty;
  v1::SessionManifest m1 = Manifest(*store);
  m1.set_token_count(tokens.size());
  m1.set_length(cache.length());
  m1.add_turn_ends(tokens.size());
  storage::TurnUpdate u1 = *BuildTurnUpdate(empty, m1, tokens, *store, 0);
  ASSERT_TRUE(cp.Apply(u1).ok());
  // 37 tokens in chunks of 16: 3 token chunks and 3 per layer.
  EXPECT_EQ(u1.put.size(), 3 * (1 + store->layers().size()));

  // Second turn: 20 more tokens; only chunks 2 and 3 change.
  const std::vector<int32_t> more = ops::testing::RandomTokens(20, 2, vocab);
  Run(&cache, store.get(), more);
  tokens.insert(tokens.end(), more.begin(), more.end());
  v1::SessionManifest m2 = u1.manifest;
  m2.set_token_count(tokens.size());
  m2.set_length(cache.length());
  m2.add_turn_ends(tokens.size());
  storage::TurnUpdate u2 = *BuildTurnUpdate(u1.manifest, m2, tokens, *store, 0);
  for (const auto& [id, value] : u2.put) {
    EXPECT_TRUE(id.index == 2 || id.index == 3) << id.layer << "/" << id.index;
  }
  ASSERT_TRUE(cp.Apply(u2).ok());
  EXPECT_EQ(cp.manifest().stored_bytes(),
            57 * 4 + 57 * store->row_bytes() *
                         static_cast<int64_t>(store->layers().size()));

  std::vector<int32_t> back;
  ASSERT_TRUE(RestoreTokens(cp, &back).ok());
  EXPECT_EQ(back, tokens);
  auto restored = NewStore();
  ASSERT_TRUE(RestoreResiduals(cp, restored.get(), 0).ok());
  for (int64_t l : store->layers()) {
    for (int64_t p = 0; p < 57; ++p) {
      ASSERT_EQ(std::memcmp(store->RowBytes(0, l, p),
                            restored->RowBytes(0, l, p), store->row_bytes()),
                0)
          << "layer " << l << " position " << p;
    }
  }
}

TEST_P(SessionChunksTest, DamagedOrMissingChunkIsNamed) {
  auto store = NewStore();
  ops::KvCache cache = model_->NewCache();
  const std::vector<int32_t> tokens =
      ops::testing::RandomTokens(40, 3, model_->config().vocab_size);
  Run(&cache, store.get(), tokens);
  v1::SessionManifest m = Manifest(*store);
  m.set_token_count(40);
  m.set_length(40);
  m.add_turn_ends(40);
  storage::TurnUpdate u =
      *BuildTurnUpdate(v1::SessionManifest(), m, tokens, *store, 0);
  // Flip one payload byte of layer 1, chunk 1.
  for (auto& [id, value] : u.put) {
    if (id.layer == 1 && id.index == 1) value[value.size() - 5] ^= 0x10;
  }
  storage::SessionCheckpoint cp;
  ASSERT_TRUE(cp.Apply(u).ok());
  auto restored = NewStore();
  absl::Status s = RestoreResiduals(cp, restored.get(), 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("layer 1 chunk 1"), std::string::npos) << s;
  // Token ids are intact, so a re-prefill is still possible.
  std::vector<int32_t> back;
  EXPECT_TRUE(RestoreTokens(cp, &back).ok());
  // A missing token chunk is reported too.
  u.put.erase(u.put.begin());
  storage::SessionCheckpoint partial;
  ASSERT_TRUE(partial.Apply(u).ok());
  s = RestoreTokens(partial, &back);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("token ids chunk 0"), std::string::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(Families, SessionChunksTest,
                         ::testing::ValuesIn(ops::testing::AllFamilyCases()),
                         ops::testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::engine
