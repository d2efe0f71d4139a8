// Replication (DESIGN.md section 7): every committed turn of a session this
// node owns goes to R-1 replica nodes, which hold it as a cold replica copy
// (never served; SessionEngine::ApplyReplicaUpdate) so that a failover can
// promote one when this node dies (failover.h).
//
// The replica set lives in the session's directory entry. After each commit
// (SessionEngineOptions::on_commit, under the session's lock, so updates
// leave in commit order) the replicator sends the turn's update to each
// replica; a replica that fails is dropped from the set, and while the set
// is short a new replica (a live, undrained node of the model, least loaded
// first) is given a whole copy first and only then added, by a transaction
// on the entry. So every node in the set holds every turn acknowledged
// since it joined, which is what failover relies on.
//
//   sync:  the turn is answered only after its replicas applied it durably;
//   async: the turn is answered at once and a background thread sends it;
//          the lag (turns committed, not yet replicated) is bounded: a turn
//          that would exceed max_lag_turns waits.
//
// Thread-safety: thread-safe.
#ifndef KVD_SERVICES_MIGRATION_REPLICATOR_H_
#define KVD_SERVICES_MIGRATION_REPLICATOR_H_

#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/cluster/directory.h"
#include "services/cluster/etcd_client.h"
#include "services/engine/session_engine.h"
#include "services/migration/migrator.h"
#include "services/migration/outbound.h"
#include "storage/checkpoint/session_checkpoint.h"

namespace kvd::migration {

struct ReplicatorOptions {
  std::string node_id;
  std::string model_fingerprint;
  int replicas = 1;  // copies in all, this node's included: R
  bool sync = true;
  int max_lag_turns = 64;  // async only
  PeerOptions peer;
  // How often a background pass refills short replica sets of sessions this
  // node owns (RefillPass); zero: never (tests call RefillPass).
  absl::Duration refill_every = absl::Seconds(10);
  int refill_per_pass = 16;  // sessions copied at most per pass
};

struct ReplicatorStats {
  int64_t turns_replicated = 0;  // updates applied by a replica
  int64_t copies_sent = 0;       // new replicas filled
  int64_t failures = 0;          // updates or copies that failed
  int64_t replicas_dropped = 0;  // removed from a set after a failure
  int64_t short_sets = 0;        // turns left with fewer than R-1 replicas
  int64_t lag_turns = 0;         // async: committed, not yet sent
  int64_t max_lag_turns = 0;
  int64_t sets_refilled = 0;  // short sets refilled between turns
  // Sessions the directory gave this node while it held no copy of them (its
  // data directory was lost or replaced), handed to their best replica.
  int64_t handed_over = 0;
};

class Replicator {
 public:
  // Everything passed in outlives the Replicator.
  Replicator(engine::SessionEngine* engine, cluster::EtcdClient* etcd,
             cluster::SessionDirectory* directory,
             transport::Transport* transport, PeerResolver resolve,
             ReplicatorOptions options);
  // Sends what async mode still holds, then stops.
  ~Replicator();

  // SessionEngineOptions::on_commit. Sync: OK once every replica the
  // directory lists for the session holds the turn (a replica that failed
  // left the set by a transaction); otherwise an error and the session is
  // unsettled, so the turn must not be acknowledged. Async: OK.
  absl::Status OnCommit(const storage::TurnUpdate& update);
  // SessionEngineOptions::before_turn. Sync, for a session not settled since
  // this node started (or since a replication failed): asks each listed
  // replica for its copy and removes from the set, by a transaction, every
  // one that does not hold exactly `committed`, so that a failover can
  // never promote a replica lacking a turn this node acknowledged (or is
  // about to acknowledge, a resend of an unconfirmed turn). UNAVAILABLE if
  // it cannot (etcd unreachable): the turn must not run.
  absl::Status Settle(const v1::SessionManifest& committed);
  // Refills the replica sets of sessions this node owns that hold fewer than
  // R-1 replicas, whether or not they have turns: a move (migrate, drain,
  // rebalance) or a failover leaves a session with none, and a replica that
  // failed left its set. Each such session is first taken up (a copy a
  // failover gave this node becomes its primary), then frozen while a new
  // replica gets a whole copy and joins the set by a transaction, so no
  // turn commits in between. At most refill_per_pass sessions; the number
  // refilled. Errors only for etcd failing; a session that cannot be
  // refilled (no candidate, a copy failed) waits for the next pass.
  //
  // Until one pass has found them all, it also looks for sessions the
  // directory gives this node that it holds no copy of at all (a node
  // restarted on an empty or replaced data directory): such a session,
  // if its entry lists replicas, is moved (epoch + 1) to the listed replica
  // holding the most turns of this node's epoch, whose own pass then takes
  // it up and refills its set. This node never starts it anew.
  absl::StatusOr<int> RefillPass();
  ReplicatorStats stats() const;

 private:
  absl::Status Replicate(const storage::TurnUpdate& update);
  void MarkSettled(const v1::SessionManifest& m, bool settled);
  absl::Status SendUpdate(const std::string& node,
                          const storage::TurnUpdate& update);
  absl::Status SendCopy(const std::string& node, const std::string& tenant,
                        const std::string& session);
  // Live, undrained nodes of this model, other than this one and `skip`,
  // least loaded first.
  std::vector<std::string> Candidates(const std::vector<std::string>& skip);
  void Drain();
  // Gives whole copies of the session to candidates (not in `skip`) until
  // `keep` lists R-1 replicas; counts copies and failures. The last failure.
  absl::Status FillSet(const std::string& tenant, const std::string& session,
                       const std::vector<std::string>& skip,
                       std::vector<std::string>* keep, int64_t* copies,
                       int64_t* failed);
  // RefillPass's work on one frozen session: true if its set grew.
  absl::StatusOr<bool> RefillFrozen(const std::string& tenant,
                                    const std::string& session, uint64_t epoch);
  void RefillLoop();
  // RefillPass's work on a session this node owns without a copy: true if
  // it moved to a replica.
  absl::StatusOr<bool> HandOver(
      const cluster::SessionDirectory::OwnedSession& s);

  engine::SessionEngine* const engine_;
  cluster::EtcdClient* const etcd_;
  cluster::SessionDirectory* const directory_;
  transport::Transport* const transport_;
  const PeerResolver resolve_;
  const ReplicatorOptions options_;
  mutable absl::Mutex mu_;
  ReplicatorStats stats_ ABSL_GUARDED_BY(mu_);
  std::deque<storage::TurnUpdate> queue_ ABSL_GUARDED_BY(mu_);  // async
  // Sync: sessions (tenant, id) whose listed replicas are known to hold
  // everything this node committed of them.
  absl::flat_hash_set<std::pair<std::string, std::string>> settled_
      ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_alarm_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // A refill pass found every owned session's copy here (or handed it over).
  bool copies_checked_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::thread refill_thread_;
};

}  // namespace kvd::migration

#endif  // KVD_SERVICES_MIGRATION_REPLICATOR_H_
