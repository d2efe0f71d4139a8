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
  ~EtcdProcess();

  const std::string& endpoint() const { return endpoint_; }  // host:port

 private:
  EtcdProcess() = default;
  pid_t pid_ = -1;
  std::string endpoint_;
  std::string data_dir_;  // removed when it stops
};

}  // namespace kvd::cluster::testing

#endif  // KVD_SERVICES_CLUSTER_TESTING_ETCD_PROCESS_H_
