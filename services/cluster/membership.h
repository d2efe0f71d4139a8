// A node's membership in the cluster: its key /kvd/v1/nodes/ID in etcd,
// held under a lease that a background thread keeps alive (every TTL/3) and
// rewrites with the node's current description (addresses, model, load).
// Peers see a node only while its lease lives. A node that loses its lease
// (etcd unreachable past the TTL, the process paused) is told at once
// (`on_lost`): it must stop committing turns until it is registered again
// and has re-validated what it owns (self-fencing), which `registered()`
// reports. Two live processes cannot hold one node id: the second is
// refused.
//
//   NodeRegistration::Options o;
//   o.node_id = "n1";
//   o.describe = [&] { return node_info_json; };
//   KVD_ASSIGN_OR_RETURN(auto reg, NodeRegistration::Start(etcd.get(), o));
//   ...                 // destroying it leaves the cluster (revokes the lease)
//
// Thread-safety: registered(), lease() and incarnation() from any thread;
// the callbacks run on the registration's thread.
#ifndef KVD_SERVICES_CLUSTER_MEMBERSHIP_H_
#define KVD_SERVICES_CLUSTER_MEMBERSHIP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/cluster/etcd_client.h"

namespace kvd::cluster {

inline constexpr char kNodesPrefix[] = "/kvd/v1/nodes/";
// /kvd/v1/drain/ID: the node takes no new sessions (kvd cluster drain).
inline constexpr char kDrainPrefix[] = "/kvd/v1/drain/";

class NodeRegistration {
 public:
  struct Options {
    std::string node_id;
    absl::Duration ttl = absl::Seconds(15);
    // The node key's value, read at every keep-alive (load changes).
    std::function<std::string()> describe;
    // The lease was lost: stop committing until registered() again.
    std::function<void()> on_lost;
    // This start's id (NewIncarnation()); empty: a new one.
    std::string incarnation;
  };

  // Registers the node (ALREADY_EXISTS if a live node holds the id) and
  // starts keeping it alive.
  static absl::StatusOr<std::unique_ptr<NodeRegistration>> Start(
      EtcdClient* etcd, Options options);
  // Leaves the cluster: stops the thread and revokes the lease, so peers
  // see the node gone at once instead of after the TTL.
  ~NodeRegistration();

  bool registered() const { return registered_.load(); }
  // Registered, and the lease cannot have ended yet by this process's own
  // monotonic clock: the last successful keep-alive plus the TTL etcd
  // granted then, less a tenth of the TTL, is still ahead. A process paused
  // past its TTL (SIGSTOP, a long GC-like stall) sees false the moment it runs
  // again, before any thread has talked to etcd: what a commit checks
  // (self-fencing).
  bool LeaseLive() const;
  int64_t lease() const { return lease_.load(); }
  // Changes on every start of the process: peers tell a restarted node
  // from the one they knew.
  const std::string& incarnation() const { return incarnation_; }

 private:
  NodeRegistration(EtcdClient* etcd, Options options);
  absl::Status Register();
  void Loop();
  // When the lease may have ended, by the monotonic clock: asked + granted,
  // less a margin.
  int64_t LiveUntil(int64_t asked_ns, absl::Duration granted) const;

  EtcdClient* const etcd_;
  const Options options_;
  const std::string key_;
  const std::string incarnation_;
  std::atomic<bool> registered_{false};
  std::atomic<int64_t> lease_{0};
  std::atomic<int64_t> live_until_ns_{0};  // steady_clock nanoseconds
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// A random id for one start of a process (16 hex digits).
std::string NewIncarnation();

// The live nodes: (node id, its description), in id order.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ListNodes(
    EtcdClient* etcd);

}  // namespace kvd::cluster

#endif  // KVD_SERVICES_CLUSTER_MEMBERSHIP_H_
