// Sessions stored by earlier kvd releases keep resuming. The committed file
// testdata/tiny_llama_format1.kvds is a two-turn conversation on the tiny
// llama model exported by the kvd that wrote checkpoint format 1 (the last
// one without session ownership), under numerics version 1. This kvd has
// other numerics (version 2: grouped row-parallel sums), so the residuals in
// the file no longer give its bits: this test imports the file and checks
// the next turn re-prefills from the stored token ids, says why, and
// continues bit-identically with the same tokens run from scratch. To write
// the file again (only with a format-1 kvd):
//
//   bazel build //services/engine:checkpoint_format_test
//   export KVD_WRITE_FORMAT_GOLDEN=$PWD/services/engine/testdata
//   bazel-bin/services/engine/checkpoint_format_test
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ops/model/testing/model_cases.h"
#include "ops/model/testing/tiny_model.h"
#include "services/engine/session_engine.h"
#include "services/engine/testing/engine_fixture.h"
#include "storage/checkpoint/codec.h"
#include "storage/checkpoint/session_file.h"

namespace kvd::engine {
namespace {

constexpr char kGolden[] = "services/engine/testdata/tiny_llama_format1.kvds";

class CheckpointFormatTest : public testing::EngineTest {
 protected:
  void SetUp() override {
    ops::testing::TinyModelSpec spec;
    spec.n_layers = 4;
    LoadModel(spec);
  }

  // Turn `turn` of acme/chat-1: greedy, a fixed function of the turn.
  TurnRequest Request(int turn, std::vector<std::vector<float>>* logits) {
    TurnRequest r;
    r.tenant = "acme";
    r.session = "chat-1";
    r.create_if_missing = true;
    r.tokens = ops::testing::RandomTokens(9 + 7 * turn, 100 + turn,
                                          model_->config().vocab_size);
    r.generate.max_tokens = 11;
    r.generate.ignore_eos = true;
    r.generate.sampling.temperature = 0;
    r.generate.on_logits = [logits](const float* l, int64_t n) {
      logits->emplace_back(l, l + n);
    };
    return r;
  }

  SessionEngineOptions Options() const {
    SessionEngineOptions o;
    o.chunk_tokens = 16;
    return o;
  }
};

// The token ids a checkpoint stores, in order.
std::vector<int32_t> StoredTokens(const storage::SessionCheckpoint& cp) {
  std::vector<int32_t> out;
  for (const auto& [id, value] : cp.chunks()) {
    if (id.layer != storage::kTokenLayer) continue;
    absl::StatusOr<storage::DecodedChunk> c =
        storage::DecodeChunk(value, "golden");
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {};
    const size_t n = c->payload.size() / sizeof(int32_t);
    const size_t at = out.size();
    out.resize(at + n);
    std::memcpy(out.data() + at, c->payload.data(), n * sizeof(int32_t));
  }
  return out;
}

TEST_P(CheckpointFormatTest, FormatOneSessionFileResumesBitIdentically) {
  if (const char* dir = std::getenv("KVD_WRITE_FORMAT_GOLDEN")) {
    // After two turns: what the golden file holds.
    OpenEngine(Options());
    for (int turn = 0; turn < 2; ++turn) {
      std::vector<std::vector<float>> unused;
      ASSERT_TRUE(
          engine_->RunTurn(Request(turn, &unused), *tokenizer_, nullptr).ok());
    }
    absl::StatusOr<storage::SessionCheckpoint> cp =
        store_->db().Load("acme", "chat-1");
    ASSERT_TRUE(cp.ok()) << cp.status();
    ASSERT_TRUE(storage::WriteSessionFile(
                    *cp, std::string(dir) + "/tiny_llama_format1.kvds")
                    .ok());
  }

  absl::StatusOr<storage::SessionCheckpoint> golden =
      storage::ReadSessionFile(kGolden);
  ASSERT_TRUE(golden.ok()) << golden.status();
  EXPECT_EQ(golden->manifest().format_version(), 1u);
  EXPECT_EQ(golden->manifest().turn_ends_size(), 2);
  EXPECT_EQ(golden->manifest().model().numerics_version(), 1u);
  const std::vector<int32_t> stored = StoredTokens(*golden);
  ASSERT_EQ(static_cast<int64_t>(stored.size()),
            golden->manifest().token_count());

  // The reference: the stored tokens and turn 2's in one prompt, from
  // scratch under this build's numerics.
  OpenEngine(Options());
  std::vector<std::vector<float>> reference;
  {
    TurnRequest all = Request(2, &reference);
    all.session = "reference";
    all.tokens.insert(all.tokens.begin(), stored.begin(), stored.end());
    absl::StatusOr<TurnResult> r =
        engine_->RunTurn(std::move(all), *tokenizer_, nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  OpenEngine(Options());
  ASSERT_TRUE(engine_->ImportSession(*golden).ok());
  std::vector<std::vector<float>> resumed;
  absl::StatusOr<TurnResult> r =
      engine_->RunTurn(Request(2, &resumed), *tokenizer_, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  // Re-prefilled from its token ids: its residuals are version-1 bits.
  EXPECT_EQ(r->path, StatePath::kReprefill)
      << StatePathName(r->path) << ": " << r->path_detail;
  EXPECT_NE(r->path_detail.find("numerics"), std::string::npos)
      << r->path_detail;
  EXPECT_TRUE(testing::LogitsBitIdentical(reference, resumed));
}

// The golden file is the llama model in bf16.
INSTANTIATE_TEST_SUITE_P(LlamaBf16, CheckpointFormatTest,
                         ::testing::Values(ops::testing::FamilyCase{
                             "llama", ops::Precision::kBf16}),
                         ops::testing::FamilyCaseName);

}  // namespace
}  // namespace kvd::engine
