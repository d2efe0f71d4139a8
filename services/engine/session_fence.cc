#include "services/engine/session_fence.h"

#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/types/optional.h"

namespace kvd::engine {

absl::Status MarkNotRun(absl::Status status, absl::string_view reason) {
  status.SetPayload(kNotRunPayload, absl::Cord(reason));
  return status;
}

std::string NotRunReason(const absl::Status& status) {
  absl::optional<absl::Cord> reason = status.GetPayload(kNotRunPayload);
  return reason.has_value() ? std::string(*reason) : std::string();
}

}  // namespace kvd::engine
