#include "ops/chat/chat_template.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "base/model_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "ops/gguf/gguf_file.h"

namespace kvd::ops {
namespace {

using ::testing::HasSubstr;

// Expected prompts are written out by hand from each model's documented chat
// format: SmolLM2-135M-Instruct's tokenizer.chat_template (below, as stored in
// its GGUF), Google's Gemma 3 template and Meta's Llama 3 Instruct template
// (minus BOS, which the tokenizer adds).

constexpr char kSmolLmJinja[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != "
    "'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' "
    "+ "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
    "add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

constexpr char kQwenJinjaFragment[] =
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
    "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- "
    "'<|im_start|>system\\nYou are "
    "Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}{%- endif %}";

constexpr char kLlama3Jinja[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% "
    "set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ "
    "message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token "
    "+ content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

TEST(ChatTemplateTest, DetectsSmolLmChatMlWithItsDefaultSystemPrompt) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Detect("llama", kSmolLmJinja);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name(), "chatml");
  EXPECT_EQ(
      t->default_system_prompt(),
      "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  EXPECT_EQ(t->stop_strings(), std::vector<std::string>{"<|im_end|>"});

  absl::StatusOr<std::string> p = t->Render({{"user", "What is 2+2?"}}, true);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
            "trained by Hugging "
            "Face<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, ChatMlKeepsAnExplicitSystemMessageAndContentVerbatim) {
  ChatTemplate t = *ChatTemplate::Detect("llama", kSmolLmJinja);
  absl::StatusOr<std::string> p = t.Render({{"system", "Be brief."},
                                            {"user", "  Hi \n"},
                                            {"assistant", "Hello!"},
                                            {"user", "Bye"}},
                                           false);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p,
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\n  Hi \n<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n");
}

TEST(ChatTemplateTest, ChatMlWithoutMessagesHasNoDefaultSystem) {
  ChatTemplate t = *ChatTemplate::Detect("llama", kSmolLmJinja);
  EXPECT_EQ(*t.Render({}, true), "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, ExtractsAnEscapedDefaultAndSkipsExpressions) {
  EXPECT_EQ(
      ExtractChatMLDefaultSystem(kQwenJinjaFragment),
      "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  EXPECT_EQ(
      ExtractChatMLDefaultSystem("{{'<|im_start|>' + message['role'] + '\n'}}"),
      std::nullopt);
  ChatTemplate plain =
      *ChatTemplate::Detect("qwen2", "{{'<|im_start|>' + m['role']}}");
  EXPECT_EQ(plain.default_system_prompt(), std::nullopt);
  EXPECT_EQ(*plain.Render({{"user", "x"}}, false),
            "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplateTest, GemmaIsTheDefaultForGemma3WithoutATemplate) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Detect("gemma3", std::nullopt);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name(), "gemma");
  EXPECT_EQ(t->stop_strings(), std::vector<std::string>{"<end_of_turn>"});
  absl::StatusOr<std::string> p = t->Render(
      {{"user", "Hello"}, {"assistant", "Hi there"}, {"user", "How are you?"}},
      true);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p,
            "<start_of_turn>user\nHello<end_of_turn>\n"
            "<start_of_turn>model\nHi there<end_of_turn>\n"
            "<start_of_turn>user\nHow are you?<end_of_turn>\n"
            "<start_of_turn>model\n");
}

TEST(ChatTemplateTest, GemmaFoldsSystemIntoFirstUserTurnAndTrims) {
  ChatTemplate t = ChatTemplate::Gemma();
  absl::StatusOr<std::string> p =
      t.Render({{"system", "You are terse."}, {"user", "  Why?\n"}}, false);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, "<start_of_turn>user\nYou are terse.\n\nWhy?<end_of_turn>\n");
  // Detected from a Gemma template too.
  EXPECT_EQ(
      ChatTemplate::Detect("llama", "{{ '<start_of_turn>' + role }}")->name(),
      "gemma");
}

TEST(ChatTemplateTest, GemmaRejectsRolesThatDoNotAlternate) {
  ChatTemplate t = ChatTemplate::Gemma();
  absl::StatusOr<std::string> p =
      t.Render({{"user", "a"}, {"user", "b"}}, true);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("alternate"));
  EXPECT_FALSE(t.Render({{"assistant", "a"}}, true).ok());
}

TEST(ChatTemplateTest, Llama3HeadersAndTrimmedContent) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Detect("llama", kLlama3Jinja);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->name(), "llama3");
  EXPECT_EQ(t->stop_strings(), std::vector<std::string>{"<|eot_id|>"});
  absl::StatusOr<std::string> p =
      t->Render({{"system", "Be kind. "}, {"user", "\nHi"}}, true);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p,
            "<|start_header_id|>system<|end_header_id|>\n\nBe kind.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, UnknownTemplatesAreClearErrors) {
  absl::StatusOr<ChatTemplate> t =
      ChatTemplate::Detect("llama", "[INST] {{ m }} [/INST]");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("unknown chat template"));
  EXPECT_THAT(t.status().message(),
              HasSubstr("supported: chatml, gemma, llama3"));
  absl::StatusOr<ChatTemplate> u = ChatTemplate::Detect("llama", std::nullopt);
  ASSERT_FALSE(u.ok());
  EXPECT_THAT(u.status().message(), HasSubstr("'llama'"));
}

TEST(ChatTemplateTest, RejectsBadRoles) {
  ChatTemplate t = ChatTemplate::ChatML();
  EXPECT_FALSE(t.Render({{"", "x"}}, false).ok());
  EXPECT_FALSE(t.Render({{"user\nsystem", "x"}}, false).ok());
}

TEST(ChatTemplateTest, JinjaTrimStripsPythonWhitespace) {
  EXPECT_EQ(JinjaTrim(" \t\n a b \r\n"), "a b");
  EXPECT_EQ(JinjaTrim("\xE3\x80\x80x\xC2\xA0"), "x");  // U+3000, U+00A0
  EXPECT_EQ(JinjaTrim("\x1Fx"), "x");  // Python counts U+001F as space
  EXPECT_EQ(JinjaTrim("   "), "");
  EXPECT_EQ(JinjaTrim("\xE2\x80\x8Bx"),
            "\xE2\x80\x8Bx");  // U+200B is not whitespace
}

// Prompts rendered from the real Jinja templates by Jinja2
// (tools/reference/make_chat_cases.py).
TEST(ChatTemplateTest, MatchesJinja2Renderings) {
  std::ifstream in("ops/chat/testdata/chat_cases.jsonl");
  ASSERT_TRUE(in.good()) << "missing ops/chat/testdata/chat_cases.jsonl";
  const ChatTemplate smollm = *ChatTemplate::Detect("llama", kSmolLmJinja);
  const ChatTemplate llama3 = *ChatTemplate::Detect("llama", kLlama3Jinja);
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    std::vector<ChatMessage> messages;
    for (const auto& m : j["messages"])
      messages.push_back({m["role"], m["content"]});
    const ChatTemplate& t = j["template"] == "smollm2" ? smollm : llama3;
    absl::StatusOr<std::string> got =
        t.Render(messages, j["add_generation_prompt"]);
    ASSERT_TRUE(got.ok()) << got.status() << " in " << line;
    EXPECT_EQ(*got, j["text"].get<std::string>()) << line;
    ++cases;
  }
  EXPECT_EQ(cases, 24);
}

std::string ModelPath(const char* file) { return CachedModelPath(file); }

TEST(ChatTemplateRealModelTest, SmolLm2FileCarriesTheChatMlTemplate) {
  const std::string path = ModelPath("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!std::ifstream(path).good())
    FAIL() << "(run tools/setup.sh --test) "
           << "model file not found: " << path;
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::string_view> jinja =
      (*file)->GetString("tokenizer.chat_template");
  ASSERT_TRUE(jinja.ok()) << jinja.status();
  EXPECT_EQ(*jinja, kSmolLmJinja);  // so the Jinja2 cases above cover this file
  absl::StatusOr<ChatTemplate> t =
      ChatTemplate::Detect((*file)->architecture(), *jinja);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name(), "chatml");
  EXPECT_EQ(
      t->default_system_prompt(),
      "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
}

TEST(ChatTemplateRealModelTest, Gemma3FileHasNoTemplateAndGetsGemma) {
  const std::string path = ModelPath("gemma-3-270m-q4_k_m.gguf");
  if (!std::ifstream(path).good())
    FAIL() << "(run tools/setup.sh --test) "
           << "model file not found: " << path;
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->Find("tokenizer.chat_template"), nullptr);
  absl::StatusOr<ChatTemplate> t =
      ChatTemplate::Detect((*file)->architecture(), std::nullopt);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name(), "gemma");
}

// A session continues by appending only the follow-up text to the stored
// tokens; that must render the very conversation Render renders in one go.
TEST(ChatTemplateTest, FollowUpContinuesTheFullRendering) {
  const std::vector<ChatTemplate> templates = {
      ChatTemplate::ChatML("You are helpful."), ChatTemplate::Gemma(),
      ChatTemplate::Llama3()};
  for (const ChatTemplate& t : templates) {
    SCOPED_TRACE(std::string(t.name()));
    const ChatMessage user1{"user", "Hi there"};
    const std::string reply = "Hello! How can I help?";
    const ChatMessage user2{"user", " What is 2+2? "};
    const std::string full =
        *t.Render({user1, {"assistant", reply}, user2}, true);
    const std::string first = *t.Render({user1}, true);
    // The model stopped before emitting its end marker (max_tokens)...
    EXPECT_EQ(first + reply + *t.RenderFollowUp(user2, false), full);
    // ...or emitted it (generation ended on the end-of-turn token).
    EXPECT_EQ(first + reply + t.stop_strings().front() +
                  *t.RenderFollowUp(user2, true),
              full);
  }
}

TEST(ChatTemplateTest, GemmaFollowUpMustBeAUserTurn) {
  EXPECT_FALSE(
      ChatTemplate::Gemma().RenderFollowUp({"assistant", "x"}, true).ok());
}

}  // namespace
}  // namespace kvd::ops
