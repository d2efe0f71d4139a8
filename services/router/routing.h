// Where a router sends a request (DESIGN.md section 7), shared by its HTTP
// and gRPC front ends: the session's owner from the etcd directory, or, for
// a new session or a stateless request, a node chosen by placement.h among
// the live nodes (followed by an etcd watch) that serve the model and are
// not draining. Nothing about a session is kept here: the directory is read
// on every call.
//
//   KVD_ASSIGN_OR_RETURN(auto routing, Routing::Connect("127.0.0.1:2379"));
//   KVD_ASSIGN_OR_RETURN(Target t, routing->Place("acme", "c1", "smollm2"));
//
// Thread-safety: all methods may be called concurrently.
#ifndef KVD_SERVICES_ROUTER_ROUTING_H_
#define KVD_SERVICES_ROUTER_ROUTING_H_

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "services/cluster/directory.h"
#include "services/cluster/etcd_client.h"
#include "services/cluster/node_info.h"
#include "services/cluster/prefix_watch.h"
#include "services/node/metrics.h"
#include "services/router/placement.h"
#include "services/router/rate_limit.h"

namespace kvd::router {

// Where a request goes, and why (for metrics and logs).
struct Target {
  cluster::NodeInfo node;
  std::string route;  // "owner", "placed", "stateless"
};

class Routing {
 public:
  // Connects to etcd and loads membership (UNAVAILABLE if etcd does not
  // answer).
  static absl::StatusOr<std::unique_ptr<Routing>> Connect(
      const std::string& etcd_endpoint);
  // The same over TLS (EtcdClientOptions' CA, certificate and key).
  static absl::StatusOr<std::unique_ptr<Routing>> Connect(
      const cluster::EtcdClientOptions& etcd);

  // The session's owner. NOT_FOUND if the directory lacks it; UNAVAILABLE
  // (retry later) if its owner is not live; INVALID_ARGUMENT if `model` is
  // given and the owner serves another. `entry` (may be null) gets the
  // directory entry read.
  absl::StatusOr<Target> Owner(const std::string& tenant,
                               const std::string& session,
                               const std::string& model,
                               cluster::DirectoryEntry* entry);
  // The owner, placing the session first (a directory transaction) if the
  // directory lacks it; RESOURCE_EXHAUSTED if that would take the tenant
  // over its limit of new sessions (LimitCreations).
  absl::StatusOr<Target> Place(const std::string& tenant,
                               const std::string& session,
                               const std::string& model);
  // A node for a stateless request, not one of `skip`.
  absl::StatusOr<Target> Stateless(const std::string& model,
                                   const std::set<std::string>& skip);

  // At most `per_minute` new sessions a minute per tenant, `burst` at once
  // (<= 0: no limit). Call before serving.
  void LimitCreations(double per_minute, double burst) {
    creations_ = std::make_unique<TenantRateLimiter>(per_minute, burst);
  }
  // At most `per_minute` migrations a minute per tenant, `burst` at once
  // (<= 0: no limit), whichever front end (HTTP, gRPC) asks for them. Call
  // before serving.
  void LimitMigrations(double per_minute, double burst) {
    migrations_ = std::make_unique<TenantRateLimiter>(per_minute, burst);
  }
  // Counts one migration of `tenant`: RESOURCE_EXHAUSTED (with when to
  // retry, rate_limit.h) past its limit, counting nothing.
  absl::Status TakeMigration(const std::string& tenant);

  std::vector<cluster::NodeInfo> LiveNodes();
  std::set<std::string> Drained();
  cluster::SessionDirectory& directory() { return *directory_; }
  Placement& placement() { return placement_; }
  node::Metrics& metrics() { return metrics_; }
  // Membership's watch: up to date, and how often it reloaded.
  bool synced() const { return nodes_->synced(); }
  int64_t resyncs() const { return nodes_->resyncs(); }

 private:
  Routing();

  std::unique_ptr<cluster::EtcdClient> etcd_;
  std::unique_ptr<cluster::SessionDirectory> directory_;
  std::unique_ptr<cluster::PrefixWatch> nodes_, drains_;
  Placement placement_;
  node::Metrics metrics_;
  std::unique_ptr<TenantRateLimiter> creations_ =
      std::make_unique<TenantRateLimiter>(0, 1);
  std::unique_ptr<TenantRateLimiter> migrations_ =
      std::make_unique<TenantRateLimiter>(0, 1);
};

}  // namespace kvd::router

#endif  // KVD_SERVICES_ROUTER_ROUTING_H_
