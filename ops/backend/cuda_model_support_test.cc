#include "ops/backend/cuda_model_support.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::ops {
namespace {

using ::testing::HasSubstr;

ModelConfig Llama() {
  ModelConfig c;
  c.architecture = "llama";
  c.name = "SmolLM2";
  c.head_dim = 64;
  c.rope_dim = 64;
  return c;
}

TEST(CudaModelSupport, LlamaAndQwen2InBf16) {
  EXPECT_TRUE(CheckCudaModelSupport(Llama(), Precision::kBf16).ok());
  ModelConfig q = Llama();
  q.architecture = "qwen2";
  q.qkv_bias = true;
  EXPECT_TRUE(CheckCudaModelSupport(q, Precision::kBf16).ok());
}

TEST(CudaModelSupport, PathSupportFeedsSelectBackend) {
  EXPECT_TRUE(CudaModelPathSupport(Llama(), Precision::kBf16).can_serve);
  const CudaModelSupport no = CudaModelPathSupport(Llama(), Precision::kF32);
  EXPECT_FALSE(no.can_serve);
  EXPECT_THAT(no.reason, HasSubstr("fp32"));
}

TEST(CudaModelSupport, RefusesWhatIsMissingNamingIt) {
  const absl::Status fp32 = CheckCudaModelSupport(Llama(), Precision::kF32);
  EXPECT_EQ(fp32.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(fp32.message(), HasSubstr("fp32"));
  EXPECT_THAT(fp32.message(), HasSubstr("SmolLM2"));

  ModelConfig g = Llama();
  g.architecture = "gemma3";
  g.name = "gemma-3-270m";
  g.qk_norm = true;
  g.post_attn_norm = true;
  g.post_ffn_norm = true;
  g.head_dim = 256;
  const absl::Status s = CheckCudaModelSupport(g, Precision::kBf16);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("gemma3"));
  EXPECT_THAT(s.message(), HasSubstr("QK-norm"));
  EXPECT_THAT(s.message(), HasSubstr("post-attention norm"));
  EXPECT_THAT(s.message(), HasSubstr("post-FFN norm"));
  EXPECT_THAT(s.message(), HasSubstr("--backend cpu"));

  ModelConfig wide = Llama();
  wide.head_dim = 512;
  wide.rope_dim = 512;
  EXPECT_THAT(CheckCudaModelSupport(wide, Precision::kBf16).message(),
              HasSubstr("head_dim 512"));
}

}  // namespace
}  // namespace kvd::ops
