// Empties a draining node (DESIGN.md section 7): while the key
// /kvd/v1/drain/<this node> exists (kvd cluster drain), the node moves every
// session the directory gives it to the other live, undrained nodes of its
// model, one at a time, each to the least loaded (by reported load, then by
// how many this drain has sent there). A move waits for the session's
// running turn (Migrator freezes at a turn boundary); one that fails is
// tried again on a later pass. kvd cluster drain watches the directory
// until the node owns nothing.
//
//   Drainer d(&etcd, &directory, &migrator, {.node_id = "n1"});
//   d.Start();   // a background thread; the destructor stops it
//
// Thread-safety: Start once; stats() from any thread.
#ifndef KVD_SERVICES_MIGRATION_DRAINER_H_
#define KVD_SERVICES_MIGRATION_DRAINER_H_

#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "services/cluster/directory.h"
#include "services/cluster/etcd_client.h"
#include "services/engine/session_engine.h"
#include "services/migration/migrator.h"

namespace kvd::migration {

struct DrainerOptions {
  std::string node_id;
  std::string model_fingerprint;
  absl::Duration poll = absl::Seconds(1);
  // Rebalancing, when this node is not draining: while it owns more than
  // `rebalance_above` times the mean sessions per node of its model (and at
  // least 2 more than the least loaded), it moves one idle session (no turn
  // running) to the node that owns the fewest, at most one move per
  // `rebalance_every`. Zero: never.
  absl::Duration rebalance_every = absl::Seconds(10);
  double rebalance_above = 1.5;
};

struct DrainerStats {
  int64_t moved = 0;
  int64_t failed = 0;
  int64_t rebalanced = 0;
  bool draining = false;
};

class Drainer {
 public:
  // `engine` tells which sessions are idle (rebalancing); may be null (no
  // rebalancing).
  Drainer(cluster::EtcdClient* etcd, cluster::SessionDirectory* directory,
          Migrator* migrator, DrainerOptions options,
          const engine::SessionEngine* engine = nullptr);
  ~Drainer();

  void Start();
  // One pass: if this node is draining, tries to move each session it owns.
  // The number moved; errors only for etcd failing.
  absl::StatusOr<int> Pass();
  DrainerStats stats() const;

 private:
  // The live, undrained nodes of this model other than this one, least
  // loaded first; empty if none.
  absl::StatusOr<std::vector<std::string>> Targets();
  // One rebalancing step: at most one idle session moved.
  absl::StatusOr<int> Rebalance();

  cluster::EtcdClient* const etcd_;
  cluster::SessionDirectory* const directory_;
  Migrator* const migrator_;
  const DrainerOptions options_;
  const engine::SessionEngine* const engine_;
  absl::Time last_rebalance_ = absl::InfinitePast();
  absl::Notification stop_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  DrainerStats stats_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> sent_ ABSL_GUARDED_BY(mu_);  // per target
};

}  // namespace kvd::migration

#endif  // KVD_SERVICES_MIGRATION_DRAINER_H_
