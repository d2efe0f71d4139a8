// `kvd cluster status | drain NODE | undrain NODE`: a cluster's state as its
// etcd holds it (docs/CLUSTER.md).
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "services/cluster/directory.h"
#include "services/cluster/etcd_client.h"
#include "services/cluster/membership.h"
#include "services/cluster/node_info.h"
#include "tools/kvd/args.h"
#include "tools/kvd/cluster_endpoint.h"
#include "tools/kvd/cluster_tls.h"
#include "tools/kvd/commands.h"

namespace kvd::cli {
namespace {

absl::StatusOr<std::unique_ptr<cluster::EtcdClient>> Connect(const Args& a) {
  KVD_ASSIGN_OR_RETURN(std::string endpoint, EtcdEndpoint(a));
  // etcd over TLS: the cluster CA and a certificate naming an etcd user
  // (any role: what the certificate names is etcd's to judge).
  EtcdTlsFiles files{a.Get("ca-cert"), a.Get("tls-cert"), a.Get("tls-key")};
  if (files.ca.empty()) files = RecordedEtcdTls(endpoint);  // up.sh's
  KVD_ASSIGN_OR_RETURN(
      ClusterTls tls,
      LoadClusterTls(files.ca, files.cert, files.key, std::nullopt, ""));
  absl::StatusOr<std::unique_ptr<cluster::EtcdClient>> etcd =
      cluster::EtcdClient::Connect({.endpoint = endpoint,
                                    .ca_pem = tls.ca_pem,
                                    .cert_pem = tls.cert_pem,
                                    .key_pem = tls.key_pem});
  if (!etcd.ok()) {
    return absl::UnavailableError(absl::StrCat(
        etcd.status().message(),
        ". Start a cluster (tools/cluster/up.sh) or name its etcd with "
        "--etcd"));
  }
  return etcd;
}

std::string Bytes(int64_t b) {
  if (b < 0) return "unlimited";
  if (b >= int64_t{1} << 30)
    return absl::StrFormat("%.1f GiB", b / 1073741824.0);
  return absl::StrFormat("%.1f MiB", b / 1048576.0);
}

absl::Status Status(const Args& a) {
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<cluster::EtcdClient> etcd, Connect(a));
  int64_t revision = 0;
  KVD_ASSIGN_OR_RETURN(std::vector<cluster::EtcdKeyValue> nodes,
                       etcd->GetPrefix(cluster::kNodesPrefix, &revision));
  KVD_ASSIGN_OR_RETURN(std::vector<cluster::EtcdKeyValue> drains,
                       etcd->GetPrefix(cluster::kDrainPrefix));
  KVD_ASSIGN_OR_RETURN(std::vector<cluster::EtcdKeyValue> sessions,
                       etcd->GetPrefix(cluster::kSessionsPrefix));
  std::set<std::string> drained;
  for (const auto& kv : drains) {
    drained.insert(kv.key.substr(sizeof(cluster::kDrainPrefix) - 1));
  }
  std::map<std::string, int64_t> per_owner;
  for (const auto& kv : sessions) {
    absl::StatusOr<cluster::DirectoryEntry> e =
        cluster::DecodeDirectoryEntry(kv);
    if (e.ok()) per_owner[e->owner]++;
  }
  std::printf("etcd %s  revision %lld  %zu sessions in the directory\n\n",
              etcd->endpoint().c_str(), static_cast<long long>(revision),
              sessions.size());
  std::printf("%-10s %-9s %-16s %-28s %7s %6s %4s %9s %12s %s\n", "NODE",
              "HEALTH", "MODEL", "HTTP", "RUNNING", "QUEUED", "HOT", "SESSIONS",
              "K/V FREE", "INCARNATION");
  std::set<std::string> live;
  for (const auto& kv : nodes) {
    absl::StatusOr<cluster::NodeInfo> n = cluster::DecodeNodeInfo(kv.value);
    if (!n.ok()) {
      std::printf("%-10s unreadable description: %s\n",
                  kv.key.substr(sizeof(cluster::kNodesPrefix) - 1).c_str(),
                  std::string(n.status().message()).c_str());
      continue;
    }
    live.insert(n->id);
    std::printf("%-10s %-9s %-16s %-28s %7lld %6lld %4lld %9lld %12s %s\n",
                n->id.c_str(), drained.count(n->id) ? "draining" : "live",
                n->model_id.c_str(), n->http_url.c_str(),
                static_cast<long long>(n->load.running),
                static_cast<long long>(n->load.queued),
                static_cast<long long>(n->load.hot_sessions),
                static_cast<long long>(per_owner[n->id]),
                Bytes(n->load.kv_pool_free_bytes).c_str(),
                n->incarnation.c_str());
  }
  for (const auto& [owner, count] : per_owner) {
    if (live.count(owner)) continue;
    std::printf("%-10s %-9s %-16s %-28s %7s %6s %4s %9lld %12s %s\n",
                owner.c_str(), "down", "-", "-", "-", "-", "-",
                static_cast<long long>(count), "-", "-");
  }
  if (nodes.empty()) std::printf("(no live nodes)\n");
  return absl::OkStatus();
}

absl::Status Drain(const Args& a, const std::string& node, bool on) {
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<cluster::EtcdClient> etcd, Connect(a));
  const std::string key = absl::StrCat(cluster::kDrainPrefix, node);
  if (!on) {
    KVD_RETURN_IF_ERROR(etcd->Delete(key));
    std::printf("node '%s' takes new sessions again\n", node.c_str());
    return absl::OkStatus();
  }
  KVD_ASSIGN_OR_RETURN(std::optional<cluster::EtcdKeyValue> info,
                       etcd->Get(absl::StrCat(cluster::kNodesPrefix, node)));
  if (!info.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("no live node '", node, "' (see kvd cluster status)"));
  }
  KVD_RETURN_IF_ERROR(
      etcd->Put(key, absl::StrCat("{\"since_unix_ms\":",
                                  absl::ToUnixMillis(absl::Now()), "}"))
          .status());
  std::printf("node '%s' is draining: routers place no new sessions there\n",
              node.c_str());
  // The node moves its sessions away itself (services/migration/drainer.h);
  // this waits until the directory gives it none and it runs no turns.
  KVD_ASSIGN_OR_RETURN(int64_t wait_s, a.GetIntIn("wait", 0, 86400));
  if (wait_s == 0) return absl::OkStatus();
  cluster::SessionDirectory directory(etcd.get());
  const absl::Time until = absl::Now() + absl::Seconds(wait_s);
  int64_t first = -1, last = -1;
  for (;;) {
    KVD_ASSIGN_OR_RETURN(info,
                         etcd->Get(absl::StrCat(cluster::kNodesPrefix, node)));
    if (!info.has_value()) {
      std::printf("node '%s' left the cluster\n", node.c_str());
      return absl::OkStatus();
    }
    KVD_ASSIGN_OR_RETURN(cluster::NodeInfo n,
                         cluster::DecodeNodeInfo(info->value));
    KVD_ASSIGN_OR_RETURN(auto owned, directory.ListOwnedBy(node));
    const int64_t left = static_cast<int64_t>(owned.size());
    if (first < 0) first = left;
    const int64_t busy = n.load.running + n.load.queued;
    if (left == 0 && busy == 0) {
      std::printf(
          "node '%s' is empty: %lld sessions moved to other nodes; it owns "
          "none and runs no turns. Stop it, or undrain it to take sessions "
          "again\n",
          node.c_str(), static_cast<long long>(first));
      return absl::OkStatus();
    }
    if (absl::Now() >= until) {
      return absl::DeadlineExceededError(absl::StrCat(
          "node '", node, "' still owns ", left, " sessions and runs ", busy,
          " turns; it stays draining and keeps moving them (see its log; "
          "kvd cluster status)"));
    }
    if (left != last) {
      std::printf("  %lld of %lld sessions left on node '%s'\n",
                  static_cast<long long>(left), static_cast<long long>(first),
                  node.c_str());
      std::fflush(stdout);
      last = left;
    }
    absl::SleepFor(absl::Milliseconds(500));
  }
}

}  // namespace

int ClusterCommand(const std::vector<std::string>& argv) {
  Args args("kvd cluster",
            "A kvd cluster's state, from its etcd.\n"
            "  kvd cluster status          nodes, health, load, sessions per "
            "node\n"
            "  kvd cluster drain NODE      no new sessions on NODE; it moves "
            "its sessions to\n"
            "                              the other nodes; waits until it "
            "owns none\n"
            "  kvd cluster undrain NODE    NODE takes new sessions again\n"
            "  kvd cluster etcd-auth USER...  turns on etcd's authentication "
            "(run as its\n"
            "                              root: --tls-cert of a certificate "
            "naming 'root'):\n"
            "                              USERs (certificate names such as "
            "node:n1,\n"
            "                              router:r1) may use only /kvd/; "
            "again to add USERs");
  args.Positional("action", "status, drain, undrain or etcd-auth");
  args.Positional("node...",
                  "the node, for drain and undrain; the users, for etcd-auth");
  DeclareEtcdFlag(args);
  args.Flag("ca-cert", "",
            "etcd over TLS (an https:// --etcd): PEM of the CA that signed "
            "its certificate");
  args.Flag("tls-cert", "",
            "etcd over TLS: a certificate naming an etcd user (make_certs.sh "
            "DIR --client root, or a router's)");
  args.Flag("tls-key", "", "PEM private key for --tls-cert");
  args.Flag("wait", "600",
            "drain: seconds to wait until the node owns no sessions and runs "
            "no turns (0: do not wait; it drains on)");
  return args.Main(argv, [](const Args& a) -> absl::Status {
    const std::vector<std::string>& p = a.positional();
    const std::string action = p.empty() ? "status" : p[0];
    if (action == "status" && p.size() <= 1) return Status(a);
    if ((action == "drain" || action == "undrain") && p.size() == 2) {
      return Drain(a, p[1], action == "drain");
    }
    if (action == "etcd-auth" && p.size() >= 2) {
      KVD_ASSIGN_OR_RETURN(std::unique_ptr<cluster::EtcdClient> etcd,
                           Connect(a));
      KVD_RETURN_IF_ERROR(etcd->EnableAuth({p.begin() + 1, p.end()}));
      std::printf("etcd authentication is on; %zu users may use /kvd/\n",
                  p.size() - 1);
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        "usage: kvd cluster status | drain NODE | undrain NODE | etcd-auth "
        "USER...");
  });
}

}  // namespace kvd::cli
