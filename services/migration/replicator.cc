#include "services/migration/replicator.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "services/cluster/membership.h"
#include "services/cluster/node_info.h"
#include "services/migration/failover.h"
#include "storage/checkpoint/ownership.h"

namespace kvd::migration {

namespace {

// A transfer of `m`'s session from `source`, at its epoch.
v1::OpenInboundRequest OpenRequest(const v1::SessionManifest& m,
                                   const std::string& source) {
  v1::OpenInboundRequest req;
  req.set_tenant(m.tenant());
  req.set_session_id(m.session_id());
  req.set_source_node(source);
  req.set_epoch(storage::EpochOf(m));
  *req.mutable_model() = m.model();
  return req;
}

}  // namespace

Replicator::Replicator(engine::SessionEngine* engine, cluster::EtcdClient* etcd,
                       cluster::SessionDirectory* directory,
                       transport::Transport* transport, PeerResolver resolve,
                       ReplicatorOptions options)
    : engine_(engine),
      etcd_(etcd),
      directory_(directory),
      transport_(transport),
      resolve_(std::move(resolve)),
      options_(std::move(options)) {
  if (!options_.sync && options_.replicas > 1) {
    thread_ = std::thread([this] { Drain(); });
  }
  if (options_.replicas > 1 && options_.refill_every > absl::ZeroDuration()) {
    refill_thread_ = std::thread([this] { RefillLoop(); });
  }
}

Replicator::~Replicator() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (refill_thread_.joinable()) refill_thread_.join();
  if (thread_.joinable()) thread_.join();
}

void Replicator::RefillLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.refill_every);
      if (stop_) return;
    }
    absl::StatusOr<int> refilled = RefillPass();
    if (!refilled.ok()) {
      std::fprintf(stderr, "kvd serve: replica refill pass failed: %s\n",
                   refilled.status().ToString().c_str());
    }
  }
}

absl::StatusOr<int> Replicator::RefillPass() {
  if (options_.replicas <= 1) return 0;
  const size_t want = static_cast<size_t>(options_.replicas - 1);
  KVD_ASSIGN_OR_RETURN(
      std::vector<cluster::SessionDirectory::OwnedSession> held,
      directory_->ListHeldBy(options_.node_id));
  int refilled = 0, tried = 0;
  absl::Status first_error = absl::OkStatus();
  bool check_copies = false;
  {
    absl::MutexLock lock(&mu_);
    check_copies = !copies_checked_;
  }
  bool copies_found = true;
  for (const cluster::SessionDirectory::OwnedSession& s : held) {
    const bool mine = s.entry.owner == options_.node_id;
    if (check_copies &&
        engine_->GetSession(s.tenant, s.session).status().code() ==
            absl::StatusCode::kNotFound &&
        engine_->GetReplica(s.tenant, s.session).status().code() ==
            absl::StatusCode::kNotFound) {
      // Listed, but no copy here: the data directory was lost or replaced.
      absl::Status fixed = absl::OkStatus();
      if (!mine) {
        // A replica that holds nothing leaves the set; its owner refills it.
        std::vector<std::string> rest;
        for (const std::string& r : s.entry.replicas) {
          if (r != options_.node_id) rest.push_back(r);
        }
        fixed = directory_->SetReplicas(s.tenant, s.session, s.entry, rest)
                    .status();
        if (fixed.ok()) {
          std::fprintf(stderr,
                       "kvd serve: this node holds no copy of session '%s' "
                       "of tenant '%s' it is listed as a replica of; it left "
                       "the replica set\n",
                       s.session.c_str(), s.tenant.c_str());
        }
      } else if (!s.entry.replicas.empty()) {
        fixed = HandOver(s).status();
      }
      if (!fixed.ok()) {
        copies_found = false;  // try again next pass
        if (first_error.ok()) first_error = fixed;
      }
      continue;
    }
    if (!mine || s.entry.replicas.size() >= want) continue;
    if (tried >= options_.refill_per_pass) break;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) break;
    }
    tried++;
    absl::Status taken = engine_->TakeUp(s.tenant, s.session);
    absl::StatusOr<engine::SessionEngine::FrozenSession> frozen =
        taken.ok()
            ? engine_->Freeze(s.tenant, s.session)
            : absl::StatusOr<engine::SessionEngine::FrozenSession>(taken);
    absl::StatusOr<bool> grew = false;
    if (frozen.ok()) {
      grew = RefillFrozen(s.tenant, s.session, frozen->epoch);
      engine_->Unfreeze(s.tenant, s.session);
    } else {
      grew = frozen.status();
    }
    if (grew.ok() && *grew) refilled++;
    if (!grew.ok() && first_error.ok()) {
      first_error =
          absl::Status(grew.status().code(),
                       absl::StrCat("session '", s.session, "' of tenant '",
                                    s.tenant, "': ", grew.status().message()));
    }
  }
  if (check_copies && copies_found) {
    absl::MutexLock lock(&mu_);
    copies_checked_ = true;
  }
  if (!first_error.ok()) {
    std::fprintf(stderr,
                 "kvd serve: %d of %d short replica sets refilled; the first "
                 "session that was not: %s\n",
                 refilled, tried, first_error.ToString().c_str());
  }
  return refilled;
}

absl::StatusOr<bool> Replicator::HandOver(
    const cluster::SessionDirectory::OwnedSession& s) {
  const cluster::DirectoryEntry& e = s.entry;
  PeerOptions quick = options_.peer;
  quick.rpc_timeout = absl::Seconds(5);
  int64_t best_turns = -1;
  const std::string best = FreshestReplica(
      e, s.tenant, s.session, [](const std::string&) { return true; },
      [this, &quick](const std::string& node, const std::string& tenant,
                     const std::string& session)
          -> absl::StatusOr<v1::ReplicaStatusResponse> {
        KVD_ASSIGN_OR_RETURN(PeerNode peer, resolve_(node));
        return QueryReplica(peer, quick, tenant, session);
      },
      &best_turns);
  if (best.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "session '", s.session, "' of tenant '", s.tenant,
        "': this node holds no copy and no listed replica answered with one "
        "of epoch ",
        e.epoch));
  }
  KVD_RETURN_IF_ERROR(directory_->Move(s.tenant, s.session, e, best).status());
  std::fprintf(stderr,
               "kvd serve: this node holds no copy of session '%s' of tenant "
               "'%s' (its data directory was lost or replaced); handed it to "
               "replica '%s' (%lld turns, epoch %llu)\n",
               s.session.c_str(), s.tenant.c_str(), best.c_str(),
               static_cast<long long>(best_turns),
               static_cast<unsigned long long>(e.epoch + 1));
  absl::MutexLock lock(&mu_);
  stats_.handed_over++;
  return true;
}

absl::Status Replicator::FillSet(const std::string& tenant,
                                 const std::string& session,
                                 const std::vector<std::string>& skip,
                                 std::vector<std::string>* keep,
                                 int64_t* copies, int64_t* failed) {
  const size_t want = static_cast<size_t>(options_.replicas - 1);
  absl::Status last = absl::OkStatus();
  for (const std::string& c : Candidates(skip)) {
    if (keep->size() >= want) break;
    absl::Status sent = SendCopy(c, tenant, session);
    if (sent.ok()) {
      keep->push_back(c);
      ++*copies;
    } else {
      ++*failed;
      last = sent;
      std::fprintf(stderr,
                   "kvd serve: could not make '%s' a replica of session "
                   "'%s': %s\n",
                   c.c_str(), session.c_str(), sent.ToString().c_str());
    }
  }
  return last;
}

absl::StatusOr<bool> Replicator::RefillFrozen(const std::string& tenant,
                                              const std::string& session,
                                              uint64_t epoch) {
  KVD_ASSIGN_OR_RETURN(std::optional<cluster::DirectoryEntry> entry,
                       directory_->Lookup(tenant, session));
  if (!entry.has_value() || entry->owner != options_.node_id ||
      entry->epoch != epoch) {
    return false;  // moved meanwhile: its new owner refills it
  }
  const cluster::DirectoryEntry& e = *entry;
  const size_t want = static_cast<size_t>(options_.replicas - 1);
  std::vector<std::string> keep = e.replicas;
  int64_t copies = 0, failed = 0;
  const absl::Status last =
      FillSet(tenant, session, e.replicas, &keep, &copies, &failed);
  absl::Status set = absl::OkStatus();
  if (copies > 0) {
    set = directory_->SetReplicas(tenant, session, e, keep).status();
  }
  absl::MutexLock lock(&mu_);
  stats_.copies_sent += copies;
  stats_.failures += failed + (set.ok() ? 0 : 1);
  if (!set.ok()) return set;
  if (copies == 0) {
    stats_.short_sets++;
    return last.ok() ? absl::StatusOr<bool>(false)  // no candidate: wait
                     : absl::StatusOr<bool>(last);
  }
  stats_.sets_refilled++;
  std::fprintf(stderr,
               "kvd serve: session '%s' of tenant '%s' had %zu of %zu "
               "replicas; now %zu\n",
               session.c_str(), tenant.c_str(), e.replicas.size(), want,
               keep.size());
  return true;
}

ReplicatorStats Replicator::stats() const {
  absl::MutexLock lock(&mu_);
  ReplicatorStats s = stats_;
  s.lag_turns = static_cast<int64_t>(queue_.size());
  return s;
}

absl::Status Replicator::OnCommit(const storage::TurnUpdate& update) {
  if (options_.replicas <= 1) return absl::OkStatus();
  if (options_.sync) {
    absl::Status s = Replicate(update);
    MarkSettled(update.manifest, s.ok());
    return s;
  }
  absl::MutexLock lock(&mu_);
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || static_cast<int>(queue_.size()) < options_.max_lag_turns;
  };
  // The bound on the lag: a turn that would exceed it waits.
  mu_.Await(absl::Condition(&room));
  queue_.push_back(update);
  stats_.max_lag_turns = std::max<int64_t>(stats_.max_lag_turns, queue_.size());
  // The alarm: half the bound is a replica set falling behind.
  if (static_cast<int>(queue_.size()) > options_.max_lag_turns / 2 &&
      absl::Now() - last_alarm_ > absl::Minutes(1)) {
    last_alarm_ = absl::Now();
    std::fprintf(stderr,
                 "kvd serve: ALARM replication lag: %zu turns committed and "
                 "not yet on their replicas (bound %d); turns will wait at "
                 "the bound\n",
                 queue_.size(), options_.max_lag_turns);
  }
  return absl::OkStatus();
}

void Replicator::MarkSettled(const v1::SessionManifest& m, bool settled) {
  std::pair<std::string, std::string> key(m.tenant(), m.session_id());
  absl::MutexLock lock(&mu_);
  if (settled) {
    settled_.insert(std::move(key));
  } else {
    settled_.erase(key);
  }
}

absl::Status Replicator::Settle(const v1::SessionManifest& committed) {
  if (options_.replicas <= 1 || !options_.sync ||
      committed.turn_ends_size() == 0) {
    return absl::OkStatus();  // nothing a replica could lack
  }
  {
    absl::MutexLock lock(&mu_);
    if (settled_.contains(
            std::make_pair(committed.tenant(), committed.session_id()))) {
      return absl::OkStatus();
    }
  }
  absl::StatusOr<std::optional<cluster::DirectoryEntry>> entry =
      directory_->Lookup(committed.tenant(), committed.session_id());
  if (!entry.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "cannot check the replicas of session '", committed.session_id(),
        "' before its turn: ", entry.status().message()));
  }
  if (!entry->has_value() || (*entry)->owner != options_.node_id ||
      (*entry)->epoch != storage::EpochOf(committed)) {
    return absl::OkStatus();  // not this node's: the fence refuses the turn
  }
  const cluster::DirectoryEntry& e = **entry;
  PeerOptions quick = options_.peer;
  quick.rpc_timeout = absl::Seconds(5);
  std::vector<std::string> keep;
  for (const std::string& r : e.replicas) {
    absl::StatusOr<PeerNode> peer = resolve_(r);
    absl::StatusOr<v1::ReplicaStatusResponse> copy =
        peer.ok() ? QueryReplica(*peer, quick, committed.tenant(),
                                 committed.session_id())
                  : absl::StatusOr<v1::ReplicaStatusResponse>(peer.status());
    if (copy.ok() && copy->owner_node() == options_.node_id &&
        copy->epoch() == storage::EpochOf(committed) &&
        copy->turns() == committed.turn_ends_size() &&
        copy->token_count() == committed.token_count()) {
      keep.push_back(r);
    } else {
      std::fprintf(stderr,
                   "kvd serve: replica '%s' of session '%s' may lack turns "
                   "this node committed and leaves its replica set: %s\n",
                   r.c_str(), committed.session_id().c_str(),
                   copy.ok() ? absl::StrCat("it holds ", copy->turns(),
                                            " turns, this node ",
                                            committed.turn_ends_size())
                                   .c_str()
                             : copy.status().ToString().c_str());
    }
  }
  if (keep != e.replicas) {
    absl::Status set =
        directory_
            ->SetReplicas(committed.tenant(), committed.session_id(), e, keep)
            .status();
    if (!set.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "cannot remove stale replicas of session '", committed.session_id(),
          "' from the directory: ", set.message()));
    }
    absl::MutexLock lock(&mu_);
    stats_.replicas_dropped +=
        static_cast<int64_t>(e.replicas.size() - keep.size());
  }
  MarkSettled(committed, true);
  return absl::OkStatus();
}

void Replicator::Drain() {
  for (;;) {
    storage::TurnUpdate next;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and everything was sent
      next = std::move(queue_.front());
    }
    (void)Replicate(next);  // async: a failure shows in the stats
    absl::MutexLock lock(&mu_);
    queue_.pop_front();
  }
}

std::vector<std::string> Replicator::Candidates(
    const std::vector<std::string>& skip) {
  std::vector<std::pair<double, std::string>> ranked;
  absl::StatusOr<std::vector<cluster::EtcdKeyValue>> drains =
      etcd_->GetPrefix(cluster::kDrainPrefix);
  absl::StatusOr<std::vector<cluster::EtcdKeyValue>> nodes =
      etcd_->GetPrefix(cluster::kNodesPrefix);
  if (!drains.ok() || !nodes.ok()) return {};
  std::set<std::string> excluded(skip.begin(), skip.end());
  excluded.insert(options_.node_id);
  for (const auto& kv : *drains) {
    excluded.insert(kv.key.substr(sizeof(cluster::kDrainPrefix) - 1));
  }
  for (const auto& kv : *nodes) {
    absl::StatusOr<cluster::NodeInfo> n = cluster::DecodeNodeInfo(kv.value);
    if (!n.ok() || excluded.count(n->id) ||
        n->model_fingerprint != options_.model_fingerprint ||
        n->grpc_address.empty()) {
      continue;
    }
    const double capacity = std::max<int64_t>(1, n->max_inflight);
    ranked.emplace_back((n->load.running + n->load.queued) / capacity, n->id);
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<std::string> out;
  for (auto& [load, id] : ranked) out.push_back(std::move(id));
  return out;
}

absl::Status Replicator::SendUpdate(const std::string& node,
                                    const storage::TurnUpdate& update) {
  KVD_ASSIGN_OR_RETURN(PeerNode peer, resolve_(node));
  const v1::SessionManifest& m = update.manifest;
  v1::OpenInboundRequest req = OpenRequest(m, options_.node_id);
  req.set_update_only(true);
  KVD_ASSIGN_OR_RETURN(
      std::unique_ptr<PeerTransfer> t,
      PeerTransfer::Open(peer, absl::StrCat("replica '", node, "'"), transport_,
                         options_.peer, req));
  absl::Status sent = t->SendDelta(update);
  if (sent.ok()) {
    sent = t->Commit(storage::EpochOf(m), m.token_count(), m.turn_ends_size())
               .status();
  }
  if (!sent.ok()) t->Abort();
  return sent;
}

absl::Status Replicator::SendCopy(const std::string& node,
                                  const std::string& tenant,
                                  const std::string& session) {
  KVD_ASSIGN_OR_RETURN(PeerNode peer, resolve_(node));
  KVD_ASSIGN_OR_RETURN(std::shared_ptr<const storage::SessionCheckpoint> cp,
                       engine_->ExportSession(tenant, session));
  const v1::SessionManifest& m = cp->manifest();
  const v1::OpenInboundRequest req = OpenRequest(m, options_.node_id);
  KVD_ASSIGN_OR_RETURN(
      std::unique_ptr<PeerTransfer> t,
      PeerTransfer::Open(peer, absl::StrCat("replica '", node, "'"), transport_,
                         options_.peer, req));
  absl::Status sent = t->SendCopy(*cp);
  if (sent.ok()) sent = t->Stage();
  if (sent.ok()) sent = t->SendDelta(CheckpointDelta(*cp, *cp));
  if (sent.ok()) {
    sent = t->Commit(storage::EpochOf(m), m.token_count(), m.turn_ends_size())
               .status();
  }
  if (!sent.ok()) t->Abort();
  return sent;
}

absl::Status Replicator::Replicate(const storage::TurnUpdate& update) {
  const v1::SessionManifest& m = update.manifest;
  absl::StatusOr<std::optional<cluster::DirectoryEntry>> entry =
      directory_->Lookup(m.tenant(), m.session_id());
  if (!entry.ok() || !entry->has_value() ||
      (*entry)->owner != options_.node_id ||
      (*entry)->epoch != storage::EpochOf(m)) {
    absl::MutexLock lock(&mu_);
    stats_.failures++;
    // Not this node's to replicate any more (it moved), or etcd is down:
    // either way no replica is known to hold the turn.
    return entry.ok() ? absl::AbortedError(absl::StrCat(
                            "session '", m.session_id(),
                            "' moved to another node during the commit"))
                      : absl::UnavailableError(absl::StrCat(
                            "cannot read the session's replica set: ",
                            entry.status().message()));
  }
  const cluster::DirectoryEntry& e = **entry;
  std::vector<std::string> keep;
  int64_t sent = 0, copies = 0, failed = 0;
  for (const std::string& r : e.replicas) {
    absl::Status s = SendUpdate(r, update);
    if (s.ok()) {
      keep.push_back(r);
      sent++;
    } else {
      failed++;
      std::fprintf(stderr,
                   "kvd serve: replica '%s' of session '%s' missed a turn "
                   "and leaves its replica set: %s\n",
                   r.c_str(), m.session_id().c_str(), s.ToString().c_str());
    }
  }
  const size_t want = static_cast<size_t>(options_.replicas - 1);
  if (keep.size() < want) {
    std::vector<std::string> skip = keep;
    skip.insert(skip.end(), e.replicas.begin(), e.replicas.end());
    FillSet(m.tenant(), m.session_id(), skip, &keep, &copies, &failed)
        .IgnoreError();  // counted; the set stays short
  }
  absl::Status result = absl::OkStatus();
  if (keep != e.replicas) {
    absl::Status set =
        directory_->SetReplicas(m.tenant(), m.session_id(), e, keep).status();
    if (!set.ok()) {
      failed++;
      // A replica without the turn may still be listed: failover could
      // promote it.
      if (sent < static_cast<int64_t>(e.replicas.size())) {
        result = absl::UnavailableError(absl::StrCat(
            "a replica missed the turn and could not be removed from the "
            "set: ",
            set.message()));
      }
    }
  }
  absl::MutexLock lock(&mu_);
  stats_.turns_replicated += sent;
  stats_.copies_sent += copies;
  stats_.failures += failed;
  stats_.replicas_dropped += static_cast<int64_t>(e.replicas.size()) - sent;
  if (keep.size() < want) stats_.short_sets++;
  return result;
}

}  // namespace kvd::migration
