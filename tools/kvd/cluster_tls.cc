#include "tools/kvd/cluster_tls.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvd::cli {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     const char* flag) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in || text.str().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", flag, " ", path));
  }
  return text.str();
}

}  // namespace

absl::StatusOr<ClusterTls> LoadClusterTls(
    const std::string& ca_path, const std::string& cert_path,
    const std::string& key_path,
    std::optional<node::PeerIdentity::Role> wanted_role,
    const std::string& id) {
  ClusterTls tls;
  if (cert_path.empty() != key_path.empty()) {
    return absl::InvalidArgumentError(
        "give both --tls-cert and --tls-key, or neither");
  }
  if (!ca_path.empty()) {
    KVD_ASSIGN_OR_RETURN(tls.ca_pem, ReadFile(ca_path, "--ca-cert"));
  }
  if (cert_path.empty()) return tls;
  KVD_ASSIGN_OR_RETURN(tls.cert_pem, ReadFile(cert_path, "--tls-cert"));
  KVD_ASSIGN_OR_RETURN(tls.key_pem, ReadFile(key_path, "--tls-key"));
  if (!wanted_role.has_value()) return tls;
  const node::PeerIdentity::Role role = *wanted_role;
  const std::string wanted = node::CommonNameFor(role, id.empty() ? "ID" : id);
  absl::StatusOr<std::string> name = node::CertificateCommonName(tls.cert_pem);
  if (!name.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-cert ", cert_path, ": ", name.status().message()));
  }
  absl::StatusOr<node::PeerIdentity> named =
      node::IdentityFromCommonName(*name);
  if (!named.ok()) {
    std::fprintf(
        stderr,
        "kvd: warning: --tls-cert %s names no cluster identity (common name "
        "'%s'), so peers are trusted by the router token alone; for mutual "
        "TLS issue one naming this process ('%s'): "
        "tools/cluster/make_certs.sh DIR --%s %s\n",
        cert_path.c_str(), name->c_str(), wanted.c_str(),
        role == node::PeerIdentity::Role::kNode ? "node" : "router",
        id.empty() ? "ID" : id.c_str());
    return tls;
  }
  if (named->role != role || (!id.empty() && named->id != id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-cert ", cert_path, " names ", node::Describe(*named),
        ", not this process ('", wanted,
        "'); issue its own: tools/cluster/make_certs.sh DIR --",
        role == node::PeerIdentity::Role::kNode ? "node" : "router", " ",
        id.empty() ? "ID" : id));
  }
  if (tls.ca_pem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-cert ", cert_path, " names ", node::Describe(*named),
        " (mutual TLS), which needs --ca-cert, the cluster CA its peers' "
        "certificates are verified with"));
  }
  tls.mutual = true;
  return tls;
}

}  // namespace kvd::cli
