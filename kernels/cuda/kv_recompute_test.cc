// Device test (tag requires-gpu) of K/V recompute from residuals, whole and
// by tensor-parallel shard simulated on one device:
//  - each shard's K/V (heads [h0, h1) from the replicated residual) are
//    bit-identical to those heads of the full recompute, for several shard
//    layouts, with NaN-poisoned outputs whose row padding must stay untouched;
//  - a row recomputed alone equals the same row recomputed in a batch;
//  - the full recompute matches a float64 host reference to bf16 accuracy.
// Each with and without random k/v biases (qwen2): a shard reading the wrong
// slice of the full-width bias breaks the first, a bias dropped or added
// after RoPE breaks the last.
#include "kernels/cuda/kv_recompute.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/internal/test_util.h"

namespace kvd::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::HostBf16ToFloat;

struct Shape {
  int64_t d_model, n_kv_heads, head_dim, rot_dim;
};

struct Inputs {
  Shape sh;
  int64_t rows;
  std::vector<uint16_t> residual, wk, wv;
  std::vector<float> norm;
  std::vector<float> bk, bv;  // empty: no bias
  std::vector<int32_t> pos;
};

Inputs MakeInputs(const Shape& sh, int64_t rows, std::mt19937_64* rng,
                  bool bias) {
  Inputs in;
  in.sh = sh;
  in.rows = rows;
  const int64_t w = sh.n_kv_heads * sh.head_dim;
  in.residual = testing::RandomBf16(rows * sh.d_model, rng, -3.0f, 3.0f);
  in.wk = testing::RandomBf16(w * sh.d_model, rng, -0.1f, 0.1f);
  in.wv = testing::RandomBf16(w * sh.d_model, rng, -0.1f, 0.1f);
  in.norm = testing::RandomFloats(sh.d_model, rng, 0.5f, 1.5f);
  if (bias) {
    // About a fifth of a projection's typical magnitude: dropping it moves
    // K/V far beyond the float64 test's 1e-2.
    in.bk = testing::RandomFloats(w, rng, -0.5f, 0.5f);
    in.bv = testing::RandomFloats(w, rng, -0.5f, 0.5f);
  }
  std::uniform_int_distribution<int32_t> p(0, 32767);
  in.pos.resize(rows);
  for (int32_t& x : in.pos) x = p(*rng);
  return in;
}

struct DeviceInputs {
  DeviceBuffer<uint16_t> residual, wk, wv;
  DeviceBuffer<float> norm, bk, bv;
  DeviceBuffer<int32_t> pos;
  explicit DeviceInputs(const Inputs& in)
      : residual(in.residual.size()),
        wk(in.wk.size()),
        wv(in.wv.size()),
        norm(in.norm.size()),
        bk(in.bk.size()),
        bv(in.bv.size()),
        pos(in.pos.size()) {}
};

// Runs RecomputeKv for heads [h0, h1) of rows [r0, r0 + rows); returns K and
// V as rows x ld_out (ld_out = width + 3: the padding must stay 0xffff).
void RunRecompute(const Inputs& in, DeviceInputs& d, int64_t r0, int64_t rows,
                  int64_t h0, int64_t h1, std::vector<uint16_t>* k,
                  std::vector<uint16_t>* v) {
  const Shape& sh = in.sh;
  const int64_t width = (h1 - h0) * sh.head_dim, ld_out = width + 3;
  DeviceBuffer<uint16_t> dk(rows * ld_out), dv(rows * ld_out);
  DeviceBuffer<float> ws(KvRecomputeWorkspaceFloats(rows, sh.d_model, width));
  KVD_CUDA_ASSERT(dk.status());
  KVD_CUDA_ASSERT(dv.status());
  KVD_CUDA_ASSERT(ws.status());
  KVD_CUDA_ASSERT(dk.Poison());
  KVD_CUDA_ASSERT(dv.Poison());
  KVD_CUDA_ASSERT(ws.Poison());
  KvRecomputeArgs a;
  a.residual = d.residual.get() + r0 * sh.d_model;
  a.rows = rows;
  a.d_model = sh.d_model;
  a.ld_residual = sh.d_model;
  a.norm_weight = d.norm.get();
  a.eps = 1e-5f;
  a.wk = d.wk.get();
  a.wv = d.wv.get();
  // The full-width biases whatever the shard: RecomputeKv picks the slice.
  a.bk = in.bk.empty() ? nullptr : d.bk.get();
  a.bv = in.bv.empty() ? nullptr : d.bv.get();
  a.n_kv_heads = sh.n_kv_heads;
  a.head_dim = sh.head_dim;
  a.head_begin = h0;
  a.head_end = h1;
  a.rot_dim = sh.rot_dim;
  a.rope_base = 500000.0f;
  a.rope_style = RopeStyle::kHalfSplit;
  a.positions = d.pos.get() + r0;
  a.k_out = dk.get();
  a.v_out = dv.get();
  a.ld_out = ld_out;
  a.workspace = ws.get();
  const absl::Status s = RecomputeKv(a, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  KVD_CUDA_SYNC();
  KVD_CUDA_ASSERT(dk.Download(k));
  KVD_CUDA_ASSERT(dv.Download(v));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = width; c < ld_out; ++c) {
      ASSERT_EQ((*k)[r * ld_out + c], 0xffff) << "K padding written";
      ASSERT_EQ((*v)[r * ld_out + c], 0xffff) << "V padding written";
    }
  }
}

void Upload(const Inputs& in, DeviceInputs& d) {
  KVD_CUDA_ASSERT(d.residual.Upload(in.residual));
  KVD_CUDA_ASSERT(d.wk.Upload(in.wk));
  KVD_CUDA_ASSERT(d.wv.Upload(in.wv));
  KVD_CUDA_ASSERT(d.norm.Upload(in.norm));
  if (!in.bk.empty()) {
    KVD_CUDA_ASSERT(d.bk.Upload(in.bk));
    KVD_CUDA_ASSERT(d.bv.Upload(in.bv));
  }
  KVD_CUDA_ASSERT(d.pos.Upload(in.pos));
}

const Shape kShapes[] = {{640, 4, 64, 64}, {1024, 8, 128, 128}};

TEST(CudaKvRecompute, ShardsEqualTheirHeadsOfTheFullRecomputeBitForBit) {
  KVD_REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed());
  for (const Shape& sh : kShapes) {
    for (int64_t rows : {5, 37}) {  // decode and prefill GEMM tiles
      for (bool bias : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "d_model " << sh.d_model << " rows " << rows << " bias "
                     << bias);
        const Inputs in = MakeInputs(sh, rows, &rng, bias);
        DeviceInputs d(in);
        Upload(in, d);
        const int64_t n = sh.n_kv_heads, hd = sh.head_dim;
        std::vector<uint16_t> fk, fv;
        RunRecompute(in, d, 0, rows, 0, n, &fk, &fv);
        const int64_t fld = n * hd + 3;
        // TP=2, an uneven 3-way split, and TP=n (one head per shard).
        std::vector<std::vector<std::pair<int64_t, int64_t>>> layouts = {
            {{0, n / 2}, {n / 2, n}}, {{0, 1}, {1, n - 1}, {n - 1, n}}, {}};
        for (int64_t h = 0; h < n; ++h) layouts[2].push_back({h, h + 1});
        for (const auto& layout : layouts) {
          for (const auto& [h0, h1] : layout) {
            std::vector<uint16_t> k, v;
            RunRecompute(in, d, 0, rows, h0, h1, &k, &v);
            const int64_t w = (h1 - h0) * hd, ld = w + 3;
            int64_t bad = 0;
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t c = 0; c < w; ++c) {
                bad += k[r * ld + c] != fk[r * fld + h0 * hd + c];
                bad += v[r * ld + c] != fv[r * fld + h0 * hd + c];
              }
            }
            EXPECT_EQ(bad, 0) << "shard heads [" << h0 << ", " << h1 << ")";
          }
        }
      }
    }
  }
}

TEST(CudaKvRecompute, RowAloneEqualsRowInBatch) {
  KVD_REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed());
  const Shape sh = kShapes[1];
  for (bool bias : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "bias " << bias);
    const Inputs in = MakeInputs(sh, 37, &rng, bias);
    DeviceInputs d(in);
    Upload(in, d);
    std::vector<uint16_t> bk, bv, k, v;
    RunRecompute(in, d, 0, 37, 2, 6, &bk, &bv);
    RunRecompute(in, d, 11, 1, 2, 6, &k, &v);
    const int64_t ld = 4 * sh.head_dim + 3;
    EXPECT_EQ(std::memcmp(&bk[11 * ld], k.data(), 4 * sh.head_dim * 2), 0);
    EXPECT_EQ(std::memcmp(&bv[11 * ld], v.data(), 4 * sh.head_dim * 2), 0);
  }
}

TEST(CudaKvRecompute, FullRecomputeMatchesFloat64) {
  KVD_REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed());
  for (const Shape& sh : kShapes) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "d_model " << sh.d_model << " bias " << bias);
      const int64_t rows = 19, n = sh.n_kv_heads, hd = sh.head_dim, w = n * hd,
                    dm = sh.d_model;
      const Inputs in = MakeInputs(sh, rows, &rng, bias);
      DeviceInputs d(in);
      Upload(in, d);
      std::vector<uint16_t> k, v;
      RunRecompute(in, d, 0, rows, 0, n, &k, &v);
      std::vector<double> wk(rows * w), wv(rows * w);
      std::vector<float> gk(rows * w), gv(rows * w);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<double> x(dm);
        double ss = 0;
        for (int64_t i = 0; i < dm; ++i) {
          x[i] = HostBf16ToFloat(in.residual[r * dm + i]);
          ss += x[i] * x[i];
        }
        const double inv = 1.0 / std::sqrt(ss / dm + 1e-5);
        for (int64_t i = 0; i < dm; ++i) x[i] *= inv * in.norm[i];
        for (int64_t j = 0; j < w; ++j) {
          double sk = 0, sv = 0;
          for (int64_t i = 0; i < dm; ++i) {
            sk += x[i] * HostBf16ToFloat(in.wk[j * dm + i]);
            sv += x[i] * HostBf16ToFloat(in.wv[j * dm + i]);
          }
          // The bias joins before RoPE, as in the forward pass.
          wk[r * w + j] = sk + (bias ? in.bk[j] : 0.0);
          wv[r * w + j] = sv + (bias ? in.bv[j] : 0.0);
        }
        const int64_t half = sh.rot_dim / 2;
        for (int64_t h = 0; h < n; ++h) {
          for (int64_t i = 0; i < half; ++i) {
            const double th =
                in.pos[r] * std::pow(500000.0, -2.0 * i / sh.rot_dim);
            double* p = &wk[r * w + h * hd];
            const double a = p[i], b = p[i + half];
            p[i] = a * std::cos(th) - b * std::sin(th);
            p[i + half] = a * std::sin(th) + b * std::cos(th);
          }
        }
        for (int64_t j = 0; j < w; ++j) {
          gk[r * w + j] = HostBf16ToFloat(k[r * (w + 3) + j]);
          gv[r * w + j] = HostBf16ToFloat(v[r * (w + 3) + j]);
        }
      }
      // bf16 activations into the GEMM and bf16 outputs: about 2^-8 relative.
      EXPECT_LT(testing::RelativeError(gk.data(), wk.data(), gk.size()), 1e-2);
      EXPECT_LT(testing::RelativeError(gv.data(), wv.data(), gv.size()), 1e-2);
    }
  }
}

}  // namespace
}  // namespace kvd::kernels::cuda
