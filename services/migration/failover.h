// Failover (DESIGN.md section 7): when a session's owner is no longer a live
// member (its lease expired: killed, partitioned, paused), the most
// up-to-date live replica becomes the owner, by a directory transaction at
// epoch + 1; its next turn adopts its copy and rebuilds K/V from it. No
// consensus of kvd's own: one controller at a time, elected through an etcd
// key under its own lease (/kvd/v1/controller), and every promotion is a
// transaction on the entry's revision, so even two controllers could not
// both promote.
//
// Safe because a replica set holds every acknowledged turn (replicator.h,
// sync mode), and because the old owner cannot commit once its lease lapsed
// (its own clock fences it) nor after the move (the directory check at
// every commit); when it comes back its copy is refused (older epoch).
//
// Every node runs one; only the elected one acts.
//
//   FailoverController f(&etcd, &directory, status_of, {.node_id = "n1"});
//   f.Start();
//
// Thread-safety: Start once; stats() from any thread.
#ifndef KVD_SERVICES_MIGRATION_FAILOVER_H_
#define KVD_SERVICES_MIGRATION_FAILOVER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proto/kvd/v1/migration.pb.h"
#include "services/cluster/directory.h"
#include "services/cluster/etcd_client.h"

namespace kvd::migration {

inline constexpr char kControllerKey[] = "/kvd/v1/controller";

// A replica node's copy of a session (kvd.v1.Migration/ReplicaStatus).
using ReplicaStatusFn = std::function<absl::StatusOr<v1::ReplicaStatusResponse>(
    const std::string& node, const std::string& tenant,
    const std::string& session)>;

// The replica of `entry` to promote: among those `live` says are live, the
// one whose copy (asked through `status_of`) is of the entry's owner and
// epoch and holds the most turns; "" if none. `turns` gets its turn count.
// Failover and a node handing over sessions it lost its copy of both use it.
std::string FreshestReplica(const cluster::DirectoryEntry& entry,
                            const std::string& tenant,
                            const std::string& session,
                            const std::function<bool(const std::string&)>& live,
                            const ReplicaStatusFn& status_of, int64_t* turns);

struct FailoverOptions {
  std::string node_id;
  absl::Duration poll = absl::Seconds(1);
  absl::Duration lease_ttl = absl::Seconds(5);  // the controller's
};

struct FailoverStats {
  bool leader = false;
  int64_t promoted = 0;         // sessions moved to a replica
  int64_t without_replica = 0;  // down owners with no live replica (passes)
};

class FailoverController {
 public:
  FailoverController(cluster::EtcdClient* etcd,
                     cluster::SessionDirectory* directory,
                     ReplicaStatusFn status_of, FailoverOptions options);
  ~FailoverController();

  void Start();
  // One pass if this node is the controller: the sessions promoted.
  absl::StatusOr<int> Pass();
  FailoverStats stats() const;

 private:
  absl::StatusOr<bool> Lead();

  cluster::EtcdClient* const etcd_;
  cluster::SessionDirectory* const directory_;
  const ReplicaStatusFn status_of_;
  const FailoverOptions options_;
  int64_t lease_ = 0;
  absl::Notification stop_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  FailoverStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvd::migration

#endif  // KVD_SERVICES_MIGRATION_FAILOVER_H_
