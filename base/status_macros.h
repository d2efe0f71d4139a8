// Status propagation macros. Abseil 20220623 (Debian's) ships none, so kvd
// defines them once.
//
//   absl::StatusOr<Model> Load(const std::string& path) {
//     KVD_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(path));
//     KVD_RETURN_IF_ERROR(file.Validate());
//     ...
//   }
#ifndef KVD_BASE_STATUS_MACROS_H_
#define KVD_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVD_STATUS_CONCAT_INNER(a, b) a##b
#define KVD_STATUS_CONCAT(a, b) KVD_STATUS_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define KVD_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::absl::Status kvd_status_ = (expr);       \
    if (!kvd_status_.ok()) return kvd_status_; \
  } while (0)

// Evaluates `rexpr` (a StatusOr); on error returns its status, else moves the
// value into `lhs`.
#define KVD_ASSIGN_OR_RETURN(lhs, rexpr)                                     \
  KVD_ASSIGN_OR_RETURN_IMPL(KVD_STATUS_CONCAT(kvd_statusor_, __LINE__), lhs, \
                            rexpr)

#define KVD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                              \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

#endif  // KVD_BASE_STATUS_MACROS_H_
