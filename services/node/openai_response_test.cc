#include "services/node/openai_response.h"

#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvd::node {
namespace {

using nlohmann::json;

// Expected shapes follow OpenAI's API reference for chat.completion,
// chat.completion.chunk and text_completion objects.
const ResponseMeta kMeta{"chatcmpl-1", 1700000000, "smol", ""};

TEST(OpenAiResponse, ChatCompletion) {
  ChoiceOutput out{"Hello", "stop", std::nullopt};
  const json j = json::parse(ChatCompletionJson(kMeta, out, Usage{7, 2}));
  EXPECT_EQ(j["id"], "chatcmpl-1");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "smol");
  EXPECT_FALSE(j.contains("session_id"));
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  EXPECT_EQ(j["usage"]["total_tokens"], 9);
}

TEST(OpenAiResponse, ChatLogprobsAndSession) {
  ResponseMeta meta = kMeta;
  meta.session_id = "s1";
  ChoiceOutput out{"Hi", "length",
                   std::vector<TokenLogProbText>{
                       {"Hi", -0.5f, {{"Hi", -0.5f}, {"Yo", -1.5f}}}}};
  const json j = json::parse(ChatCompletionJson(meta, out, Usage{1, 1}));
  EXPECT_EQ(j["session_id"], "s1");
  const json& c = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0]["token"], "Hi");
  EXPECT_EQ(c[0]["logprob"], -0.5);
  EXPECT_EQ(c[0]["bytes"], json({72, 105}));
  EXPECT_EQ(c[0]["top_logprobs"][1]["token"], "Yo");
  EXPECT_EQ(c[0]["top_logprobs"][1]["logprob"], -1.5);
}

TEST(OpenAiResponse, ChatChunks) {
  json first =
      json::parse(ChatChunkJson(kMeta, "", true, nullptr, nullptr, nullptr));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  json mid =
      json::parse(ChatChunkJson(kMeta, "lo", false, nullptr, nullptr, nullptr));
  EXPECT_FALSE(mid["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(mid["choices"][0]["delta"]["content"], "lo");
  const std::string stop = "stop";
  json last =
      json::parse(ChatChunkJson(kMeta, "", false, &stop, nullptr, nullptr));
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  const Usage usage{3, 4};
  json u =
      json::parse(ChatChunkJson(kMeta, "", false, nullptr, &usage, nullptr));
  EXPECT_EQ(u["choices"], json::array());
  EXPECT_EQ(u["usage"]["total_tokens"], 7);
  EXPECT_FALSE(u.contains("session_state")) << "not a session turn";
}

TEST(OpenAiResponse, SessionTurnsSayWhereTheirStateWasFound) {
  Usage usage{3, 4};
  usage.session_state = "rocksdb";
  usage.restore_ms = 12.5;
  json chunk =
      json::parse(ChatChunkJson(kMeta, "", false, nullptr, &usage, nullptr));
  EXPECT_EQ(chunk["session_state"], "rocksdb");
  EXPECT_EQ(chunk["session_restore_ms"], 12.5);
  ChoiceOutput out{"Hi", "stop", std::nullopt};
  json whole = json::parse(ChatCompletionJson(kMeta, out, usage));
  EXPECT_EQ(whole["session_state"], "rocksdb");
  EXPECT_EQ(whole["usage"]["completion_tokens"], 4);
}

TEST(OpenAiResponse, CompletionAndInvalidUtf8Tokens) {
  ChoiceOutput out{"x", "length",
                   std::vector<TokenLogProbText>{{"\xe2\x82", -1.0f, {}}}};
  const json j = json::parse(CompletionJson(kMeta, out, Usage{1, 1}));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "x");
  // Half a UTF-8 character is replaced, not an exception or invalid JSON.
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"][0], "\xef\xbf\xbd");
  EXPECT_EQ(j["choices"][0]["logprobs"]["token_logprobs"][0], -1.0);
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"][0], 0);
}

TEST(OpenAiResponse, ModelsAndSse) {
  const json j = json::parse(ModelsJson("smol", 5));
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "smol");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["owned_by"], "kvd");
  EXPECT_EQ(SseEvent("{}"), "data: {}\n\n");
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
}

TEST(OpenAiResponse, Sessions) {
  v1::SessionManifest m;
  m.set_session_id("s1");
  m.set_policy("kv-direct");
  m.set_token_count(42);
  m.add_turn_ends(20);
  m.add_turn_ends(42);
  const json j = json::parse(SessionListJson({m}, ""));
  EXPECT_EQ(j["data"][0]["id"], "s1");
  EXPECT_EQ(j["data"][0]["tokens"], 42);
  EXPECT_EQ(j["data"][0]["turns"], 2);
  EXPECT_TRUE(j["next_page_token"].is_null());
}

}  // namespace
}  // namespace kvd::node
