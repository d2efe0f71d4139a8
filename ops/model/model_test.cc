// Forward-pass properties on tiny random models of every family, in both
// precision modes: exactness guarantees compared bit for bit, and agreement
// with an independent float64 reference implementation written here from the
// architectures' definitions.
#include "ops/model/model.h"

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/elementwise.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::ops {
namespace {

using kernels::cpu::Isa;

using Case = testing::FamilyCase;

class ModelProperties : public ::testing::TestWithParam<Case> {
 protected:
  std::unique_ptr<Model> Load(int threads = 2, uint32_t seed = 1) {
    testing::TinyModelSpec spec;
    spec.family = GetParam().family;
    spec.seed = seed;
    spec.tied_embeddings = spec.family != "qwen2";
    if (spec.family == "gemma3")
      spec.n_layers = 6;  // five local layers, then a global one
    absl::StatusOr<std::string> path =
        testing::WriteTinyModel(spec, ::testing::TempDir());
    EXPECT_TRUE(path.ok()) << path.status();
    LoadOptions opts;
    opts.precision = GetParam().precision;
    opts.num_threads = threads;
    absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(*path, opts);
    EXPECT_TRUE(model.ok()) << model.status();
    return std::move(*model);
  }

  // Logits of every position of `tokens`, fed in pieces of the given sizes.
  static std::vector<float> RunInPieces(const Model& model,
                                        const std::vector<int32_t>& tokens,
                                        const std::vector<int>& pieces) {
    KvCache cache = model.NewCache();
    std::vector<float> all;
    size_t at = 0;
    for (int n : pieces) {
      SequenceStep step{&cache, absl::MakeConstSpan(tokens).subspan(at, n),
                        LogitsMode::kAll};
      ForwardOutput out;
      EXPECT_TRUE(model.Forward({&step, 1}, &out).ok());
      all.insert(all.end(), out.logits.begin(), out.logits.end());
      at += n;
    }
    EXPECT_EQ(at, tokens.size());
    return all;
  }
};

bool Bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST_P(ModelProperties, PrefillChunkingAndDecodeGiveIdenticalBits) {
  auto model = Load();
  const std::vector<int32_t> tokens =
      testing::RandomTokens(70, 7, model->config().vocab_size);
  const std::vector<float> prefill = RunInPieces(*model, tokens, {70});
  std::vector<int> ones(70, 1);
  EXPECT_TRUE(Bits(prefill, RunInPieces(*model, tokens, ones)))
      << "token-by-token decode";
  EXPECT_TRUE(Bits(prefill, RunInPieces(*model, tokens, {5, 31, 1, 33})))
      << "chunked prefill";
}

TEST_P(ModelProperties, BatchCompositionDoesNotChangeBits) {
  auto model = Load();
  const int vocab = model->config().vocab_size;
  const std::vector<int32_t> a = testing::RandomTokens(40, 1, vocab),
                             b = testing::RandomTokens(23, 2, vocab),
                             c = testing::RandomTokens(1, 3, vocab);
  const std::vector<float> alone = RunInPieces(*model, a, {40});
  KvCache ca = model->NewCache(), cb = model->NewCache(),
          cc = model->NewCache();
  SequenceStep steps[] = {{&cb, b, LogitsMode::kLast, 1},
                          {&ca, a, LogitsMode::kAll, 0},
                          {&cc, c, LogitsMode::kLast, 2}};
  ForwardOutput out;
  ASSERT_TRUE(model->Forward(steps, &out).ok());
  std::vector<float> in_batch(out.Logits(1, 0), out.Logits(1, 0) + 40 * vocab);
  EXPECT_TRUE(Bits(alone, in_batch));
}

TEST_P(ModelProperties, ThreadCountAndIsaDoNotChangeBits) {
  auto one = Load(/*threads=*/1);
  auto three = Load(/*threads=*/3);
  const std::vector<int32_t> tokens =
      testing::RandomTokens(45, 9, one->config().vocab_size);
  const std::vector<float> base = RunInPieces(*one, tokens, {45});
  EXPECT_TRUE(Bits(base, RunInPieces(*three, tokens, {45})));
  const Isa saved = kernels::cpu::ActiveIsa();
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!kernels::cpu::IsaSupported(isa)) continue;
    ASSERT_TRUE(kernels::cpu::SetIsa(isa).ok());
    EXPECT_TRUE(Bits(base, RunInPieces(*three, tokens, {20, 25})))
        << IsaName(isa);
  }
  ASSERT_TRUE(kernels::cpu::SetIsa(saved).ok());
}

// Decode past 512 keys cuts each query's attention across the threads
// (kernels/cpu/attention.h AttendRangeAcrossThreads) and, on one thread,
// adds value rows head by head where prefill fuses the heads: either way the
// logits keep the bits of a one-thread prefill of the same tokens.
TEST_P(ModelProperties, DecodeAtDepthAcrossThreadsKeepsTheBits) {
  auto one = Load(/*threads=*/1);
  auto three = Load(/*threads=*/3);
  const std::vector<int32_t> tokens =
      testing::RandomTokens(530, 4, one->config().vocab_size);
  const std::vector<float> base = RunInPieces(*one, tokens, {530});
  std::vector<int> pieces = {518};
  pieces.resize(13, 1);
  EXPECT_TRUE(Bits(base, RunInPieces(*three, tokens, pieces)));
  EXPECT_TRUE(Bits(base, RunInPieces(*one, tokens, pieces)));
}

// Records every residual the forward pass exposes.
class RecordingObserver : public ResidualObserver {
 public:
  explicit RecordingObserver(int64_t d) : d_(d) {}
  void OnResidual(int64_t seq, int64_t layer, int64_t pos,
                  const float* h) override {
    seen[{seq, layer, pos}] = std::vector<float>(h, h + d_);
  }
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<float>> seen;

 private:
  int64_t d_;
};

TEST_P(ModelProperties, ResidualHookSeesEveryLayerInputOfEveryToken) {
  auto model = Load();
  const ModelConfig& c = model->config();
  const std::vector<int32_t> a = testing::RandomTokens(20, 4, c.vocab_size),
                             b = testing::RandomTokens(7, 5, c.vocab_size);
  // Alone, a in two steps.
  RecordingObserver alone(c.d_model);
  {
    KvCache cache = model->NewCache();
    for (auto piece : {absl::MakeConstSpan(a).subspan(0, 12),
                       absl::MakeConstSpan(a).subspan(12)}) {
      SequenceStep step{&cache, piece, LogitsMode::kLast, 0};
      ForwardOutput out;
      ASSERT_TRUE(model->Forward({&step, 1}, &out, &alone).ok());
    }
  }
  EXPECT_EQ(alone.seen.size(), static_cast<size_t>((c.n_layers + 1) * 20));
  // Layer 0's input is the (scaled) token embedding.
  std::vector<float> emb(c.d_model);
  model->weights().token_embedding.RowToFloat(a[3], emb.data());
  for (float& x : emb) x *= c.embedding_scale;
  if (GetParam().precision == Precision::kBf16)
    kernels::cpu::RoundToBf16(emb.data(), c.d_model);
  EXPECT_EQ(alone.seen.at({0, 0, 3}), emb);
  // Batched with another sequence: a's residuals are bit-identical.
  RecordingObserver batched(c.d_model);
  KvCache ca = model->NewCache(), cb = model->NewCache();
  SequenceStep steps[] = {{&cb, b, LogitsMode::kLast, 1},
                          {&ca, a, LogitsMode::kLast, 0}};
  ForwardOutput out;
  ASSERT_TRUE(model->Forward(steps, &out, &batched).ok());
  for (const auto& [key, value] : alone.seen) {
    EXPECT_EQ(batched.seen.at(key), value)
        << std::get<1>(key) << " " << std::get<2>(key);
  }
  EXPECT_EQ(batched.seen.size(), static_cast<size_t>((c.n_layers + 1) * 27));
}

// A GPU node frees the CPU copy of the weights after uploading them: the
// model keeps its config and GGUF file, and refuses to compute.
TEST(ModelWeights, ReleasedWeightsRefuseComputeAndKeepTheRest) {
  auto model = testing::LoadTinyModel({}, Precision::kBf16);
  ASSERT_TRUE(model.ok()) << model.status();
  Model& m = **model;
  const std::string name = m.config().name;
  KvCache cache = m.NewCache();
  const std::vector<int32_t> t = {1, 2, 3};
  SequenceStep step{&cache, t, LogitsMode::kLast};
  ForwardOutput out;
  ASSERT_TRUE(m.Forward({&step, 1}, &out).ok());
  m.ReleaseWeights();
  EXPECT_FALSE(m.has_weights());
  EXPECT_TRUE(m.weights().layers.empty());
  EXPECT_EQ(m.config().name, name);
  EXPECT_TRUE(m.has_gguf());
  const absl::Status refused = m.Forward({&step, 1}, &out);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("released"), absl::string_view::npos);
  EXPECT_EQ(cache.length(), 3);
  std::vector<float> h(m.config().d_model, 0.5f);
  EXPECT_EQ(m.ForwardLayers(&cache, 3, 1, 0, 1, h.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.RecomputeKvIntoCache(0, h.data(), 0, 1, &cache).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Policy kv's checkpoint: rows copied out of one cache and into another are
// the same bytes, and the next step over the copy gives the same logits.
TEST_P(ModelProperties, KvRowsCopyOutAndInBitForBit) {
  auto model = Load();
  const std::vector<int32_t> tokens =
      testing::RandomTokens(40, 7, model->config().vocab_size);
  KvCache cache = model->NewCache();
  cache.KeepRowsPastWindows();
  SequenceStep step{&cache, tokens, LogitsMode::kNone};
  ForwardOutput out;
  ASSERT_TRUE(model->Forward({&step, 1}, &out).ok());
  ASSERT_TRUE(model->KvRowAccess().ok());

  KvCache copy = model->NewCache();
  copy.KeepRowsPastWindows();
  ASSERT_TRUE(copy.Reserve(40).ok());
  copy.SetLength(40);
  const size_t rb = cache.row_bytes();
  std::vector<uint8_t> rows(40 * 2 * rb);
  for (int64_t l = 0; l < model->config().n_layers; ++l) {
    // In two pieces, as chunks come.
    ASSERT_TRUE(model->ReadKvRows(cache, l, 0, 40, rows.data()).ok());
    ASSERT_TRUE(model->WriteKvRows(&copy, l, 0, 25, rows.data()).ok());
    ASSERT_TRUE(
        model->WriteKvRows(&copy, l, 25, 15, rows.data() + 25 * 2 * rb).ok());
    for (int64_t p = 0; p < 40; ++p) {
      ASSERT_EQ(std::memcmp(cache.KeyBytes(l, p), copy.KeyBytes(l, p), rb), 0);
      ASSERT_EQ(std::memcmp(cache.ValueBytes(l, p), copy.ValueBytes(l, p), rb),
                0);
    }
  }
  const std::vector<int32_t> next = {5};
  SequenceStep a{&cache, next, LogitsMode::kLast};
  SequenceStep b{&copy, next, LogitsMode::kLast};
  ForwardOutput out_a, out_b;
  ASSERT_TRUE(model->Forward({&a, 1}, &out_a).ok());
  ASSERT_TRUE(model->Forward({&b, 1}, &out_b).ok());
  ASSERT_EQ(out_a.logits.size(), out_b.logits.size());
  EXPECT_EQ(std::memcmp(out_a.logits.data(), out_b.logits.data(),
                        out_a.logits.size() * sizeof(float)),
            0);

  // Positions the cache does not hold are refused, and nothing is written.
  EXPECT_EQ(model->ReadKvRows(cache, 0, 35, 10, rows.data()).code(),
            absl::StatusCode::kInvalidArgument);
  KvCache empty = model->NewCache();
  EXPECT_EQ(model->WriteKvRows(&empty, 0, 0, 1, rows.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      model->ReadKvRows(cache, model->config().n_layers, 0, 1, rows.data())
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_P(ModelProperties, RejectsBadInputWithoutTouchingTheCache) {
  auto model = Load();
  KvCache cache = model->NewCache();
  const std::vector<int32_t> good = {1, 2, 3},
                             bad = {1, static_cast<int32_t>(
                                           model->config().vocab_size)};
  SequenceStep ok{&cache, good, LogitsMode::kLast};
  ForwardOutput out;
  ASSERT_TRUE(model->Forward({&ok, 1}, &out).ok());
  SequenceStep wrong{&cache, bad, LogitsMode::kLast};
  const absl::Status s = model->Forward({&wrong, 1}, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("out of range"), std::string::npos) << s;
  EXPECT_EQ(cache.length(), 3);
  std::vector<int32_t> too_long(model->config().context_length, 1);
  SequenceStep overflow{&cache, too_long, LogitsMode::kLast};
  EXPECT_EQ(model->Forward({&overflow, 1}, &out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.length(), 3);
}

INSTANTIATE_TEST_SUITE_P(Families, ModelProperties,
                         ::testing::ValuesIn(testing::AllFamilyCases()),
                         testing::FamilyCaseName);

// ---------------------------------------------------------------------------------------------
// Independent float64 reference: a direct transcription of each architecture,
// sharing no code with the engine (only the GGUF reader, to get the weights).

using Vec = std::vector<double>;

struct RefModel {
  const GgufFile* f;
  const ModelConfig* c;
  Vec T(const std::string& name) const {
    const GgufTensor* t = f->FindTensor(name);
    const float* p = reinterpret_cast<const float*>(t->data);
    return Vec(p, p + t->num_elements);
  }
  bool Has(const std::string& name) const {
    return f->FindTensor(name) != nullptr;
  }
};

Vec RmsNormRef(const Vec& x, const Vec& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double s = 1.0 / std::sqrt(ss / x.size() + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[i];
  return y;
}

Vec MatVec(const Vec& w, const Vec& x, int64_t rows) {
  const int64_t cols = x.size();
  Vec y(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) y[r] += w[r * cols + k] * x[k];
  return y;
}

void RopeRef(Vec& v, int64_t heads, int64_t hd, int64_t pos, double base,
             bool interleaved) {
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double th = pos * std::pow(base, -2.0 * i / hd);
      const int64_t a = h * hd + (interleaved ? 2 * i : i);
      const int64_t b = h * hd + (interleaved ? 2 * i + 1 : i + hd / 2);
      const double x0 = v[a], x1 = v[b];
      v[a] = x0 * std::cos(th) - x1 * std::sin(th);
      v[b] = x0 * std::sin(th) + x1 * std::cos(th);
    }
  }
}

// Logits at every position, recomputing the whole prefix (simple and obviously
// causal).
std::vector<Vec> ReferenceLogits(const RefModel& m,
                                 const std::vector<int32_t>& tokens) {
  const ModelConfig& c = *m.c;
  const bool gemma = c.architecture == "gemma3";
  const bool interleaved = c.architecture == "llama";
  const int64_t d = c.d_model, hd = c.head_dim, n = tokens.size();
  const Vec emb = m.T("token_embd.weight");
  std::vector<Vec> h(n);
  for (int64_t t = 0; t < n; ++t) {
    h[t] = Vec(emb.begin() + tokens[t] * d, emb.begin() + (tokens[t] + 1) * d);
    if (gemma)
      for (double& x : h[t])
        x *= std::sqrt(static_cast<double>(static_cast<float>(d)));
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const bool local = gemma && (l + 1) % 6 != 0;
    const double base = gemma ? (local ? 10000.0 : 1000000.0) : 10000.0;
    const int64_t window = local ? 8 : 0;
    std::vector<Vec> q(n), k(n), v(n);
    for (int64_t t = 0; t < n; ++t) {
      const Vec x = RmsNormRef(h[t], m.T(p + "attn_norm.weight"), c.rms_eps);
      q[t] = MatVec(m.T(p + "attn_q.weight"), x, c.q_dim());
      k[t] = MatVec(m.T(p + "attn_k.weight"), x, c.kv_dim());
      v[t] = MatVec(m.T(p + "attn_v.weight"), x, c.kv_dim());
      if (m.Has(p + "attn_q.bias")) {
        const Vec bq = m.T(p + "attn_q.bias"), bk = m.T(p + "attn_k.bias"),
                  bv = m.T(p + "attn_v.bias");
        for (size_t i = 0; i < bq.size(); ++i) q[t][i] += bq[i];
        for (size_t i = 0; i < bk.size(); ++i)
          k[t][i] += bk[i], v[t][i] += bv[i];
      }
      if (gemma) {
        const std::tuple<Vec*, int64_t, std::string> norms[] = {
            {&q[t], c.n_heads, "attn_q_norm.weight"},
            {&k[t], c.n_kv_heads, "attn_k_norm.weight"}};
        for (const auto& [vec, heads, w] : norms) {
          for (int64_t hh = 0; hh < heads; ++hh) {
            Vec part(vec->begin() + hh * hd, vec->begin() + (hh + 1) * hd);
            part = RmsNormRef(part, m.T(p + w), c.rms_eps);
            std::copy(part.begin(), part.end(), vec->begin() + hh * hd);
          }
        }
      }
      RopeRef(q[t], c.n_heads, hd, t, base, interleaved);
      RopeRef(k[t], c.n_kv_heads, hd, t, base, interleaved);
    }
    const int64_t group = c.n_heads / c.n_kv_heads;
    for (int64_t t = 0; t < n; ++t) {
      Vec attn(c.q_dim(), 0.0);
      for (int64_t hh = 0; hh < c.n_heads; ++hh) {
        const int64_t g = hh / group;
        const int64_t first = window ? std::max<int64_t>(0, t - window + 1) : 0;
        std::vector<double> s;
        double mx = -1e300;
        for (int64_t j = first; j <= t; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i)
            dot += q[t][hh * hd + i] * k[j][g * hd + i];
          s.push_back(dot / std::sqrt(static_cast<double>(hd)));
          mx = std::max(mx, s.back());
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t j = first; j <= t; ++j)
          for (int64_t i = 0; i < hd; ++i)
            attn[hh * hd + i] += s[j - first] / sum * v[j][g * hd + i];
      }
      Vec o = MatVec(m.T(p + "attn_output.weight"), attn, d);
      if (gemma)
        o = RmsNormRef(o, m.T(p + "post_attention_norm.weight"), c.rms_eps);
      for (int64_t i = 0; i < d; ++i) h[t][i] += o[i];
      const Vec x = RmsNormRef(h[t], m.T(p + "ffn_norm.weight"), c.rms_eps);
      const Vec gate = MatVec(m.T(p + "ffn_gate.weight"), x, c.d_ff);
      const Vec up = MatVec(m.T(p + "ffn_up.weight"), x, c.d_ff);
      Vec act(c.d_ff);
      for (int64_t i = 0; i < c.d_ff; ++i) {
        const double g = gate[i];
        const double a = gemma ? 0.5 * g *
                                     (1 + std::tanh(std::sqrt(2 / M_PI) *
                                                    (g + 0.044715 * g * g * g)))
                               : g / (1 + std::exp(-g));
        act[i] = a * up[i];
      }
      Vec down = MatVec(m.T(p + "ffn_down.weight"), act, d);
      if (gemma)
        down = RmsNormRef(down, m.T(p + "post_ffw_norm.weight"), c.rms_eps);
      for (int64_t i = 0; i < d; ++i) h[t][i] += down[i];
    }
  }
  const Vec out_w = m.Has("output.weight") ? m.T("output.weight") : emb;
  std::vector<Vec> logits;
  for (int64_t t = 0; t < n; ++t) {
    logits.push_back(
        MatVec(out_w, RmsNormRef(h[t], m.T("output_norm.weight"), c.rms_eps),
               c.vocab_size));
  }
  return logits;
}

TEST_P(ModelProperties, AgreesWithFloat64Reference) {
  auto model = Load();
  const std::vector<int32_t> tokens =
      testing::RandomTokens(40, 11, model->config().vocab_size);
  const std::vector<float> got = RunInPieces(*model, tokens, {40});
  const std::vector<Vec> ref =
      ReferenceLogits(RefModel{&model->file(), &model->config()}, tokens);
  // fp32 mode: fp32 rounding only. bf16 mode: weights, K/V and residuals
  // rounded to bf16 (8 mantissa bits), measured on these models at ~1e-2
  // relative.
  const double tol = GetParam().precision == Precision::kF32 ? 1e-5 : 5e-2;
  const int64_t vocab = model->config().vocab_size;
  for (size_t t = 0; t < tokens.size(); ++t) {
    double err = 0, norm = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      err += std::pow(got[t * vocab + i] - ref[t][i], 2);
      norm += ref[t][i] * ref[t][i];
    }
    EXPECT_LT(std::sqrt(err / norm), tol) << "position " << t;
  }
}

}  // namespace
}  // namespace kvd::ops
