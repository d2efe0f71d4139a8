// Runs without a GPU: every entry point rejects bad shapes, strides and null
// pointers with INVALID_ARGUMENT before touching the CUDA runtime, and treats
// an empty batch as a no-op.
#include <cstdint>

#include "gtest/gtest.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"

namespace kvd::kernels::cuda {
namespace {

// Never dereferenced: validation fails (or returns early) before any launch.
const float* const kFakeX = reinterpret_cast<const float*>(0x1000);
const uint16_t* const kFakeW = reinterpret_cast<const uint16_t*>(0x2000);
float* const kFakeY = reinterpret_cast<float*>(0x3000);

TEST(CudaArgumentChecks, Gemm) {
  auto code = [](Activations x, Bf16Weights w, float* y, int64_t ldy) {
    return Gemm(x, w, y, ldy, nullptr).code();
  };
  EXPECT_EQ(
      code({kFakeX, ActType::kF32, 1, 63}, {kFakeW, 8, 64, 64}, kFakeY, 8),
      absl::StatusCode::kInvalidArgument);  // ldx < k
  EXPECT_EQ(
      code({kFakeX, ActType::kF32, 1, 64}, {kFakeW, 8, 64, 32}, kFakeY, 8),
      absl::StatusCode::kInvalidArgument);  // ldw < k
  EXPECT_EQ(code({kFakeX, ActType::kF32, 1, 64}, {kFakeW, 8, 64, 0}, kFakeY, 7),
            absl::StatusCode::kInvalidArgument);  // ldy < n
  EXPECT_EQ(code({kFakeX, ActType::kF32, 1, 64}, {kFakeW, 0, 64, 0}, kFakeY, 8),
            absl::StatusCode::kInvalidArgument);  // n == 0
  EXPECT_EQ(
      code({kFakeX, ActType::kF32, -1, 64}, {kFakeW, 8, 64, 0}, kFakeY, 8),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      code({nullptr, ActType::kF32, 1, 64}, {kFakeW, 8, 64, 0}, kFakeY, 8),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      code({kFakeX, ActType::kBf16, 1, 64}, {kFakeW, 8, 64, 0}, nullptr, 8),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Gemm({nullptr, ActType::kF32, 0, 64}, {kFakeW, 8, 64, 0}, nullptr,
                   8,
                   nullptr)
                  .ok());  // m == 0
  const absl::Status s = Gemm({kFakeX, ActType::kF32, 1, 10},
                              {kFakeW, 8, 64, 0}, kFakeY, 8, nullptr);
  EXPECT_NE(s.message().find("ldx=10"), absl::string_view::npos) << s;
}

TEST(CudaArgumentChecks, Elementwise) {
  float* x = kFakeY;
  EXPECT_EQ(RmsNorm(x, 10, nullptr, 1e-5f, 1, 16, x, 16, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNorm(x, 16, nullptr, -1.0f, 1, 16, x, 16, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNorm(nullptr, 16, nullptr, 1e-5f, 1, 16, x, 16, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      RmsNorm(nullptr, 16, nullptr, 1e-5f, 0, 16, nullptr, 16, nullptr).ok());
  EXPECT_EQ(GatedActivation(GatedAct::kSilu, x, 8, x, 16, 1, 16, x, 16, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  const int32_t* pos = reinterpret_cast<const int32_t*>(0x4000);
  EXPECT_EQ(
      Rope(x, 128, 1, 2, 64, 65, pos, 1e4f, RopeStyle::kHalfSplit, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);  // odd rot_dim
  EXPECT_EQ(
      Rope(x, 128, 1, 2, 64, 128, pos, 1e4f, RopeStyle::kHalfSplit, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);  // rot_dim > head_dim
  EXPECT_EQ(
      Rope(x, 127, 1, 2, 64, 64, pos, 1e4f, RopeStyle::kHalfSplit, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);  // ldx too small
  EXPECT_EQ(
      Rope(x, 128, 1, 2, 64, 64, nullptr, 1e4f, RopeStyle::kHalfSplit, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(CudaArgumentChecks, Attention) {
  AttentionArgs a;
  a.q = kFakeX;
  a.nq = 1;
  a.q_stride = 512;
  a.n_heads = 4;
  a.n_kv_heads = 3;  // does not divide
  a.head_dim = 128;
  a.k = kFakeW;
  a.v = kFakeW;
  a.kv_stride = 512;
  a.last = reinterpret_cast<const int32_t*>(0x4000);
  a.out = kFakeY;
  a.out_stride = 512;
  EXPECT_EQ(Attention(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a.n_kv_heads = 2;
  a.head_dim = 512;  // above kMaxAttentionHeadDim
  a.q_stride = a.out_stride = a.kv_stride = 4096;
  EXPECT_EQ(Attention(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a.head_dim = 128;
  a.kv_stride = 255;  // < 2 * 128
  EXPECT_EQ(Attention(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a.kv_stride = 256;
  a.v = nullptr;
  EXPECT_EQ(Attention(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a.nq = 0;
  EXPECT_TRUE(Attention(a, nullptr).ok());
}

}  // namespace
}  // namespace kvd::kernels::cuda
