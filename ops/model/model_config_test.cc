#include "ops/model/model_config.h"

#include "gtest/gtest.h"

namespace kvd::ops {
namespace {

ModelConfig SmolLm2Shape() {
  ModelConfig c;
  c.n_layers = 30;
  c.d_model = 576;
  c.n_heads = 9;
  c.n_kv_heads = 3;
  c.head_dim = 64;
  c.rope_dim = 64;
  c.d_ff = 1536;
  c.vocab_size = 49152;
  c.context_length = 8192;
  c.layers.assign(30, LayerConfig{});
  return c;
}

TEST(ModelConfigValidate, AcceptsARealShapeAndRejectsCorruptOnes) {
  EXPECT_TRUE(SmolLm2Shape().Validate().ok());
  struct Bad {
    const char* name;
    void (*corrupt)(ModelConfig&);
    const char* message;
  } cases[] = {
      {"zero heads", [](ModelConfig& c) { c.n_heads = 0; }, "head count 0"},
      {"heads not in groups", [](ModelConfig& c) { c.n_kv_heads = 4; },
       "not a multiple"},
      {"huge vocab", [](ModelConfig& c) { c.vocab_size = int64_t{1} << 40; },
       "vocabulary"},
      {"odd head", [](ModelConfig& c) { c.head_dim = c.rope_dim = 63; },
       "head size 63"},
      {"rope wider than head", [](ModelConfig& c) { c.rope_dim = 128; },
       "RoPE size 128"},
      {"layer settings", [](ModelConfig& c) { c.layers.pop_back(); },
       "29 layer settings"},
  };
  for (const Bad& bad : cases) {
    ModelConfig c = SmolLm2Shape();
    bad.corrupt(c);
    const absl::Status s = c.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad.name;
    EXPECT_NE(s.message().find(bad.message), std::string::npos)
        << bad.name << ": " << s;
  }
}

TEST(PrecisionTest, ParsesTheNamesFlagsUse) {
  EXPECT_EQ(*ParsePrecision("fp32"), Precision::kF32);
  EXPECT_EQ(*ParsePrecision("bf16"), Precision::kBf16);
  EXPECT_EQ(ParsePrecision("fp16").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParsePrecision("").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvd::ops
