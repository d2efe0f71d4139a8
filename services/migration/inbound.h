// A migration's target side (DESIGN.md section 7): transfers this node has
// agreed to receive. The source asks over gRPC (services/migration:
// migration_service.h) to open one; this node opens a receiver on the data
// plane with a fresh one-time secret, and a thread takes the stream as it
// arrives:
//   'S' + a piece of the session file (storage/checkpoint/session_file.h):
//       the committed checkpoint, copied while the session kept serving;
//   'F' alone: the copy is complete (the source then waits for Stage);
//   'D' + a piece of a turn-update stream: what the session committed
//       between that copy and its freeze (possibly nothing).
// The copy is checked as it arrives (every chunk's CRC32C and the stream's
// own checks, session_file.h; the model's fingerprint and precision; the
// owner and epoch the move was opened at) and stored as a replica
// (SessionEngine::StoreReplica: unlisted, refusing turns) while the session
// still serves on its source; Stage reports when that is done. Commit
// checks the delta (its records, the epoch and the token and turn counts
// the source froze) and applies it to the replica. Nothing is live here
// until the directory names this node. Other numerics are accepted: the
// session then re-prefills from its token ids on its first turn here, and
// Commit says so.
//
// Thread-safety: thread-safe.
#ifndef KVD_SERVICES_MIGRATION_INBOUND_H_
#define KVD_SERVICES_MIGRATION_INBOUND_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/kvd/v1/migration.pb.h"
#include "services/engine/session_engine.h"
#include "services/transport/chunk_stream.h"

namespace kvd::migration {

// Section tags: the first byte of every chunk a migration sends.
inline constexpr char kSnapshotPiece = 'S';
inline constexpr char kSnapshotEnd = 'F';  // alone: the copy is complete
inline constexpr char kDeltaPiece = 'D';

struct InboundOptions {
  // Transfers open at once; more are RESOURCE_EXHAUSTED (the source retries
  // or picks another node).
  int max_open = 4;
  // A transfer whose stream is silent this long fails.
  absl::Duration idle_timeout = absl::Seconds(30);
  // How long Commit waits for the stream's end.
  absl::Duration commit_wait = absl::Seconds(60);
  // The largest checkpoint accepted (sum of the stream's pieces).
  int64_t max_session_bytes = int64_t{16} << 30;
};

struct InboundStats {
  int64_t opened = 0;
  int64_t committed = 0;
  int64_t failed = 0;  // refused by a check, broken, aborted or timed out
  int64_t bytes_committed = 0;
};

class InboundTransfers {
 public:
  // `engine` and `transport` outlive this.
  InboundTransfers(engine::SessionEngine* engine,
                   transport::Transport* transport, InboundOptions options);
  // Cancels open transfers and waits for their threads.
  ~InboundTransfers();

  // FAILED_PRECONDITION for another model or precision (nothing could be
  // resumed here); RESOURCE_EXHAUSTED when max_open are open.
  absl::StatusOr<v1::OpenInboundResponse> Open(
      const v1::OpenInboundRequest& request);
  // Waits until the copy sent while the session served has arrived, passed
  // its checks and is stored as a replica. NOT_FOUND for an unknown
  // transfer; the stream's or the checks' error otherwise.
  absl::StatusOr<v1::StageInboundResponse> Stage(
      const v1::StageInboundRequest& request);
  // Applies the delta to the staged copy once it has arrived and passed its
  // checks. NOT_FOUND for an unknown (or already ended) transfer; the
  // stream's or the checks' error otherwise, and the staged copy is
  // dropped. The transfer ends either way.
  absl::StatusOr<v1::CommitInboundResponse> Commit(
      const v1::CommitInboundRequest& request);
  // Ends the transfer, storing nothing. NOT_FOUND if unknown.
  absl::Status Abort(const std::string& transfer_id);

  InboundStats stats() const;
  engine::SessionEngine* engine() const { return engine_; }
  std::string transport_name() const { return transport_->name(); }

 private:
  struct Transfer;
  void Receive(Transfer* t);
  absl::StatusOr<std::shared_ptr<Transfer>> Take(const std::string& id);
  // After a failed commit or an abort: drops what the transfer stored.
  void DropStaged(const Transfer& t);

  engine::SessionEngine* const engine_;
  transport::Transport* const transport_;
  const InboundOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Transfer>> open_ ABSL_GUARDED_BY(mu_);
  InboundStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvd::migration

#endif  // KVD_SERVICES_MIGRATION_INBOUND_H_
