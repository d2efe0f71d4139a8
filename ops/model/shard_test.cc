// Tensor-parallel shards (Model::ShardOf) compute the unsharded model's bits:
// at every degree dividing the model's row-parallel groups, run as threads
// joined by a ThreadShardReducer, each shard's logits equal the whole
// model's bit for bit, and its K/V are its heads' slice of the whole
// model's. A random-weight model with 8 K/V heads runs at TP = 1, 2, 4, 8;
// SmolLM2-135M (3 K/V heads) at TP = 3.
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/model_dir.h"
#include "gtest/gtest.h"
#include "ops/model/model.h"
#include "ops/model/shard_reducer.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::ops {
namespace {

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The last logits of every step (testing::LastLogitsPerStep); a failure is
// an empty vector, which matches nothing.
std::vector<float> RunSteps(const Model& m, const std::vector<int32_t>& prompt,
                            const std::vector<int32_t>& steps) {
  absl::StatusOr<std::vector<float>> out =
      testing::LastLogitsPerStep(m, prompt, steps);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *std::move(out) : std::vector<float>();
}

// Runs `degree` shards of `full` as threads; every shard's logits.
std::vector<std::vector<float>> RunSharded(
    const Model& full, int64_t degree, const std::vector<int32_t>& prompt,
    const std::vector<int32_t>& steps,
    std::vector<std::unique_ptr<Model>>* shards_out = nullptr) {
  ThreadShardReducer reducer(degree);
  std::vector<std::unique_ptr<Model>> shards;
  for (int64_t s = 0; s < degree; ++s) {
    absl::StatusOr<std::unique_ptr<Model>> m =
        Model::ShardOf(full, s, degree, &reducer, 1);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return {};
    shards.push_back(*std::move(m));
  }
  std::vector<std::vector<float>> logits(degree);
  std::vector<std::thread> threads;
  for (int64_t s = 0; s < degree; ++s) {
    threads.emplace_back(
        [&, s] { logits[s] = RunSteps(*shards[s], prompt, steps); });
  }
  for (std::thread& t : threads) t.join();
  if (shards_out != nullptr) *shards_out = std::move(shards);
  return logits;
}

// Layer `layer`'s K/V rows recomputed from `h` by the whole model, and by
// each shard: the shard's rows are its slice of the whole rows.
void ExpectKvSlices(const Model& full,
                    const std::vector<std::unique_ptr<Model>>& shards) {
  const ModelConfig& c = full.config();
  const int64_t n = 7;
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> h(n * c.d_model);
  for (float& x : h) x = u(rng);
  if (full.precision() == Precision::kBf16) {  // residuals are bf16 there
    for (float& x : h) {
      uint32_t b;
      std::memcpy(&b, &x, 4);
      b &= 0xffff0000u;
      std::memcpy(&x, &b, 4);
    }
  }
  std::vector<int64_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = 3 + i;
  const int64_t row = full.NewCache().row_bytes();
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    std::vector<uint8_t> k(n * row), v(n * row);
    ASSERT_TRUE(
        full.RecomputeKv(layer, h.data(), pos.data(), n, k.data(), v.data())
            .ok());
    for (size_t s = 0; s < shards.size(); ++s) {
      const int64_t srow = shards[s]->NewCache().row_bytes();
      ASSERT_EQ(srow * static_cast<int64_t>(shards.size()), row);
      std::vector<uint8_t> sk(n * srow), sv(n * srow);
      ASSERT_TRUE(shards[s]
                      ->RecomputeKv(layer, h.data(), pos.data(), n, sk.data(),
                                    sv.data())
                      .ok());
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(std::memcmp(sk.data() + i * srow,
                              k.data() + i * row + s * srow, srow),
                  0)
            << "layer " << layer << " shard " << s << " row " << i << " K";
        EXPECT_EQ(std::memcmp(sv.data() + i * srow,
                              v.data() + i * row + s * srow, srow),
                  0)
            << "layer " << layer << " shard " << s << " row " << i << " V";
      }
    }
  }
}

class TinyShardTest : public ::testing::TestWithParam<Precision> {};

TEST_P(TinyShardTest, EveryDegreeDividingTheGroupsGivesTheSameBits) {
  testing::TinyModelSpec spec = testing::EightKvHeadSpec();
  spec.n_layers = 3;
  absl::StatusOr<std::unique_ptr<Model>> full =
      testing::LoadTinyModel(spec, GetParam(), 1);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_EQ((*full)->config().row_parallel_groups(), 8);
  const std::vector<int32_t> prompt =
      testing::RandomTokens(21, 1, spec.vocab_size);
  const std::vector<int32_t> steps =
      testing::RandomTokens(5, 2, spec.vocab_size);
  const auto want = RunSteps(**full, prompt, steps);
  for (int64_t degree : {1, 2, 4, 8}) {
    std::vector<std::unique_ptr<Model>> shards;
    const auto got = RunSharded(**full, degree, prompt, steps, &shards);
    ASSERT_EQ(got.size(), static_cast<size_t>(degree));
    for (int64_t s = 0; s < degree; ++s) {
      EXPECT_TRUE(SameBits(got[s], want)) << "TP=" << degree << ", shard " << s;
    }
    ExpectKvSlices(**full, shards);
  }
  ThreadShardReducer reducer(3);
  EXPECT_FALSE(Model::ShardOf(**full, 0, 3, &reducer, 1).ok())
      << "3 does not divide 8 groups";
}

INSTANTIATE_TEST_SUITE_P(Precisions, TinyShardTest,
                         ::testing::Values(Precision::kF32, Precision::kBf16));

class SmolLm2ShardTest : public ::testing::TestWithParam<Precision> {};

// In fp32 the shards keep the file's quantized blocks (their slices fall on
// block boundaries), in bf16 they hold bf16 slices.
TEST_P(SmolLm2ShardTest, ThreeShardsGiveTheSameBitsAsOneProcess) {
  const std::string path = CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf");
  LoadOptions o;
  o.precision = GetParam();
  o.num_threads = 2;
  absl::StatusOr<std::unique_ptr<Model>> full = Model::Load(path, o);
  ASSERT_TRUE(full.ok()) << full.status()
                         << " (the model comes with tools/setup.sh --test)";
  ASSERT_EQ((*full)->config().row_parallel_groups(), 3);
  const std::vector<int32_t> prompt =
      testing::RandomTokens(40, 3, (*full)->config().vocab_size);
  const std::vector<int32_t> steps =
      testing::RandomTokens(4, 4, (*full)->config().vocab_size);
  const auto want = RunSteps(**full, prompt, steps);
  std::vector<std::unique_ptr<Model>> shards;
  const auto got = RunSharded(**full, 3, prompt, steps, &shards);
  ASSERT_EQ(got.size(), 3u);
  for (int s = 0; s < 3; ++s) {
    EXPECT_TRUE(SameBits(got[s], want)) << "shard " << s;
  }
  ExpectKvSlices(**full, shards);
  if (GetParam() == Precision::kF32) {
    EXPECT_EQ(shards[1]->weights().layers[0].wo.view().type,
              kernels::cpu::WeightType::kGgmlBlocks);
    EXPECT_EQ(shards[1]->weights().layers[0].w_down.view().type,
              kernels::cpu::WeightType::kGgmlBlocks);
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, SmolLm2ShardTest,
                         ::testing::Values(Precision::kF32, Precision::kBf16));

}  // namespace
}  // namespace kvd::ops
