// The shared chat-turn rule on SmolLM2's real tokenizer and template: a
// conversation continued turn by turn gets exactly the tokens of the whole
// conversation rendered at once, and the pre-lock estimate never undercounts.
#include "services/engine/chat_turn.h"

#include <memory>
#include <string>
#include <vector>

#include "base/model_dir.h"
#include "gtest/gtest.h"
#include "ops/gguf/gguf_file.h"
#include "ops/tokenizer/gguf_tokenizer.h"

namespace kvd::engine {
namespace {

class ChatTurnTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<ops::GgufFile>> file =
        ops::GgufFile::Open(CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf"));
    ASSERT_TRUE(file.ok()) << file.status();
    absl::StatusOr<std::unique_ptr<ops::Tokenizer>> tok =
        ops::TokenizerFromGguf(**file);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
    std::optional<std::string_view> jinja;
    if (const ops::GgufValue* v = (*file)->Find("tokenizer.chat_template")) {
      jinja = v->AsString();
    }
    absl::StatusOr<ops::ChatTemplate> tmpl =
        ops::ChatTemplate::Detect((*file)->architecture(), jinja);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    tmpl_ = std::make_unique<ops::ChatTemplate>(*std::move(tmpl));
  }

  std::unique_ptr<ops::Tokenizer> tokenizer_;
  std::unique_ptr<ops::ChatTemplate> tmpl_;
};

TEST_F(ChatTurnTest, TurnByTurnEqualsTheWholeConversation) {
  const std::vector<ops::ChatMessage> first = {{"system", "Be brief."},
                                               {"user", "Hi"}};
  absl::StatusOr<std::vector<int32_t>> t1 =
      ChatTurnTokens(*tmpl_, *tokenizer_, first, {});
  ASSERT_TRUE(t1.ok()) << t1.status();
  // The model's reply, closed by its end-of-turn token, as a session stores
  // it.
  std::vector<int32_t> session = *t1;
  for (int32_t id : tokenizer_->Encode("Hello!<|im_end|>", false, true)) {
    session.push_back(id);
  }
  ASSERT_TRUE(tokenizer_->IsEog(session.back()));
  const std::vector<ops::ChatMessage> next = {{"user", "Bye"}};
  absl::StatusOr<std::vector<int32_t>> t2 =
      ChatTurnTokens(*tmpl_, *tokenizer_, next, session);
  ASSERT_TRUE(t2.ok()) << t2.status();
  session.insert(session.end(), t2->begin(), t2->end());

  const std::vector<ops::ChatMessage> whole = {{"system", "Be brief."},
                                               {"user", "Hi"},
                                               {"assistant", "Hello!"},
                                               {"user", "Bye"}};
  absl::StatusOr<std::string> text = tmpl_->Render(whole, true);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(session, tokenizer_->Encode(*text, true, true)) << *text;
}

TEST_F(ChatTurnTest, EstimateNeverUndercounts) {
  const std::vector<ops::ChatMessage> next = {{"user", "Summarize."}};
  const std::vector<int32_t> open =
      tokenizer_->Encode("<|im_start|>assistant\nHello", true, true);
  const std::vector<int32_t> closed =
      tokenizer_->Encode("<|im_start|>assistant\nHello<|im_end|>", true, true);
  absl::StatusOr<std::vector<int32_t>> estimate =
      ChatTurnTokens(*tmpl_, *tokenizer_, next, {-1}, /*estimate=*/true);
  ASSERT_TRUE(estimate.ok()) << estimate.status();
  for (const auto* s : {&open, &closed}) {
    absl::StatusOr<std::vector<int32_t>> exact =
        ChatTurnTokens(*tmpl_, *tokenizer_, next, *s);
    ASSERT_TRUE(exact.ok());
    EXPECT_GE(estimate->size(), exact->size());
  }
  EXPECT_EQ(ChatTurnTokens(*tmpl_, *tokenizer_, {}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvd::engine
