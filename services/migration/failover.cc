#include "services/migration/failover.h"

#include <cstdio>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "services/cluster/membership.h"

namespace kvd::migration {

std::string FreshestReplica(const cluster::DirectoryEntry& entry,
                            const std::string& tenant,
                            const std::string& session,
                            const std::function<bool(const std::string&)>& live,
                            const ReplicaStatusFn& status_of, int64_t* turns) {
  std::string best;
  *turns = -1;
  for (const std::string& r : entry.replicas) {
    if (!live(r)) continue;
    absl::StatusOr<v1::ReplicaStatusResponse> s = status_of(r, tenant, session);
    if (!s.ok() || s->owner_node() != entry.owner ||
        s->epoch() != entry.epoch) {
      continue;
    }
    if (s->turns() > *turns) {
      *turns = s->turns();
      best = r;
    }
  }
  return best;
}

FailoverController::FailoverController(cluster::EtcdClient* etcd,
                                       cluster::SessionDirectory* directory,
                                       ReplicaStatusFn status_of,
                                       FailoverOptions options)
    : etcd_(etcd),
      directory_(directory),
      status_of_(std::move(status_of)),
      options_(std::move(options)) {}

FailoverController::~FailoverController() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
  if (lease_ != 0) (void)etcd_->RevokeLease(lease_);  // another may lead
}

void FailoverController::Start() {
  thread_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(options_.poll)) {
      absl::StatusOr<int> promoted = Pass();
      if (!promoted.ok()) {
        std::fprintf(stderr, "kvd serve: failover pass failed: %s\n",
                     promoted.status().ToString().c_str());
      }
    }
  });
}

FailoverStats FailoverController::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::StatusOr<bool> FailoverController::Lead() {
  if (lease_ != 0 && !etcd_->KeepAliveOnce(lease_).ok()) lease_ = 0;
  if (lease_ == 0) {
    KVD_ASSIGN_OR_RETURN(lease_, etcd_->GrantLease(options_.lease_ttl));
  }
  // Only if nobody holds it: the key goes when its holder's lease does.
  KVD_ASSIGN_OR_RETURN(
      bool won,
      etcd_->PutIfModRevision(kControllerKey, options_.node_id, 0, lease_));
  if (won) return true;
  KVD_ASSIGN_OR_RETURN(std::optional<cluster::EtcdKeyValue> holder,
                       etcd_->Get(kControllerKey));
  return holder.has_value() && holder->value == options_.node_id &&
         holder->lease == lease_;
}

absl::StatusOr<int> FailoverController::Pass() {
  KVD_ASSIGN_OR_RETURN(bool leader, Lead());
  {
    absl::MutexLock lock(&mu_);
    stats_.leader = leader;
  }
  if (!leader) return 0;
  KVD_ASSIGN_OR_RETURN(std::vector<cluster::EtcdKeyValue> nodes,
                       etcd_->GetPrefix(cluster::kNodesPrefix));
  std::set<std::string> live;
  for (const auto& kv : nodes) {
    live.insert(kv.key.substr(sizeof(cluster::kNodesPrefix) - 1));
  }
  KVD_ASSIGN_OR_RETURN(std::vector<cluster::EtcdKeyValue> sessions,
                       etcd_->GetPrefix(cluster::kSessionsPrefix));
  int promoted = 0;
  for (const cluster::EtcdKeyValue& kv : sessions) {
    if (stop_.HasBeenNotified()) break;
    absl::StatusOr<cluster::DirectoryEntry> e =
        cluster::DecodeDirectoryEntry(kv);
    if (!e.ok() || live.count(e->owner)) continue;
    const std::string rest =
        kv.key.substr(sizeof(cluster::kSessionsPrefix) - 1);
    const size_t slash = rest.find('/');
    if (slash == std::string::npos) continue;
    const std::string tenant = rest.substr(0, slash);
    const std::string session = rest.substr(slash + 1);
    int64_t best_turns = -1;
    const std::string best = FreshestReplica(
        *e, tenant, session,
        [&live](const std::string& r) { return live.count(r) > 0; }, status_of_,
        &best_turns);
    if (best.empty()) {
      absl::MutexLock lock(&mu_);
      stats_.without_replica++;
      continue;  // it waits for its owner to come back
    }
    absl::StatusOr<cluster::DirectoryEntry> moved =
        directory_->Move(tenant, session, *e, best);
    if (!moved.ok()) continue;  // changed meanwhile: the next pass decides
    std::fprintf(stderr,
                 "kvd serve: failover: session '%s' of tenant '%s' moved from "
                 "down node '%s' to its replica '%s' (epoch %llu, %lld "
                 "turns)\n",
                 session.c_str(), tenant.c_str(), e->owner.c_str(),
                 best.c_str(), static_cast<unsigned long long>(moved->epoch),
                 static_cast<long long>(best_turns));
    promoted++;
    absl::MutexLock lock(&mu_);
    stats_.promoted++;
  }
  return promoted;
}

}  // namespace kvd::migration
