#include "ops/model/testing/tiny_model.h"

#include <cmath>
#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "gtest/gtest.h"
#include "ops/gguf/gguf_writer.h"

namespace kvd::ops::testing {
namespace {

class Filler {
 public:
  explicit Filler(uint32_t seed) : rng_(seed) {}
  std::vector<float> Random(int64_t n, float scale) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng_);
    return v;
  }
  std::vector<float> Near(int64_t n, float center, float spread) {
    std::vector<float> v = Random(n, spread);
    for (float& x : v) x += center;
    return v;
  }

 private:
  std::mt19937 rng_;
};

}  // namespace

absl::StatusOr<std::string> WriteTinyModel(const TinyModelSpec& s,
                                           const std::string& dir) {
  GgufWriter w;
  const std::string& a = s.family;
  w.AddString("general.architecture", a);
  w.AddString("general.name", "tiny-" + a);
  w.AddUint32(a + ".block_count", s.metadata_block_count != 0
                                      ? s.metadata_block_count
                                      : static_cast<uint32_t>(s.n_layers));
  w.AddUint32(a + ".embedding_length", s.d_model);
  w.AddUint32(a + ".feed_forward_length", s.d_ff);
  w.AddUint32(a + ".attention.head_count", s.n_heads);
  w.AddUint32(a + ".attention.head_count_kv", s.n_kv_heads);
  w.AddUint32(a + ".context_length", s.context_length);
  w.AddFloat32(a + ".attention.layer_norm_rms_epsilon", s.rms_eps);
  w.AddFloat32(
      a + ".rope.freq_base",
      s.rope_freq_base.value_or(a == "gemma3" ? 1000000.0f : 10000.0f));
  if (s.head_dim * s.n_heads != s.d_model || a == "gemma3") {
    w.AddUint32(a + ".attention.key_length", s.head_dim);
    w.AddUint32(a + ".attention.value_length", s.head_dim);
  }
  if (a == "gemma3")
    w.AddUint32(a + ".attention.sliding_window", s.sliding_window);
  // A byte-level BPE vocabulary without merges: ids 0-255 are GPT-2's
  // byte-to-unicode characters (so any text encodes, one token per byte),
  // the rest are placeholders.
  std::vector<std::string> tokens;
  int next_extra = 0;
  for (int b = 0; b < 256 && b < s.vocab_size; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
                           (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? b : 256 + next_extra++;
    std::string utf8;
    if (cp < 0x80) {
      utf8.push_back(static_cast<char>(cp));
    } else {
      utf8.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      utf8.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    tokens.push_back(utf8);
  }
  for (int64_t i = tokens.size(); i < s.vocab_size; ++i)
    tokens.push_back(absl::StrCat("<t", i, ">"));
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddStringArray("tokenizer.ggml.tokens",
                   absl::Span<const std::string>(tokens));
  w.AddStringArray("tokenizer.ggml.merges", absl::Span<const std::string>());

  Filler f(s.seed);
  const int64_t d = s.d_model, qd = s.n_heads * s.head_dim,
                kvd = s.n_kv_heads * s.head_dim;
  const float proj = 1.0f / std::sqrt(static_cast<float>(d));
  // GGUF dims are {cols, rows}: the row length first.
  w.AddTensorF32("token_embd.weight", {d, s.vocab_size},
                 f.Random(s.vocab_size * d, 1.0f));
  w.AddTensorF32("output_norm.weight", {d}, f.Near(d, 1.0f, 0.1f));
  if (!s.tied_embeddings) {
    w.AddTensorF32("output.weight", {d, s.vocab_size},
                   f.Random(s.vocab_size * d, proj));
  }
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    w.AddTensorF32(p + "attn_norm.weight", {d}, f.Near(d, 1.0f, 0.1f));
    w.AddTensorF32(p + "attn_q.weight", {d, qd}, f.Random(qd * d, proj));
    w.AddTensorF32(p + "attn_k.weight", {d, kvd}, f.Random(kvd * d, proj));
    w.AddTensorF32(p + "attn_v.weight", {d, kvd}, f.Random(kvd * d, proj));
    w.AddTensorF32(p + "attn_output.weight", {qd, d}, f.Random(d * qd, proj));
    if (a == "qwen2") {
      w.AddTensorF32(p + "attn_q.bias", {qd}, f.Random(qd, 0.1f));
      w.AddTensorF32(p + "attn_k.bias", {kvd}, f.Random(kvd, 0.1f));
      w.AddTensorF32(p + "attn_v.bias", {kvd}, f.Random(kvd, 0.1f));
    }
    if (a == "gemma3") {
      w.AddTensorF32(p + "attn_q_norm.weight", {s.head_dim},
                     f.Near(s.head_dim, 1.0f, 0.1f));
      w.AddTensorF32(p + "attn_k_norm.weight", {s.head_dim},
                     f.Near(s.head_dim, 1.0f, 0.1f));
      w.AddTensorF32(p + "post_attention_norm.weight", {d},
                     f.Near(d, 1.0f, 0.1f));
      w.AddTensorF32(p + "post_ffw_norm.weight", {d}, f.Near(d, 1.0f, 0.1f));
    }
    w.AddTensorF32(p + "ffn_norm.weight", {d}, f.Near(d, 1.0f, 0.1f));
    w.AddTensorF32(p + "ffn_gate.weight", {d, s.d_ff},
                   f.Random(s.d_ff * d, proj));
    w.AddTensorF32(p + "ffn_up.weight", {d, s.d_ff},
                   f.Random(s.d_ff * d, proj));
    w.AddTensorF32(
        p + "ffn_down.weight", {s.d_ff, d},
        f.Random(d * s.d_ff, 1.0f / std::sqrt(static_cast<float>(s.d_ff))));
  }
  const std::string path = absl::StrCat(dir, "/tiny-", a, "-", s.seed, ".gguf");
  KVD_RETURN_IF_ERROR(w.WriteToFile(path));
  return path;
}

absl::StatusOr<std::unique_ptr<Model>> LoadTinyModel(const TinyModelSpec& spec,
                                                     Precision precision,
                                                     int threads) {
  KVD_ASSIGN_OR_RETURN(std::string path,
                       WriteTinyModel(spec, ::testing::TempDir()));
  LoadOptions options;
  options.precision = precision;
  options.num_threads = threads;
  return Model::Load(path, options);
}

TinyModelSpec EightKvHeadSpec() {
  TinyModelSpec spec;
  spec.n_heads = 8;
  spec.n_kv_heads = 8;
  spec.d_ff = 96;
  return spec;
}

absl::StatusOr<std::vector<float>> LastLogitsPerStep(
    const ModelBackend& m, const std::vector<int32_t>& prompt,
    const std::vector<int32_t>& steps) {
  const int64_t vocab = m.config().vocab_size;
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<KvBlockPool> pool, m.NewBlockPool({}));
  KVD_ASSIGN_OR_RETURN(KvCache cache, m.NewCache(pool.get()));
  std::vector<float> out;
  for (size_t i = 0; i <= steps.size(); ++i) {
    SequenceStep s{&cache,
                   i == 0 ? absl::MakeConstSpan(prompt)
                          : absl::MakeConstSpan(&steps[i - 1], 1),
                   LogitsMode::kLast};
    ForwardOutput f;
    KVD_RETURN_IF_ERROR(m.Forward({&s, 1}, &f));
    out.insert(out.end(), f.Logits(0), f.Logits(0) + vocab);
  }
  return out;
}

}  // namespace kvd::ops::testing
