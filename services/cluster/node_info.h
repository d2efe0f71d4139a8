// What a node publishes about itself in its membership key
// (/kvd/v1/nodes/ID, membership.h), as JSON: where to reach it, which model
// and numerics it serves (a router never places a session on a node that
// could not continue it), its capacity and its current load (for placement),
// and an incarnation id that changes on every start (so a restarted node is
// told from the one peers knew).
//
//   NodeInfo info; info.id = "n1"; ...
//   std::string value = EncodeNodeInfo(info);
//   KVD_ASSIGN_OR_RETURN(NodeInfo back, DecodeNodeInfo(value));
//
// Thread-safety: plain values and free functions.
#ifndef KVD_SERVICES_CLUSTER_NODE_INFO_H_
#define KVD_SERVICES_CLUSTER_NODE_INFO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvd::cluster {

struct NodeLoad {
  int64_t running = 0;  // generations running now
  int64_t queued = 0;   // waiting for a slot
  int64_t hot_sessions = 0;
  int64_t kv_pool_free_bytes = -1;  // -1: unlimited pool
  int64_t dram_tier_bytes = 0;      // residual checkpoints held in DRAM
  int64_t turns_committed = 0;      // since the process started
  // Why the node cannot commit a typical turn now (a full disk, a damaged
  // database file); empty when it can. Such a node gets no new sessions.
  std::string not_writable;
};

struct NodeInfo {
  std::string id;
  std::string incarnation;
  std::string http_url;      // e.g. http://10.0.0.5:8080 ("" = no HTTP)
  std::string grpc_address;  // host:port ("" = no gRPC)
  std::string model_id;      // the name clients ask for (/v1/models)
  std::string model_fingerprint;
  std::string precision;
  uint32_t numerics_version = 0;
  int64_t max_inflight = 0;
  int64_t max_queue = 0;
  NodeLoad load;

  // Queue pressure used for placement: busy slots over capacity.
  double Utilization() const;
};

std::string EncodeNodeInfo(const NodeInfo& info);
// INVALID_ARGUMENT naming what is missing for a value that is not a node's
// description.
absl::StatusOr<NodeInfo> DecodeNodeInfo(const std::string& json);

}  // namespace kvd::cluster

#endif  // KVD_SERVICES_CLUSTER_NODE_INFO_H_
