#include "tools/kvd/cluster_endpoint.h"

#include <cstdlib>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kvd::cli {

std::string RecordedEtcdPath() {
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr ? home : "/tmp",
                      "/.config/kvd/cluster-etcd");
}

void DeclareEtcdFlag(Args& args) {
  args.Flag("etcd", "",
            "the cluster's etcd endpoint (host:port, or its members' "
            "address:port, comma-separated; https://host:port for an etcd "
            "serving TLS, with --ca-cert and a --tls-cert naming an etcd "
            "user); default: $KVD_ETCD, else the cluster "
            "tools/cluster/up.sh started last, else 127.0.0.1:2379");
}

absl::StatusOr<std::string> EtcdEndpoint(const Args& args) {
  if (args.Has("etcd")) return args.Get("etcd");
  if (const char* env = std::getenv("KVD_ETCD"); env != nullptr && *env) {
    return std::string(env);
  }
  std::ifstream in(RecordedEtcdPath());
  std::string recorded;
  if (in && std::getline(in, recorded)) {
    recorded = std::string(absl::StripAsciiWhitespace(recorded));
    if (!recorded.empty()) return recorded;
  }
  return std::string("127.0.0.1:2379");
}

EtcdTlsFiles RecordedEtcdTls(const std::string& endpoint) {
  std::ifstream in(RecordedEtcdPath());
  std::string line;
  if (!in || !std::getline(in, line) ||
      absl::StripAsciiWhitespace(line) != endpoint) {
    return {};
  }
  EtcdTlsFiles files;
  for (std::string* path : {&files.ca, &files.cert, &files.key}) {
    if (!std::getline(in, line)) return {};
    *path = std::string(absl::StripAsciiWhitespace(line));
  }
  return files;
}

}  // namespace kvd::cli
