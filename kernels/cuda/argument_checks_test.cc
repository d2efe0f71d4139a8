// Runs without a GPU: every entry point rejects bad shapes, strides and null
// pointers with INVALID_ARGUMENT before touching the CUDA runtime, and treats
// an empty batch as a no-op.
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/dequant.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kv_recompute.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/quant/ggml_type.h"

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

// Both implementations share Gemm's checks: each bad argument is refused
// before any launch whichever kernel is asked for.
TEST(CudaArgumentChecks, GemmEveryImpl) {
  for (GemmImpl impl : {GemmImpl::kAuto, GemmImpl::kWmma, GemmImpl::kMma}) {
    for (GemmTile tile :
         {GemmTile::kAuto, GemmTile::kDecode, GemmTile::kPrefill}) {
      SCOPED_TRACE(::testing::Message() << "impl=" << static_cast<int>(impl)
                                        << " tile=" << static_cast<int>(tile));
      auto code = [&](Activations x, Bf16Weights w, float* y, int64_t ldy) {
        return Gemm(x, w, y, ldy, nullptr, tile, impl).code();
      };
      const auto kBad = absl::StatusCode::kInvalidArgument;
      EXPECT_EQ(
          code({kFakeX, ActType::kBf16, 1, 63}, {kFakeW, 8, 64, 64}, kFakeY, 8),
          kBad);  // ldx < k
      EXPECT_EQ(
          code({kFakeX, ActType::kF32, 1, 64}, {kFakeW, 8, 64, 32}, kFakeY, 8),
          kBad);  // ldw < k
      EXPECT_EQ(
          code({kFakeX, ActType::kF32, 1, 64}, {kFakeW, 8, 64, 0}, kFakeY, 7),
          kBad);  // ldy < n
      EXPECT_EQ(
          code({kFakeX, ActType::kF32, 1, 64}, {kFakeW, 8, 0, 0}, kFakeY, 8),
          kBad);  // k == 0
      EXPECT_EQ(
          code({kFakeX, ActType::kF32, -1, 64}, {kFakeW, 8, 64, 0}, kFakeY, 8),
          kBad);  // m < 0
      EXPECT_EQ(
          code({kFakeX, ActType::kF32, 1, 64}, {nullptr, 8, 64, 0}, kFakeY, 8),
          kBad);  // null W
      EXPECT_EQ(code({kFakeX, ActType::kF32, int64_t{1} << 40, 64},
                     {kFakeW, 8, 64, 0}, kFakeY, 8),
                kBad);  // m beyond the grid
      EXPECT_EQ(
          code({nullptr, ActType::kF32, 0, 64}, {kFakeW, 8, 64, 0}, nullptr, 8),
          absl::StatusCode::kOk);  // m == 0: nothing to do
    }
  }
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

TEST(CudaArgumentChecks, Dequantize) {
  const void* src = reinterpret_cast<const void*>(0x5000);
  uint16_t* dst = reinterpret_cast<uint16_t*>(0x6000);
  auto code = [&](GgmlType t, int64_t row_bytes, int64_t rows, int64_t cols,
                  int64_t ld, const void* s = nullptr, uint16_t* d = nullptr) {
    return DequantizeToBf16(t, s ? s : src, row_bytes, rows, cols, d ? d : dst,
                            ld, nullptr)
        .code();
  };
  // Q4_K: 256 elements in 144 bytes.
  EXPECT_EQ(code(GgmlType::kQ2_K, 84, 1, 256, 256),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(code(GgmlType::kIQ4_XS, 136, 1, 256, 256),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(code(GgmlType::kQ4_K, 144, 1, 255, 256),
            absl::StatusCode::kInvalidArgument);  // not whole blocks
  EXPECT_EQ(code(GgmlType::kQ4_K, 143, 1, 256, 256),
            absl::StatusCode::kInvalidArgument);  // row_bytes too small
  EXPECT_EQ(code(GgmlType::kQ4_K, 144, 1, 256, 255),
            absl::StatusCode::kInvalidArgument);  // ld < cols
  EXPECT_EQ(code(GgmlType::kQ4_K, 144, -1, 256, 256),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      DequantizeToBf16(GgmlType::kQ8_0, nullptr, 34, 1, 32, dst, 32, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      DequantizeToBf16(GgmlType::kQ8_0, src, 34, 1, 32, nullptr, 32, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(DequantizeToBf16(GgmlType::kQ8_0, src, 34, 0, 32, dst, 32,
                               nullptr)
                  .ok());  // nothing to do, nothing launched
  // The upload helper checks the byte count against the shape.
  std::vector<uint8_t> host(34 * 2);
  EXPECT_EQ(UploadDequantizedBf16(GgmlType::kQ8_0, host.data(), host.size(), 3,
                                  32, dst, 32, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UploadDequantizedBf16(GgmlType::kQ6_K, host.data(), host.size(), 1,
                                  32, dst, 32, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaArgumentChecks, RecomputeKv) {
  KvRecomputeArgs a;
  a.residual = kFakeW;
  a.rows = 4;
  a.d_model = 64;
  a.ld_residual = 64;
  a.wk = kFakeW;
  a.wv = kFakeW;
  a.n_kv_heads = 4;
  a.head_dim = 16;
  a.head_begin = 1;
  a.head_end = 3;
  a.rot_dim = 16;
  a.positions = reinterpret_cast<const int32_t*>(0x4000);
  a.k_out = reinterpret_cast<uint16_t*>(0x7000);
  a.v_out = reinterpret_cast<uint16_t*>(0x8000);
  a.ld_out = 32;
  a.workspace = kFakeY;
  auto code = [](KvRecomputeArgs b) { return RecomputeKv(b, nullptr).code(); };
  KvRecomputeArgs b = a;
  b.head_end = 5;  // past n_kv_heads
  EXPECT_EQ(code(b), absl::StatusCode::kInvalidArgument);
  b = a;
  b.head_end = b.head_begin;  // empty shard
  EXPECT_EQ(code(b), absl::StatusCode::kInvalidArgument);
  b = a;
  b.ld_out = 31;  // < 2 heads x 16
  EXPECT_EQ(code(b), absl::StatusCode::kInvalidArgument);
  b = a;
  b.rot_dim = 15;  // odd
  EXPECT_EQ(code(b), absl::StatusCode::kInvalidArgument);
  b = a;
  b.ld_residual = 63;
  EXPECT_EQ(code(b), absl::StatusCode::kInvalidArgument);
  b = a;
  b.workspace = nullptr;
  EXPECT_EQ(code(b), absl::StatusCode::kInvalidArgument);
  b = a;
  b.positions = nullptr;
  EXPECT_EQ(code(b), absl::StatusCode::kInvalidArgument);
  b = a;
  b.rows = 0;
  EXPECT_EQ(code(b), absl::StatusCode::kOk);
  // k/v biases: both or neither, refused even with nothing to recompute.
  const float* bias = reinterpret_cast<const float*>(0x9000);
  b.bk = bias;
  EXPECT_EQ(code(b), absl::StatusCode::kInvalidArgument);
  b.bk = nullptr;
  b.bv = bias;
  EXPECT_EQ(code(b), absl::StatusCode::kInvalidArgument);
  b.bk = bias;
  EXPECT_EQ(code(b), absl::StatusCode::kOk);
  b = a;
  b.bk = bias;
  b.bv = bias;
  b.workspace = nullptr;  // the bias does not stand in for other checks
  EXPECT_EQ(code(b), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvRecomputeWorkspaceFloats(4, 64, 32), 4 * 64 + 2 * 4 * 32);
}

PagedAttentionArgs ValidPaged() {
  PagedAttentionArgs a;
  a.q = kFakeX;
  a.nq = 1;
  a.q_stride = 512;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.head_dim = 128;
  a.kv = PagedKv{kFakeW, reinterpret_cast<const int32_t*>(0x5000), 8, 64, 256};
  a.last = reinterpret_cast<const int32_t*>(0x4000);
  a.out = kFakeY;
  a.out_stride = 512;
  return a;
}

TEST(CudaArgumentChecks, PagedAttention) {
  auto code = [](const PagedAttentionArgs& a) {
    return PagedAttention(a, nullptr).code();
  };
  PagedAttentionArgs a = ValidPaged();
  a.kv.block_rows = 48;  // not a multiple of the chunk: chunks would straddle
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  const absl::Status s = PagedAttention(a, nullptr);
  EXPECT_NE(s.message().find("block_rows=48"), absl::string_view::npos) << s;
  a = ValidPaged();
  a.kv.block_rows = 0;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ValidPaged();
  a.kv.table_stride = 0;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ValidPaged();
  a.kv.kv_stride = 255;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ValidPaged();
  a.n_kv_heads = 3;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ValidPaged();
  a.kv.block_table = nullptr;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ValidPaged();
  a.nq = 70000;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ValidPaged();
  a.nq = 0;
  a.kv.pool = nullptr;
  EXPECT_TRUE(PagedAttention(a, nullptr).ok());
}

TEST(CudaArgumentChecks, PagedAttentionRecompute) {
  const int64_t hot[2] = {64, 0};
  const uint16_t* const residual[2] = {kFakeW, nullptr};
  auto valid = [&] {
    PagedRecomputeArgs r;
    r.attn = ValidPaged();
    r.attn.nq = 0;  // everything valid: returns before any CUDA call
    r.n_seqs = 2;
    r.hot_begin = hot;
    r.residual = residual;
    r.ld_residual = 512;
    r.d_model = 512;
    r.wk = kFakeW;
    r.wv = kFakeW;
    r.rot_dim = 128;
    r.group_rows = 64;
    r.workspace = reinterpret_cast<void*>(0x6000);
    r.workspace_bytes =
        PagedRecomputeWorkspaceBytes(0, 4, 2, 128, 2, 512, 64, 64);
    return r;
  };
  auto code = [](const PagedRecomputeArgs& r) {
    return PagedAttentionRecompute(r, nullptr).code();
  };
  EXPECT_TRUE(PagedAttentionRecompute(valid(), nullptr).ok());
  PagedRecomputeArgs r = valid();
  const int64_t unaligned[2] = {48, 0};
  r.hot_begin = unaligned;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  const absl::Status s = PagedAttentionRecompute(r, nullptr);
  EXPECT_NE(s.message().find("hot_begin[0]=48"), absl::string_view::npos) << s;
  r = valid();
  const int64_t negative[2] = {0, -32};
  r.hot_begin = negative;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = valid();
  const uint16_t* const no_residual[2] = {nullptr, nullptr};
  r.residual = no_residual;  // sequence 0 has cold positions
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = valid();
  r.group_rows = 40;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = valid();
  r.ld_residual = 100;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = valid();
  r.wv = nullptr;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = valid();
  r.rot_dim = 129;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  // k/v biases: both or neither.
  const float* bias = reinterpret_cast<const float*>(0x9000);
  r = valid();
  r.bk = bias;
  r.bv = bias;
  EXPECT_TRUE(PagedAttentionRecompute(r, nullptr).ok());
  r.bv = nullptr;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r.bk = nullptr;
  r.bv = bias;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = valid();
  r.workspace_bytes -= 1;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = valid();
  r.attn.nq = 3;  // no query_seq: query i reads sequence i, but only 2
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = valid();
  r.attn.kv.block_rows = 16;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  // The workspace does not grow with the cached context beyond the scratch
  // block table (4 bytes per group of positions): 1M positions vs 256.
  const int64_t small =
      PagedRecomputeWorkspaceBytes(1, 32, 8, 128, 1, 4096, 256, 256);
  const int64_t big =
      PagedRecomputeWorkspaceBytes(1, 32, 8, 128, 1, 4096, 256, 1 << 20);
  EXPECT_GT(big, small);
  EXPECT_LE(big - small, (1 << 20) / 256 * 4 + 256);
}

TEST(CudaArgumentChecks, ModelOps) {
  const int32_t* const idx = reinterpret_cast<const int32_t*>(0x4000);
  constexpr auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(
      EmbedRows(kFakeW, 63, idx, 2, 64, 1.0f, true, kFakeY, 64, nullptr).code(),
      kBad);  // ld_table < n
  EXPECT_EQ(EmbedRows(nullptr, 64, idx, 2, 64, 1.0f, true, kFakeY, 64, nullptr)
                .code(),
            kBad);
  EXPECT_TRUE(
      EmbedRows(nullptr, 64, idx, 0, 64, 1.0f, true, kFakeY, 64, nullptr)
          .ok());  // empty: no-op
  EXPECT_EQ(AddRows(kFakeY, 64, kFakeX, 32, 2, 64, false, nullptr).code(),
            kBad);
  EXPECT_EQ(AddRows(kFakeY, 64, kFakeX, 64, -1, 64, false, nullptr).code(),
            kBad);
  EXPECT_EQ(AddBias(kFakeY, 64, nullptr, 2, 64, nullptr).code(), kBad);
  EXPECT_EQ(GatherRows(kFakeX, 64, idx, 2, 0, kFakeY, 64, nullptr).code(),
            kBad);
  KvWriteArgs a;
  a.k = kFakeX;
  a.v = kFakeX;
  a.ld = 64;
  a.rows = 3;
  a.n = 64;
  a.row_seq = idx;
  a.positions = idx;
  a.pool = reinterpret_cast<uint16_t*>(0x5000);
  a.block_table = idx;
  a.table_stride = 4;
  a.block_rows = 32;
  a.kv_stride = 64;
  KvWriteArgs b = a;
  b.kv_stride = 32;
  EXPECT_EQ(WriteKvPaged(b, nullptr).code(), kBad);  // kv_stride < n
  b = a;
  b.block_rows = 0;
  EXPECT_EQ(WriteKvPaged(b, nullptr).code(), kBad);
  b = a;
  b.pool = nullptr;
  EXPECT_EQ(WriteKvPaged(b, nullptr).code(), kBad);
}

}  // namespace
}  // namespace kvd::kernels::cuda
