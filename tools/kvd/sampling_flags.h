// The sampling and length flags every generating kvd command shares
// (--max-tokens, --temperature, --top-k, --top-p, --min-p, --repeat-penalty,
// --seed, --stop, --ignore-eos), and their conversion to a GenerateRequest.
#ifndef KVD_TOOLS_KVD_SAMPLING_FLAGS_H_
#define KVD_TOOLS_KVD_SAMPLING_FLAGS_H_

#include "absl/status/statusor.h"
#include "services/engine/generator.h"
#include "tools/kvd/args.h"

namespace kvd::cli {

void DeclareSamplingFlags(Args& args);

// A request with max_tokens, sampling, stop strings and ignore_eos set from
// the flags (validated); its prompt is empty.
absl::StatusOr<engine::GenerateRequest> SamplingFromFlags(const Args& args);

}  // namespace kvd::cli

#endif  // KVD_TOOLS_KVD_SAMPLING_FLAGS_H_
