#include "ops/tokenizer/gguf_tokenizer.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/gguf/gguf_file.h"
#include "ops/gguf/gguf_writer.h"

namespace kvd::ops {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Parses the writer's bytes; `bytes` must outlive the returned file.
std::unique_ptr<GgufFile> Parse(const GgufWriter& w, std::string* bytes) {
  absl::StatusOr<std::string> s = w.WriteToString();
  EXPECT_TRUE(s.ok()) << s.status();
  *bytes = *s;
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Parse(
      "tiny.gguf", reinterpret_cast<const uint8_t*>(bytes->data()),
      bytes->size());
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? std::move(*f) : nullptr;
}

void AddGpt2Vocab(GgufWriter& w) {
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", "smollm");
  w.AddStringArray("tokenizer.ggml.tokens", {"<|im_end|>", "a", "b", "ab"});
  w.AddInt32Array("tokenizer.ggml.token_type",
                  std::vector<int32_t>{3, 1, 1, 1});
  w.AddStringArray("tokenizer.ggml.merges", {"a b"});
}

TEST(GgufTokenizerTest, ReadsAGpt2Vocabulary) {
  GgufWriter w;
  AddGpt2Vocab(w);
  w.AddUint32("tokenizer.ggml.eos_token_id", 0);
  w.AddBool("tokenizer.ggml.add_bos_token", false);
  std::string bytes;
  auto file = Parse(w, &bytes);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = TokenizerFromGguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("ab<|im_end|>", true, true), ElementsAre(3, 0));
  EXPECT_EQ((*tok)->eos(), 0);
  // No bos_token_id: llama.cpp's gpt2 default (11) is outside this vocabulary,
  // so none.
  EXPECT_EQ((*tok)->bos(), std::nullopt);
}

TEST(GgufTokenizerTest, SpmDefaultsAndIntegerScores) {
  GgufWriter w;
  w.AddString("tokenizer.ggml.model", "llama");
  w.AddStringArray("tokenizer.ggml.tokens",
                   {"<unk>", "<s>", "</s>", "a", "b", "ab"});
  w.AddInt32Array("tokenizer.ggml.scores",
                  std::vector<int32_t>{0, 0, 0, -2, -2, -1});
  w.AddInt32Array("tokenizer.ggml.token_type",
                  std::vector<int32_t>{2, 3, 3, 1, 1, 1});
  w.AddBool("tokenizer.ggml.add_space_prefix", false);
  std::string bytes;
  auto file = Parse(w, &bytes);
  absl::StatusOr<TokenizerSpec> spec = TokenizerSpecFromGguf(*file);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->scores, ElementsAre(0, 0, 0, -2, -2, -1));
  EXPECT_EQ(spec->bos_id, 1);  // llama.cpp's SentencePiece defaults
  EXPECT_EQ(spec->eos_id, 2);
  EXPECT_EQ(spec->unk_id, 0);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = TokenizerFromGguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("ab", true, false), ElementsAre(1, 5));
}

TEST(GgufTokenizerTest, ErrorsNameTheFileAndKey) {
  {
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "bert");
    std::string bytes;
    absl::Status s = TokenizerFromGguf(*Parse(w, &bytes)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("tiny.gguf"));
    EXPECT_THAT(s.message(), HasSubstr("tokenizer.ggml.model"));
    EXPECT_THAT(s.message(), HasSubstr("bert"));
  }
  {
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "gpt2");
    std::string bytes;
    absl::Status s = TokenizerFromGguf(*Parse(w, &bytes)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(s.message(), HasSubstr("tokenizer.ggml.tokens"));
  }
  {
    GgufWriter w;
    AddGpt2Vocab(w);
    w.AddUint32("tokenizer.ggml.bos_token_id", 99);
    std::string bytes;
    absl::Status s = TokenizerFromGguf(*Parse(w, &bytes)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("tokenizer.ggml.bos_token_id = 99"));
  }
  {
    GgufWriter w;
    AddGpt2Vocab(w);
    w.AddString("tokenizer.ggml.add_bos_token", "yes");
    std::string bytes;
    absl::Status s = TokenizerFromGguf(*Parse(w, &bytes)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("tokenizer.ggml.add_bos_token"));
  }
  {
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "gpt2");
    w.AddStringArray("tokenizer.ggml.tokens", {"a", "b"});
    w.AddStringArray("tokenizer.ggml.merges", {"a c"});
    std::string bytes;
    absl::Status s = TokenizerFromGguf(*Parse(w, &bytes)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("tiny.gguf"));
    EXPECT_THAT(s.message(), HasSubstr("'c', which is not a token"));
  }
  {
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "llama");
    w.AddStringArray("tokenizer.ggml.tokens", {"a", "b"});
    w.AddFloat32Array("tokenizer.ggml.scores", std::vector<float>{1.0f});
    std::string bytes;
    absl::Status s = TokenizerFromGguf(*Parse(w, &bytes)).status();
    EXPECT_THAT(s.message(),
                HasSubstr("tokenizer.ggml.scores has 1 entries for 2 tokens"));
  }
}

}  // namespace
}  // namespace kvd::ops
