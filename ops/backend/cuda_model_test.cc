// Device tests (requires-gpu; skipped with the reason where there is no CUDA
// device) of the CUDA forward pass against itself and against the CPU engine,
// on random-weight models built here (testing/cuda_model_cases.h):
//   (a) batch invariance: a sequence's logits alone == in a batch of 4 with
//       other sequences of different lengths, prefill and decode mixed; one
//       prefill chunk == several chunks == token by token (bits);
//   (b) token identity: greedy tokens equal the CPU bf16 engine's, except
//       after a near-tie that the measured logit difference can flip (random
//       weights have flat distributions: testing/cuda_model_cases.h); prints
//       the first divergence and the max |logit diff|, which is bounded, also
//       teacher-forced along the CPU's tokens;
//   (c) last-token logits within kCudaLogitTolerance (relative L2) of the CPU
//       fp32 engine.
#include "ops/backend/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/internal/test_util.h"
#include "ops/backend/testing/cuda_model_cases.h"

namespace kvd::ops {
namespace {

using testing::CpuGreedy;
using testing::CpuLogits;
using testing::CudaCasePrompts;
using testing::CudaCaseSpec;
using testing::kCudaCaseNewTokens;
using testing::kCudaLogitTolerance;
using testing::kMaxLogitDiff;
using testing::LoadTinyModel;
using testing::RelL2;
using testing::SameBits;
using testing::Top2Margin;

class CudaModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    KVD_REQUIRE_GPU();
    auto cpu = LoadTinyModel(CudaCaseSpec(GetParam()), Precision::kBf16, 4);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(*cpu);
    auto gpu = CudaModel::Create(*cpu_, {});
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
    vocab_ = cpu_->config().vocab_size;
  }

  // Feeds `tokens` to a fresh cache in chunks of `chunk` (alone in each
  // step); returns the last step's logits.
  std::vector<float> Alone(const std::vector<int32_t>& tokens, size_t chunk,
                           CudaKvCache* cache) {
    std::vector<float> logits;
    for (size_t b = 0; b < tokens.size(); b += chunk) {
      CudaStep st{cache, absl::MakeConstSpan(tokens).subspan(b, chunk)};
      const absl::Status s = gpu_->Forward({&st, 1}, &logits);
      EXPECT_TRUE(s.ok()) << s;
    }
    return logits;
  }

  std::unique_ptr<Model> cpu_;
  std::unique_ptr<CudaModel> gpu_;
  int64_t vocab_ = 0;
};

TEST_P(CudaModelTest, LogitsDoNotDependOnBatchOrChunking) {
  const auto prompts = CudaCasePrompts();
  const std::vector<int32_t>& a = prompts[3];  // 37 tokens: two chunks
  auto cache = gpu_->NewCache();
  ASSERT_TRUE(cache.ok());
  const std::vector<float> alone = Alone(a, a.size(), &*cache);
  ASSERT_EQ(alone.size(), vocab_);

  for (size_t chunk : {16, 5, 1}) {
    auto c = gpu_->NewCache();
    ASSERT_TRUE(c.ok());
    const std::vector<float> chunked = Alone(a, chunk, &*c);
    EXPECT_TRUE(SameBits(chunked.data(), alone.data(), vocab_))
        << "prefill in chunks of " << chunk << " differs from one chunk";
  }

  // A batch of 4: another sequence decoding at position 64, a's prompt, a
  // fresh one-token sequence and a 20-token chunk after a 3-token history.
  auto b = gpu_->NewCache(), c = gpu_->NewCache(), d = gpu_->NewCache(),
       a2 = gpu_->NewCache();
  ASSERT_TRUE(b.ok() && c.ok() && d.ok() && a2.ok());
  const std::vector<int32_t>& b_hist = prompts[4];  // 64 tokens
  Alone(b_hist, b_hist.size(), &*b);
  Alone({prompts[1].begin(), prompts[1].begin() + 3}, 3, &*d);
  const std::vector<int32_t> b_next = {prompts[5][0]}, c_tok = {prompts[5][1]};
  const std::vector<int32_t> d_chunk(prompts[5].begin() + 2,
                                     prompts[5].begin() + 22);
  std::vector<CudaStep> batch = {
      {&*b, b_next}, {&*a2, a}, {&*c, c_tok}, {&*d, d_chunk}};
  std::vector<float> logits;
  ASSERT_TRUE(gpu_->Forward(batch, &logits).ok());
  ASSERT_EQ(logits.size(), 4 * vocab_);
  EXPECT_TRUE(SameBits(logits.data() + vocab_, alone.data(), vocab_))
      << "a's logits in a batch of 4 differ from a alone";

  // The others, replayed alone, give their batch rows' bits too.
  auto b1 = gpu_->NewCache(), c1 = gpu_->NewCache(), d1 = gpu_->NewCache();
  ASSERT_TRUE(b1.ok() && c1.ok() && d1.ok());
  Alone(b_hist, 7, &*b1);
  EXPECT_TRUE(SameBits(Alone(b_next, 1, &*b1).data(), logits.data(), vocab_));
  EXPECT_TRUE(SameBits(Alone(c_tok, 1, &*c1).data(), logits.data() + 2 * vocab_,
                       vocab_));
  Alone({prompts[1].begin(), prompts[1].begin() + 3}, 1, &*d1);
  EXPECT_TRUE(SameBits(Alone(d_chunk, d_chunk.size(), &*d1).data(),
                       logits.data() + 3 * vocab_, vocab_));

  // Decoding on: a2 (batched history) and cache (alone) stay identical.
  const std::vector<int32_t> next = {prompts[2][0]};
  std::vector<CudaStep> batch2 = {{&*a2, next}, {&*b1, next}};
  ASSERT_TRUE(gpu_->Forward(batch2, &logits).ok());
  EXPECT_TRUE(SameBits(Alone(next, 1, &*cache).data(), logits.data(), vocab_));
}

TEST_P(CudaModelTest, GreedyTokensEqualTheCpuEngine) {
  int identical = 0;
  double worst = 0;
  for (const auto& prompt : CudaCasePrompts()) {
    std::vector<std::vector<float>> cpu_logits, gpu_logits;
    auto want = CpuGreedy(*cpu_, prompt, kCudaCaseNewTokens, &cpu_logits);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = gpu_->Generate(prompt, kCudaCaseNewTokens, 16, &gpu_logits);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want->size());
    size_t same = 0;
    while (same < want->size() && (*got)[same] == (*want)[same]) ++same;
    // Up to and including the first divergence both saw the same context.
    double max_diff = 0;
    for (size_t i = 0; i < std::min(same + 1, want->size()); ++i)
      for (int64_t j = 0; j < vocab_; ++j)
        max_diff = std::max<double>(
            max_diff, std::fabs(gpu_logits[i][j] - cpu_logits[i][j]));
    worst = std::max(worst, max_diff);
    if (same == want->size()) {
      ++identical;
      std::printf(
          "[ %s ] prompt of %zu: all %zu tokens equal the CPU's, max "
          "|logit diff| %.5f\n",
          GetParam().c_str(), prompt.size(), want->size(), max_diff);
    } else {
      const float margin = Top2Margin(cpu_logits[same]);
      std::printf(
          "[ %s ] prompt of %zu: first divergence at generated token %zu (GPU "
          "%d, CPU %d, CPU top-2 margin %.5f), max |logit diff| %.5f\n",
          GetParam().c_str(), prompt.size(), same, (*got)[same], (*want)[same],
          margin, max_diff);
      // Only a near-tie that the measured rounding difference can flip.
      EXPECT_LT(margin, 2 * max_diff)
          << "prompt of " << prompt.size() << " diverges at token " << same
          << " where the CPU's choice was not a near-tie";
    }
    EXPECT_LT(max_diff, kMaxLogitDiff) << "prompt of " << prompt.size();

    // Teacher-forced along the CPU's tokens, so every step is compared even
    // after a divergence.
    auto cache = gpu_->NewCache();
    ASSERT_TRUE(cache.ok());
    std::vector<float> logits = Alone(prompt, prompt.size(), &*cache);
    double forced = 0;
    for (size_t i = 0; i < want->size(); ++i) {
      for (int64_t j = 0; j < vocab_; ++j)
        forced =
            std::max<double>(forced, std::fabs(logits[j] - cpu_logits[i][j]));
      if (i + 1 < want->size()) logits = Alone({(*want)[i]}, 1, &*cache);
    }
    EXPECT_LT(forced, kMaxLogitDiff)
        << "prompt of " << prompt.size() << " along the CPU's tokens";
    worst = std::max(worst, forced);
  }
  std::printf(
      "[ %s ] %d of %zu prompts token-identical over %lld tokens; max "
      "|logit diff| vs CPU bf16 %.5f\n",
      GetParam().c_str(), identical, CudaCasePrompts().size(),
      static_cast<long long>(kCudaCaseNewTokens), worst);
}

TEST_P(CudaModelTest, LogitsCloseToTheCpuFp32Engine) {
  auto fp32 = LoadTinyModel(CudaCaseSpec(GetParam()), Precision::kF32, 4);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  for (const auto& prompt : CudaCasePrompts()) {
    auto want = CpuLogits(**fp32, prompt);
    auto cpu_bf16 = CpuLogits(*cpu_, prompt);
    ASSERT_TRUE(want.ok() && cpu_bf16.ok());
    auto cache = gpu_->NewCache();
    ASSERT_TRUE(cache.ok());
    const std::vector<float> got = Alone(prompt, prompt.size(), &*cache);
    const double err = RelL2(got, *want);
    std::printf(
        "[ %s ] prompt of %zu: relative L2 vs CPU fp32: GPU %.5f, CPU bf16 "
        "%.5f\n",
        GetParam().c_str(), prompt.size(), err, RelL2(*cpu_bf16, *want));
    EXPECT_LT(err, kCudaLogitTolerance) << "prompt of " << prompt.size();
  }
}

TEST_P(CudaModelTest, PoolExhaustionChangesNothing) {
  CudaModelOptions small;
  small.max_blocks = cpu_->config().n_layers * 2;  // 64 positions
  auto gpu = CudaModel::Create(*cpu_, small);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto cache = (*gpu)->NewCache();
  ASSERT_TRUE(cache.ok());
  const auto prompts = CudaCasePrompts();
  std::vector<float> logits;
  CudaStep too_long{&*cache, prompts[5]};  // 100 tokens
  EXPECT_EQ((*gpu)->Forward({&too_long, 1}, &logits).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->length(), 0);
  EXPECT_EQ((*gpu)->free_blocks(), small.max_blocks);
  CudaStep fits{&*cache, prompts[4]};  // 64 tokens
  ASSERT_TRUE((*gpu)->Forward({&fits, 1}, &logits).ok());
  EXPECT_EQ((*gpu)->free_blocks(), 0);
  auto ref = gpu_->NewCache();
  ASSERT_TRUE(ref.ok());
  EXPECT_TRUE(
      SameBits(Alone(prompts[4], 64, &*ref).data(), logits.data(), vocab_))
      << "pool size changed the bits";
  const std::vector<int32_t> bad = {static_cast<int32_t>(vocab_)};
  CudaStep oob{&*ref, bad};
  EXPECT_EQ(gpu_->Forward({&oob, 1}, &logits).code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaModelTest,
                         ::testing::Values("llama", "qwen2"));

}  // namespace
}  // namespace kvd::ops
