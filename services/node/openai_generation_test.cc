// PrepareGeneration sizes a session turn's default max_tokens from an
// estimate of the new message's tokens, made before the session's lock is
// held; the exact count is checked again under it. The estimate must never
// be below the exact count, or a session near the end of its context gets a
// 400 naming a max_tokens the client never sent.
#include "services/node/openai_generation.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/node/runtime.h"

namespace kvd::node {
namespace {

constexpr char kSmolLm[] =
    "/root/.cache/kvd/models/SmolLM2-135M-Instruct.Q4_1.gguf";

absl::StatusOr<std::unique_ptr<NodeRuntime>> OpenSmolLm(
    const std::string& name) {
  NodeOptions options;
  options.model_path = kSmolLm;
  const char* tmp = std::getenv("TEST_TMPDIR");
  options.data_dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
  options.num_threads = 1;
  return NodeRuntime::Open(options, nullptr);
}

TEST(ChatTokens, EstimateIsAnUpperBoundOfTheExactFollowUp) {
  absl::StatusOr<std::unique_ptr<NodeRuntime>> rt = OpenSmolLm("gen");
  ASSERT_TRUE(rt.ok()) << rt.status();
  const ops::Tokenizer& tok = (*rt)->tokenizer();

  GenerationJob job;
  job.chat = true;
  job.session = "s";
  job.messages = {{"user", "Summarize."}};
  // The session so far: a first turn and a reply, either cut off by length
  // (still open) or closed by the model's end-of-turn token.
  std::vector<int32_t> open = tok.Encode(
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello there",
      /*add_special=*/true, /*parse_special=*/true);
  ASSERT_FALSE(tok.IsEog(open.back()));
  std::vector<int32_t> closed = tok.Encode(
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>",
      /*add_special=*/true, /*parse_special=*/true);
  ASSERT_TRUE(tok.IsEog(closed.back()));

  const std::vector<int32_t> placeholder = {-1};
  auto estimate = ChatTokens(**rt, job, placeholder, /*estimate=*/true);
  ASSERT_TRUE(estimate.ok()) << estimate.status();
  for (const auto* session : {&open, &closed}) {
    auto exact = ChatTokens(**rt, job, *session, /*estimate=*/false);
    ASSERT_TRUE(exact.ok()) << exact.status();
    EXPECT_GE(estimate->size(), exact->size())
        << (session == &open ? "open" : "closed") << " reply";
  }
  // The open reply needs its closing tokens: the case the estimate missed.
  auto exact_open = ChatTokens(**rt, job, open, /*estimate=*/false);
  auto exact_closed = ChatTokens(**rt, job, closed, /*estimate=*/false);
  EXPECT_GT(exact_open->size(), exact_closed->size());
}

// The estimate overcounts by the reply-closing tokens when the last reply was
// closed; it sizes the default max_tokens, but must not refuse a max_tokens
// the client chose that fits exactly (the check under the session's lock
// decides those).
TEST(PrepareGeneration, ExplicitMaxTokensThatFitsExactlyIsNotRefusedEarly) {
  absl::StatusOr<std::unique_ptr<NodeRuntime>> rt = OpenSmolLm("prepare");
  ASSERT_TRUE(rt.ok()) << rt.status();
  GenerationJob job;
  job.chat = true;
  job.tenant = "local";
  job.session = "s";
  job.common.model = (*rt)->model_id();
  job.common.sampling.temperature = 0;
  job.common.max_tokens = 1;
  job.messages = {{"user", "Hi"}};
  ASSERT_TRUE(PrepareGeneration(**rt, 512, job).ok());
  ASSERT_TRUE(RunGeneration(**rt, job, nullptr, nullptr).ok());
  auto m = (*rt)->engine().GetSession("local", "s");
  ASSERT_TRUE(m.ok()) << m.status();

  // The smallest follow-up the session could need: its reply closed.
  job.messages = {{"user", "Summarize."}};
  const std::vector<int32_t> closed = {
      (*rt)->tokenizer().Encode("<|im_end|>", false, true)[0]};
  ASSERT_TRUE((*rt)->tokenizer().IsEog(closed[0]));
  auto least = ChatTokens(**rt, job, closed, /*estimate=*/false);
  ASSERT_TRUE(least.ok()) << least.status();
  const int64_t context = (*rt)->model().config().context_length;
  job.common.max_tokens =
      context - m->token_count() - static_cast<int64_t>(least->size());
  absl::Status s = PrepareGeneration(**rt, 512, job);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(job.max_tokens, *job.common.max_tokens);
}

}  // namespace
}  // namespace kvd::node
