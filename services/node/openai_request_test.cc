#include "services/node/openai_request.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/rocksdb/disk_full.h"

namespace kvd::node {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// A valid chat body with `extra` merged in (null values delete a key).
std::string Chat(const json& extra = json::object()) {
  json j = {{"model", "m"},
            {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  j.merge_patch(extra);
  return j.dump();
}

std::string Completion(const json& extra = json::object()) {
  json j = {{"model", "m"}, {"prompt", "Once"}};
  j.merge_patch(extra);
  return j.dump();
}

// The OpenAI error a failed parse turns into.
ApiError ChatError(const std::string& body, const std::string& header = "") {
  absl::StatusOr<ChatRequest> r = ParseChatRequest(body, header, {});
  EXPECT_FALSE(r.ok()) << body;
  return r.ok() ? ApiError{} : ApiErrorFromStatus(r.status());
}

ApiError CompletionError(const std::string& body) {
  absl::StatusOr<CompletionRequest> r = ParseCompletionRequest(body, {});
  EXPECT_FALSE(r.ok()) << body;
  return r.ok() ? ApiError{} : ApiErrorFromStatus(r.status());
}

TEST(ParseChatRequest, AcceptsAFullRequest) {
  absl::StatusOr<ChatRequest> r =
      ParseChatRequest(Chat({{"messages",
                              {{{"role", "developer"}, {"content", "be brief"}},
                               {{"role", "assistant"}, {"content", nullptr}},
                               {{"role", "user"},
                                {"content",
                                 {{{"type", "text"}, {"text", "a"}},
                                  {{"type", "text"}, {"text", "b"}}}}}}},
                             {"stream", true},
                             {"stream_options", {{"include_usage", true}}},
                             {"max_completion_tokens", 16},
                             {"temperature", 0},
                             {"top_p", 0.5},
                             {"top_k", 40},
                             {"min_p", 0.05},
                             {"repetition_penalty", 1.1},
                             {"seed", -1},
                             {"stop", {"x", "y"}},
                             {"logprobs", true},
                             {"top_logprobs", 20},
                             {"user", "u1"},
                             {"ignore_eos", true},
                             {"n", 1},
                             {"tool_choice", "none"},
                             {"response_format", {{"type", "text"}}},
                             {"some_vendor_extra", {1, 2}},
                             {"session_id", "chat-1"}}),
                       "", {});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 3u);
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[1].content, "");
  EXPECT_EQ(r->messages[2].content, "ab");
  EXPECT_TRUE(r->common.stream);
  EXPECT_TRUE(r->common.include_usage);
  EXPECT_EQ(r->common.max_tokens, 16);
  EXPECT_EQ(r->common.sampling.temperature, 0.0f);
  EXPECT_EQ(r->common.sampling.top_p, 0.5f);
  EXPECT_EQ(r->common.sampling.top_k, 40);
  EXPECT_EQ(r->common.sampling.min_p, 0.05f);
  EXPECT_EQ(r->common.sampling.repetition_penalty, 1.1f);
  EXPECT_TRUE(r->common.seed_given);
  EXPECT_EQ(r->common.sampling.seed, ~uint64_t{0});
  EXPECT_THAT(r->common.stop, ::testing::ElementsAre("x", "y"));
  EXPECT_TRUE(r->common.logprobs);
  EXPECT_EQ(r->common.top_logprobs, 20);
  EXPECT_TRUE(r->common.ignore_eos);
  EXPECT_EQ(r->session_id, "chat-1");
}

TEST(ParseChatRequest, DefaultsAreOpenAis) {
  absl::StatusOr<ChatRequest> r = ParseChatRequest(Chat(), "", {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->common.stream);
  EXPECT_FALSE(r->common.max_tokens.has_value());
  EXPECT_EQ(r->common.sampling.temperature, 1.0f);
  EXPECT_EQ(r->common.sampling.top_p, 1.0f);
  EXPECT_EQ(r->common.sampling.top_k, 0);
  EXPECT_EQ(r->common.sampling.min_p, 0.0f);
  EXPECT_EQ(r->common.sampling.repetition_penalty, 1.0f);
  EXPECT_FALSE(r->common.seed_given);
  EXPECT_TRUE(r->common.stop.empty());
  EXPECT_TRUE(r->session_id.empty());
  // null is absent, as in OpenAI's API.
  r = ParseChatRequest(Chat({{"temperature", nullptr}}), "", {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->common.sampling.temperature, 1.0f);
}

struct BadCase {
  json extra;
  std::string param;
};

TEST(ParseChatRequest, RejectsEveryOutOfRangeOrMistypedField) {
  const BadCase cases[] = {
      {{{"temperature", 2.0001}}, "temperature"},
      {{{"temperature", -0.1}}, "temperature"},
      {{{"temperature", "1"}}, "temperature"},
      {{{"top_p", 0}}, "top_p"},
      {{{"top_p", 1.01}}, "top_p"},
      {{{"top_k", -2}}, "top_k"},
      {{{"top_k", 1.5}}, "top_k"},
      {{{"min_p", 1.5}}, "min_p"},
      {{{"min_p", -0.1}}, "min_p"},
      {{{"repetition_penalty", 0}}, "repetition_penalty"},
      {{{"repetition_penalty", 10.5}}, "repetition_penalty"},
      {{{"frequency_penalty", 2.5}}, "frequency_penalty"},
      {{{"presence_penalty", -2.5}}, "presence_penalty"},
      {{{"max_tokens", 0}}, "max_tokens"},
      {{{"max_tokens", (int64_t{1} << 20) + 1}}, "max_tokens"},
      {{{"max_tokens", 1.5}}, "max_tokens"},
      {{{"max_tokens", "8"}}, "max_tokens"},
      {{{"max_completion_tokens", -3}}, "max_completion_tokens"},
      {{{"max_tokens", 18446744073709551615u}}, "max_tokens"},
      {{{"seed", 1.5}}, "seed"},
      {{{"n", 2}}, "n"},
      {{{"n", 0}}, "n"},
      {{{"stop", {"a", "b", "c", "d", "e"}}}, "stop"},
      {{{"stop", {""}}}, "stop"},
      {{{"stop", std::string(257, 'x')}}, "stop"},
      {{{"stop", {1}}}, "stop"},
      {{{"stop", 3}}, "stop"},
      {{{"logprobs", 1}}, "logprobs"},
      {{{"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs"},
      {{{"top_logprobs", 2}}, "top_logprobs"},
      {{{"stream", "yes"}}, "stream"},
      {{{"stream_options", {{"include_usage", 1}}}},
       "stream_options.include_usage"},
      {{{"stream_options", 1}}, "stream_options"},
      {{{"user", std::string(257, 'u')}}, "user"},
      {{{"ignore_eos", 1}}, "ignore_eos"},
      {{{"model", 1}}, "model"},
      {{{"model", nullptr}}, "model"},
      {{{"tools", {{{"type", "function"}}}}}, "tools"},
      {{{"logit_bias", {{"1", 5}}}}, "logit_bias"},
      {{{"tool_choice", "auto"}}, "tool_choice"},
      {{{"response_format", {{"type", "json_object"}}}}, "response_format"},
      {{{"messages", json::array()}}, "messages"},
      {{{"messages", "hi"}}, "messages"},
      {{{"messages", {{{"role", "tool"}, {"content", "x"}}}}},
       "messages[0].role"},
      {{{"messages", {{{"content", "x"}}}}}, "messages[0].role"},
      {{{"messages", {{{"role", "user"}}}}}, "messages[0].content"},
      {{{"messages",
         {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}},
       "messages[0].content"},
      {{{"messages",
         {{{"role", "user"}, {"content", "a"}},
          {{"role", "assistant"}, {"content", "b"}}}}},
       "messages"},
      {{{"messages", {1}}}, "messages[0]"},
      {{{"session_id", ""}}, "session_id"},
      {{{"session_id", "a/b"}}, "session_id"},
      {{{"session_id", std::string(129, 's')}}, "session_id"},
      {{{"session_id", 5}}, "session_id"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.extra.dump());
    const ApiError e = ChatError(Chat(c.extra));
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_EQ(e.param, c.param);
    EXPECT_FALSE(e.message.empty());
  }
}

TEST(ParseChatRequest, BoundsAreInclusiveWhereDocumented) {
  for (const json& extra :
       {json{{"temperature", 2}}, json{{"temperature", 0}}, json{{"top_p", 1}},
        json{{"top_p", 1e-9}}, json{{"frequency_penalty", -2}},
        json{{"presence_penalty", 2}}, json{{"max_tokens", int64_t{1} << 20}},
        json{{"top_k", -1}}, json{{"min_p", 0}}, json{{"min_p", 1}},
        json{{"repetition_penalty", 10}}, json{{"max_tokens", 1}},
        json{{"stop", {"a", "b", "c", "d"}}},
        json{{"stop", std::string(256, 'x')}},
        json{{"seed", 18446744073709551615u}},
        json{{"session_id", std::string(128, 's')}}}) {
    SCOPED_TRACE(extra.dump());
    absl::StatusOr<ChatRequest> r = ParseChatRequest(Chat(extra), "", {});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->common.sampling.top_p, 0.0f);
  }
}

TEST(ParseChatRequest, RejectsMalformedJson) {
  for (const std::string& body : std::vector<std::string>{
           "", "{", "[]", "1", "{\"model\": NaN}",
           "{\"temperature\": Infinity}", "{\"model\": \"m\"} trailing",
           "{'model': 'm'}", std::string("{\"model\": \"\xff\xfe\"}"),
           std::string("{\"model\": \"\xc3\"}")}) {
    SCOPED_TRACE(body);
    const ApiError e = ChatError(body);
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.type, "invalid_request_error");
  }
  // Invalid UTF-8 inside a message.
  const ApiError e = ChatError(
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\x80"
      "\"}]}");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_THAT(e.message, HasSubstr("UTF-8"));
}

TEST(ParseChatRequest, BodyTooLargeIs413) {
  RequestLimits limits;
  limits.max_body_bytes = 100;
  absl::StatusOr<ChatRequest> r =
      ParseChatRequest(Chat({{"user", std::string(100, 'u')}}), "", limits);
  ASSERT_FALSE(r.ok());
  const ApiError e = ApiErrorFromStatus(r.status());
  EXPECT_EQ(e.http_status, 413);
  EXPECT_EQ(e.code, "request_too_large");
}

TEST(ParseChatRequest, TooManyMessagesAndTooDeep) {
  json messages = json::array();
  for (int i = 0; i < 257; ++i) {
    messages.push_back({{"role", "user"}, {"content", "x"}});
  }
  ApiError e = ChatError(Chat({{"messages", messages}}));
  EXPECT_EQ(e.param, "messages");
  EXPECT_THAT(e.message, HasSubstr("257"));
  messages.erase(messages.begin());
  EXPECT_TRUE(ParseChatRequest(Chat({{"messages", messages}}), "", {}).ok());

  std::string deep = "{\"model\":\"m\",\"x\":" + std::string(40, '[') +
                     std::string(40, ']') + "}";
  e = ChatError(deep);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_THAT(e.message, HasSubstr("deeper"));
  // Brackets inside strings do not count.
  EXPECT_TRUE(
      ParseChatRequest(Chat({{"user", std::string(100, '[')}}), "", {}).ok());
}

TEST(ParseChatRequest, SessionIdFromHeaderOrBody) {
  absl::StatusOr<ChatRequest> r = ParseChatRequest(Chat(), "s-1", {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->session_id, "s-1");
  r = ParseChatRequest(Chat({{"session_id", "s-1"}}), "s-1", {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->session_id, "s-1");
  EXPECT_EQ(ChatError(Chat({{"session_id", "s-1"}}), "s-2").param,
            "session_id");
  EXPECT_EQ(ChatError(Chat(), "bad id").param, "X-Session-Id");
}

TEST(ParseCompletionRequest, AcceptsAndRejects) {
  absl::StatusOr<CompletionRequest> r = ParseCompletionRequest(
      Completion({{"logprobs", 5}, {"max_tokens", 4}, {"stop", "."}}), {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt, "Once");
  EXPECT_TRUE(r->common.logprobs);
  EXPECT_EQ(r->common.top_logprobs, 5);
  r = ParseCompletionRequest(Completion({{"prompt", {"one"}}}), {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompt, "one");

  const BadCase cases[] = {
      {{{"prompt", nullptr}}, "prompt"},
      {{{"prompt", {"a", "b"}}}, "prompt"},
      {{{"prompt", {1, 2}}}, "prompt"},
      {{{"echo", true}}, "echo"},
      {{{"suffix", "x"}}, "suffix"},
      {{{"best_of", 2}}, "best_of"},
      {{{"logprobs", 21}}, "logprobs"},
      {{{"logprobs", true}}, "logprobs"},
      {{{"session_id", "s"}}, "session_id"},
      {{{"temperature", 3}}, "temperature"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.extra.dump());
    const ApiError e = CompletionError(Completion(c.extra));
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.param, c.param);
  }
}

TEST(ApiError, MapsStatusCodesAndFormatsOpenAisObject) {
  EXPECT_EQ(ApiErrorFromStatus(absl::NotFoundError("x")).http_status, 404);
  EXPECT_EQ(ApiErrorFromStatus(absl::UnauthenticatedError("x")).http_status,
            401);
  EXPECT_EQ(ApiErrorFromStatus(absl::ResourceExhaustedError("x")).http_status,
            429);
  EXPECT_EQ(ApiErrorFromStatus(absl::UnavailableError("x")).http_status, 503);
  EXPECT_EQ(ApiErrorFromStatus(absl::CancelledError("x")).http_status, 499);
  EXPECT_EQ(ApiErrorFromStatus(absl::InternalError("x")).http_status, 500);
  EXPECT_EQ(ApiErrorFromStatus(absl::DataLossError("x")).http_status, 500);

  const json j = json::parse(
      ApiErrorJson(ApiErrorFromStatus(RequestError("temperature", "too hot"))));
  EXPECT_EQ(j["error"]["message"], "too hot");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_TRUE(j["error"]["code"].is_null());
  const json k =
      json::parse(ApiErrorJson(ApiErrorFromStatus(absl::InternalError("x"))));
  EXPECT_TRUE(k["error"]["param"].is_null());
}

// A tenant's quota and a full disk share RESOURCE_EXHAUSTED; only the quota
// is the client's to fix (429, as OpenAI's insufficient_quota).
TEST(ApiErrorFromStatus, FullDiskIs507AndQuotaIs429) {
  const absl::Status quota = absl::ResourceExhaustedError("over its quota");
  EXPECT_EQ(ApiErrorFromStatus(quota).http_status, 429);
  const ApiError full = ApiErrorFromStatus(
      storage::MarkDiskFull(absl::ResourceExhaustedError("disk is full")));
  EXPECT_EQ(full.http_status, 507);
  EXPECT_EQ(full.type, "server_error");
  EXPECT_EQ(full.code, "insufficient_storage");
  EXPECT_EQ(full.message, "disk is full");
}

}  // namespace
}  // namespace kvd::node
