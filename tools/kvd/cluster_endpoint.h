// Where the cluster's etcd is, for `kvd router` and `kvd cluster`: --etcd,
// else $KVD_ETCD, else what tools/cluster/up.sh recorded in
// ~/.config/kvd/cluster-etcd, else etcd's default 127.0.0.1:2379. So after
// up.sh, `kvd cluster status` finds that cluster with no flags.
#ifndef KVD_TOOLS_KVD_CLUSTER_ENDPOINT_H_
#define KVD_TOOLS_KVD_CLUSTER_ENDPOINT_H_

#include <string>

#include "absl/status/statusor.h"
#include "tools/kvd/args.h"

namespace kvd::cli {

void DeclareEtcdFlag(Args& args);
absl::StatusOr<std::string> EtcdEndpoint(const Args& args);
// The file up.sh writes the endpoint to.
std::string RecordedEtcdPath();

}  // namespace kvd::cli

#endif  // KVD_TOOLS_KVD_CLUSTER_ENDPOINT_H_
