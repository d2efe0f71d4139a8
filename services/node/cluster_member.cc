#include "services/node/cluster_member.h"

#include <atomic>
#include <cstdio>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "services/cluster/node_info.h"

namespace kvd::node {

class ClusterMember::DirectoryFence : public engine::SessionFence {
 public:
  DirectoryFence(cluster::SessionDirectory* directory, std::string node_id)
      : directory_(directory), node_id_(std::move(node_id)) {}

  void set_registration(const cluster::NodeRegistration* r) {
    registration_.store(r);
  }
  // Between the node's key appearing in etcd (routers may send it turns at
  // once) and set_registration, a turn waits for the registration rather
  // than being refused.
  void set_joining(bool joining) { joining_.store(joining); }

  absl::StatusOr<uint64_t> OwnedEpoch(const std::string& tenant,
                                      const std::string& session) override {
    if (absl::Status live = CheckLease(); !live.ok()) return live;
    absl::StatusOr<std::optional<cluster::DirectoryEntry>> e =
        directory_->Lookup(tenant, session);
    if (!e.ok()) return e.status();
    if (!e->has_value()) {
      return absl::NotFoundError(absl::StrCat(
          "session '", session,
          "' is not in the cluster's directory; a router places new "
          "sessions: send the request through one (kvd router)"));
    }
    if ((*e)->owner != node_id_) {
      return absl::AbortedError(absl::StrCat(
          "session '", session, "' is owned by node '", (*e)->owner,
          "' (epoch ", (*e)->epoch, "), not this node ('", node_id_,
          "'); nothing was written. Send the request through a router"));
    }
    return (*e)->epoch;
  }

  absl::Status MayCommit(const std::string& tenant, const std::string& session,
                         uint64_t epoch) override {
    absl::StatusOr<uint64_t> owned = OwnedEpoch(tenant, session);
    if (!owned.ok()) return owned.status();
    if (*owned != epoch) {
      return absl::AbortedError(absl::StrCat(
          "session '", session, "' moved to epoch ", *owned,
          " in the cluster directory while this turn ran at epoch ", epoch,
          "; nothing was written, retry the turn"));
    }
    // The lease once more: the directory read may have taken a while.
    return CheckLease();
  }

  absl::Status Ready() override { return CheckLease(); }

  absl::StatusOr<bool> HasCommitsElsewhere(
      const std::string& tenant, const std::string& session) override {
    absl::StatusOr<std::optional<cluster::DirectoryEntry>> e =
        directory_->Lookup(tenant, session);
    if (!e.ok()) return e.status();
    return e->has_value() && !(*e)->replicas.empty();
  }

 private:
  absl::Status CheckLease() const {
    const cluster::NodeRegistration* r = registration_.load();
    for (int i = 0; r == nullptr && joining_.load() && i < 500; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
      r = registration_.load();
    }
    if (r != nullptr && r->LeaseLive()) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(
        "node '", node_id_,
        "' has no live cluster lease (etcd unreachable, or the process was "
        "paused past its lease); it commits nothing until it has "
        "registered again. Retry shortly"));
  }

  cluster::SessionDirectory* const directory_;
  const std::string node_id_;
  std::atomic<const cluster::NodeRegistration*> registration_{nullptr};
  std::atomic<bool> joining_{false};
};

absl::StatusOr<std::unique_ptr<ClusterMember>> ClusterMember::Connect(
    ClusterMemberOptions options) {
  if (options.node_id.empty()) {
    return absl::InvalidArgumentError(
        "a node in a cluster needs a --node-id (unique in the cluster)");
  }
  if (absl::StrContains(options.node_id, "/")) {
    return absl::InvalidArgumentError("--node-id must not contain '/'");
  }
  std::unique_ptr<ClusterMember> m(new ClusterMember());
  absl::StatusOr<std::unique_ptr<cluster::EtcdClient>> etcd =
      cluster::EtcdClient::Connect({.endpoint = options.etcd_endpoint,
                                    .ca_pem = options.etcd_ca_pem,
                                    .cert_pem = options.etcd_cert_pem,
                                    .key_pem = options.etcd_key_pem});
  if (!etcd.ok()) return etcd.status();
  m->etcd_ = std::move(*etcd);
  m->directory_ = std::make_unique<cluster::SessionDirectory>(m->etcd_.get());
  m->fence_ =
      std::make_shared<DirectoryFence>(m->directory_.get(), options.node_id);
  m->options_ = std::move(options);
  return m;
}

ClusterMember::~ClusterMember() {
  if (fence_) fence_->set_registration(nullptr);
  registration_.reset();  // revokes the lease: routers see the node leave
}

absl::Status ClusterMember::Join(NodeRuntime* runtime,
                                 const Admission* admission,
                                 const std::string& http_url,
                                 const std::string& grpc_address) {
  cluster::NodeInfo info;
  info.id = options_.node_id;
  info.http_url = http_url;
  info.grpc_address = grpc_address;
  info.model_id = runtime->model_id();
  const v1::ModelIdentity& identity = runtime->engine().identity();
  info.model_fingerprint = identity.fingerprint();
  info.precision = identity.precision();
  info.numerics_version = identity.numerics_version();
  info.max_inflight = options_.max_inflight;
  info.max_queue = options_.max_queue;
  cluster::NodeRegistration::Options o;
  o.node_id = options_.node_id;
  o.ttl = options_.lease_ttl;
  // Filled in below, once the registration (and its incarnation) exists;
  // the first describe() runs inside Start, so it reads `incarnation`.
  auto incarnation = std::make_shared<std::string>();
  o.describe = [info, runtime, admission, incarnation]() mutable {
    const engine::EngineStats s = runtime->engine().stats();
    info.incarnation = *incarnation;
    info.load.running = admission != nullptr ? admission->inflight() : 0;
    info.load.queued = admission != nullptr ? admission->queued() : 0;
    info.load.hot_sessions = s.hot_sessions;
    info.load.kv_pool_free_bytes =
        s.kv_pool_blocks_total == 0
            ? -1
            : (s.kv_pool_blocks_total - s.kv_pool_blocks_used) *
                  s.kv_pool_block_bytes;
    info.load.dram_tier_bytes = runtime->store().dram_stats().bytes;
    info.load.turns_committed = s.turns_committed;
    // The database's own judgement, not the engine's: that one also asks
    // the cluster fence, which waits for the registration this runs inside.
    const absl::Status writable = runtime->store().db().WriteHealth();
    info.load.not_writable = std::string(writable.message());
    return cluster::EncodeNodeInfo(info);
  };
  o.on_lost = [id = options_.node_id] {
    std::fprintf(stderr,
                 "kvd serve: node '%s' lost its cluster lease; committing "
                 "nothing until it has registered again\n",
                 id.c_str());
  };
  *incarnation = cluster::NewIncarnation();
  o.incarnation = *incarnation;
  fence_->set_joining(true);
  absl::StatusOr<std::unique_ptr<cluster::NodeRegistration>> reg =
      cluster::NodeRegistration::Start(etcd_.get(), o);
  // A node restarted right after it died (kill -9, a crash) finds its old
  // incarnation's key until that lease expires: wait it out, once. A live
  // node holding the id keeps renewing, and this one then gives up.
  const absl::Time until = absl::Now() + options_.lease_ttl + absl::Seconds(2);
  if (reg.status().code() == absl::StatusCode::kAlreadyExists) {
    std::fprintf(stderr,
                 "kvd serve: node id '%s' is still registered (a previous run "
                 "whose lease has not expired yet?); waiting up to %s\n",
                 options_.node_id.c_str(),
                 absl::FormatDuration(until - absl::Now()).c_str());
  }
  while (reg.status().code() == absl::StatusCode::kAlreadyExists &&
         absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(500));
    reg = cluster::NodeRegistration::Start(etcd_.get(), o);
  }
  if (!reg.ok()) {
    fence_->set_joining(false);
    return reg.status();
  }
  registration_ = std::move(*reg);
  fence_->set_registration(registration_.get());
  fence_->set_joining(false);
  return absl::OkStatus();
}

std::shared_ptr<engine::SessionFence> ClusterMember::fence() const {
  return fence_;
}

bool ClusterMember::LeaseLive() const {
  return registration_ != nullptr && registration_->LeaseLive();
}

const std::string& ClusterMember::incarnation() const {
  static const std::string kNone;
  return registration_ != nullptr ? registration_->incarnation() : kNone;
}

}  // namespace kvd::node
