// Where `kvd` finds models: a path, or the name of a model that
// tools/fetch_models.sh caches.
#ifndef KVD_TOOLS_KVD_MODEL_SOURCE_H_
#define KVD_TOOLS_KVD_MODEL_SOURCE_H_

#include <string>

#include "absl/status/statusor.h"

namespace kvd::cli {

// Resolves "smollm2", "gemma3" or a file path to an existing GGUF file;
// NOT_FOUND says how to fetch the model.
absl::StatusOr<std::string> ResolveModel(const std::string& name_or_path);

}  // namespace kvd::cli

#endif  // KVD_TOOLS_KVD_MODEL_SOURCE_H_
