// A migration's source side (DESIGN.md section 7): moves a session this node
// owns to another node while it keeps serving, and continues it there token
// for token.
//
//   1. the target opens an inbound transfer (gRPC, authenticated by the
//      cluster token over TLS) and hands back a data-plane address and a
//      one-time secret (services/transport/secure_stream.h);
//   2. the committed checkpoint is copied over the data plane while turns
//      keep committing here; the target checks it and stores it as a
//      replica (StageInbound returns once it has);
//   3. at a turn boundary the session is frozen (SessionEngine::Freeze: a
//      running turn finishes, later ones wait), and the delta since the copy
//      is sent: what those turns committed;
//   4. the target verifies the delta and applies it (CommitInbound);
//   5. the directory moves the session to the target at epoch + 1 in one
//      transaction on the revision read at the start, so of racing moves
//      one wins, and a session that moved meanwhile is not moved again;
//   6. this node's copy is released (turns that waited learn where it went
//      and are sent there by the router: they run on the target) and then
//      deleted, only now that the target holds the session.
// Any failure before step 5 unfreezes the session here: it keeps serving as
// if nothing happened, and the target discards what it received.
//
//   Migrator m(&engine, &directory, ucx.get(), resolver, options);
//   KVD_ASSIGN_OR_RETURN(MigrationReport r, m.Migrate("acme", "c1", "n2"));
//
// Thread-safety: thread-safe; migrations of different sessions run at once.
#ifndef KVD_SERVICES_MIGRATION_MIGRATOR_H_
#define KVD_SERVICES_MIGRATION_MIGRATOR_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/cluster/directory.h"
#include "services/engine/session_engine.h"
#include "services/migration/outbound.h"
#include "services/transport/chunk_stream.h"
#include "storage/checkpoint/session_checkpoint.h"

namespace kvd::migration {

// NOT_FOUND / UNAVAILABLE when the node is not a live member.
using PeerResolver =
    std::function<absl::StatusOr<PeerNode>(const std::string& node_id)>;

struct MigratorOptions {
  std::string node_id;  // this node
  // Sent to peers as "authorization: Bearer <token>" (kvd serve
  // --router-token: the secret a cluster's nodes and routers share).
  std::string cluster_token;
  // PEM of the CA that signed the peers' certificates; "" = plaintext gRPC
  // (loopback tests, --no-tls clusters).
  std::string ca_cert_pem;
  // This node's certificate and key (PEM), presented to peers (mutual TLS).
  std::string client_cert_pem;
  std::string client_key_pem;
  size_t piece_bytes = 1 << 20;
  absl::Duration rpc_timeout = absl::Seconds(120);
};

struct MigrationReport {
  std::string target;
  uint64_t epoch = 0;  // the session's epoch on the target
  int64_t tokens = 0;
  int64_t turns = 0;
  int64_t snapshot_bytes = 0;  // copied while the session served
  int64_t delta_bytes = 0;     // sent while it was frozen
  int64_t delta_chunks = 0;    // chunks new or changed since the copy
  int64_t wire_bytes = 0;      // everything on the data plane, framing too
  absl::Duration total;
  // Waiting for the session's running turn to finish before the freeze
  // (that turn is not delayed, it completes here).
  absl::Duration freeze_wait;
  // Frozen to the directory naming the target: how long a new turn waits.
  absl::Duration pause;
  std::string restore_path;  // the target's: "residuals" or "tokens"
  std::string transport;
};

struct MigratorStats {
  int64_t started = 0;
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t bytes_sent = 0;
};

// The delta from `before` to `after` (the same session's later committed
// state): `after`'s manifest, its chunks that are new or changed, and the
// chunks it no longer has.
storage::TurnUpdate CheckpointDelta(const storage::SessionCheckpoint& before,
                                    const storage::SessionCheckpoint& after);

// The report as the HTTP API returns it (object "session.migration").
std::string MigrationReportJson(const MigrationReport& r,
                                const std::string& session,
                                const std::string& from);

class Migrator {
 public:
  // Everything passed in outlives the Migrator.
  Migrator(engine::SessionEngine* engine, cluster::SessionDirectory* directory,
           transport::Transport* transport, PeerResolver resolve,
           MigratorOptions options);

  // INVALID_ARGUMENT for this node as the target; NOT_FOUND for a session
  // this node does not hold; FAILED_PRECONDITION if the directory does not
  // give it to this node, or the target serves another model or is
  // draining; ABORTED if the
  // directory changed meanwhile or the session is being moved by another call
  // already; the target's or the transport's error otherwise. On every error
  // the session stays here, serving.
  absl::StatusOr<MigrationReport> Migrate(const std::string& tenant,
                                          const std::string& session,
                                          const std::string& target);

  MigratorStats stats() const;
  const std::string& node_id() const { return options_.node_id; }

 private:
  engine::SessionEngine* const engine_;
  cluster::SessionDirectory* const directory_;
  transport::Transport* const transport_;
  const PeerResolver resolve_;
  const MigratorOptions options_;
  mutable absl::Mutex mu_;
  MigratorStats stats_ ABSL_GUARDED_BY(mu_);
  // Sessions a Migrate call is moving now (tenant, session).
  std::set<std::pair<std::string, std::string>> moving_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvd::migration

#endif  // KVD_SERVICES_MIGRATION_MIGRATOR_H_
