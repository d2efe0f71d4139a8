// One transfer to a peer node, the sending side of kvd.v1.Migration: a
// session's committed copy and/or a turn-update stream, over the data plane
// under the transfer's one-time secret (services/transport/secure_stream.h).
// A move (migrator.h) sends a copy, waits for the peer to stage it, then
// sends the delta; replication (replicator.h) sends a copy to a new replica,
// or one turn's update to an existing one.
//
//   KVD_ASSIGN_OR_RETURN(auto t, PeerTransfer::Open(peer, plane, o, req));
//   KVD_RETURN_IF_ERROR(t->SendCopy(checkpoint));
//   KVD_RETURN_IF_ERROR(t->Stage());
//   KVD_RETURN_IF_ERROR(t->SendDelta(update));
//   KVD_ASSIGN_OR_RETURN(auto done, t->Commit(epoch, tokens, turns));
//   // on any error: t->Abort();
//
// Thread-safety: one thread per transfer.
#ifndef KVD_SERVICES_MIGRATION_OUTBOUND_H_
#define KVD_SERVICES_MIGRATION_OUTBOUND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/kvd/v1/migration.grpc.pb.h"
#include "services/transport/chunk_stream.h"
#include "services/transport/secure_stream.h"
#include "storage/checkpoint/session_checkpoint.h"

namespace kvd::migration {

// Another node as a transfer reaches it.
struct PeerNode {
  std::string grpc_address;  // host:port of its gRPC API
  std::string model_fingerprint;
  bool draining = false;  // kvd cluster drain: it takes no sessions
};

struct PeerOptions {
  // Sent as "authorization: Bearer <token>" (kvd serve --router-token).
  std::string cluster_token;
  // PEM of the CA that signed the peers' certificates; "" = plaintext gRPC.
  std::string ca_cert_pem;
  // This node's certificate and key (PEM), presented to peers that verify
  // client certificates (mutual TLS: they authorize this node by it);
  // "" = none.
  std::string client_cert_pem;
  std::string client_key_pem;
  size_t piece_bytes = 1 << 20;
  absl::Duration rpc_timeout = absl::Seconds(120);
};

// The peer's replica copy of a session (kvd.v1.Migration/ReplicaStatus).
absl::StatusOr<v1::ReplicaStatusResponse> QueryReplica(
    const PeerNode& peer, const PeerOptions& options, const std::string& tenant,
    const std::string& session);

class PeerTransfer {
 public:
  // OpenInbound on the peer, then connects to the address it returns.
  // `what` names the peer in errors ("node 'n2'").
  static absl::StatusOr<std::unique_ptr<PeerTransfer>> Open(
      const PeerNode& peer, const std::string& what,
      transport::Transport* plane, const PeerOptions& options,
      const v1::OpenInboundRequest& request);

  // The committed copy, then its end marker.
  absl::Status SendCopy(const storage::SessionCheckpoint& checkpoint);
  // Returns once the peer has checked and stored the copy.
  absl::Status Stage();
  // A turn-update stream (a move's delta, or one replicated turn), then the
  // end of the stream.
  absl::Status SendDelta(const storage::TurnUpdate& update);
  // The peer checks the update against what the sender froze and applies
  // it.
  absl::StatusOr<v1::CommitInboundResponse> Commit(uint64_t epoch,
                                                   int64_t tokens,
                                                   int64_t turns);
  // Tells the peer to drop the transfer (best effort).
  void Abort();

  const v1::OpenInboundResponse& opened() const { return open_; }
  int64_t payload_bytes() const { return out_->payload_bytes(); }
  int64_t wire_bytes() const { return out_->wire_bytes(); }

 private:
  PeerTransfer(std::string what, PeerOptions options)
      : what_(std::move(what)), options_(std::move(options)) {}
  std::unique_ptr<grpc::ClientContext> Context() const;
  absl::Status SendTagged(char tag, absl::string_view piece);
  using PieceSink = std::function<bool(absl::string_view piece)>;
  // Runs `write` (a record-stream writer) with a sink that sends each piece
  // under `tag`; the first send error, else the writer's status.
  absl::Status SendPieces(
      char tag, const std::function<absl::Status(const PieceSink&)>& write);

  const std::string what_;
  const PeerOptions options_;
  std::unique_ptr<v1::Migration::Stub> stub_;
  v1::OpenInboundResponse open_;
  std::unique_ptr<transport::SecureSender> out_;
  std::string tagged_;
};

}  // namespace kvd::migration

#endif  // KVD_SERVICES_MIGRATION_OUTBOUND_H_
