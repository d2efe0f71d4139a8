// The Hugging Face loader against the GGUF path: tiny random checkpoints of
// every family are written both as safetensors + config.json and as the GGUF
// file llama.cpp's converter would make of them (testing/hf_tiny_model.h), and
// the two models must give the same logits. Plus the checkpoint layouts
// (shards, dtypes, tied/untied, multimodal gemma3) and the errors.
#include "ops/model/hf_loader.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "ops/model/model.h"
#include "ops/model/testing/hf_tiny_model.h"

namespace kvd::ops {
namespace {

using ::kvd::ops::testing::HfTensor;
using ::kvd::ops::testing::HfTinySpec;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/hf_", name);
  std::filesystem::remove_all(dir);
  return dir;
}

std::vector<float> AllLogits(const Model& model, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens(n);
  for (int32_t& t : tokens) t = rng() % model.config().vocab_size;
  KvCache cache = model.NewCache();
  SequenceStep step{&cache, tokens, LogitsMode::kAll};
  ForwardOutput out;
  absl::Status s = model.Forward({&step, 1}, &out);
  EXPECT_TRUE(s.ok()) << s;
  return out.logits;
}

double RelativeL2(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (a[i] - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

absl::StatusOr<std::unique_ptr<Model>> LoadDir(const std::string& dir,
                                               Precision p = Precision::kF32) {
  LoadOptions opts;
  opts.precision = p;
  opts.num_threads = 2;
  return Model::Load(dir, opts);
}

struct Case {
  std::string name;
  HfTinySpec spec;
  Precision precision = Precision::kF32;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const char* family : {"llama", "qwen2", "gemma3"}) {
    for (Precision p : {Precision::kF32, Precision::kBf16}) {
      Case c;
      c.name = absl::StrCat(family, "_", PrecisionName(p));
      c.spec.family = family;
      c.spec.n_layers = c.spec.family == "gemma3" ? 6 : 3;  // one global layer
      c.spec.tied_embeddings = c.spec.family != "qwen2";
      c.precision = p;
      cases.push_back(c);
    }
  }
  {  // an index and three shards, untied, F16 matrices, BF16 norms and biases
    Case c{"qwen2_sharded_f16_bf16", {}, Precision::kF32};
    c.spec.family = "qwen2";
    c.spec.shards = 3;
    c.spec.tied_embeddings = false;
    c.spec.matrix_dtype = "F16";
    c.spec.vector_dtype = "BF16";
    cases.push_back(c);
  }
  {
    Case c{"llama_untied_bf16", {}, Precision::kF32};
    c.spec.tied_embeddings = false;
    c.spec.matrix_dtype = "BF16";
    c.spec.vector_dtype = "BF16";
    c.spec.seed = 7;
    cases.push_back(c);
  }
  {
    Case c{"gemma3_multimodal_sharded_bf16", {}, Precision::kF32};
    c.spec.family = "gemma3";
    c.spec.n_layers = 6;
    c.spec.multimodal = true;
    c.spec.shards = 2;
    c.spec.matrix_dtype = "BF16";
    c.spec.vector_dtype = "F16";
    cases.push_back(c);
  }
  {
    Case c{"gemma3_untied_f16", {}, Precision::kF32};
    c.spec.family = "gemma3";
    c.spec.n_layers = 6;
    c.spec.tied_embeddings = false;
    c.spec.matrix_dtype = "F16";
    c.spec.vector_dtype = "F16";
    cases.push_back(c);
  }
  return cases;
}

class HfMatchesGguf : public ::testing::TestWithParam<Case> {};

TEST_P(HfMatchesGguf, SameLogits) {
  const Case& c = GetParam();
  const std::string dir = FreshDir(c.name);
  const std::vector<HfTensor> tensors = testing::MakeHfTinyTensors(c.spec);
  ASSERT_TRUE(testing::WriteHfCheckpoint(c.spec, tensors, dir).ok());
  const std::string gguf = dir + ".gguf";
  ASSERT_TRUE(testing::WriteGgufEquivalent(c.spec, tensors, gguf).ok());

  absl::StatusOr<std::unique_ptr<Model>> hf = LoadDir(dir, c.precision);
  ASSERT_TRUE(hf.ok()) << hf.status();
  absl::StatusOr<std::unique_ptr<Model>> ref = LoadDir(gguf, c.precision);
  ASSERT_TRUE(ref.ok()) << ref.status();

  const ModelConfig& a = (*hf)->config();
  const ModelConfig& b = (*ref)->config();
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.activation, b.activation);
  EXPECT_EQ(a.embedding_scale, b.embedding_scale);
  EXPECT_EQ(a.attn_scale(), b.attn_scale());
  EXPECT_EQ(a.rope_style, kernels::cpu::RopeStyle::kHalfSplit);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    EXPECT_EQ(a.layers[l].sliding_window, b.layers[l].sliding_window) << l;
    EXPECT_EQ(a.layers[l].rope_base, b.layers[l].rope_base) << l;
  }
  EXPECT_EQ((*hf)->weights().output.empty(), c.spec.tied_embeddings);

  // 20 tokens: past the sliding window of 8.
  const std::vector<float> x = AllLogits(**hf, 20, 3);
  const std::vector<float> y = AllLogits(**ref, 20, 3);
  ASSERT_EQ(x.size(), y.size());
  ASSERT_EQ(x.size(), 20u * c.spec.vocab_size);
  const bool bits = std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
  std::printf("%s: bit-identical %d, relative L2 %.3g\n", c.name.c_str(), bits,
              RelativeL2(x, y));
  if (c.spec.family == "llama") {
    // The GGUF copy's permuted Q/K rows sum each head's q.k in another order.
    // In the bf16 mode a one-ulp difference can flip a bf16 rounding of the
    // residual, so the bound there is that of bf16 itself.
    EXPECT_LT(RelativeL2(x, y), c.precision == Precision::kF32 ? 1e-5 : 2e-2);
  } else {
    EXPECT_TRUE(bits) << "relative L2 " << RelativeL2(x, y);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HfMatchesGguf, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// Checkpoints written by transformers' save_pretrained and the logits of its
// own forward pass (testing/hf_golden/make_hf_golden.py): the independent
// check that the HF conventions (rotate_half RoPE, gemma3's (1 + w) norms and
// norm placement, query_pre_attn_scalar, local RoPE base, sliding window) are
// mapped right.
class HfMatchesTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(HfMatchesTransformers, SameLogits) {
  const std::string dir = "ops/model/testing/hf_golden/" + GetParam();
  std::ifstream in(dir + "/expected.json");
  ASSERT_TRUE(in.good()) << dir;
  const nlohmann::json expected = nlohmann::json::parse(in);
  const std::vector<int32_t> tokens = expected["tokens"];
  std::vector<float> want;
  for (const auto& row : expected["logits"]) {
    for (double x : row) want.push_back(static_cast<float>(x));
  }
  absl::StatusOr<std::unique_ptr<Model>> model = LoadDir(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  KvCache cache = (*model)->NewCache();
  SequenceStep step{&cache, tokens, LogitsMode::kAll};
  ForwardOutput out;
  ASSERT_TRUE((*model)->Forward({&step, 1}, &out).ok());
  ASSERT_EQ(out.logits.size(), want.size());
  const double rel = RelativeL2(out.logits, want);
  std::printf("%s vs transformers: relative L2 %.3g\n", GetParam().c_str(),
              rel);
  EXPECT_LT(rel, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Families, HfMatchesTransformers,
                         ::testing::Values("llama", "qwen2", "gemma3"));

// Writes the default llama checkpoint after `edit` changed its tensors.
absl::StatusOr<std::unique_ptr<Model>> LoadEdited(
    const std::string& name,
    const std::function<void(std::vector<HfTensor>&)>& edit,
    HfTinySpec spec = {}) {
  const std::string dir = FreshDir(name);
  std::vector<HfTensor> tensors = testing::MakeHfTinyTensors(spec);
  edit(tensors);
  absl::Status s = testing::WriteHfCheckpoint(spec, tensors, dir);
  if (!s.ok()) return s;
  return LoadDir(dir);
}

HfTensor* Find(std::vector<HfTensor>& tensors, const std::string& name) {
  for (HfTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  ADD_FAILURE() << "no " << name;
  return nullptr;
}

TEST(HfLoaderErrors, MissingTensor) {
  auto model = LoadEdited("missing", [](std::vector<HfTensor>& t) {
    t.erase(t.begin() +
            (Find(t, "model.layers.1.self_attn.k_proj.weight") - t.data()));
  });
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("tensor 'model.layers.1.self_attn.k_proj.weight' is "
                        "missing"));
}

TEST(HfLoaderErrors, WrongShape) {
  auto model = LoadEdited("shape", [](std::vector<HfTensor>& t) {
    HfTensor* w = Find(t, "model.layers.2.mlp.down_proj.weight");
    w->shape = {96, 64};  // transposed
  });
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("tensor 'model.layers.2.mlp.down_proj.weight' has "
                        "shape [96, 64], expected [64, 96]"));
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("model.safetensors"));
}

TEST(HfLoaderErrors, UnsupportedDtype) {
  auto model = LoadEdited("dtype", [](std::vector<HfTensor>& t) {
    Find(t, "model.norm.weight")->dtype = "I32";
  });
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("tensor 'model.norm.weight' has dtype I32"));
}

TEST(HfLoaderErrors, UnusedTensorIsRefused) {
  // Llama with attention_bias would have an o_proj bias the forward pass
  // lacks; ignoring it would compute another model.
  auto model = LoadEdited("extra", [](std::vector<HfTensor>& t) {
    t.push_back({"model.layers.0.self_attn.o_proj.bias",
                 {64},
                 "F32",
                 std::vector<float>(64, 0.5f)});
  });
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("'model.layers.0.self_attn.o_proj.bias'"));
}

TEST(HfLoaderErrors, UntiedWithoutLmHead) {
  HfTinySpec spec;
  spec.tied_embeddings = false;
  auto model = LoadEdited(
      "nohead",
      [](std::vector<HfTensor>& t) {
        t.erase(t.begin() + (Find(t, "lm_head.weight") - t.data()));
      },
      spec);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("'lm_head.weight'"));
}

TEST(HfLoaderErrors, TiedIgnoresStoredLmHead) {
  // Some tied checkpoints store lm_head anyway; it is the embedding.
  auto model = LoadEdited("tiedhead", [](std::vector<HfTensor>& t) {
    HfTensor head = t[0];
    head.name = "lm_head.weight";
    t.push_back(head);
  });
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE((*model)->weights().output.empty());
}

TEST(HfLoaderErrors, MissingConfig) {
  const std::string dir = FreshDir("noconfig");
  HfTinySpec spec;
  ASSERT_TRUE(
      testing::WriteHfCheckpoint(spec, testing::MakeHfTinyTensors(spec), dir)
          .ok());
  std::filesystem::remove(dir + "/config.json");
  auto model = LoadDir(dir);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("without config.json"));
  EXPECT_THAT(std::string(model.status().message()), HasSubstr(dir));
}

TEST(HfLoaderErrors, CorruptHeader) {
  const std::string dir = FreshDir("corrupt");
  HfTinySpec spec;
  ASSERT_TRUE(
      testing::WriteHfCheckpoint(spec, testing::MakeHfTinyTensors(spec), dir)
          .ok());
  {
    std::fstream f(dir + "/model.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.write("[", 1);  // the header's opening brace
  }
  auto model = LoadDir(dir);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("safetensors file '" + dir + "/model.safetensors'"));
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("JSON"));
}

TEST(HfLoaderErrors, ShardListedButAbsent) {
  const std::string dir = FreshDir("noshard");
  HfTinySpec spec;
  spec.shards = 3;
  ASSERT_TRUE(
      testing::WriteHfCheckpoint(spec, testing::MakeHfTinyTensors(spec), dir)
          .ok());
  std::filesystem::remove(dir + "/model-00002-of-00003.safetensors");
  auto model = LoadDir(dir);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("shard '" + dir +
                        "/model-00002-of-00003.safetensors' is listed in "
                        "model.safetensors.index.json"));
}

TEST(HfLoaderErrors, IndexPointsOutsideTheDirectory) {
  const std::string dir = FreshDir("badindex");
  HfTinySpec spec;
  spec.shards = 2;
  ASSERT_TRUE(
      testing::WriteHfCheckpoint(spec, testing::MakeHfTinyTensors(spec), dir)
          .ok());
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"weight_map": {"model.norm.weight": "../model.safetensors"}})";
  auto model = LoadDir(dir);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("../model.safetensors"));
}

TEST(HfLoaderErrors, IndexDisagreesWithShard) {
  const std::string dir = FreshDir("wrongshard");
  HfTinySpec spec;
  spec.shards = 2;
  ASSERT_TRUE(
      testing::WriteHfCheckpoint(spec, testing::MakeHfTinyTensors(spec), dir)
          .ok());
  std::ofstream(dir + "/model.safetensors.index.json") << R"({"weight_map": {
      "model.embed_tokens.weight": "model-00002-of-00002.safetensors",
      "model.norm.weight": "model-00001-of-00002.safetensors"}})";
  auto model = LoadDir(dir);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("places tensor 'model.embed_tokens.weight' in "
                        "'model-00002-of-00002.safetensors'"));
}

TEST(HfLoaderErrors, NoWeights) {
  const std::string dir = FreshDir("noweights");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << testing::HfTinyConfigJson({});
  auto model = LoadDir(dir);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("no *.safetensors"));
}

// config.json settings: expected values follow transformers' modeling code
// (Gemma3Attention.scaling = query_pre_attn_scalar ** -0.5; sliding layers
// use rope_local_base_freq).
absl::StatusOr<ModelConfig> MapConfig(const std::string& json) {
  absl::StatusOr<HfConfig> hf = ParseHfConfig(json, "config.json");
  if (!hf.ok()) return hf.status();
  return ModelConfigFromHf(*hf, "m", "config.json");
}

TEST(HfConfigMapping, Gemma3) {
  absl::StatusOr<ModelConfig> c = MapConfig(R"({
      "model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 96,
      "num_hidden_layers": 4, "num_attention_heads": 4,
      "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 100,
      "query_pre_attn_scalar": 144, "sliding_window": 16,
      "rope_theta": 500000.0, "rope_local_base_freq": 20000.0,
      "layer_types": ["sliding_attention", "full_attention",
                      "sliding_attention", "full_attention"]})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "gemma3");
  EXPECT_EQ(c->attn_scale(), 1.0f / 12.0f);
  EXPECT_EQ(c->embedding_scale, 8.0f);
  EXPECT_EQ(c->activation, Activation::kGeluTanh);
  EXPECT_TRUE(c->qk_norm && c->post_attn_norm && c->post_ffn_norm);
  EXPECT_EQ(c->context_length, 131072);  // Gemma3TextConfig's default
  ASSERT_EQ(c->layers.size(), 4u);
  EXPECT_EQ(c->layers[0].sliding_window, 16);
  EXPECT_EQ(c->layers[0].rope_base, 20000.0f);
  EXPECT_EQ(c->layers[1].sliding_window, 0);
  EXPECT_EQ(c->layers[1].rope_base, 500000.0f);
}

TEST(HfConfigMapping, Qwen2SlidingWindowOffByDefault) {
  absl::StatusOr<ModelConfig> c = MapConfig(R"({
      "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 96,
      "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 100, "sliding_window": 32,
      "rope_theta": 1000000.0})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->layers[1].sliding_window, 0);
  EXPECT_EQ(c->layers[1].rope_base, 1000000.0f);
  EXPECT_EQ(c->rope_style, kernels::cpu::RopeStyle::kHalfSplit);
}

TEST(HfConfigMapping, Unsupported) {
  const std::string base = R"("hidden_size": 64, "intermediate_size": 96,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
      "max_position_embeddings": 512)";
  for (const auto& [extra, what] :
       std::vector<std::pair<std::string, std::string>>{
           {R"("model_type": "phi3")", "model_type 'phi3'"},
           {R"("model_type": "llama", "rope_scaling": {"rope_type": "llama3",
               "factor": 32.0})",
            "RoPE scaling 'llama3'"},
           {R"("model_type": "llama", "attention_bias": true)",
            "attention_bias"},
           {R"("model_type": "llama", "hidden_act": "gelu")", "hidden_act"},
       }) {
    absl::StatusOr<ModelConfig> c = MapConfig("{" + base + ", " + extra + "}");
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << extra;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(what));
  }
}

}  // namespace
}  // namespace kvd::ops
