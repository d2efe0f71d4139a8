// A real etcd server (Debian's etcd-server) for tests: started on free
// loopback ports in a fresh data directory, stopped (SIGTERM, then SIGKILL)
// when destroyed. Not a double: the cluster's tests talk to etcd itself.
//
//   absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd =
//   EtcdProcess::Start(dir); EtcdClient::Connect({.endpoint =
//   (*etcd)->endpoint()});
//
// Thread-safety: one owner.
#ifndef KVD_SERVICES_CLUSTER_TESTING_ETCD_PROCESS_H_
#define KVD_SERVICES_CLUSTER_TESTING_ETCD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvd::cluster::testing {

class EtcdProcess {
 public:
  // Starts `etcd` from PATH with its data under `dir`; returns once it
  // answers. FAILED_PRECONDITION if etcd is not installed (tools/setup.sh
  // --test installs etcd-server).
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(
      const std::string& dir);

  // PEM files for an etcd serving its clients over TLS that requires and
  // verifies their certificates (--client-cert-auth).
  struct Tls {
    std::string ca_file;    // verifies the clients' certificates
    std::string cert_file;  // etcd's own, for 127.0.0.1
    std::string key_file;
    // A client certificate of the CA, with which Start checks it answers.
    std::string client_cert_file;
    std::string client_key_file;
  };
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(
      const std::string& dir, const Tls& tls);
  ~EtcdProcess();

  // host:port; "https://host:port" when it serves TLS.
  const std::string& endpoint() const { return endpoint_; }

 private:
  EtcdProcess() = default;
  pid_t pid_ = -1;
  std::string endpoint_;
  std::string data_dir_;  // removed when it stops
};

}  // namespace kvd::cluster::testing

#endif  // KVD_SERVICES_CLUSTER_TESTING_ETCD_PROCESS_H_
