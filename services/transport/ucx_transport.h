// The Transport (chunk_stream.h) between nodes: UCX's UCP tag API (Debian's
// libucx 1.13). Each receiver is its own UCP worker; its worker address is
// the address() a sender connects to (exchanged over gRPC, so no listening
// socket is opened). Chunks are tagged messages, which UCX delivers in order
// per endpoint; large ones go by rendezvous, so the receiver's memory holds
// only the chunk it has accepted. A receiver probes each message's length
// and refuses one over its limit before allocating for it.
//
// Which UCX transports carry the bytes is UCX's choice among `tls` (UCX_TLS
// syntax): "tcp", "sm" (shared memory: posix, sysv, cma) or "" for UCX's
// default (which honours $UCX_TLS). Waiting blocks on the worker's event fd,
// so an idle stream costs no CPU.
//
//   KVD_ASSIGN_OR_RETURN(auto ucx, UcxTransport::Create({.tls = "tcp"}));
//
// Thread-safety: as chunk_stream.h (the UCP context is shared by workers of
// different threads; each worker is used by one thread at a time).
#ifndef KVD_SERVICES_TRANSPORT_UCX_TRANSPORT_H_
#define KVD_SERVICES_TRANSPORT_UCX_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "services/transport/chunk_stream.h"

namespace kvd::transport {

struct UcxOptions {
  std::string tls;  // UCX_TLS syntax; "" = UCX's default
  // How long a Send waits for the receiver to take a chunk.
  absl::Duration send_timeout = absl::Seconds(30);
};

class UcxTransport : public Transport {
 public:
  // UNAVAILABLE (with UCX's reason) if UCX cannot start with `options.tls`.
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(
      const UcxOptions& options);
  ~UcxTransport() override;

  std::string name() const override;
  absl::StatusOr<std::unique_ptr<ChunkReceiver>> Listen(
      const ListenOptions& options) override;
  absl::StatusOr<std::unique_ptr<ChunkSender>> Connect(
      absl::string_view address) override;

  struct Context;  // the UCP context, shared with live senders and receivers

 private:
  UcxTransport(UcxOptions options, std::shared_ptr<Context> context);
  const UcxOptions options_;
  std::shared_ptr<Context> context_;
};

}  // namespace kvd::transport

#endif  // KVD_SERVICES_TRANSPORT_UCX_TRANSPORT_H_
