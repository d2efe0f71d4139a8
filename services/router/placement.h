// Where a router puts a new session or a stateless request (DESIGN.md
// section 7): among the live nodes that serve the requested model and are
// not draining, two picked at random, and of those the less loaded ("power
// of two choices": close to least-loaded placement, without every router
// herding onto the same node between two load reports).
//
// A node's load is what it last reported (running + queued over its
// capacity) plus what this router has added since that report: its own
// requests in flight there, and a small weight per session it placed there
// (the report has not counted them yet). That is soft state a router may
// lose at any time; where a session lives is only ever read from the
// directory.
//
//   Placement p;
//   KVD_ASSIGN_OR_RETURN(std::string node, p.Pick(nodes, "smollm2", drained));
//
// Thread-safety: all methods may be called concurrently.
#ifndef KVD_SERVICES_ROUTER_PLACEMENT_H_
#define KVD_SERVICES_ROUTER_PLACEMENT_H_

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/cluster/node_info.h"

namespace kvd::router {

class Placement {
 public:
  explicit Placement(uint64_t seed = std::random_device{}()) : rng_(seed) {}

  // A node for `model`. `commits`: the request will commit turns (a new
  // session), so nodes that report they cannot (NodeLoad::not_writable: a
  // full disk) are left out. NOT_FOUND naming the served models when no
  // live node serves it; UNAVAILABLE when all that do are draining or, for
  // `commits`, cannot commit (with one node's reason).
  absl::StatusOr<std::string> Pick(const std::vector<cluster::NodeInfo>& nodes,
                                   const std::string& model,
                                   const std::set<std::string>& drained,
                                   bool commits = true);

  // This router's own traffic to `node`, counted in its load.
  void Placed(const std::string& node);
  void Started(const std::string& node);
  void Finished(const std::string& node);
  // A node's new load report (its incarnation and turns count changed)
  // already counts what this router placed there before it.
  void Reported(const std::string& node, int64_t report_id);

 private:
  double Score(const cluster::NodeInfo& n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> inflight_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> placed_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> report_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvd::router

#endif  // KVD_SERVICES_ROUTER_PLACEMENT_H_
