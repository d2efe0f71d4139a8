// The data plane's unit (DESIGN.md section 7): a one-way, ordered stream of
// byte chunks from one sender to one receiver, over UCX between nodes
// (ucx_transport.h) or in process for tests (loopback_transport.h). A
// transport knows nothing about sessions or checkpoints: migration and
// replication send checkpoint frames through it, wrapped by secure_stream.h,
// which authorises and authenticates every chunk.
//
// A receiver is opened first; its address() travels to the sender over the
// authenticated control channel (gRPC), and the sender connects to it:
//
//   KVD_ASSIGN_OR_RETURN(auto inbox, transport.Listen({.max_chunk_bytes = n}));
//   ... send inbox->address() to the peer ...
//   // on the peer:
//   KVD_ASSIGN_OR_RETURN(auto out, transport.Connect(address));
//   KVD_RETURN_IF_ERROR(out->Send(chunk));
//   KVD_RETURN_IF_ERROR(out->Close());
//   // back here:
//   std::string chunk;
//   while (true) {
//     KVD_ASSIGN_OR_RETURN(bool more, inbox->Receive(&chunk, deadline));
//     if (!more) break;  // the sender closed the stream cleanly
//   }
//
// Thread-safety: a sender or receiver is used by one thread at a time;
// Transport's methods are thread-safe.
#ifndef KVD_SERVICES_TRANSPORT_CHUNK_STREAM_H_
#define KVD_SERVICES_TRANSPORT_CHUNK_STREAM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kvd::transport {

class ChunkSender {
 public:
  virtual ~ChunkSender() = default;
  // Returns once the chunk is on its way and its bytes may be reused.
  // UNAVAILABLE when the receiver is gone or the stream broke;
  // DEADLINE_EXCEEDED when the receiver took nothing for the transport's
  // send timeout.
  virtual absl::Status Send(absl::string_view chunk) = 0;
  // Ends the stream: the receiver's Receive returns false after the last
  // chunk. Destroying a sender without Close breaks the stream instead.
  // OK means the end was sent, not that it arrived: a receiver that has
  // everything may already be gone. Delivery is the receiver's to confirm
  // (e.g. over the control channel).
  virtual absl::Status Close() = 0;
};

class ChunkReceiver {
 public:
  virtual ~ChunkReceiver() = default;
  // Where a sender connects (opaque bytes, e.g. a UCX worker address).
  virtual const std::string& address() const = 0;
  // Replaces *chunk with the next chunk; false once the sender has closed
  // the stream. RESOURCE_EXHAUSTED for a chunk over max_chunk_bytes (refused
  // before anything is allocated for it; the stream is unusable after);
  // DEADLINE_EXCEEDED if nothing arrived by `deadline`; CANCELLED after
  // Cancel(); UNAVAILABLE if the stream broke.
  virtual absl::StatusOr<bool> Receive(std::string* chunk,
                                       absl::Time deadline) = 0;
  // Makes a Receive in progress (on another thread) and every later one
  // return CANCELLED: the control plane gave up on the transfer.
  virtual void Cancel() = 0;
};

struct ListenOptions {
  // The largest chunk a sender may send; a bigger one breaks the stream.
  int64_t max_chunk_bytes = int64_t{64} << 20;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // "ucx(tcp)", "loopback", ...: for logs and metrics.
  virtual std::string name() const = 0;
  virtual absl::StatusOr<std::unique_ptr<ChunkReceiver>> Listen(
      const ListenOptions& options) = 0;
  // UNAVAILABLE if `address` cannot be reached; INVALID_ARGUMENT if it is
  // not an address of this transport.
  virtual absl::StatusOr<std::unique_ptr<ChunkSender>> Connect(
      absl::string_view address) = 0;
};

}  // namespace kvd::transport

#endif  // KVD_SERVICES_TRANSPORT_CHUNK_STREAM_H_
