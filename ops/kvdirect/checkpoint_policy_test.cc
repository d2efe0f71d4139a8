// Policy parsing and byte accounting. The expected byte counts for the real
// models are DESIGN.md section 1's table, worked out by hand from the models'
// published shapes (SmolLM2-135M: 30 layers, d_model 576, 3 KV heads x 64;
// Gemma 3 270M: 18 layers, d_model 640, 1 KV head x 256, every sixth layer
// global); here they are computed from the configs read out of the files.
#include "ops/kvdirect/checkpoint_policy.h"

#include <filesystem>
#include <iostream>

#include "absl/strings/str_format.h"
#include "base/model_dir.h"
#include "gtest/gtest.h"
#include "ops/model/architecture.h"

namespace kvd::ops {
namespace {

TEST(CheckpointPolicy, ParsesEverySpellingAndRejectsOthers) {
  for (const char* name :
       {"kv", "kv-direct", "tokens", "stride:1", "stride:6"}) {
    absl::StatusOr<CheckpointPolicy> p = ParseCheckpointPolicy(name);
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    EXPECT_EQ(p->Name(), name);
  }
  for (const char* bad : {"", "kv_direct", "stride:", "stride:0", "stride:-2",
                          "stride:x", "KV"}) {
    EXPECT_EQ(ParseCheckpointPolicy(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(CheckpointPolicy, LayerSets) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(CheckpointLayers(*ParseCheckpointPolicy("kv-direct"), 4),
            (V{0, 1, 2, 3}));
  EXPECT_EQ(CheckpointLayers(*ParseCheckpointPolicy("stride:3"), 10),
            (V{0, 3, 6, 9}));
  EXPECT_EQ(CheckpointLayers(*ParseCheckpointPolicy("stride:1"), 3),
            (V{0, 1, 2}));
  EXPECT_TRUE(CheckpointLayers(*ParseCheckpointPolicy("kv"), 4).empty());
  EXPECT_TRUE(CheckpointLayers(*ParseCheckpointPolicy("tokens"), 4).empty());
}

ModelConfig ReadConfig(const std::string& path) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  absl::StatusOr<const ArchitectureEntry*> arch =
      FindArchitecture(std::string((*file)->architecture()));
  EXPECT_TRUE(arch.ok()) << arch.status();
  absl::StatusOr<ModelConfig> config = (*arch)->read_config(**file);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

BytesPerToken Bytes(const ModelConfig& c, Precision p, const char* policy) {
  return ComputeBytesPerToken(c, p, *ParseCheckpointPolicy(policy));
}

void PrintTable(const ModelConfig& c) {
  for (Precision p : {Precision::kF32, Precision::kBf16}) {
    for (const char* policy :
         {"kv", "kv-direct", "stride:2", "stride:4", "stride:6", "tokens"}) {
      const BytesPerToken b = Bytes(c, p, policy);
      std::cout << absl::StrFormat(
          "%s %s %-9s state %7d B/token (%.2f KiB), past window %7d B/token "
          "(+%d B token id)\n",
          c.name, PrecisionName(p), policy, b.state, b.state / 1024.0,
          b.state_past_window, b.token_id);
    }
  }
}

const std::string kSmolLm2 = CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf");
const std::string kGemma3 = CachedModelPath("gemma-3-270m-q4_k_m.gguf");

TEST(CheckpointPolicy, SmolLm2BytesPerToken) {
  if (!std::filesystem::exists(kSmolLm2))
    FAIL() << kSmolLm2 << " is missing: run tools/setup.sh --test";
  const ModelConfig c = ReadConfig(kSmolLm2);
  PrintTable(c);
  EXPECT_EQ(Bytes(c, Precision::kBf16, "kv").state, 22.5 * 1024);
  EXPECT_EQ(Bytes(c, Precision::kBf16, "kv-direct").state, 33.75 * 1024);
  EXPECT_EQ(Bytes(c, Precision::kBf16, "kv-direct").residual_row, 1152);
  EXPECT_EQ(Bytes(c, Precision::kF32, "kv-direct").state, 67.5 * 1024);
  // Layers 0, 4, ..., 28: 8 checkpoints.
  EXPECT_EQ(Bytes(c, Precision::kBf16, "stride:4").state, 8 * 1152);
  EXPECT_EQ(Bytes(c, Precision::kBf16, "tokens").state, 0);
  // No sliding windows: everything is kept for the whole session.
  EXPECT_EQ(Bytes(c, Precision::kBf16, "kv").state_past_window, 22.5 * 1024);
}

TEST(CheckpointPolicy, Gemma3BytesPerTokenCountOnlyGlobalLayersPastWindow) {
  if (!std::filesystem::exists(kGemma3))
    FAIL() << kGemma3 << " is missing: run tools/setup.sh --test";
  const ModelConfig c = ReadConfig(kGemma3);
  PrintTable(c);
  EXPECT_EQ(Bytes(c, Precision::kBf16, "kv").state, 18 * 1024);
  EXPECT_EQ(Bytes(c, Precision::kBf16, "kv").state_past_window, 3 * 1024);
  EXPECT_EQ(Bytes(c, Precision::kBf16, "kv-direct").state, 22.5 * 1024);
  // Three global layers (5, 11, 17) x 640 values x 2 bytes.
  EXPECT_EQ(Bytes(c, Precision::kBf16, "kv-direct").state_past_window, 3840);
  // stride:6 checkpoints 0, 6, 12; each segment holds one global layer.
  EXPECT_EQ(Bytes(c, Precision::kBf16, "stride:6").state, 3840);
  EXPECT_EQ(Bytes(c, Precision::kBf16, "stride:6").state_past_window, 3840);
  // stride:3 checkpoints 0, 3, ..., 15; segments [0,3), [6,9), [12,15) are
  // all-local.
  EXPECT_EQ(Bytes(c, Precision::kBf16, "stride:3").state, 6 * 1280);
  EXPECT_EQ(Bytes(c, Precision::kBf16, "stride:3").state_past_window, 3 * 1280);
}

}  // namespace
}  // namespace kvd::ops
