#include "services/node/grpc_convert.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvd::node {
namespace {

using ::testing::HasSubstr;

TEST(GenerateRequestFromProtoTest, DefaultsAndBounds) {
  absl::StatusOr<engine::GenerateRequest> g =
      GenerateRequestFromProto(v1::SamplingParams(), 100);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->max_tokens, 100);  // default 256 capped at the context
  EXPECT_EQ(g->sampling.temperature, 1.0f);

  v1::SamplingParams p;
  p.set_temperature(0);
  p.set_top_k(5);
  p.set_top_p(0.5f);
  p.set_seed(7);
  p.set_max_tokens(100);
  p.add_stop("\n\n");
  g = GenerateRequestFromProto(p, 100);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->sampling.temperature, 0.0f);
  EXPECT_EQ(g->sampling.top_k, 5);
  EXPECT_EQ(g->sampling.seed, 7u);
  EXPECT_EQ(g->max_tokens, 100);
  EXPECT_THAT(g->stop, ::testing::ElementsAre("\n\n"));

  p.set_max_tokens(101);
  absl::Status s = GenerateRequestFromProto(p, 100).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("1..100"));
  p.set_max_tokens(0);
  EXPECT_EQ(GenerateRequestFromProto(p, 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  p.set_max_tokens(10);
  p.set_temperature(INFINITY);
  EXPECT_EQ(GenerateRequestFromProto(p, 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  p.set_temperature(1);
  p.set_top_k(-1);
  EXPECT_EQ(GenerateRequestFromProto(p, 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  p.set_top_k(0);
  p.add_stop("");
  EXPECT_EQ(GenerateRequestFromProto(p, 100).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The bounds HTTP has (openai_request.h): temperature in [0, 2], at most 4
// stop strings.
TEST(GenerateRequestFromProtoTest, SharesHttpBounds) {
  v1::SamplingParams p;
  p.set_temperature(2);
  EXPECT_TRUE(GenerateRequestFromProto(p, 100).ok());
  p.set_temperature(2.5f);
  absl::Status hot = GenerateRequestFromProto(p, 100).status();
  EXPECT_EQ(hot.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(hot.message(), HasSubstr("[0, 2]"));
  p.set_temperature(NAN);
  EXPECT_EQ(GenerateRequestFromProto(p, 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  p.set_temperature(1);
  for (int i = 0; i < 4; ++i) p.add_stop("s");
  EXPECT_TRUE(GenerateRequestFromProto(p, 100).ok());
  p.add_stop("s");
  absl::Status stops = GenerateRequestFromProto(p, 100).status();
  EXPECT_EQ(stops.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(stops.message(), HasSubstr("at most 4"));
}

TEST(ValidateLabelsTest, Bounds) {
  google::protobuf::Map<std::string, std::string> labels;
  labels["title"] = "x";
  EXPECT_TRUE(ValidateLabels(labels).ok());
  labels[""] = "y";
  EXPECT_EQ(ValidateLabels(labels).code(), absl::StatusCode::kInvalidArgument);
  labels.erase("");
  labels["big"] = std::string(kMaxLabelValueBytes + 1, 'v');
  EXPECT_EQ(ValidateLabels(labels).code(), absl::StatusCode::kInvalidArgument);
  labels.clear();
  for (int i = 0; i <= kMaxLabels; ++i) labels[std::to_string(i)] = "";
  EXPECT_EQ(ValidateLabels(labels).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PageSizeTest, Bounds) {
  EXPECT_EQ(*PageSize(0), kDefaultPageSize);
  EXPECT_EQ(*PageSize(1000), 1000);
  EXPECT_EQ(PageSize(1001).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PageSize(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateInputTest, ExactlyOneInput) {
  std::optional<ops::ChatTemplate> none;
  v1::GenerateRequest r;
  EXPECT_EQ(ValidateInput(r, none).code(), absl::StatusCode::kInvalidArgument);
  r.set_prompt("x");
  EXPECT_TRUE(ValidateInput(r, none).ok());
  v1::ChatMessage* m = r.add_messages();
  m->set_role("user");
  m->set_content("y");
  EXPECT_EQ(ValidateInput(r, none).code(), absl::StatusCode::kInvalidArgument);
  r.clear_prompt();
  EXPECT_EQ(ValidateInput(r, none).code(),
            absl::StatusCode::kFailedPrecondition);
  // A role the templates do not know is refused, not rendered.
  m->set_role("wizard");
  const absl::Status bad = ValidateInput(r, none);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("messages[0].role"), std::string::npos) << bad;
}

TEST(ValidateInputTest, TheLastMessageIsTheUsers) {
  const std::optional<ops::ChatTemplate> tmpl = ops::ChatTemplate::ChatML();
  v1::GenerateRequest r;
  v1::ChatMessage* m = r.add_messages();
  m->set_role("system");
  m->set_content("Be brief.");
  const absl::Status no_user = ValidateInput(r, tmpl);
  EXPECT_EQ(no_user.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_user.message(), HasSubstr("role 'user'"));
  m = r.add_messages();
  m->set_role("user");
  m->set_content("Hi");
  EXPECT_TRUE(ValidateInput(r, tmpl).ok());
}

TEST(ToGrpcStatusTest, KeepsCodeAndMessage) {
  grpc::Status s = ToGrpcStatus(absl::NotFoundError("session 'x'"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "session 'x'");
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(ValidUtf8Test, ReplacesBadBytesOnly) {
  EXPECT_EQ(ValidUtf8("h\xC3\xA9llo"), "h\xC3\xA9llo");
  EXPECT_EQ(ValidUtf8("a\xFF"
                      "b"),
            "a\xEF\xBF\xBD"
            "b");
  // An encoded surrogate (U+D800) decodes but is not UTF-8: replaced, as a
  // proto string field requires.
  EXPECT_EQ(ValidUtf8("x\xED\xA0\x80y"), "x\xEF\xBF\xBDy");
}

}  // namespace
}  // namespace kvd::node
