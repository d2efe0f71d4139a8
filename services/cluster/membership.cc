#include "services/cluster/membership.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace kvd::cluster {
std::string NewIncarnation() {
  std::random_device rd;
  std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) ^ rd());
  return absl::StrFormat("%016x", rng());
}

NodeRegistration::NodeRegistration(EtcdClient* etcd, Options options)
    : etcd_(etcd),
      options_(std::move(options)),
      key_(absl::StrCat(kNodesPrefix, options_.node_id)),
      incarnation_(options_.incarnation.empty() ? NewIncarnation()
                                                : options_.incarnation) {}

absl::StatusOr<std::unique_ptr<NodeRegistration>> NodeRegistration::Start(
    EtcdClient* etcd, Options options) {
  if (options.node_id.empty()) {
    return absl::InvalidArgumentError("a cluster node needs a --node-id");
  }
  if (options.ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        "the membership lease TTL must be >= 1 s");
  }
  std::unique_ptr<NodeRegistration> reg(
      new NodeRegistration(etcd, std::move(options)));
  absl::Status first = reg->Register();
  if (!first.ok()) return first;
  reg->thread_ = std::thread([r = reg.get()] { r->Loop(); });
  return reg;
}

bool NodeRegistration::LeaseLive() const {
  return registered_.load() &&
         absl::ToUnixNanos(absl::Now()) < live_until_ns_.load();
}

absl::Status NodeRegistration::Register() {
  // The lease's clock starts at etcd no earlier than this.
  const absl::Time asked = absl::Now();
  absl::StatusOr<int64_t> lease = etcd_->GrantLease(options_.ttl);
  if (!lease.ok()) return lease.status();
  const std::string value = options_.describe ? options_.describe() : "";
  // Only if no live node holds the id: a key under a lapsed lease is gone
  // already, so a restarted node gets its id back once its old lease ends.
  absl::StatusOr<bool> won = etcd_->PutIfModRevision(key_, value, 0, *lease);
  if (!won.ok() || !*won) {
    (void)etcd_->RevokeLease(*lease);
    if (!won.ok()) return won.status();
    return absl::AlreadyExistsError(absl::StrCat(
        "node id '", options_.node_id,
        "' is held by another live node (its key ", key_,
        " exists); give this node another --node-id, or wait for the other "
        "one's lease to end"));
  }
  lease_.store(*lease);
  live_until_ns_.store(absl::ToUnixNanos(asked + options_.ttl));
  registered_.store(true);
  return absl::OkStatus();
}

void NodeRegistration::Loop() {
  const absl::Duration every = options_.ttl / 3;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), every)) return;
    }
    if (registered_.load()) {
      const absl::Time asked = absl::Now();
      absl::StatusOr<absl::Duration> kept = etcd_->KeepAliveOnce(lease_.load());
      if (kept.ok()) {
        live_until_ns_.store(absl::ToUnixNanos(asked + *kept));
        // The description carries the node's load: rewritten each round.
        if (options_.describe) {
          (void)etcd_->Put(key_, options_.describe(), lease_.load());
        }
        continue;
      }
      if (kept.status().code() != absl::StatusCode::kNotFound) {
        continue;  // etcd unreachable: retry until the lease would end
      }
      registered_.store(false);
      if (options_.on_lost) options_.on_lost();
    }
    (void)Register();  // back in when etcd lets it
  }
}

NodeRegistration::~NodeRegistration() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (registered_.load()) (void)etcd_->RevokeLease(lease_.load());
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ListNodes(
    EtcdClient* etcd) {
  absl::StatusOr<std::vector<EtcdKeyValue>> kvs = etcd->GetPrefix(kNodesPrefix);
  if (!kvs.ok()) return kvs.status();
  std::vector<std::pair<std::string, std::string>> nodes;
  for (EtcdKeyValue& kv : *kvs) {
    nodes.emplace_back(kv.key.substr(sizeof(kNodesPrefix) - 1),
                       std::move(kv.value));
  }
  return nodes;
}

}  // namespace kvd::cluster
