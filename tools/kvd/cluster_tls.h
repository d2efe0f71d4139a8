// The TLS a cluster process starts with, from its flags: the cluster CA, its
// own certificate and key, and whether that certificate names it, in which
// case the cluster runs mutual TLS (peer_identity.h): a node requires the
// certificate of a router or a node with the router token and a node's for
// kvd.v1.Migration, and presents its own to the peers it calls; a router
// presents its own to the nodes.
//
//   KVD_ASSIGN_OR_RETURN(ClusterTls tls,
//       LoadClusterTls(ca, cert, key, node::PeerIdentity::Role::kNode, "n1"));
//   if (tls.mutual) ...
//
// Thread-safety: a free function.
#ifndef KVD_TOOLS_KVD_CLUSTER_TLS_H_
#define KVD_TOOLS_KVD_CLUSTER_TLS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "services/node/peer_identity.h"

namespace kvd::cli {

struct ClusterTls {
  std::string ca_pem;    // "" = no CA given
  std::string cert_pem;  // this process's certificate ("" = none)
  std::string key_pem;
  // The certificate names this process (`role`:`id`): mutual TLS.
  bool mutual = false;
};

// Reads the files given ("" = not given). INVALID_ARGUMENT for a file that
// cannot be read, a certificate without its key (or the reverse), and a
// certificate naming another process than `role` `id` (an empty `id`: any
// of that role; no `role`: the files are only read, for a tool whose
// certificate etcd judges, such as `kvd cluster`). A certificate that names no
// identity at all (the one certificate every node shared before identities were
// issued) is TLS without mutual authentication, with a warning on stderr saying
// how to issue identities.
absl::StatusOr<ClusterTls> LoadClusterTls(
    const std::string& ca_path, const std::string& cert_path,
    const std::string& key_path, std::optional<node::PeerIdentity::Role> role,
    const std::string& id);

}  // namespace kvd::cli

#endif  // KVD_TOOLS_KVD_CLUSTER_TLS_H_
