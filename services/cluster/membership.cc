#include "services/cluster/membership.h"

#include <algorithm>
#include <chrono>
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

namespace {

// A monotonic clock: a wall-clock step (NTP) must not extend a lease.
int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool NodeRegistration::LeaseLive() const {
  return registered_.load() && MonotonicNanos() < live_until_ns_.load();
}

int64_t NodeRegistration::LiveUntil(int64_t asked_ns,
                                    absl::Duration granted) const {
  // A tenth of the TTL short of what etcd granted: room for the commit
  // that follows the check.
  return asked_ns + absl::ToInt64Nanoseconds(granted - options_.ttl / 10);
}

absl::Status NodeRegistration::Register() {
  // The lease's clock starts at etcd no earlier than this.
  const int64_t asked = MonotonicNanos();
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
  live_until_ns_.store(LiveUntil(asked, options_.ttl));
  registered_.store(true);
  return absl::OkStatus();
}

void NodeRegistration::Loop() {
  const absl::Duration every = options_.ttl / 3;
  absl::Duration wait = every;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), wait)) return;
    }
    // After a failure, try again soon rather than a third of the TTL later.
    wait = std::min(every, absl::Milliseconds(500));
    if (registered_.load()) {
      const int64_t asked = MonotonicNanos();
      // Each call gives up within a third of the TTL, so that one held by
      // an etcd member without quorum still leaves time to renew through
      // another before the lease ends.
      absl::StatusOr<absl::Duration> kept =
          etcd_->KeepAliveOnce(lease_.load(), every);
      if (kept.ok()) {
        wait = every;
        live_until_ns_.store(LiveUntil(asked, *kept));
        // The description carries the node's load: rewritten each round.
        if (options_.describe) {
          (void)etcd_->Put(key_, options_.describe(), lease_.load(), every);
        }
        continue;
      }
      if (kept.status().code() != absl::StatusCode::kNotFound) {
        continue;  // etcd unreachable: retry until the lease would end
      }
      registered_.store(false);
      if (options_.on_lost) options_.on_lost();
    }
    if (Register().ok()) wait = every;  // back in when etcd lets it
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
