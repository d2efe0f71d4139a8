// A node's part in a cluster (DESIGN.md section 7), for `kvd serve
// --cluster`: it registers the node under a lease in etcd with what routers
// place sessions by (node_info.h: addresses, model, numerics, capacity,
// load), and it fences the engine (engine::SessionFence) by the session
// directory and that lease:
//   - a turn is served only for a session the directory gives this node,
//     at the directory's epoch (a new session is placed by a router first);
//   - right before each commit the lease must still be live by the node's
//     own clock and the directory must still name this node at that epoch,
//     so a node paused past its lease, or whose session moved meanwhile,
//     commits nothing (self-fencing).
//
//   KVD_ASSIGN_OR_RETURN(auto member, ClusterMember::Connect(options));
//   node_options.engine.fence = member->fence();
//   ... open the runtime and the front ends ...
//   KVD_RETURN_IF_ERROR(member->Join(runtime.get(), admission.get(), url, ""));
//   ... serve; destroying the member leaves the cluster at once.
//
// Thread-safety: fence() is thread-safe; Join once, from one thread.
#ifndef KVD_SERVICES_NODE_CLUSTER_MEMBER_H_
#define KVD_SERVICES_NODE_CLUSTER_MEMBER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/cluster/directory.h"
#include "services/cluster/etcd_client.h"
#include "services/cluster/membership.h"
#include "services/engine/session_fence.h"
#include "services/node/admission.h"
#include "services/node/runtime.h"

namespace kvd::node {

struct ClusterMemberOptions {
  std::string etcd_endpoint;  // host:port (an http:// prefix is dropped)
  // etcd over TLS (an https:// endpoint): its CA, and this node's
  // certificate and key, which etcd's authentication takes as the user
  // named in it (EtcdClientOptions).
  std::string etcd_ca_pem;
  std::string etcd_cert_pem;
  std::string etcd_key_pem;
  std::string node_id;
  absl::Duration lease_ttl = absl::Seconds(15);
  int64_t max_inflight = 0;
  int64_t max_queue = 0;
};

class ClusterMember {
 public:
  // Connects to etcd (UNAVAILABLE naming it if it does not answer).
  static absl::StatusOr<std::unique_ptr<ClusterMember>> Connect(
      ClusterMemberOptions options);
  ~ClusterMember();

  // For NodeOptions::engine.fence. Until Join, every turn is UNAVAILABLE.
  std::shared_ptr<engine::SessionFence> fence() const;

  // Registers the node (ALREADY_EXISTS if a live node holds its id); its
  // description is rewritten at every keep-alive with the current load.
  // `http_url`: where routers reach this node's HTTP API (e.g.
  // http://10.0.0.5:8080); `grpc_address`: its gRPC API, "" = none.
  absl::Status Join(NodeRuntime* runtime, const Admission* admission,
                    const std::string& http_url,
                    const std::string& grpc_address);

  // Registered with a live lease (for /readyz and logs).
  bool LeaseLive() const;
  // The cluster's etcd and session directory, for what else the node does
  // in the cluster (moving sessions: services/migration).
  cluster::EtcdClient* etcd() const { return etcd_.get(); }
  cluster::SessionDirectory* directory() const { return directory_.get(); }
  const std::string& incarnation() const;

 private:
  class DirectoryFence;
  ClusterMember() = default;

  ClusterMemberOptions options_;
  std::unique_ptr<cluster::EtcdClient> etcd_;
  std::unique_ptr<cluster::SessionDirectory> directory_;
  std::shared_ptr<DirectoryFence> fence_;
  std::unique_ptr<cluster::NodeRegistration> registration_;
};

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_CLUSTER_MEMBER_H_
