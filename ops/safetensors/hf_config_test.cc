#include "ops/safetensors/hf_config.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvd::ops {
namespace {

using ::testing::HasSubstr;

constexpr char kTestdata[] = "ops/safetensors/testdata/";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Compares against the values transformers' AutoConfig read from the same file
// (config_*.expected.json, written by
// tools/reference/make_safetensors_testdata.py).
void ExpectMatches(const HfConfig& c, const nlohmann::json& want) {
  EXPECT_EQ(c.architecture, want["architecture"]);
  EXPECT_EQ(c.model_type, want["model_type"]);
  EXPECT_EQ(c.hidden_size, want["hidden_size"]);
  EXPECT_EQ(c.num_hidden_layers, want["num_hidden_layers"]);
  EXPECT_EQ(c.num_attention_heads, want["num_attention_heads"]);
  EXPECT_EQ(c.num_key_value_heads, want["num_key_value_heads"]);
  EXPECT_EQ(c.head_dim, want["head_dim"]);
  EXPECT_EQ(c.intermediate_size, want["intermediate_size"]);
  EXPECT_EQ(c.vocab_size, want["vocab_size"]);
  EXPECT_EQ(c.max_position_embeddings, want["max_position_embeddings"]);
  EXPECT_EQ(c.rms_norm_eps, want["rms_norm_eps"].get<double>());
  EXPECT_EQ(c.rope_theta, want["rope_theta"].get<double>());
  EXPECT_EQ(c.rope_local_base_freq, want["rope_local_base_freq"].get<double>());
  EXPECT_EQ(c.rope_scaling_type, want["rope_scaling_type"]);
  EXPECT_EQ(c.rope_scaling_factor, want["rope_scaling_factor"].get<double>());
  EXPECT_EQ(c.sliding_window, want["sliding_window"]);
  std::vector<std::string> layer_types;
  for (HfLayerType t : c.layer_types) {
    layer_types.push_back(t == HfLayerType::kSlidingAttention
                              ? "sliding_attention"
                              : "full_attention");
  }
  EXPECT_EQ(layer_types, want["layer_types"].get<std::vector<std::string>>());
  EXPECT_EQ(c.tie_word_embeddings, want["tie_word_embeddings"]);
  EXPECT_EQ(c.query_pre_attn_scalar,
            want["query_pre_attn_scalar"].get<double>());
  EXPECT_EQ(c.attention_bias, want["attention_bias"]);
  EXPECT_EQ(c.bos_token_ids, want["bos_token_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(c.eos_token_ids, want["eos_token_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(c.hidden_activation, want["hidden_activation"]);
  EXPECT_EQ(c.torch_dtype, want["torch_dtype"]);
  EXPECT_EQ(c.final_logit_softcapping,
            want["final_logit_softcapping"].get<double>());
  EXPECT_EQ(c.attn_logit_softcapping,
            want["attn_logit_softcapping"].get<double>());
}

class PublishedConfigTest : public ::testing::TestWithParam<const char*> {};

TEST_P(PublishedConfigTest, MatchesTransformers) {
  const std::string base = std::string(kTestdata) + GetParam();
  const nlohmann::json want =
      nlohmann::json::parse(ReadFile(base + ".expected.json"));
  absl::StatusOr<HfConfig> config = LoadHfConfig(base + ".json");
  ASSERT_TRUE(config.ok()) << config.status();
  ExpectMatches(*config, want);
}

// The same config after transformers 5 saved it again ("rope_parameters",
// "dtype", defaults written out) must read to the same values.
TEST_P(PublishedConfigTest, TransformersFiveLayoutMatchesToo) {
  const std::string base = std::string(kTestdata) + GetParam();
  const nlohmann::json want =
      nlohmann::json::parse(ReadFile(base + ".expected.json"));
  absl::StatusOr<HfConfig> config = LoadHfConfig(base + ".transformers5.json");
  ASSERT_TRUE(config.ok()) << config.status();
  ExpectMatches(*config, want);
}

INSTANTIATE_TEST_SUITE_P(Models, PublishedConfigTest,
                         ::testing::Values("config_smollm2_135m_instruct",
                                           "config_qwen2_0_5b",
                                           "config_gemma3_270m",
                                           "config_gemma3_4b_it"));

TEST(HfConfigTest, GemmaSlidingLayersFollowThePattern) {
  absl::StatusOr<HfConfig> c =
      LoadHfConfig(std::string(kTestdata) + "config_gemma3_270m.json");
  ASSERT_TRUE(c.ok()) << c.status();
  // Every sixth layer (5, 11, 17) is global.
  for (int64_t layer = 0; layer < 18; ++layer) {
    EXPECT_EQ(c->IsSlidingLayer(layer), layer % 6 != 5) << layer;
  }
  EXPECT_FALSE(c->IsSlidingLayer(18));
  EXPECT_FALSE(c->IsSlidingLayer(-1));
}

TEST(HfConfigTest, MissingFileIsNotFound) {
  absl::StatusOr<HfConfig> c =
      LoadHfConfig(std::string(kTestdata) + "nope.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
}

constexpr char kMinimalLlama[] = R"({
  "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100})";

TEST(HfConfigTest, MinimalLlamaTakesLlamaConfigDefaults) {
  // Expected values: transformers.LlamaConfig(hidden_size=64,
  // num_attention_heads=4, num_hidden_layers=2, intermediate_size=128,
  // vocab_size=100) (transformers 5.24).
  absl::StatusOr<HfConfig> c = ParseHfConfig(kMinimalLlama, "mem");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_ids, std::vector<int32_t>{1});
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>{2});
  EXPECT_EQ(c->hidden_activation, "silu");
  EXPECT_EQ(c->architecture, "");
  EXPECT_EQ(c->layer_types.size(), 2u);
  EXPECT_FALSE(c->IsSlidingLayer(0));
}

TEST(HfConfigTest, Llama3RopeScalingIsRead) {
  nlohmann::json j = nlohmann::json::parse(kMinimalLlama);
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 32.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  j["eos_token_id"] = {128001, 128008, 128009};
  absl::StatusOr<HfConfig> c = ParseHfConfig(j.dump(), "mem");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling_type, "llama3");
  EXPECT_EQ(c->rope_scaling_factor, 32.0);
  EXPECT_EQ(c->rope_low_freq_factor, 1.0);
  EXPECT_EQ(c->rope_high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_original_max_position_embeddings, 8192);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
}

struct BadConfig {
  const char* name;
  const char* key;    // key to set (or remove, when value is "<erase>")
  const char* value;  // JSON text
  const char* message;
};

void PrintTo(const BadConfig& c, std::ostream* os) { *os << c.name; }

class BadConfigTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(BadConfigTest, IsRejectedNamingTheKey) {
  nlohmann::json j = nlohmann::json::parse(kMinimalLlama);
  if (std::string(GetParam().value) == "<erase>") {
    j.erase(GetParam().key);
  } else {
    j[GetParam().key] = nlohmann::json::parse(GetParam().value);
  }
  absl::StatusOr<HfConfig> c = ParseHfConfig(j.dump(), "cfg.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("config 'cfg.json'"));
  EXPECT_THAT(c.status().message(), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadConfigTest,
    ::testing::Values(
        BadConfig{"missing_hidden_size", "hidden_size", "<erase>",
                  "key 'hidden_size' is required and missing"},
        BadConfig{"missing_vocab", "vocab_size", "<erase>",
                  "key 'vocab_size' is required and missing"},
        BadConfig{"missing_model_type", "model_type", "<erase>",
                  "key 'model_type' is required and missing"},
        BadConfig{"string_size", "hidden_size", "\"64\"",
                  "key 'hidden_size' must be an integer"},
        BadConfig{"float_size", "num_hidden_layers", "2.5",
                  "key 'num_hidden_layers' must be an integer"},
        BadConfig{"huge_layer_count", "num_hidden_layers", "2147483647",
                  "key 'num_hidden_layers' is 2147483647; kvd loads at most "
                  "1024 layers"},
        BadConfig{"rope_theta_zero", "rope_theta", "0",
                  "key 'rope_theta' must be positive"},
        BadConfig{"zero_heads", "num_attention_heads", "0",
                  "key 'num_attention_heads' must be at least 1"},
        BadConfig{"kv_not_dividing", "num_key_value_heads", "3",
                  "key 'num_key_value_heads' (3) must divide "
                  "num_attention_heads (4)"},
        BadConfig{"eps_string", "rms_norm_eps", "\"1e-5\"",
                  "key 'rms_norm_eps' must be a number"},
        BadConfig{"eps_negative", "rms_norm_eps", "-1e-5",
                  "key 'rms_norm_eps' must be positive"},
        BadConfig{"tie_string", "tie_word_embeddings", "\"true\"",
                  "key 'tie_word_embeddings' must be true or false"},
        BadConfig{
            "eos_negative", "eos_token_id", "[2, -1]",
            "key 'eos_token_id' must be a token id or a list of token ids"},
        BadConfig{"architectures_string", "architectures",
                  "\"LlamaForCausalLM\"",
                  "key 'architectures' must be a list of strings"},
        BadConfig{"layer_types_short", "layer_types", "[\"full_attention\"]",
                  "key 'layer_types' must be a list of 2 strings"},
        BadConfig{"layer_types_unknown", "layer_types",
                  "[\"full_attention\", \"chunked\"]",
                  "key 'layer_types' has \"chunked\""},
        BadConfig{"rope_scaling_not_object", "rope_scaling", "8",
                  "key 'rope_scaling' must be an object"},
        BadConfig{"rope_factor_string", "rope_scaling",
                  "{\"rope_type\": \"linear\", \"factor\": \"8\"}",
                  "key 'rope_scaling.factor' must be a number"},
        BadConfig{"odd_head_dim", "hidden_size", "66",
                  "key 'head_dim' is missing and hidden_size (66) is not a "
                  "multiple"}),
    [](const ::testing::TestParamInfo<BadConfig>& info) {
      return std::string(info.param.name);
    });

TEST(HfConfigTest, NestedTextConfigErrorsNameTheNestedKey) {
  const char* text =
      R"({"model_type": "gemma3", "text_config": {"hidden_size": "wide"}})";
  absl::StatusOr<HfConfig> c = ParseHfConfig(text, "g.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(),
              HasSubstr("key 'text_config.hidden_size' must be an integer"));
}

TEST(HfConfigTest, NotJsonOrNotAnObjectIsRejected) {
  EXPECT_THAT(ParseHfConfig("{\"model_type\": ", "a.json").status().message(),
              HasSubstr("config 'a.json' is not valid JSON"));
  EXPECT_THAT(ParseHfConfig("[1, 2]", "b.json").status().message(),
              HasSubstr("config 'b.json' is a JSON array, not an object"));
}

}  // namespace
}  // namespace kvd::ops
