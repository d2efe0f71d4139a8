// Model files whose metadata is hostile or broken: every family refuses them
// with an error naming the file and the bad value, before allocating anything
// sized by them. The same files (tiny ones) are committed under
// ops/model/testdata/ as seeds of model_config_fuzz_test; this test checks the
// committed copies are current. To rewrite them:
//
//   bazel build //ops/model:model_metadata_test
//   export KVD_WRITE_MODEL_TESTDATA=$PWD/ops/model/testdata
//   bazel-bin/ops/model/model_metadata_test
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/model/model.h"
#include "ops/model/testing/tiny_model.h"

namespace kvd::ops {
namespace {

using ::testing::HasSubstr;

struct HostileMetadata {
  std::string name;  // testdata file: <family>_<name>.gguf
  void (*corrupt)(testing::TinyModelSpec&);
  std::string want;  // the error names this
};

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<HostileMetadata> Cases() {
  return {
      {"block_count_2_pow_31_minus_1",
       [](testing::TinyModelSpec& s) { s.metadata_block_count = 0x7fffffff; },
       "implausible layer count 2147483647"},
      {"rope_base_zero",
       [](testing::TinyModelSpec& s) { s.rope_freq_base = 0; },
       ".rope.freq_base is 0"},
      {"rope_base_nan",
       [](testing::TinyModelSpec& s) { s.rope_freq_base = kNan; },
       ".rope.freq_base is nan"},
      {"rope_base_inf",
       [](testing::TinyModelSpec& s) { s.rope_freq_base = kInf; },
       ".rope.freq_base is inf"},
      {"rope_base_negative",
       [](testing::TinyModelSpec& s) { s.rope_freq_base = -10000; },
       ".rope.freq_base is -10000"},
      {"rms_eps_nan", [](testing::TinyModelSpec& s) { s.rms_eps = kNan; },
       ".attention.layer_norm_rms_epsilon is nan"},
      {"rms_eps_negative",
       [](testing::TinyModelSpec& s) { s.rms_eps = -1e-5f; },
       ".attention.layer_norm_rms_epsilon is -1e-05"},
  };
}

// Small enough to commit as fuzzer seeds.
testing::TinyModelSpec SeedSpec(const std::string& family) {
  testing::TinyModelSpec s;
  s.family = family;
  s.n_layers = 1;
  s.d_model = 8;
  s.n_heads = 2;
  s.n_kv_heads = 1;
  s.head_dim = 4;
  s.d_ff = 8;
  s.vocab_size = 16;
  s.sliding_window = 4;
  return s;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ModelMetadataTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelMetadataTest, HostileValuesAreRefusedNamingTheKey) {
  const std::string family = GetParam();
  const std::string dir = ::testing::TempDir() + "/metadata_" + family;
  std::filesystem::create_directories(dir);
  const char* write_to = std::getenv("KVD_WRITE_MODEL_TESTDATA");
  for (const HostileMetadata& c : Cases()) {
    SCOPED_TRACE(c.name);
    testing::TinyModelSpec spec = SeedSpec(family);
    c.corrupt(spec);
    absl::StatusOr<std::string> written = testing::WriteTinyModel(spec, dir);
    ASSERT_TRUE(written.ok()) << written.status();
    const std::string seed = family + "_" + c.name + ".gguf";
    const std::string bytes = ReadFile(*written);
    if (write_to != nullptr) {
      std::ofstream(std::string(write_to) + "/" + seed, std::ios::binary)
          << bytes;
    }
    EXPECT_EQ(ReadFile("ops/model/testdata/" + seed), bytes)
        << seed << " is stale or missing; see the top of this file";

    absl::StatusOr<std::unique_ptr<Model>> model =
        Model::Load(*written, LoadOptions{});
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(model.status().message(), HasSubstr(*written));
    EXPECT_THAT(model.status().message(), HasSubstr(c.want));
  }
}

// The seed spec itself is a loadable model: the refusals above come from the
// one value each case changes.
TEST_P(ModelMetadataTest, TheUnchangedSpecLoads) {
  absl::StatusOr<std::string> written =
      testing::WriteTinyModel(SeedSpec(GetParam()), ::testing::TempDir());
  ASSERT_TRUE(written.ok()) << written.status();
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Load(*written, LoadOptions{});
  EXPECT_TRUE(model.ok()) << model.status();
}

INSTANTIATE_TEST_SUITE_P(Families, ModelMetadataTest,
                         ::testing::Values("llama", "qwen2", "gemma3"));

}  // namespace
}  // namespace kvd::ops
