#include "services/migration/drainer.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "services/cluster/membership.h"
#include "services/cluster/node_info.h"

namespace kvd::migration {

Drainer::Drainer(cluster::EtcdClient* etcd,
                 cluster::SessionDirectory* directory, Migrator* migrator,
                 DrainerOptions options, const engine::SessionEngine* engine)
    : etcd_(etcd),
      directory_(directory),
      migrator_(migrator),
      options_(std::move(options)),
      engine_(engine) {}

Drainer::~Drainer() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void Drainer::Start() {
  thread_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(options_.poll)) {
      absl::StatusOr<int> moved = Pass();
      if (!moved.ok()) {
        std::fprintf(stderr, "kvd serve: drain pass failed: %s\n",
                     moved.status().ToString().c_str());
      }
    }
  });
}

DrainerStats Drainer::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::StatusOr<std::vector<std::string>> Drainer::Targets() {
  KVD_ASSIGN_OR_RETURN(std::vector<cluster::EtcdKeyValue> drains,
                       etcd_->GetPrefix(cluster::kDrainPrefix));
  std::set<std::string> draining;
  for (const auto& kv : drains) {
    draining.insert(kv.key.substr(sizeof(cluster::kDrainPrefix) - 1));
  }
  KVD_ASSIGN_OR_RETURN(std::vector<cluster::EtcdKeyValue> nodes,
                       etcd_->GetPrefix(cluster::kNodesPrefix));
  std::vector<std::pair<double, std::string>> ranked;
  absl::MutexLock lock(&mu_);
  for (const auto& kv : nodes) {
    absl::StatusOr<cluster::NodeInfo> n = cluster::DecodeNodeInfo(kv.value);
    if (!n.ok() || n->id == options_.node_id || draining.count(n->id) ||
        n->model_fingerprint != options_.model_fingerprint ||
        n->grpc_address.empty()) {
      continue;
    }
    const double capacity = std::max<int64_t>(1, n->max_inflight);
    // Reported load, plus what this drain sent there since (reports are
    // up to a third of a lease old).
    const double load = (n->load.running + n->load.queued) / capacity +
                        0.05 * static_cast<double>(sent_[n->id]);
    ranked.emplace_back(load, n->id);
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<std::string> out;
  for (auto& [load, id] : ranked) out.push_back(std::move(id));
  return out;
}

absl::StatusOr<int> Drainer::Pass() {
  KVD_ASSIGN_OR_RETURN(
      std::optional<cluster::EtcdKeyValue> mark,
      etcd_->Get(absl::StrCat(cluster::kDrainPrefix, options_.node_id)));
  {
    absl::MutexLock lock(&mu_);
    stats_.draining = mark.has_value();
    if (!mark.has_value()) sent_.clear();
  }
  if (!mark.has_value()) return Rebalance();
  KVD_ASSIGN_OR_RETURN(std::vector<cluster::SessionDirectory::OwnedSession> own,
                       directory_->ListOwnedBy(options_.node_id));
  int moved = 0;
  for (const auto& s : own) {
    if (stop_.HasBeenNotified()) break;
    KVD_ASSIGN_OR_RETURN(std::vector<std::string> targets, Targets());
    if (targets.empty()) {
      std::fprintf(stderr,
                   "kvd serve: draining, but no other live node serves this "
                   "model; %zu sessions stay here\n",
                   own.size());
      break;
    }
    absl::StatusOr<MigrationReport> r =
        migrator_->Migrate(s.tenant, s.session, targets.front());
    absl::MutexLock lock(&mu_);
    if (r.ok()) {
      moved++;
      stats_.moved++;
      sent_[targets.front()]++;
    } else {
      stats_.failed++;
      std::fprintf(stderr, "kvd serve: drain: %s\n",
                   r.status().ToString().c_str());
    }
  }
  return moved;
}

absl::StatusOr<int> Drainer::Rebalance() {
  if (engine_ == nullptr || options_.rebalance_every <= absl::ZeroDuration() ||
      absl::Now() - last_rebalance_ < options_.rebalance_every) {
    return 0;
  }
  KVD_ASSIGN_OR_RETURN(std::vector<std::string> targets, Targets());
  if (targets.empty()) return 0;
  // Sessions per node of this model, from the directory.
  std::map<std::string, int64_t> owned;
  for (const std::string& t : targets) owned[t] = 0;
  owned[options_.node_id] = 0;
  KVD_ASSIGN_OR_RETURN(std::vector<cluster::EtcdKeyValue> all,
                       etcd_->GetPrefix(cluster::kSessionsPrefix));
  for (const auto& kv : all) {
    absl::StatusOr<cluster::DirectoryEntry> e =
        cluster::DecodeDirectoryEntry(kv);
    if (e.ok() && owned.count(e->owner)) owned[e->owner]++;
  }
  double total = 0;
  for (const auto& [node, n] : owned) total += static_cast<double>(n);
  const double mean = total / static_cast<double>(owned.size());
  const int64_t mine = owned[options_.node_id];
  std::string least = targets.front();
  for (const std::string& t : targets) {
    if (owned[t] < owned[least]) least = t;
  }
  if (static_cast<double>(mine) <= options_.rebalance_above * mean ||
      mine - owned[least] < 2) {
    return 0;
  }
  KVD_ASSIGN_OR_RETURN(std::vector<cluster::SessionDirectory::OwnedSession> own,
                       directory_->ListOwnedBy(options_.node_id));
  int attempts = 0;
  for (const auto& s : own) {
    if (engine_->InTurn(s.tenant, s.session)) continue;  // never a running one
    last_rebalance_ = absl::Now();
    absl::StatusOr<MigrationReport> r =
        migrator_->Migrate(s.tenant, s.session, least);
    absl::MutexLock lock(&mu_);
    if (!r.ok()) {
      stats_.failed++;
      std::fprintf(stderr, "kvd serve: rebalancing: %s\n",
                   r.status().ToString().c_str());
      // Another session may move where this one could not.
      if (++attempts >= 3) return 0;
      continue;
    }
    stats_.rebalanced++;
    std::fprintf(stderr,
                 "kvd serve: rebalanced session '%s' to node '%s' (this node "
                 "owned %lld, the mean is %.1f)\n",
                 s.session.c_str(), least.c_str(), static_cast<long long>(mine),
                 mean);
    return 1;
  }
  return 0;
}

}  // namespace kvd::migration
