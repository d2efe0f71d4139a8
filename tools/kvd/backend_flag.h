// The --backend flag of the commands that load a model (generate, chat,
// serve): auto (default), cpu or cuda; the rule is ops/backend/backend.h.
//
//   DeclareBackendFlag(args);
//   ...
//   KVD_RETURN_IF_ERROR(ApplyBackendFlag(args, "smollm2"));
#ifndef KVD_TOOLS_KVD_BACKEND_FLAG_H_
#define KVD_TOOLS_KVD_BACKEND_FLAG_H_

#include <string>

#include "absl/status/status.h"
#include "tools/kvd/args.h"

namespace kvd::cli {

void DeclareBackendFlag(Args& args);

// Applies --backend for `model`: prints the one-line notice (e.g. "kvd: no
// CUDA device (...); using the CPU backend") to stderr; FAILED_PRECONDITION
// for --backend cuda when CUDA cannot serve the model.
absl::Status ApplyBackendFlag(const Args& args, const std::string& model);

}  // namespace kvd::cli

#endif  // KVD_TOOLS_KVD_BACKEND_FLAG_H_
