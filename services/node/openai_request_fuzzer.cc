// libFuzzer target: the OpenAI request parsers must return a status (never
// crash, hang, leak or trip a sanitizer) on any bytes, and whatever they
// accept must satisfy the documented bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "services/node/openai_request.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckCommon(const kvd::node::OpenAiCommon& c,
                 const kvd::node::RequestLimits& limits) {
  Check(c.sampling.temperature >= 0 && c.sampling.temperature <= 2);
  Check(c.sampling.top_p > 0 && c.sampling.top_p <= 1);
  Check(c.stop.size() <= static_cast<size_t>(limits.max_stop));
  for (const std::string& s : c.stop) {
    Check(!s.empty() && s.size() <= limits.max_stop_bytes);
  }
  Check(c.top_logprobs >= 0 && c.top_logprobs <= limits.max_top_logprobs);
  if (c.max_tokens.has_value()) {
    Check(*c.max_tokens >= 1 && *c.max_tokens <= limits.max_tokens_bound);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvd::node::RequestLimits limits;
  limits.max_body_bytes = 64 << 10;
  const std::string body(reinterpret_cast<const char*>(data), size);
  auto chat = kvd::node::ParseChatRequest(body, "", limits);
  if (chat.ok()) {
    CheckCommon(chat->common, limits);
    Check(!chat->messages.empty());
    Check(chat->messages.size() <= static_cast<size_t>(limits.max_messages));
    Check(chat->messages.back().role == "user");
  } else {
    (void)kvd::node::ApiErrorJson(kvd::node::ApiErrorFromStatus(chat.status()));
  }
  auto completion = kvd::node::ParseCompletionRequest(body, limits);
  if (completion.ok()) CheckCommon(completion->common, limits);
  return 0;
}
