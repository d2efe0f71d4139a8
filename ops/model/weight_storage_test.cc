// The two weight storages on the real models, in both precision modes: blocks
// kept as the file stores them (dequantized, and in bf16 rounded, inside the
// GEMM) give every logit of weights converted at load, bit for bit, on every
// vector ISA, at prefill, batched decode and single-sequence decode, while
// holding a fraction of the bytes.
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "base/model_dir.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_features.h"
#include "ops/model/model.h"
#include "ops/model/testing/model_cases.h"

namespace kvd::ops {
namespace {

namespace cpu = kernels::cpu;

std::unique_ptr<Model> LoadWith(const std::string& file, Precision precision,
                                WeightStorage storage) {
  LoadOptions o;
  o.precision = precision;
  o.weights = storage;
  o.num_threads = 2;
  absl::StatusOr<std::unique_ptr<Model>> m =
      Model::Load(CachedModelPath(file), o);
  EXPECT_TRUE(m.ok()) << m.status()
                      << " (the model comes with tools/setup.sh --test)";
  return m.ok() ? std::move(*m) : nullptr;
}

// Every logit of: a 40-token prompt and a 3-token prompt prefilled together
// (every position's logits), then 4 decode steps of both together, then 3
// steps of the first alone.
std::vector<float> AllLogits(const Model& m) {
  const int64_t vocab = m.config().vocab_size;
  const std::vector<int32_t> long_prompt = testing::RandomTokens(40, 1, vocab);
  const std::vector<int32_t> short_prompt = testing::RandomTokens(3, 2, vocab);
  const std::vector<int32_t> next = testing::RandomTokens(7, 3, vocab);
  KvCache a = m.NewCache(), b = m.NewCache();
  std::vector<float> all;
  auto step = [&](std::vector<SequenceStep> batch) {
    ForwardOutput out;
    EXPECT_TRUE(m.Forward(batch, &out).ok());
    all.insert(all.end(), out.logits.begin(), out.logits.end());
  };
  step({{&a, long_prompt, LogitsMode::kAll, 0},
        {&b, short_prompt, LogitsMode::kAll, 1}});
  for (int i = 0; i < 4; ++i) {
    step({{&a, {&next[i], 1}, LogitsMode::kLast, 0},
          {&b, {&next[6 - i], 1}, LogitsMode::kLast, 1}});
  }
  for (int i = 4; i < 7; ++i) step({{&a, {&next[i], 1}, LogitsMode::kLast, 0}});
  return all;
}

class WeightStorageTest
    : public ::testing::TestWithParam<std::tuple<std::string, Precision>> {};

TEST_P(WeightStorageTest, BlocksAsStoredGiveTheBitsOfWeightsDequantizedAtLoad) {
  const auto [file, precision] = GetParam();
  std::unique_ptr<Model> dequantized =
      LoadWith(file, precision, WeightStorage::kDequantized);
  std::unique_ptr<Model> stored =
      LoadWith(file, precision, WeightStorage::kAsStored);
  ASSERT_TRUE(dequantized && stored);
  const std::vector<float> want = AllLogits(*dequantized);
  ASSERT_FALSE(want.empty());

  // The file's matrices stay blocks: far fewer bytes than fp32 or bf16
  // copies.
  // (The bf16 mode keeps them only where AVX-512 runs: BlocksPayOff.)
  if (BlocksPayOff(precision)) {
    EXPECT_EQ(stored->weights().layers[0].w_up.view().type,
              cpu::WeightType::kGgmlBlocks);
    EXPECT_LT(
        stored->weights().size_bytes() * (precision == Precision::kF32 ? 4 : 2),
        dequantized->weights().size_bytes());
  }

  const cpu::Isa saved = cpu::ActiveIsa();
  for (cpu::Isa isa : {cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
    if (!cpu::IsaSupported(isa)) continue;
    ASSERT_TRUE(cpu::SetIsa(isa).ok());
    const std::vector<float> got = AllLogits(*stored);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0)
        << file << " " << PrecisionName(precision) << " on "
        << cpu::IsaName(isa);
  }
  ASSERT_TRUE(cpu::SetIsa(saved).ok());
}

INSTANTIATE_TEST_SUITE_P(
    RealModels, WeightStorageTest,
    ::testing::Combine(::testing::Values("SmolLM2-135M-Instruct.Q4_1.gguf",
                                         "gemma-3-270m-q4_k_m.gguf"),
                       ::testing::Values(Precision::kF32, Precision::kBf16)),
    [](const ::testing::TestParamInfo<std::tuple<std::string, Precision>>& i) {
      return std::string(std::get<0>(i.param)[0] == 'S' ? "SmolLM2"
                                                        : "Gemma3") +
             "_" + PrecisionName(std::get<1>(i.param));
    });

}  // namespace
}  // namespace kvd::ops
