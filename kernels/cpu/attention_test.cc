#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/testing/gemm_contract.h"

namespace kvd::kernels::cpu {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The same rows in fp32 (`f`) or in their bf16 copy (`b`).
KvRows Store(bool bf16, const std::vector<float>& f,
             const std::vector<uint16_t>& b, int64_t stride) {
  return bf16 ? KvRows{WeightType::kBf16, b.data(), stride}
              : KvRows{WeightType::kF32, f.data(), stride};
}

// The contract's attention written plainly (kernels/cpu/README.md): per
// query, chunks of kAttentionChunk absolute positions; in each, scores by the
// canonical dot times the scale, the running max, p = Exp(s - max), the sum
// and acc[d] = fma(p, v[d], acc[d]) key by key in order; out = acc / sum.
std::vector<float> ContractAttention(const std::vector<float>& q, int64_t group,
                                     int64_t head_dim, float scale,
                                     const std::vector<float>& k,
                                     const std::vector<float>& v,
                                     int64_t stride, int64_t first,
                                     int64_t last) {
  std::vector<float> out(group * head_dim);
  for (int64_t g = 0; g < group; ++g) {
    float max = -std::numeric_limits<float>::infinity(), sum = 0.0f;
    std::vector<float> acc(head_dim, 0.0f);
    for (int64_t c = first / kAttentionChunk * kAttentionChunk; c <= last;
         c += kAttentionChunk) {
      const int64_t b = std::max(c, first);
      const int64_t e = std::min(c + kAttentionChunk - 1, last);
      std::vector<float> s;
      float chunk_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = b; j <= e; ++j) {
        s.push_back(
            testing::ContractDot(&q[g * head_dim], &k[j * stride], head_dim) *
            scale);
        chunk_max = std::max(chunk_max, s.back());
      }
      const float new_max = std::max(max, chunk_max);
      if (max != new_max) {
        const float alpha = max == -std::numeric_limits<float>::infinity()
                                ? 0.0f
                                : Exp(max - new_max);
        sum *= alpha;
        for (float& a : acc) a *= alpha;
        max = new_max;
      }
      for (int64_t j = b; j <= e; ++j) {
        const float p = Exp(s[j - b] - new_max);
        sum += p;
        for (int64_t d = 0; d < head_dim; ++d)
          acc[d] = std::fma(p, v[j * stride + d], acc[d]);
      }
    }
    for (int64_t d = 0; d < head_dim; ++d) out[g * head_dim + d] = acc[d] / sum;
  }
  return out;
}

TEST(Attention, FollowsTheContractBitForBit) {
  // head_dims: SmolLM2's 64, Gemma 3's 256, and widths that leave 16-lane,
  // 8-lane and single-lane remainders.
  // groups: query heads per K/V head, fused four at a time for the values.
  for (const auto& [head_dim, group] : {std::pair<int64_t, int64_t>{64, 3},
                                        {256, 3},
                                        {72, 3},
                                        {13, 3},
                                        {64, 1},
                                        {64, 2},
                                        {72, 4},
                                        {24, 5},
                                        {13, 8}}) {
    const int64_t n_keys = 100, stride = head_dim + 5;
    const std::vector<float> q = Random(group * head_dim, 21);
    std::vector<float> k = Random(n_keys * stride, 22),
                       v = Random(n_keys * stride, 23);
    for (const bool bf16 : {false, true}) {
      std::vector<uint16_t> kb(k.size()), vb(v.size());
      if (bf16) {
        // The same values in both storages.
        FloatToBf16(k.data(), kb.data(), k.size());
        FloatToBf16(v.data(), vb.data(), v.size());
        Bf16ToFloat(kb.data(), k.data(), k.size());
        Bf16ToFloat(vb.data(), v.data(), v.size());
      }
      const KvRows kr = Store(bf16, k, kb, stride);
      const KvRows vr = Store(bf16, v, vb, stride);
      for (const auto& [first, last] :
           {std::pair<int64_t, int64_t>{0, 99}, {7, 70}, {40, 41}}) {
        std::vector<float> out(group * head_dim);
        AttendRange(q.data(), group, head_dim, 0.125f, kr, vr, first, last,
                    out.data());
        const std::vector<float> want = ContractAttention(
            q, group, head_dim, 0.125f, k, v, stride, first, last);
        EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size() * 4), 0)
            << "head_dim " << head_dim << " group " << group
            << (bf16 ? " bf16" : " f32") << " [" << first << ", " << last
            << "]";
        // The group's heads taking each value row together (a block of
        // queries does): the same bits.
        std::vector<float> fused(group * head_dim);
        OnlineSoftmax state(group, head_dim, 0.125f);
        state.set_fuse_heads(true);
        for (int64_t c = first / kAttentionChunk * kAttentionChunk; c <= last;
             c += kAttentionChunk) {
          const int64_t b = std::max(c, first);
          const int64_t e = std::min(c + kAttentionChunk - 1, last);
          state.AddChunk(q.data(), KvRows{kr.type, kr.Row(b), kr.stride},
                         KvRows{vr.type, vr.Row(b), vr.stride}, e - b + 1);
        }
        state.Finish(fused.data());
        EXPECT_EQ(std::memcmp(fused.data(), want.data(), fused.size() * 4), 0)
            << "fused heads, head_dim " << head_dim << " group " << group
            << (bf16 ? " bf16" : " f32") << " [" << first << ", " << last
            << "]";
      }
    }
  }
}

TEST(Attention, MatchesFloat64SoftmaxReference) {
  const int64_t group = 3, head_dim = 64, n_keys = 150, stride = 2 * head_dim;
  const float scale = 1.0f / 8.0f;
  const std::vector<float> q = Random(group * head_dim, 1);
  const std::vector<float> k = Random(n_keys * stride, 2);
  const std::vector<float> v = Random(n_keys * stride, 3);
  const KvRows kr{WeightType::kF32, k.data(), stride};
  const KvRows vr{WeightType::kF32, v.data(), stride};
  for (int64_t first : {int64_t{0}, int64_t{45}}) {
    const int64_t last = n_keys - 1;
    std::vector<float> out(group * head_dim);
    AttendRange(q.data(), group, head_dim, scale, kr, vr, first, last,
                out.data());
    for (int64_t g = 0; g < group; ++g) {
      std::vector<double> s;
      double mx = -1e300;
      for (int64_t j = first; j <= last; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < head_dim; ++d)
          dot += double(q[g * head_dim + d]) * k[j * stride + d];
        s.push_back(dot * scale);
        mx = std::max(mx, s.back());
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < head_dim; ++d) {
        double ref = 0;
        for (int64_t j = first; j <= last; ++j)
          ref += s[j - first] / sum * v[j * stride + d];
        EXPECT_NEAR(out[g * head_dim + d], ref, 1e-5) << g << " " << d;
      }
    }
  }
}

// A chunk's K/V copied to a scratch buffer (as the recompute path does) gives
// the same bits as reading them in place, and any split of the same canonical
// chunks gives the same result.
TEST(Attention, ChunkSourceDoesNotChangeBits) {
  const int64_t group = 4, head_dim = 32, n_keys = 100, stride = head_dim;
  const std::vector<float> q = Random(group * head_dim, 4);
  const std::vector<float> k = Random(n_keys * stride, 5);
  const std::vector<float> v = Random(n_keys * stride, 6);
  std::vector<float> in_place(group * head_dim), from_scratch(group * head_dim);
  AttendRange(
      q.data(), group, head_dim, 0.3f, {WeightType::kF32, k.data(), stride},
      {WeightType::kF32, v.data(), stride}, 0, n_keys - 1, in_place.data());
  OnlineSoftmax state(group, head_dim, 0.3f);
  std::vector<float> ks(kAttentionChunk * stride), vs(kAttentionChunk * stride);
  for (int64_t c = 0; c < n_keys; c += kAttentionChunk) {
    const int64_t n = std::min(kAttentionChunk, n_keys - c);
    std::memcpy(ks.data(), &k[c * stride], n * stride * sizeof(float));
    std::memcpy(vs.data(), &v[c * stride], n * stride * sizeof(float));
    state.AddChunk(q.data(), {WeightType::kF32, ks.data(), stride},
                   {WeightType::kF32, vs.data(), stride}, n);
  }
  state.Finish(from_scratch.data());
  EXPECT_EQ(
      std::memcmp(in_place.data(), from_scratch.data(), in_place.size() * 4),
      0);
}

TEST(Attention, Bf16StorageEqualsFloatStorageOfTheSameValues) {
  const int64_t head_dim = 64, n_keys = 70;
  const std::vector<float> q = Random(head_dim, 7);
  std::vector<float> k = Random(n_keys * head_dim, 8),
                     v = Random(n_keys * head_dim, 9);
  std::vector<uint16_t> kb(k.size()), vb(v.size());
  FloatToBf16(k.data(), kb.data(), k.size());
  FloatToBf16(v.data(), vb.data(), v.size());
  Bf16ToFloat(kb.data(), k.data(), k.size());
  Bf16ToFloat(vb.data(), v.data(), v.size());
  std::vector<float> a(head_dim), b(head_dim);
  AttendRange(q.data(), 1, head_dim, 0.125f,
              {WeightType::kF32, k.data(), head_dim},
              {WeightType::kF32, v.data(), head_dim}, 0, n_keys - 1, a.data());
  AttendRange(
      q.data(), 1, head_dim, 0.125f, {WeightType::kBf16, kb.data(), head_dim},
      {WeightType::kBf16, vb.data(), head_dim}, 0, n_keys - 1, b.data());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

}  // namespace
}  // namespace kvd::kernels::cpu

namespace kvd::kernels::cpu {
namespace {

// The block path (one score GEMM for many queries) gives the same bits as one
// query at a time, with and without a sliding window, for fp32 and bf16
// storage.
TEST(Attention, CausalBlockEqualsPerQueryBitForBit) {
  const int64_t group = 3, head_dim = 64, n = 150, kv_stride = 2 * head_dim;
  const int64_t q_stride = group * head_dim + 5;
  const std::vector<float> q = Random(n * q_stride, 11);
  std::vector<float> k = Random(n * kv_stride, 12),
                     v = Random(n * kv_stride, 13);
  std::vector<uint16_t> kb(k.size()), vb(v.size());
  FloatToBf16(k.data(), kb.data(), k.size());
  FloatToBf16(v.data(), vb.data(), v.size());
  for (const bool bf16 : {false, true}) {
    const KvRows kr = Store(bf16, k, kb, kv_stride);
    const KvRows vr = Store(bf16, v, vb, kv_stride);
    for (const int64_t window : {int64_t{0}, int64_t{40}}) {
      for (const int64_t pos0 : {int64_t{0}, int64_t{37}}) {
        const int64_t nq = n - pos0;
        std::vector<float> block(nq * group * head_dim),
            single(nq * group * head_dim);
        AttendCausalBlock(q.data() + pos0 * q_stride, q_stride, nq, group,
                          head_dim, 0.125f, kr, vr, pos0, window, block.data(),
                          group * head_dim);
        for (int64_t i = 0; i < nq; ++i) {
          const int64_t pos = pos0 + i;
          const int64_t first =
              window ? std::max<int64_t>(0, pos - window + 1) : 0;
          AttendRange(q.data() + pos * q_stride, group, head_dim, 0.125f, kr,
                      vr, first, pos, single.data() + i * group * head_dim);
        }
        EXPECT_EQ(std::memcmp(block.data(), single.data(), block.size() * 4), 0)
            << "bf16=" << bf16 << " window=" << window << " pos0=" << pos0;
      }
    }
  }
}

// Rows of a contiguous store copied into separately allocated blocks of
// `block_rows` rows, the way the paged K/V cache holds them.
struct PagedCopy {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<const uint8_t*> blocks;
  KvRows rows;
};

PagedCopy Page(const KvRows& contiguous, int64_t n_rows, int64_t block_rows) {
  const size_t elem = contiguous.type == WeightType::kBf16 ? 2 : 4;
  const size_t row_bytes = contiguous.stride * elem;
  PagedCopy p;
  for (int64_t r0 = 0; r0 < n_rows; r0 += block_rows) {
    p.storage.emplace_back(block_rows * row_bytes, 0xff);
    const int64_t n = std::min(block_rows, n_rows - r0);
    std::memcpy(p.storage.back().data(), contiguous.Row(r0), n * row_bytes);
  }
  for (const auto& b : p.storage) p.blocks.push_back(b.data());
  p.rows = KvRows{contiguous.type, nullptr,    contiguous.stride,
                  p.blocks.data(), block_rows, 0};
  return p;
}

// Cutting one query's attention across threads (scores by key spans, weights
// by query head, values by slices of head_dim) gives AttendRange's bits for
// every K/V head, over contiguous and paged stores, fp32 and bf16, ranges
// that start and end inside chunks and spans, and any thread count.
TEST(Attention, AcrossThreadsEqualsPerHeadBitForBit) {
  const int64_t n_kv_heads = 3, group = 3, n_keys = 700;
  ThreadPool two(2), three(3), four(4);
  for (const int64_t head_dim : {64, 256, 72, 13}) {
    const int64_t stride = n_kv_heads * head_dim + 3;
    const std::vector<float> q = Random(n_kv_heads * group * head_dim, 31);
    std::vector<float> k = Random(n_keys * stride, 32),
                       v = Random(n_keys * stride, 33);
    std::vector<uint16_t> kb(k.size()), vb(v.size());
    FloatToBf16(k.data(), kb.data(), k.size());
    FloatToBf16(v.data(), vb.data(), v.size());
    for (const bool bf16 : {false, true}) {
      const KvRows kc = Store(bf16, k, kb, stride);
      const KvRows vc = Store(bf16, v, vb, stride);
      const PagedCopy kp = Page(kc, n_keys, 64), vp = Page(vc, n_keys, 64);
      for (const bool paged : {false, true}) {
        const KvRows& kr = paged ? kp.rows : kc;
        const KvRows& vr = paged ? vp.rows : vc;
        for (const auto& [first, last] : {std::pair<int64_t, int64_t>{0, 699},
                                          {37, 650},
                                          {300, 300},
                                          {0, 5},
                                          {250, 520}}) {
          std::vector<float> want(n_kv_heads * group * head_dim);
          for (int64_t g = 0; g < n_kv_heads; ++g) {
            AttendRange(q.data() + g * group * head_dim, group, head_dim,
                        0.125f, kr.Shifted(g * head_dim),
                        vr.Shifted(g * head_dim), first, last,
                        want.data() + g * group * head_dim);
          }
          for (ThreadPool* pool : {&two, &three, &four}) {
            std::vector<float> got(want.size(), -1.0f);
            AttendRangeAcrossThreads(q.data(), n_kv_heads, group, head_dim,
                                     0.125f, kr, vr, first, last, got.data(),
                                     pool);
            EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
                << "head_dim " << head_dim << (bf16 ? " bf16" : " f32")
                << (paged ? " paged" : " contiguous") << " [" << first << ", "
                << last << "] threads " << pool->num_threads();
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvd::kernels::cpu
