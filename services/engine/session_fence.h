// A cluster's say over which sessions a node may serve and commit (DESIGN.md
// section 7: ownership is a fencing token). The engine asks it before every
// turn and again right before the turn's commit; a standalone node has
// none. The node implements it over etcd and its lease
// (services/node/cluster_member.cc); the engine sees only this interface.
//
// Thread-safety: implementations must allow concurrent calls.
#ifndef KVD_SERVICES_ENGINE_SESSION_FENCE_H_
#define KVD_SERVICES_ENGINE_SESSION_FENCE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvd::engine {

class SessionFence {
 public:
  virtual ~SessionFence() = default;

  // Before a turn or a create: the epoch at which the cluster gives this
  // node the session. NOT_FOUND: the cluster has no such session (a router
  // places new ones); ABORTED: another node owns it (the message names it);
  // UNAVAILABLE: this node may not commit now (its lease lapsed, or the
  // directory cannot be read).
  virtual absl::StatusOr<uint64_t> OwnedEpoch(const std::string& tenant,
                                              const std::string& session) = 0;

  // Right before a commit under `epoch`: OK only if the node still owns the
  // session at exactly that epoch and its lease is live. Anything else
  // fails the turn and nothing is written.
  virtual absl::Status MayCommit(const std::string& tenant,
                                 const std::string& session,
                                 uint64_t epoch) = 0;

  // Why no turn can commit now, whatever its session (e.g. the lease
  // lapsed); OK when turns may. Readiness (/readyz, gRPC health) reports it.
  virtual absl::Status Ready() { return absl::OkStatus(); }

  // Whether the cluster says the session has committed turns somewhere (its
  // directory entry lists replicas, which exist only once a turn did). A
  // node that holds no copy of such a session lost it (a data directory
  // wiped or replaced) and must not start it again empty.
  virtual absl::StatusOr<bool> HasCommitsElsewhere(const std::string& tenant,
                                                   const std::string& session) {
    return false;
  }
};

// A refused turn that ran nothing and may be sent again, to wherever the
// directory says the session lives then: the session is being moved
// ("moving": wait a moment) or lives on another node ("moved"). Servers
// pass the reason on (HTTP header X-Kvd-Retry, gRPC trailer kvd-retry) so a
// router can resend the turn instead of failing the client.
inline constexpr char kNotRunPayload[] = "type.kvd.dev/not-run";
absl::Status MarkNotRun(absl::Status status, absl::string_view reason);
// "moving", "moved", or "" when `status` is not such a refusal.
std::string NotRunReason(const absl::Status& status);

}  // namespace kvd::engine

#endif  // KVD_SERVICES_ENGINE_SESSION_FENCE_H_
