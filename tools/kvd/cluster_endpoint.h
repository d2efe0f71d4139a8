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
// The file up.sh writes the endpoint to: its first line; for an etcd over
// TLS, the next three the paths of the CA, a client certificate (its root
// user's) and its key.
std::string RecordedEtcdPath();

struct EtcdTlsFiles {
  std::string ca, cert, key;  // paths; "" = none
};
// The TLS files recorded with `endpoint`, when it is the one up.sh recorded
// (none otherwise).
EtcdTlsFiles RecordedEtcdTls(const std::string& endpoint);

}  // namespace kvd::cli

#endif  // KVD_TOOLS_KVD_CLUSTER_ENDPOINT_H_
