// An in-process Transport (chunk_stream.h) for unit tests: a bounded queue
// per receiver, found by its address. It behaves as a real one does at the
// edges: a sender that goes away without Close breaks the stream, a receiver
// that goes away makes Send fail, an oversized chunk is refused, and a full
// queue holds the sender back (flow control).
//
// Thread-safety: as chunk_stream.h.
#ifndef KVD_SERVICES_TRANSPORT_LOOPBACK_TRANSPORT_H_
#define KVD_SERVICES_TRANSPORT_LOOPBACK_TRANSPORT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "services/transport/chunk_stream.h"

namespace kvd::transport {

class LoopbackTransport : public Transport {
 public:
  // `queue_chunks`: how many chunks a receiver buffers before Send waits.
  explicit LoopbackTransport(int queue_chunks = 8);
  ~LoopbackTransport() override;

  std::string name() const override { return "loopback"; }
  absl::StatusOr<std::unique_ptr<ChunkReceiver>> Listen(
      const ListenOptions& options) override;
  absl::StatusOr<std::unique_ptr<ChunkSender>> Connect(
      absl::string_view address) override;

  struct Queue;  // shared by one receiver and its sender

 private:
  const int queue_chunks_;
  absl::Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::weak_ptr<Queue>> queues_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvd::transport

#endif  // KVD_SERVICES_TRANSPORT_LOOPBACK_TRANSPORT_H_
