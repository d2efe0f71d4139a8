// A small client of etcd's v3 gRPC API (KV, Txn, Lease, Watch), the store the
// cluster keeps its membership and session directory in (DESIGN.md section
// 7). Stubs come from etcd's own .proto files (third_party/etcd).
//
// Ownership changes are transactions on a key's revision: PutIfModRevision
// writes only if the key is still at the revision the caller read (0: only
// if it does not exist), which is how the directory moves a session's owner
// to epoch + 1 without trusting a lock.
//
//   KVD_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd,
//                        EtcdClient::Connect({.endpoint = "127.0.0.1:2379"}));
//   KVD_ASSIGN_OR_RETURN(int64_t lease, etcd->GrantLease(absl::Seconds(15)));
//   KVD_RETURN_IF_ERROR(etcd->Put("/kvd/v1/nodes/n1", info, lease).status());
//   KVD_ASSIGN_OR_RETURN(bool won, etcd->PutIfModRevision(key, v, rev));
//
// Thread-safety: all methods may be called concurrently.
#ifndef KVD_SERVICES_CLUSTER_ETCD_CLIENT_H_
#define KVD_SERVICES_CLUSTER_ETCD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace kvd::cluster {

struct EtcdClientOptions {
  // host:port of an etcd client URL (plain gRPC); an "http://" prefix and
  // a trailing "/" are accepted and dropped; an "https://" prefix asks for
  // TLS (as does a CA below). Several members of one etcd
  // cluster: a comma-separated list of IPv4 address:port, over which calls
  // are spread (gRPC round robin), so a member that is down or cut off is
  // skipped once its connection fails, and a call a member answers with
  // UNAVAILABLE (no leader: it is in a minority) is retried on the next.
  std::string endpoint;
  absl::Duration timeout = absl::Seconds(5);  // per call
  // Idempotent calls (reads and lease grants) are retried with jittered
  // exponential backoff for up to this long while etcd is unavailable;
  // writes are not (a lost answer may hide a committed write), and
  // keep-alives are retried by their caller (membership.h).
  absl::Duration retry_for = absl::Seconds(3);
  // etcd over TLS: the PEM of the CA that signed etcd's certificate, and
  // this client's certificate and key (PEM text, optional), which an etcd
  // run with --client-cert-auth verifies and, with its authentication
  // enabled (EnableAuth), takes the common name of as the user.
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
};

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;  // what PutIfModRevision compares against
  int64_t version = 0;
  int64_t lease = 0;
};

// The smallest key greater than every key starting with `prefix` (etcd's
// range_end for a prefix query); "\0" means "to the end" when the prefix is
// all 0xff bytes.
std::string PrefixRangeEnd(std::string prefix);

EtcdKeyValue FromProto(const mvccpb::KeyValue& kv);

class EtcdClient {
 public:
  // Connects and checks that etcd answers (UNAVAILABLE naming the endpoint
  // otherwise).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(
      EtcdClientOptions options);

  // Writes `key` (attached to `lease` unless 0); the store's revision after
  // it. `timeout` (if shorter) replaces the options' per-call timeout.
  absl::StatusOr<int64_t> Put(
      const std::string& key, const std::string& value, int64_t lease = 0,
      absl::Duration timeout = absl::InfiniteDuration());
  // The key, or nullopt if it does not exist.
  absl::StatusOr<std::optional<EtcdKeyValue>> Get(const std::string& key);
  // Every key starting with `prefix`, in key order; `revision` (if not
  // null) gets the store's revision the answer reflects, from which a
  // PrefixWatch continues.
  absl::StatusOr<std::vector<EtcdKeyValue>> GetPrefix(
      const std::string& prefix, int64_t* revision = nullptr);
  // Writes only if the key's mod revision is still `mod_revision` (0: only
  // if the key does not exist). True if written; false if someone else
  // changed it first (read it again and decide).
  absl::StatusOr<bool> PutIfModRevision(const std::string& key,
                                        const std::string& value,
                                        int64_t mod_revision,
                                        int64_t lease = 0);
  // OK whether or not the key existed.
  absl::Status Delete(const std::string& key);
  // Deletes only if the key's mod revision is still `mod_revision`; true if
  // deleted.
  absl::StatusOr<bool> DeleteIfModRevision(const std::string& key,
                                           int64_t mod_revision);

  // A lease of `ttl` (etcd may round it up); keys attached to it vanish when
  // it expires or is revoked.
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl);
  // Renews the lease once; its remaining TTL. NOT_FOUND once it expired:
  // the caller lost whatever it held under it. `timeout` (if shorter)
  // replaces the options' per-call timeout: a renewal must give up well
  // within the TTL to be retried on another member in time (a member in an
  // etcd minority holds the call until it times out).
  absl::StatusOr<absl::Duration> KeepAliveOnce(
      int64_t lease, absl::Duration timeout = absl::InfiniteDuration());
  absl::Status RevokeLease(int64_t lease);

  // Discards history older than `revision` (watches from before it then
  // get the compaction; see PrefixWatch).
  absl::Status Compact(int64_t revision);

  // A Watch stream on `ctx` (no deadline: it lives until cancelled), for
  // PrefixWatch.
  std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::WatchRequest,
                                           etcdserverpb::WatchResponse>>
  OpenWatch(grpc::ClientContext* ctx);
  const std::string& endpoint() const { return options_.endpoint; }

  // Turns on etcd's own authentication for a kvd cluster, as its root: a
  // role "kvd" that may read and write only keys under `prefix`, granted to
  // each of `users` (certificate common names such as "node:n1" and
  // "router:r1": etcd authenticates them by the certificate they present,
  // with no password), a root user "root" (also by certificate), then
  // authentication on. Whatever exists already is kept, so it may run again
  // to add users; run it with a certificate naming "root" once auth is on.
  absl::Status EnableAuth(const std::vector<std::string>& users,
                          const std::string& prefix = "/kvd/");

 private:
  // Runs an idempotent call again while etcd is UNAVAILABLE (restarting,
  // electing a leader), after 50 ms, 100 ms, 200 ms ... each with +-50%
  // jitter so that many clients do not return at once, for up to `timeout`
  // in all.
  template <typename T>
  T Retrying(const std::function<T()>& call) const;
  // Runs `op` only if `key`'s mod revision is still `mod_revision`; true if
  // it ran.
  absl::StatusOr<bool> IfModRevision(const std::string& key,
                                     int64_t mod_revision,
                                     etcdserverpb::RequestOp op);
  absl::StatusOr<int64_t> GrantLeaseOnce(absl::Duration ttl);
  explicit EtcdClient(EtcdClientOptions options);
  // A call's context, its deadline the shorter of `timeout` and the
  // options' timeout from now.
  std::unique_ptr<grpc::ClientContext> Context(
      absl::Duration timeout = absl::InfiniteDuration()) const;
  absl::Status FromGrpc(const grpc::Status& s, const char* what) const;

  const EtcdClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease_;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch_;
};

}  // namespace kvd::cluster

#endif  // KVD_SERVICES_CLUSTER_ETCD_CLIENT_H_
