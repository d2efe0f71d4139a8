// Conversions between kvd.v1 Sessions messages (proto/kvd/v1/sessions.proto)
// and the engine's types, with the request checks the gRPC service makes
// before any work starts. Separate from the server so each check is
// unit-testable without a socket.
//
//   KVD_ASSIGN_OR_RETURN(engine::GenerateRequest g,
//                        GenerateRequestFromProto(req.sampling(), context));
//   KVD_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
//                        TurnTokens(req, tokenizer, tmpl, session_tokens));
//
// Thread-safety: free functions without shared state.
#ifndef KVD_SERVICES_NODE_GRPC_CONVERT_H_
#define KVD_SERVICES_NODE_GRPC_CONVERT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "ops/chat/chat_template.h"
#include "ops/tokenizer/tokenizer.h"
#include "proto/kvd/v1/checkpoint.pb.h"
#include "proto/kvd/v1/sessions.pb.h"
#include "services/engine/generator.h"

namespace kvd::node {

// Bounds on request fields (sessions.proto documents them to clients); those
// the HTTP API shares are its bounds (openai_request.h), so a request means
// the same on both front ends.
inline constexpr int64_t kDefaultMaxTokens = 256;
inline constexpr float kMaxTemperature = 2;  // as OpenAI's API
inline constexpr int kMaxStopStrings = 4;
inline constexpr size_t kMaxStopBytes = 256;
inline constexpr int kMaxLabels = 64;
inline constexpr size_t kMaxLabelKeyBytes = 128;
inline constexpr size_t kMaxLabelValueBytes = 1024;
inline constexpr int kDefaultPageSize = 100;
inline constexpr int kMaxPageSize = 1000;
inline constexpr int kMaxMessages = 256;
inline constexpr int kMaxTopLogprobs = 20;  // as OpenAI's API

// absl and gRPC share the canonical code numbering.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The generation parameters of a request: sampling, max_tokens (default
// kDefaultMaxTokens capped at `context_length`), stop strings. INVALID_ARGUMENT
// naming the field and its bound for a temperature outside [0, 2], top_p
// outside (0, 1], negative top_k, max_tokens < 1 or > context_length, more than
// kMaxStopStrings stops or an empty/oversized one, top_logprobs outside
// 0..kMaxTopLogprobs or without logprobs.
absl::StatusOr<engine::GenerateRequest> GenerateRequestFromProto(
    const v1::SamplingParams& sampling, int64_t context_length);

// INVALID_ARGUMENT unless there are at most kMaxLabels labels with keys of
// 1..kMaxLabelKeyBytes and values of at most kMaxLabelValueBytes.
absl::Status ValidateLabels(
    const google::protobuf::Map<std::string, std::string>& labels);

// The page size ListSessions uses: 0 -> kDefaultPageSize; INVALID_ARGUMENT
// outside 1..kMaxPageSize.
absl::StatusOr<int> PageSize(int32_t requested);

// INVALID_ARGUMENT unless exactly one of messages/prompt is given (and at
// most kMaxMessages messages); FAILED_PRECONDITION for messages when the
// model has no chat template.
absl::Status ValidateInput(const v1::GenerateRequest& request,
                           const std::optional<ops::ChatTemplate>& tmpl);

// The tokens a request appends to a session holding `session_tokens` (empty
// for a new session or a stateless request), as `kvd chat` builds them: a
// first turn renders every message with the generation prompt and encodes
// with the tokenizer's special tokens; a later turn takes exactly one message
// and renders it as a follow-up (closing the previous reply unless the model
// already emitted its end-of-generation token). A raw prompt is encoded as
// text (special tokens only at the start of a session).
absl::StatusOr<std::vector<int32_t>> TurnTokens(
    const v1::GenerateRequest& request, const ops::Tokenizer& tokenizer,
    const std::optional<ops::ChatTemplate>& tmpl,
    absl::Span<const int32_t> session_tokens);

// Appends one TokenLogprobs per entry of `logprobs` (token bytes from the
// tokenizer).
void SetLogprobs(const ops::Tokenizer& tokenizer,
                 absl::Span<const ops::LogProbs> logprobs,
                 google::protobuf::RepeatedPtrField<v1::TokenLogprobs>* out);

// `text` with every invalid UTF-8 byte replaced by U+FFFD: proto string
// fields must be UTF-8, and a model may emit byte tokens that are not.
std::string ValidUtf8(std::string_view text);

// The client's view of a committed manifest.
v1::Session SessionFromManifest(const v1::SessionManifest& manifest);

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_GRPC_CONVERT_H_
